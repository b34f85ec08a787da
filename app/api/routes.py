"""HTTP routes: the native `/infer` API, KServe v2 (with the binary tensor data
extension, as `tritonclient.http` uses it) and `/metrics`.

Mounting::

    app = create_api(get_service, metrics, lifespan=...)   # a new FastAPI app
    # or, on an app you already have:
    install(app, get_service, metrics)

`get_service()` is called on every request and returns the `InferenceService`
(so the service may be created in a lifespan handler after the app); it may
raise a `ServingError` (e.g. `ShuttingDown`), which is answered as usual.
`install` adds the routes, the exception handlers (every error body is
`{"error": message, "reason": code}`) and the request schemas to the OpenAPI
document. `build_router` gives the bare router; without `install`'s exception
handlers errors would get FastAPI's default bodies, so prefer `install`.

Error mapping: a `ServingError` → its `.status` (InvalidInput 400,
ModelNotFound 404, Dropped 503 with its reason, Overloaded 429 with
Retry-After, ...); malformed bodies (bad JSON, truncated or lying binary
sizes, bad headers) 400; bodies that do not fit the schema 422; body over
`max_body_bytes` 413; unsupported Content-Encoding 415; a model name that
cannot be a model's (`../x`, NUL bytes, ...) 400 before the service is asked;
management routes without a valid token 401, or 403 when they are off (see
app.api.security); anything unexpected 500 (logged).

Limits (each answered with a 4xx JSON error before anything is allocated for
the tensors): the body size (`max_body_bytes`, default 64 MiB, env
`MAX_BODY_BYTES` where the server reads its settings), the decompressed size
of a gzip/deflate body (the same limit), one item per request (batch dimension
1: the scheduler forms batches up to the model's max_batch_size), tensor
shapes fixed by the model config (a variable dimension is bounded by the body
size), and a per-request SLO of at most `MAX_SLO_MS` (1 hour).

Nothing from the network is unpickled or evaluated: JSON is parsed by
pydantic/json, and binary tensor data is read with `numpy.frombuffer` as one
of the numeric datatypes of the model config (never an object dtype).

Request bodies are read and validated by the handlers (not by FastAPI's body
parameters) so that binary bodies, gzip/deflate request compression and
clients that send no `Content-Type` (curl -d) all work; the OpenAPI document
still describes them (`openapi_extra` referencing the request models).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.api import models as m
from app.api.fastpath import InferEndpoints, ServingAPI, install_fast_path
from app.api.received import received_at
from app.api.security import check_model_name, require_token, short_repr
from app.api.tensors import (
    check_datatype,
    check_input_names,
    check_shape,
    datatype_name,
    decode_binary_tensor,
    decode_json_tensor,
    output_bytes,
    resolve_slo,
    spec_map,
)
from app.errors import InvalidInput, ModelNotFound, Overloaded, ServingError
from app.repository.config import ModelConfig
from app.server.metrics import Metrics
from app.server.service import InferenceService, InferResult

try:  # fast JSON for tensor data (30x faster than json.dumps on float arrays)
    import orjson as _orjson
except ImportError:  # pragma: no cover - optional
    _orjson = None

log = logging.getLogger(__name__)

SERVER_NAME = "deadline-serve"
EXTENSIONS = ["binary_tensor_data", "model_configuration"]
HEADER_LENGTH = "Inference-Header-Content-Length"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # Triton's default --http-max-input-size
MAX_BODY_BYTES_ENV = "MAX_BODY_BYTES"  # where the server's settings read max_body_bytes

ServiceProvider = Callable[[], InferenceService]
M = TypeVar("M", bound=BaseModel)


def _server_version() -> str:
    try:
        from importlib.metadata import version

        return version(SERVER_NAME)
    except Exception:
        return "0.1.0"


# ------------------------------------------------------------------ errors


class MalformedRequest(ServingError):
    """The body cannot be read: bad JSON, truncated or lying binary sizes."""

    status = 400
    reason = "malformed_request"


class RequestSchemaError(ServingError):
    """Well-formed JSON that does not fit the request schema."""

    status = 422
    reason = "invalid_request"


class PayloadTooLarge(ServingError):
    status = 413
    reason = "payload_too_large"


class UnsupportedEncoding(ServingError):
    status = 415
    reason = "unsupported_encoding"


class NotReady(ServingError):
    """A health or readiness check that answers "no" (KServe: a 4xx status)."""

    status = 400
    reason = "not_ready"


def error_response(
    status: int, message: str, reason: str | None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if reason is not None:
        body["reason"] = reason
    return JSONResponse(body, status_code=status, headers=headers)


async def _serving_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServingError)
    return serving_error_response(request, exc)


def serving_error_response(request: Request, exc: ServingError) -> Response:
    """The JSON error answer to a ServingError (FastAPI's handler and the fast path)."""
    headers = dict(getattr(exc, "headers", None) or {})
    if isinstance(exc, Overloaded):
        headers.setdefault("Retry-After", "1")
    if exc.status >= 500 and exc.status != 503:
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    return error_response(exc.status, exc.message, exc.reason, headers or None)


async def _validation_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "request body is not valid JSON", MalformedRequest.reason)
    return error_response(422, format_validation_errors(errors), RequestSchemaError.reason)


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = str(exc.detail)
    if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
        what = "no such route" if exc.status_code == 404 else "method not allowed"
        message = f"{what}: {request.method} {short_repr(request.url.path)}"
    return error_response(exc.status_code, message, reason, exc.headers)


