"""Pydantic models of the HTTP API: the native `/infer` API and KServe v2.

They serve two purposes: validating request bodies (the handlers parse bodies
themselves, so that the binary tensor extension and clients that send no or a
wrong `Content-Type` work) and describing every route in the OpenAPI document.

Tensor `data` is typed `list[Any]` on purpose: the elements are checked and
converted by numpy against the model's datatype (app.api.tensors), which is
far faster than per-element pydantic validation and gives messages that name
the tensor.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.api.app_id import AppId
from app.api.security import MAX_MODEL_NAME_LENGTH

MAX_SLO_MS = 3_600_000.0  # 1 hour: a larger per-request SLO is a client's mistake
# A model name as app.repository.loader.validate_model_name allows it: letters,
# digits, '_', '.' and '-', no '..' and not '.' (single dots between runs of the
# other characters, optionally one first and one last). Documented on every
# model name in the OpenAPI document; the server checks it itself (400
# invalid_model_name, app.api.security.check_model_name). "stats" is reserved:
# /v2/models/stats is Triton's statistics route (app.api.statistics_routes).
MODEL_NAME_PATTERN = r"^(?!stats$)\.?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?$"
MODEL_NAME_SCHEMA = {"pattern": MODEL_NAME_PATTERN, "maxLength": MAX_MODEL_NAME_LENGTH}


def _integral_float_to_int(value: Any) -> Any:
    # JSON Schema's "integer" is a number without a fraction, so 12.0 is one
    # (as in Triton's JSON parser); 12.5, "12" and true stay errors (422).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Integers in request bodies: JSON integers, or numbers with a zero fraction
# (the constraints first: the validator wraps them, and the schema keeps them).
WholeInt = Annotated[int, Field(strict=True), BeforeValidator(_integral_float_to_int)]
WholeNonNegInt = Annotated[int, Field(strict=True, ge=0), BeforeValidator(_integral_float_to_int)]
SloMs = Annotated[
    float,
    Field(
        strict=True,
        gt=0,
        le=MAX_SLO_MS,
        allow_inf_nan=False,
        description=(
            "Per-request SLO in milliseconds (deadline = arrival + slo_ms), finite, more than "
            "0 and at most 3600000 (1 hour). A tighter SLO than the model's is always allowed; "
            "a looser one only if the model config sets allow_slo_loosening, else the request "
            "is rejected with 400."
        ),
    ),
]

NESTED_DATA_DESCRIPTION = (
    "Tensor elements: numbers (booleans for BOOL), as a flat row-major array or nested to "
    "the tensor's rank. NaN and Infinity literals are accepted for floating-point tensors."
)
DATATYPE_DESCRIPTION = (
    "KServe v2 datatype name: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, "
    "FP16, FP32, FP64 (BYTES and BF16 are not supported). Must equal the model's datatype "
    "for the tensor."
)


class ErrorResponse(BaseModel):
    """Body of every error response (KServe's `{"error": ...}` plus a stable code)."""

    error: str = Field(description="Human-readable message; names the tensor at fault.")
    reason: str | None = Field(
        default=None,
        description=(
            "Stable short code: invalid_input, invalid_request, malformed_request, "
            "invalid_model_name, model_not_found, model_not_ready, deadline (or another drop "
            "reason), overloaded, executor_failed, shutting_down, not_ready, payload_too_large, "
            "unsupported_encoding, unauthorized, management_disabled, not_found, "
            "method_not_allowed, internal."
        ),
    )


# --------------------------------------------------------------------------- native API


class TensorData(BaseModel):
    """A tensor given as flat data plus its shape."""

    model_config = ConfigDict(extra="forbid")

    data: list[Any] = Field(description=NESTED_DATA_DESCRIPTION)
    shape: list[WholeInt] = Field(
        description=(
            "Shape, batch dimension n first (the request's items, 1 to the model's "
            "max_batch_size); omitted, it is 1."
        ),
        examples=[[1, 4]],
    )


class InferRequest(BaseModel):
    """Native inference request: n items (the inputs' batch dimension), kept whole."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"model": "add_one", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}, "slo_ms": 20},
                {"model": "add_one", "inputs": {"x": {"data": [1, 2, 3, 4], "shape": [4]}}},
            ]
        },
    )

    model: str = Field(description="Model name.", json_schema_extra=MODEL_NAME_SCHEMA)
    inputs: dict[str, list[Any] | TensorData] = Field(
        description=(
            "Input tensors by name: a nested array (batch dimension n first, 1 to the "
            "model's max_batch_size, the same for every input; omitted, it is 1) or "
            "{data, shape}. Every model input must be given."
        )
    )
    slo_ms: SloMs | None = None
    id: str | None = Field(default=None, description="Request id, echoed in the response.")
    app_id: AppId = None


class OutputTensor(BaseModel):
    shape: list[int] = Field(description="Shape, batch dimension n (the request's) first.")
    datatype: str = Field(description="KServe v2 datatype name.")
    data: list[Any] = Field(description="Elements nested to the tensor's rank.")


class Timing(BaseModel):
    queue_ms: float = Field(description="Arrival to batch start, milliseconds.")
    exec_ms: float = Field(description="Execution time of the batch, milliseconds.")
    batch_size: int = Field(description="Size of the batch the request ran in.")
    device: str = Field(description="Device the batch ran on.")
    intake_ms: float = Field(
        description="Arrival (the request's first byte) to the scheduler seeing it, milliseconds."
    )
    answer_ms: float = Field(
        description="End of the batch to the answer being ready to send, milliseconds."
    )
    app_id: str = Field(
        description="The request's application (app_id; \"\": the model's default one)."
    )


class InferResponse(BaseModel):
    model: str
    id: str | None = None
    outputs: dict[str, OutputTensor]
    timing: Timing


# --------------------------------------------------------------------------- KServe v2


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool
    # Capacity, where the service reports it: while an executor restarts the
    # server stays ready with fewer devices alive.
    devices_alive: int | None = None
    devices_total: int | None = None


class ModelReadyResponse(BaseModel):
    name: str
    ready: bool


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="Batch dimension first as -1; -1 is any size.")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str = Field(
        description="Triton's platform name (onnxruntime_onnx, pytorch_libtorch; emulated)."
    )
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ModelConfigTensor(BaseModel):
    name: str
    data_type: str = Field(description="Triton-style type name, e.g. TYPE_FP32.")
    dims: list[int] = Field(description="Shape without the batch dimension.")


class ModelConfigParameter(BaseModel):
    string_value: str


class ModelConfigResponse(BaseModel):
    """The model's configuration in Triton's model-config JSON (`name`,
    `platform`, `backend` as Triton names them, `max_batch_size`, `input`,
    `output`, `parameters`: what tritonclient's `get_model_config` reads,
    the same as the gRPC ModelConfig), with this server's own fields beside
    them (`version`, `slo_ms`, `allow_slo_loosening`, `devices`,
    `description`, and `runtime`: the backend that runs it here)."""

    name: str
    platform: str
    backend: str
    runtime: str
    version: str
    max_batch_size: int
    parameters: dict[str, ModelConfigParameter]
    slo_ms: float
    allow_slo_loosening: bool
    devices: list[str] | None = None
    description: str = ""
    input: list[ModelConfigTensor]
    output: list[ModelConfigTensor]


class V2InputParameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    binary_data_size: WholeNonNegInt | None = Field(
        default=None,
        description=(
            "Binary tensor data extension: the tensor's bytes (little-endian, row-major) "
            "follow the JSON header in the body, in input order; this is their length."
        ),
    )


class V2RequestInput(BaseModel):
    name: str
    shape: list[WholeInt] = Field(
        description=(
            "Shape, batch dimension n first: the request's items, 1 to the model's "
            "max_batch_size, the same for every input."
        )
    )
    datatype: str = Field(description=DATATYPE_DESCRIPTION)
    parameters: V2InputParameters | None = None
    data: list[Any] | None = Field(
        default=None, description=NESTED_DATA_DESCRIPTION + " Absent when binary_data_size is."
    )


class V2RequestedOutputParameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    binary_data: bool | None = Field(
        default=None,
        description="Return this output as binary data (overrides binary_data_output).",
        strict=True,
    )
    classification: WholeNonNegInt | None = Field(
        default=None, description="Classification extension: not supported, must be 0."
    )


class V2RequestedOutput(BaseModel):
    name: str
    parameters: V2RequestedOutputParameters | None = None


class V2RequestParameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    binary_data_output: bool | None = Field(
        default=None,
        strict=True,
        description="Return outputs as binary data unless an output's binary_data says no.",
    )
    slo_ms: SloMs | None = None
    app_id: AppId = None


class V2InferRequest(BaseModel):
    """KServe v2 inference request (the JSON part when the binary extension is used)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "42",
                    "inputs": [
                        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                    ],
                    "parameters": {"slo_ms": 20},
                }
            ]
        }
    )

    id: str | None = None
    parameters: V2RequestParameters | None = None
    inputs: list[V2RequestInput]
    outputs: list[V2RequestedOutput] | None = Field(
        default=None, description="Outputs to return (default: all)."
    )


class V2OutputParameters(BaseModel):
    binary_data_size: int | None = Field(
        default=None, description="Length of this output's bytes after the JSON header."
    )


class V2ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: V2OutputParameters | None = None
    data: list[Any] | None = Field(
        default=None, description="Flat row-major elements; absent for binary outputs."
    )


class V2ResponseParameters(BaseModel):
    queue_ms: float
    exec_ms: float
    batch_size: int
    device: str
    intake_ms: float
    answer_ms: float
    app_id: str = Field(
        description="The request's application (parameters.app_id; \"\": the model's default)."
    )


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: V2ResponseParameters
    outputs: list[V2ResponseOutput]


class RepositoryIndexRequest(BaseModel):
    ready: bool | None = Field(
        default=None, strict=True, description="If true, list only models that are ready."
    )


class LoadParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: str | None = Field(
        default=None,
        description="A model-config override as a JSON string: the fields of GET "
        "/v2/models/{name}/config that can change (max_batch_size, slo_ms, "
        "allow_slo_loosening, description, devices); the others must keep their value.",
    )


class RepositoryLoadRequest(BaseModel):
    parameters: LoadParameters | None = None


class UnloadParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unload_dependents: bool | None = Field(
        default=None, strict=True, description="Accepted; there are no ensembles."
    )