def unexpected_error_response(exc: Exception) -> JSONResponse:
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "internal")


async def _unexpected_error_handler(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after sending this, so the server logs the traceback.
    return unexpected_error_response(exc)


def format_validation_errors(errors: Sequence[Any], raw: Any = None, *, limit: int = 5) -> str:
    """pydantic errors → one line naming each field (and the v2 tensor by name)."""
    parts: list[str] = []
    for err in errors[:limit]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        msg = err.get("msg", "invalid")
        if len(loc) == 3 and loc[0] == "inputs" and loc[2] in _NATIVE_UNION_TAGS:
            # native tensor that is neither a list nor {data, shape}: one message
            loc, msg = loc[:2], "expected a (nested) list of numbers or an object {data, shape}"
        if loc and loc[-1] == "slo_ms":
            msg += f" (milliseconds: more than 0, at most {m.MAX_SLO_MS:.0f} = 1 hour)"
        text = _loc_text(loc, raw)
        line = f"{text}: {msg}" if text else msg
        if line not in parts:
            parts.append(line)
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return "; ".join(parts)


_NATIVE_UNION_TAGS = ("list[any]", "TensorData")


def _loc_text(loc: list[Any], raw: Any) -> str:
    # v2: ("inputs", 0, "shape", 1) → "input 'x' (inputs[0]).shape[1]"
    if (
        len(loc) >= 2
        and loc[0] in ("inputs", "outputs")
        and isinstance(loc[1], int)
        and isinstance(raw, dict)
    ):
        items = raw.get(loc[0])
        name = None
        if isinstance(items, list) and loc[1] < len(items) and isinstance(items[loc[1]], dict):
            name = items[loc[1]].get("name")
        head = f"{loc[0]}[{loc[1]}]"
        if isinstance(name, str):
            head = f"{loc[0][:-1]} '{name}' ({head})"
        return head + _path(loc[2:])
    # native: ("inputs", "x", "list[any]") → "input 'x'"
    if len(loc) >= 2 and loc[0] == "inputs" and isinstance(loc[1], str):
        rest = [p for p in loc[2:] if p not in _NATIVE_UNION_TAGS]
        return f"input '{loc[1]}'" + _path(rest)
    return _path(loc).lstrip(".")


def _path(loc: Sequence[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


# ------------------------------------------------------------------ body reading


def _is_uint(text: str) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit()


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, at most `limit` bytes (after gzip/deflate decoding)."""
    length = request.headers.get("content-length")
    if length is not None and _is_uint(length) and int(length) > limit:
        raise PayloadTooLarge(f"request body of {int(length)} bytes exceeds {limit} bytes")
    chunks = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise MalformedRequest("client disconnected before sending the whole body") from None
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported (use gzip, deflate or none)"
        )
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip header, auto-detected
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as e:
        raise MalformedRequest(f"body is not valid {encoding} data: {e}") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed request body exceeds {limit} bytes")
    if not decoder.eof:
        raise MalformedRequest(f"{encoding} body is truncated")
    return out


def parse_model(model: type[M], data: bytes, what: str = "request body") -> M:
    """Parse and validate a JSON body (NaN/Infinity literals allowed) in one pass."""
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        bad_json = next((err for err in errors if err["type"] == "json_invalid"), None)
        if bad_json is not None:
            detail = str(bad_json.get("ctx", {}).get("error", bad_json["msg"]))
            raise MalformedRequest(f"{what} is not valid JSON: {detail}") from None
        try:  # only to name v2 tensors in the message
            raw = json.loads(data)
        except (ValueError, RecursionError):
            raw = None
        raise RequestSchemaError(format_validation_errors(errors, raw)) from None


# ------------------------------------------------------------------ responses


def _np_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def dumps_json(content: Any, arrays: Sequence[np.ndarray] = ()) -> bytes:
    """Compact JSON of `content`, whose tensor data are numpy arrays (`arrays`).

    orjson when available and every float is finite; else the json module,
    which writes NaN/Infinity literals (as Triton does; Python's json and
    tritonclient read them) instead of failing or writing null.
    """
    if _orjson is not None and all(
        a.dtype.kind != "f" or bool(np.isfinite(a).all()) for a in arrays
    ):
        try:
            return _orjson.dumps(content, default=_np_default, option=_orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:
            pass
    return json.dumps(content, default=_np_default, allow_nan=True, separators=(",", ":")).encode()


class _JSON(JSONResponse):
    def __init__(self, content: Any, arrays: Sequence[np.ndarray] = (), **kw: Any) -> None:
        self._arrays = arrays
        super().__init__(content, **kw)

    def render(self, content: Any) -> bytes:
        return dumps_json(content, self._arrays)


def _result_output(result: InferResult, name: str) -> np.ndarray:
    try:
        return np.asarray(result.outputs[name])
    except KeyError:
        raise RuntimeError(
            f"model '{result.model}' returned no output '{name}' "
            f"(returned: {', '.join(result.outputs)})"
        ) from None


# ------------------------------------------------------------------ helpers


def _config(service: InferenceService, name: str, version: str | None = None) -> ModelConfig:
    """The model's config; `name` is checked to be a safe model name first, so
    the service is never asked about `../x`, absolute paths or NUL bytes."""
    check_model_name(name)
    try:
        config = service.model_config(name)
    except KeyError:
        raise ModelNotFound(f"unknown model {short_repr(name)}") from None
    if version is not None and version != config.version:
        raise ModelNotFound(
            f"model {short_repr(name)} has no version {short_repr(version)} "
            f"(available: {config.version})"
        )
    return config


def _decode_v2_inputs(
    config: ModelConfig,
    req: m.V2InferRequest,
    binary: memoryview,
    header_length: int | None,
    max_elements: int,
) -> dict[str, np.ndarray]:
    """The request's tensors, checked against the model; `header_length` is the
    Inference-Header-Content-Length (None: no header, the body is all JSON).
    Every shape is checked (against the config and `max_elements`) before
    its tensor is built."""
    check_input_names(config, [i.name for i in req.inputs])
    specs = spec_map(config.inputs)

    declared = 0
    sizes = []
    for inp in req.inputs:
        params = inp.parameters
        if params is not None and params.binary_data_size is not None:
            declared += params.binary_data_size
            sizes.append(f"{inp.name}: {params.binary_data_size}")
    if declared != len(binary):
        if header_length is None:
            raise MalformedRequest(
                f"inputs set parameters.binary_data_size ({', '.join(sizes)}) but the request "
                f"has no {HEADER_LENGTH} header to say where the JSON ends"
            )
        if not declared:
            raise MalformedRequest(
                f"{len(binary)} unexpected bytes after the JSON header ({HEADER_LENGTH} "
                "is shorter than the body and no input sets parameters.binary_data_size)"
            )
        raise MalformedRequest(
            f"binary tensor data: the inputs declare {declared} bytes ({', '.join(sizes)}) "
            f"but the body carries {len(binary)} bytes after the {header_length}-byte JSON "
            f"header ({HEADER_LENGTH})"
        )

    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for inp in req.inputs:
        spec = specs[inp.name]
        check_datatype(inp.name, spec, inp.datatype)
        shape = check_shape(inp.name, spec, inp.shape, max_elements=max_elements)
        params = inp.parameters
        extra = (params.model_extra or {}) if params is not None else {}
        if "shared_memory_region" in extra:
            raise InvalidInput(f"input '{inp.name}': the shared-memory extension is not supported")
        size = params.binary_data_size if params is not None else None
        if size is not None:
            if inp.data is not None:
                raise InvalidInput(
                    f"input '{inp.name}' has both data and parameters.binary_data_size; give one"
                )
            inputs[inp.name] = decode_binary_tensor(
                inp.name, spec, binary[offset : offset + size], shape
            )
            offset += size
        elif inp.data is not None:
            inputs[inp.name] = decode_json_tensor(inp.name, spec, inp.data, shape)
        else:
            raise InvalidInput(
                f"input '{inp.name}' has no data: give data or parameters.binary_data_size"
            )
    return inputs


def _v2_requested_outputs(
    config: ModelConfig, req: m.V2InferRequest
) -> list[tuple[str, bool]] | None:
    """[(name, binary)] for requested outputs, or None for all outputs."""
    params = req.parameters
    default_binary = bool(params.binary_data_output) if params is not None else False
    if not req.outputs:
        return None
    known = [s.name for s in config.outputs]
    seen: set[str] = set()
    chosen = []
    for out in req.outputs:
        if out.name not in known:
            raise InvalidInput(
                f"unknown output '{out.name}': model '{config.name}' has outputs {', '.join(known)}"
            )
        if out.name in seen:
            raise InvalidInput(f"output '{out.name}' is requested more than once")
        seen.add(out.name)
        p = out.parameters
        if p is not None and p.classification:
            raise InvalidInput(
                f"output '{out.name}': the classification extension is not supported"
            )
        binary = p.binary_data if p is not None and p.binary_data is not None else default_binary
        chosen.append((out.name, binary))
    return chosen


def _v2_response(
    config: ModelConfig,
    req: m.V2InferRequest,
    result: InferResult,
    chosen: list[tuple[str, bool]] | None,
) -> Response:
    if chosen is None:
        params = req.parameters
        default_binary = bool(params.binary_data_output) if params is not None else False
        chosen = [(name, default_binary) for name in result.outputs]
    outputs = []
    blobs: list[bytes] = []
    arrays: list[np.ndarray] = []
    for name, binary in chosen:
        arr = _result_output(result, name)
        entry: dict[str, Any] = {
            "name": name,
            "shape": [int(d) for d in arr.shape],
            "datatype": datatype_name(arr.dtype),
        }
        if binary:
            blob = output_bytes(arr)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            data = np.ascontiguousarray(arr.reshape(-1))
            entry["data"] = data
            arrays.append(data)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": config.name, "model_version": config.version}
    request_id = req.id if req.id is not None else result.request_id
    if request_id is not None:
        body["id"] = request_id
    body["parameters"] = result.timing()
    body["outputs"] = outputs
    if not blobs:
        return _JSON(body, arrays)
    header = dumps_json(body, arrays)
    return Response(
        b"".join([header, *blobs]),
        media_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(header))},
    )


def _split_v2_body(body: bytes, header_value: str | None) -> tuple[bytes, memoryview]:
    """(JSON part, binary part) of a v2 request body."""
    if header_value is None:
        return body, memoryview(b"")
    text = header_value.strip()
    if not _is_uint(text):
        raise MalformedRequest(
            f"{HEADER_LENGTH} must be a non-negative integer, got {header_value!r}"
        )
    n = int(text)
    if n > len(body):
        raise MalformedRequest(f"{HEADER_LENGTH} is {n} but the body has only {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


# ------------------------------------------------------------------ the router

_ERRORS = {
    400: {
        "model": m.ErrorResponse,
        "description": "Invalid input, invalid model name or malformed body.",
    },
    404: {"model": m.ErrorResponse, "description": "Unknown model."},
    413: {"model": m.ErrorResponse, "description": "Body too large."},
    415: {"model": m.ErrorResponse, "description": "Unsupported Content-Encoding."},
    422: {"model": m.ErrorResponse, "description": "Body does not fit the schema."},
    429: {"model": m.ErrorResponse, "description": "Overloaded: retry later."},
    503: {
        "model": m.ErrorResponse,
        "description": "Dropped (its deadline cannot be met; `reason` says why), "
        "model not ready, or shutting down.",
    },
}
_UNAVAILABLE = {
    503: {"model": m.ErrorResponse, "description": "The server is starting or shutting down."}
}
# routes that look a model up by the name in their path
_NOT_FOUND = {
    400: {"model": m.ErrorResponse, "description": "Not a valid model name (e.g. '../x')."},
    404: _ERRORS[404],
    **_UNAVAILABLE,
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json_body(model: type[BaseModel], description: str, required: bool = True) -> dict:
    return {
        "requestBody": {
            "required": required,
            "description": description,
            "content": {"application/json": {"schema": _ref(model)}},
        }
    }


_V2_INFER_EXTRA: dict[str, Any] = {
    "parameters": [
        {
            "name": HEADER_LENGTH,
            "in": "header",
            "required": False,
            "schema": {"type": "integer", "minimum": 0},
            "description": (
                "Binary tensor data extension: length of the JSON header at the start of "
                "the body; the inputs' binary data (parameters.binary_data_size each) "
                "follows it. Absent: the whole body is JSON."
            ),
        },
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]},
            "description": "Request body compression.",
        },
    ],
    "requestBody": {
        "required": True,
        "description": (
            "A V2InferRequest as JSON; or, with the binary tensor data extension, that JSON "
            f"({HEADER_LENGTH} bytes) followed by the binary data of the inputs that set "
            "parameters.binary_data_size, in input order (little-endian, row-major)."
        ),
        "content": {
            "application/json": {"schema": _ref(m.V2InferRequest)},
            "application/octet-stream": {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "JSON header followed by binary tensor data.",
                },
            },
        },
    },
}

_V2_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "Outputs. When any output is binary (binary_data / binary_data_output), the body is "
            f"the V2InferResponse JSON ({HEADER_LENGTH} bytes, given in the response header) "
            "followed by those outputs' bytes in output order."
        ),
        "headers": {
            HEADER_LENGTH: {
                "schema": {"type": "integer"},
                "description": "Present when the body carries binary output data.",
            }
        },
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
            }
        },
    },
    **_ERRORS,
}


def build_router(
    get_service: ServiceProvider,
    metrics: Metrics,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> APIRouter:
    router = APIRouter()
    version = _server_version()

    # -- native API -------------------------------------------------------------

    @router.post(
        "/infer",
        response_model=m.InferResponse,
        responses=_ERRORS,
        tags=["native"],
        summary="Run one inference (native JSON API)",
        operation_id="infer",
        openapi_extra=_json_body(
            m.InferRequest, "Model, named input tensors, optional SLO and request id."
        ),
    )
    async def infer(request: Request) -> Response:
        body = await read_body(request, max_body_bytes)
        req = parse_model(m.InferRequest, body)
        service = get_service()
        config = _config(service, req.model)
        check_input_names(config, list(req.inputs))
        specs = spec_map(config.inputs)
        inputs: dict[str, np.ndarray] = {}
        for name, value in req.inputs.items():
            spec = specs[name]
            if isinstance(value, m.TensorData):
                shape = check_shape(
                    name, spec, value.shape, batch_optional=True, max_elements=max_body_bytes
                )
                inputs[name] = decode_json_tensor(name, spec, value.data, shape)
            else:
                inputs[name] = decode_json_tensor(name, spec, value, None)
        slo_ms = resolve_slo(config, req.slo_ms)
        result = await service.infer(
            req.model,
            inputs,
            slo_ms=slo_ms,
            request_id=req.id,
            received_at=received_at(request.scope),
        )
        outputs = {}
        arrays = []
        for name in result.outputs:
            arr = np.ascontiguousarray(np.atleast_1d(_result_output(result, name)))
            arrays.append(arr)
            outputs[name] = {
                "shape": [int(d) for d in arr.shape],
                "datatype": datatype_name(arr.dtype),
                "data": arr,
            }
        return _JSON(
            {
                "model": req.model,
                "id": req.id if req.id is not None else result.request_id,
                "outputs": outputs,
                "timing": result.timing(),
            },
            arrays,
        )

    # -- KServe v2: server --------------------------------------------------------

    @router.get(
        "/v2",
        response_model=m.ServerMetadata,
        tags=["v2"],
        summary="Server metadata",
        operation_id="v2_server_metadata",
    )
    async def server_metadata() -> m.ServerMetadata:
        return m.ServerMetadata(name=SERVER_NAME, version=version, extensions=EXTENSIONS)

    @router.get(
        "/v2/health/live",
        response_model=m.LiveResponse,
        tags=["v2"],
        summary="Liveness (200: live)",
        operation_id="v2_health_live",
    )
    async def health_live() -> m.LiveResponse:
        return m.LiveResponse(live=True)

    @router.get(
        "/v2/health/ready",
        response_model=m.ReadyResponse,
        response_model_exclude_none=True,
        responses={400: {"model": m.ErrorResponse, "description": "Not ready."}},
        tags=["v2"],
        summary="Readiness (200: ready, 400: not ready)",
        operation_id="v2_health_ready",
    )
    async def health_ready() -> m.ReadyResponse:
        try:
            service = get_service()
            ready = bool(service.server_ready())
        except ServingError as e:
            raise NotReady(f"server not ready: {e.message}") from None
        capacity_of = getattr(service, "capacity", None)
        capacity = capacity_of() if callable(capacity_of) else {}
        if not ready:
            missing = capacity.get("models_unavailable")
            if missing:
                raise NotReady(
                    f"server not ready: no live device for {', '.join(missing)} "
                    f"({capacity.get('devices_alive')}/{capacity.get('devices_total')} "
                    "devices alive)"
                )
            raise NotReady("server not ready")
        return m.ReadyResponse(
            ready=True,
            devices_alive=capacity.get("devices_alive"),
            devices_total=capacity.get("devices_total"),
        )

    # -- KServe v2: models --------------------------------------------------------

    def model_metadata(name: str, ver: str | None) -> m.ModelMetadata:
        config = _config(get_service(), name, ver)

        def tensors(specs: Sequence[Any]) -> list[m.TensorMetadata]:
            return [
                m.TensorMetadata(name=s.name, datatype=s.datatype, shape=list(s.shape))
                for s in specs
            ]

        return m.ModelMetadata(
            name=config.name,
            versions=[config.version],
            platform=config.backend,
            inputs=tensors(config.inputs),
            outputs=tensors(config.outputs),
        )

    @router.get(
        "/v2/models/{name}",
        response_model=m.ModelMetadata,
        responses=_NOT_FOUND,
        tags=["v2"],
        summary="Model metadata",
        operation_id="v2_model_metadata",
    )
    async def get_model_metadata(name: str) -> m.ModelMetadata:
        return model_metadata(name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}",
        response_model=m.ModelMetadata,
        responses=_NOT_FOUND,
        tags=["v2"],
        summary="Model metadata (one version)",
        operation_id="v2_model_version_metadata",
    )
    async def get_model_version_metadata(name: str, version: str) -> m.ModelMetadata:
        return model_metadata(name, version)

    def model_config_response(name: str, ver: str | None) -> m.ModelConfigResponse:
        config = _config(get_service(), name, ver)

        def tensors(specs: Sequence[Any]) -> list[m.ModelConfigTensor]:
            return [
                m.ModelConfigTensor(
                    name=s.name, data_type=f"TYPE_{s.datatype}", dims=list(s.item_shape)
                )
                for s in specs
            ]

        return m.ModelConfigResponse(
            name=config.name,
            backend=config.backend,
            version=config.version,
            max_batch_size=config.max_batch_size,
            slo_ms=config.slo_ms,
            allow_slo_loosening=config.allow_slo_loosening,
            devices=list(config.devices) if config.devices is not None else None,
            description=config.description,
            input=tensors(config.inputs),
            output=tensors(config.outputs),
        )

    @router.get(
        "/v2/models/{name}/config",
        response_model=m.ModelConfigResponse,
        responses=_NOT_FOUND,
        tags=["v2"],
        summary="Model configuration (Triton-style)",
        operation_id="v2_model_config",
    )
    async def get_model_config(name: str) -> m.ModelConfigResponse:
        return model_config_response(name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}/config",
        response_model=m.ModelConfigResponse,
        responses=_NOT_FOUND,
        tags=["v2"],
        summary="Model configuration (one version)",
        operation_id="v2_model_version_config",
    )
    async def get_model_version_config(name: str, version: str) -> m.ModelConfigResponse:
        return model_config_response(name, version)

    def model_ready(name: str, ver: str | None) -> m.ModelReadyResponse:
        service = get_service()
        _config(service, name, ver)
        if not service.model_ready(name):
            raise NotReady(f"model '{name}' is not ready")
        return m.ModelReadyResponse(name=name, ready=True)

    _ready_responses = {
        **_NOT_FOUND,
        400: {"model": m.ErrorResponse, "description": "Not ready, or not a valid model name."},
    }

    @router.get(
        "/v2/models/{name}/ready",
        response_model=m.ModelReadyResponse,
        responses=_ready_responses,
        tags=["v2"],
        summary="Model readiness (200: ready, 400: not ready)",
        operation_id="v2_model_ready",
    )
    async def get_model_ready(name: str) -> m.ModelReadyResponse:
        return model_ready(name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}/ready",
        response_model=m.ModelReadyResponse,
        responses=_ready_responses,
        tags=["v2"],
        summary="Model readiness (one version)",
        operation_id="v2_model_version_ready",
    )
    async def get_model_version_ready(name: str, version: str) -> m.ModelReadyResponse:
        return model_ready(name, version)

    # -- KServe v2: inference -----------------------------------------------------

    async def v2_infer(name: str, ver: str | None, request: Request) -> Response:
        service = get_service()
        config = _config(service, name, ver)
        body = await read_body(request, max_body_bytes)
        header_value = request.headers.get(HEADER_LENGTH)
        header, binary = _split_v2_body(body, header_value)
        what = (
            "request body"
            if header_value is None
            else f"JSON header (the first {len(header)} bytes, per {HEADER_LENGTH})"
        )
        req = parse_model(m.V2InferRequest, header, what)
        inputs = _decode_v2_inputs(
            config, req, binary, None if header_value is None else len(header), max_body_bytes
        )
        chosen = _v2_requested_outputs(config, req)
        slo_ms = resolve_slo(config, req.parameters.slo_ms if req.parameters else None)
        result = await service.infer(
            name, inputs, slo_ms=slo_ms, request_id=req.id, received_at=received_at(request.scope)
        )
        return _v2_response(config, req, result, chosen)

    @router.post(
        "/v2/models/{name}/infer",
        response_model=m.V2InferResponse,
        responses=_V2_INFER_RESPONSES,
        tags=["v2"],
        summary="Run one inference (KServe v2, JSON or binary tensor data)",
        operation_id="v2_infer",
        openapi_extra=_V2_INFER_EXTRA,
    )
    async def infer_v2(name: str, request: Request) -> Response:
        return await v2_infer(name, None, request)

    @router.post(
        "/v2/models/{name}/versions/{version}/infer",
        response_model=m.V2InferResponse,
        responses=_V2_INFER_RESPONSES,
        tags=["v2"],
        summary="Run one inference on a model version",
        operation_id="v2_infer_version",
        openapi_extra=_V2_INFER_EXTRA,
    )
    async def infer_v2_version(name: str, version: str, request: Request) -> Response:
        return await v2_infer(name, version, request)

    # -- KServe v2: repository ----------------------------------------------------

    @router.post(
        "/v2/repository/index",
        response_model=list[m.RepositoryModel],
        responses={code: _ERRORS[code] for code in (400, 413, 415, 422, 503)},
        tags=["v2"],
        summary="Models in the repository",
        operation_id="v2_repository_index",
        openapi_extra=_json_body(
            m.RepositoryIndexRequest, "Optional filter; an empty body lists every model.", False
        ),
    )
    async def repository_index(request: Request) -> list[m.RepositoryModel]:
        body = await read_body(request, max_body_bytes)
        ready_only = False
        if body.strip():
            req = parse_model(m.RepositoryIndexRequest, body)
            ready_only = bool(req.ready)
        entries = [m.RepositoryModel.model_validate(e) for e in get_service().repository_index()]
        if ready_only:
            entries = [e for e in entries if e.state == "READY"]
        return entries

    # -- metrics ------------------------------------------------------------------

    @router.get(
        "/metrics",
        tags=["metrics"],
        summary="Prometheus metrics",
        operation_id="metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition format (OpenMetrics if Accept asks).",
                "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    "application/openmetrics-text": {"schema": {"type": "string"}},
                },
            }
        },
    )
    async def get_metrics(request: Request) -> Response:
        data, content_type = metrics.render(request.headers.get("accept"))
        return Response(data, media_type=content_type)

    # The inference routes' short way through the ASGI stack (app.api.fastpath).
    router.infer_endpoints = InferEndpoints(  # type: ignore[attr-defined]
        native=infer,
        v2=v2_infer,
        on_error=serving_error_response,
        on_unexpected=unexpected_error_response,
    )
    return router


# ------------------------------------------------------------------ app assembly


def _add_request_schemas(app: FastAPI) -> None:
    """Put the hand-validated request models into the OpenAPI components."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        _, defs = models_json_schema(
            [(model, "validation") for model in m.REQUEST_MODELS],
            ref_template="#/components/schemas/{model}",
        )
        for key, value in defs.get("$defs", {}).items():
            components.setdefault(key, value)
        # FastAPI documents its validation errors as HTTPValidationError; the
        # handlers installed here answer them as ErrorResponse instead.
        components.setdefault("ErrorResponse", m.ErrorResponse.model_json_schema())
        for ops in schema.get("paths", {}).values():
            for op in ops.values():
                resp = op.get("responses", {}).get("422")
                if resp and "HTTPValidationError" in json.dumps(resp):
                    resp["content"] = {"application/json": {"schema": _ref(m.ErrorResponse)}}
        if "HTTPValidationError" not in json.dumps(schema.get("paths", {})):
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install(
    app: FastAPI,
    get_service: ServiceProvider,
    metrics: Metrics,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    admin_token: str | None = None,
    bind_host: str = "127.0.0.1",
) -> FastAPI:
    """Add the API's routes, exception handlers and OpenAPI request schemas to `app`.

    `max_body_bytes` caps request bodies (413 above it; settings: MAX_BODY_BYTES).
    `admin_token` (settings: ADMIN_TOKEN) and `bind_host` (HOST) configure the
    guard of management routes, `app.state.require_admin`: a dependency for
    `Depends(...)` (see app.api.security.require_token).
    """
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
        raise TypeError(f"max_body_bytes must be an int, got {max_body_bytes!r}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be ≥ 1, got {max_body_bytes}")
    app.state.max_body_bytes = max_body_bytes
    app.state.require_admin = require_token(admin_token, host=bind_host)
    router = build_router(get_service, metrics, max_body_bytes=max_body_bytes)
    app.include_router(router)
    install_fast_path(app, router.infer_endpoints)  # type: ignore[attr-defined]
    app.add_exception_handler(ServingError, _serving_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler)
    _add_request_schemas(app)
    return app


def create_api(
    get_service: ServiceProvider,
    metrics: Metrics,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    admin_token: str | None = None,
    bind_host: str = "127.0.0.1",
    **fastapi_kwargs: Any,
) -> FastAPI:
    """A FastAPI app serving the API. `fastapi_kwargs` go to FastAPI (e.g. lifespan);
    the other options are `install`'s."""
    fastapi_kwargs.setdefault("title", SERVER_NAME)
    fastapi_kwargs.setdefault("version", _server_version())
    fastapi_kwargs.setdefault(
        "description",
        "Deadline-aware DNN inference server: native JSON API and the KServe v2 / Open "
        "Inference Protocol REST API with the binary tensor data extension.",
    )
    return install(
        ServingAPI(**fastapi_kwargs),
        get_service,
        metrics,
        max_body_bytes=max_body_bytes,
        admin_token=admin_token,
        bind_host=bind_host,
    )


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_BYTES_ENV",
    "Metrics",
    "build_router",
    "create_api",
    "error_response",
    "install",
]