class RepositoryUnloadRequest(BaseModel):
    parameters: UnloadParameters | None = None


class RepositoryModel(BaseModel):
    name: str
    version: str | None = None
    state: str = Field(description="READY, UNAVAILABLE or LOADING.")
    reason: str | None = None


# Models the handlers validate by hand; their schemas are added to the OpenAPI
# components so that `openapi_extra` request bodies can reference them.
class ReshareRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(description="An executor device's name, e.g. cpu:0/1 (GET /v2/devices).")
    share: float = Field(
        gt=0.0,
        le=1.0,
        description="Its new share of the device, in (0, 1]; with the device's "
        "other shares at most 1 in all.",
    )


class DeviceEntry(BaseModel):
    name: str
    kind: str = Field(description="cpu, cuda or emulated.")
    share: float = Field(description="The executor's share of its device, in (0, 1].")
    cpus: list[int] | None = Field(description="A CPU executor's cores; null for other kinds.")
    threads: int
    alive: bool = Field(description="Serving now (false while its executor restarts).")
    state: str = Field(
        "serving",
        description="serving, parked (stopped on purpose: AUTOSCALE), resharing, loading "
        "(starting or loading models) or down (failed; restarting).",
    )
    node: str | None = Field(
        None, description="The Ray node its actor runs on (RAY_ADDRESS); null otherwise."
    )
    device_class: str | None = Field(
        None,
        alias="class",
        description="A PPipe pipeline's device: its device class (PPIPE_CLASSES); null otherwise.",
    )
    models: list[str]


class DeviceIndex(BaseModel):
    devices: list[DeviceEntry]


class PlanMadeFrom(BaseModel):
    planner: str = Field(description="`python -m app plan PLANNER`: partition, herd, inss, ppipe.")
    inputs: list[str] = Field(description="The planner's input files.")
    command: str = Field(description="The command line that made the plan.")
    rates: dict[str, float] = Field(description="Requests/s per model the plan was made for.")
    made_at: str = Field(description="When, UTC (ISO 8601).")


class PlanInForce(BaseModel):
    in_force: bool = Field(description="Whether the daemon serves a plan (PLAN).")
    setting: str | None = Field(
        None, description="PLAN, or its older name CORE_GROUPS or PPIPE_PLAN."
    )
    path: str | None = Field(None, description="The plan file.")
    kind: str | None = Field(
        None, description="symphony-partition, herd-plan, inss-plan or ppipe-plan."
    )
    version: int | None = Field(None, description="The plan file's version.")
    planner: str | None = None
    made_from: PlanMadeFrom | None = Field(
        None, description="What the plan was made from (null: the file does not say)."
    )
    loaded_at: str | None = Field(None, description="When the daemon took it up, UTC (ISO 8601).")
    plan: dict[str, Any] | None = Field(None, description="The planner's plan, as in the file.")


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    InferRequest,
    V2InferRequest,
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryUnloadRequest,
    ReshareRequest,
)
