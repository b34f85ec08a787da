"""Request parameters as Triton takes them (app/api/request_params.py), over
HTTP v2 and gRPC against the fake service: Triton's own parameters and
custom ones accepted, `timeout` tightening the deadline, Triton's error
texts where Triton refuses, the ignored ones counted (bounded) and logged
once, times readable without double_param, and the exact ModelInfer that
Triton's C++ client library (perf_analyzer's) sends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from app.grpc.lifecycle import start_grpc_endpoint
from app.server.metrics import MAX_PARAMETER_NAMES, Metrics
from app.server.settings import Settings
from bench.daemon_launcher import free_port
from tests.fakes import GOOD_V2, FakeService

pytestmark = pytest.mark.anyio

INFER = "/inference.GRPCInferenceService/ModelInfer"


def ignored(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(
        metrics.prefix + "ignored_parameters_total", {"name": name}
    )
    return value or 0.0


class GrpcFake:
    def __init__(self, service: FakeService, metrics: Metrics, channel: Any) -> None:
        self.service = service
        self.metrics = metrics
        self.infer_raw = channel.unary_unary(
            INFER,
            request_serializer=lambda b: b,
            response_deserializer=pb.ModelInferResponse.FromString,
        )

    async def infer(self, request: pb.ModelInferRequest | bytes) -> Any:
        """The answer, or (code, details) of the error."""
        data = request if isinstance(request, bytes) else request.SerializeToString()
        try:
            return await self.infer_raw(data)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details()


@pytest.fixture
async def rpc() -> AsyncIterator[GrpcFake]:
    service, metrics = FakeService(), Metrics()
    settings = Settings(grpc_port=free_port(), max_body_bytes=1 << 20)
    endpoint = await start_grpc_endpoint(settings, lambda: service, metrics)
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        yield GrpcFake(service, metrics, channel)
    await endpoint.stop()


def request_of(**parameters: tuple[str, Any]) -> pb.ModelInferRequest:
    """add_one's request, x [1, 4] raw, with `name=(field, value)` parameters."""
    request = pb.ModelInferRequest(model_name="add_one")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    for name, (field, value) in parameters.items():
        setattr(request.parameters[name], field, value)
    return request


# ------------------------------------------------------------------------- gRPC


def cpp_client_request() -> bytes:
    """ModelInfer as Triton's C++ client library builds it
    (triton-inference-server/client, src/c++/library/grpc_client.cc,
    PreRunProcessing): name, empty version and id, the parameter
    `triton_enable_empty_final_response` (false by default) on every request,
    each input's name, shape and datatype with its bytes in
    raw_input_contents, each requested output by name only — encoded by hand
    in the protobuf wire format, field by field."""

    def field(number: int, payload: bytes) -> bytes:  # length-delimited
        return bytes([number << 3 | 2, len(payload)]) + payload

    def varint_field(number: int, value: int) -> bytes:
        return bytes([number << 3 | 0, value])

    parameter = varint_field(1, 0)  # InferParameter.bool_param = false
    entry = field(1, b"triton_enable_empty_final_response") + field(2, parameter)
    tensor = field(1, b"x") + field(2, b"FP32") + field(3, bytes([1, 4]))  # packed shape
    return (
        field(1, b"add_one")  # model_name
        + field(4, entry)  # parameters map entry
        + field(5, tensor)  # inputs
        + field(6, field(1, b"y"))  # outputs
        + field(7, np.array([1, 2, 3, 4], np.float32).tobytes())  # raw_input_contents
    )


async def test_the_cpp_clients_request_is_answered(rpc) -> None:
    wire = cpp_client_request()
    parsed = pb.ModelInferRequest.FromString(wire)  # the bytes are the message meant
    assert parsed.parameters["triton_enable_empty_final_response"].HasField("bool_param")
    reply = await rpc.infer(wire)
    assert isinstance(reply, pb.ModelInferResponse), reply
    y = np.frombuffer(reply.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(y, [2, 3, 4, 5])
    assert rpc.service.calls[-1]["slo_ms"] is None  # the model's SLO
    assert ignored(rpc.metrics, "triton_enable_empty_final_response") == 1.0
    await rpc.infer(wire)
    assert ignored(rpc.metrics, "triton_enable_empty_final_response") == 2.0


async def test_timeout_tightens_the_deadline_and_never_loosens_it(rpc) -> None:
    # add_one's SLO is 50 ms: a 5000 µs timeout is the request's SLO
    assert isinstance(
        await rpc.infer(request_of(timeout=("int64_param", 5000))), pb.ModelInferResponse
    )
    assert rpc.service.calls[-1]["slo_ms"] == 5.0
    # looser than the SLO: the SLO stays
    await rpc.infer(request_of(timeout=("int64_param", 80_000)))
    assert rpc.service.calls[-1]["slo_ms"] is None
    # with slo_ms, the tighter of the two
    await rpc.infer(request_of(timeout=("int64_param", 7000), slo_ms=("double_param", 20.0)))
    assert rpc.service.calls[-1]["slo_ms"] == 7.0
    await rpc.infer(request_of(timeout=("int64_param", 30_000), slo_ms=("double_param", 20.0)))
    assert rpc.service.calls[-1]["slo_ms"] == 20.0
    await rpc.infer(request_of(timeout=("int64_param", 0)))  # 0: no timeout, as Triton
    assert rpc.service.calls[-1]["slo_ms"] is None
    assert ignored(rpc.metrics, "timeout") == 0.0  # it acts: not counted as ignored


async def test_triton_and_custom_parameters_are_accepted_and_counted(rpc) -> None:
    request = request_of(
        priority=("uint64_param", 2),
        sequence_id=("string_param", "s1"),
        sequence_start=("bool_param", True),
        sequence_end=("bool_param", False),
        my_int=("int64_param", 3),
        my_text=("string_param", "x"),
        my_flag=("bool_param", True),
        my_real=("double_param", 0.5),
    )
    request.inputs[0].parameters["binary_data_size"].int64_param = 16  # the KServe SDK's
    request.outputs.add(name="y").parameters["binary_data"].bool_param = True
    request.outputs[0].parameters["tag"].string_param = "t"
    reply = await rpc.infer(request)
    assert isinstance(reply, pb.ModelInferResponse), reply
    for name in ("priority", "sequence_id", "sequence_start", "my_int", "my_real", "tag"):
        assert ignored(rpc.metrics, name) == 1.0, name
    assert ignored(rpc.metrics, "binary_data_size") == 0.0  # known: not ignored
    assert ignored(rpc.metrics, "binary_data") == 0.0
    # priority as int64 too
    reply = await rpc.infer(request_of(priority=("int64_param", 1)))
    assert isinstance(reply, pb.ModelInferResponse)
    assert ignored(rpc.metrics, "priority") == 2.0


REFUSED = [
    ({"priority": ("int64_param", -1)}, "invalid value for 'priority', expected value >= 0."),
    (
        {"priority": ("string_param", "1")},
        "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
    ),
    (
        {"timeout": ("uint64_param", 5)},
        "invalid value type for 'timeout' parameter, expected int64_param.",
    ),
    (
        {"sequence_start": ("int64_param", 1)},
        "invalid value type for 'sequence_start' parameter, expected bool_param.",
    ),
    (
        {"sequence_id": ("bool_param", True)},
        "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
    ),
    (
        {"triton_enable_empty_final_response": ("int64_param", 1)},
        "invalid value type for 'triton_enable_empty_final_response' parameter, "
        "expected bool_param.",
    ),
    (
        {"triton_other": ("bool_param", True)},
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response",
    ),
    (
        {"custom": ("uint64_param", 1)},
        "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
        "string_param.",
    ),
]


@pytest.mark.parametrize(("parameters", "message"), REFUSED)
async def test_what_triton_refuses_is_refused_with_its_text(rpc, parameters, message) -> None:
    code, details = await rpc.infer(request_of(**parameters))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(message)  # then the reason, as every error here
    assert not rpc.service.calls


async def test_times_come_also_as_int64_microseconds(rpc) -> None:
    reply = await rpc.infer(request_of())
    p = reply.parameters
    # the fake's result: queue 1.25 ms, exec 3.5 ms, intake 0.5 ms, answer 0.75 ms
    assert (p["queue_ms"].double_param, p["queue_us"].int64_param) == (1.25, 1250)
    assert (p["exec_ms"].double_param, p["exec_us"].int64_param) == (3.5, 3500)
    assert p["intake_us"].int64_param == 500 and p["answer_us"].int64_param == 750
    assert p["batch_size"].int64_param == 4


# ------------------------------------------------------------------------- HTTP


async def test_http_takes_tritons_parameters(client, service, metrics) -> None:
    body = {
        **GOOD_V2,
        "parameters": {
            "priority": 1,
            "timeout": 4000,
            "sequence_id": 7,
            "sequence_start": True,
            "headers": "h",
            "custom_text": "x",
            "custom_real": 0.5,
            "binary_data_output": False,
        },
    }
    body["inputs"] = [{**body["inputs"][0], "parameters": {"note": 1}}]
    r = await client.post("/v2/models/add_one/infer", json=body)
    assert r.status_code == 200, r.text
    assert service.calls[-1]["slo_ms"] == 4.0
    for name in ("priority", "sequence_id", "sequence_start", "headers", "custom_real", "note"):
        assert ignored(metrics, name) == 1.0, name
    assert ignored(metrics, "timeout") == 0.0
    # a timeout looser than the model's SLO (50 ms) leaves it
    r = await client.post(
        "/v2/models/add_one/infer", json={**GOOD_V2, "parameters": {"timeout": 10**6}}
    )
    assert r.status_code == 200 and service.calls[-1]["slo_ms"] is None


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"timeout": -1}, "Unable to parse 'timeout'"),
        ({"timeout": 1.5}, "Unable to parse 'timeout'"),
        ({"sequence_end": 1}, "Unable to parse 'sequence_end'"),
        ({"sequence_id": -3}, "Unable to parse 'sequence_id'"),
        # over HTTP, Triton refuses every triton_ key, this one too
        ({"triton_enable_empty_final_response": True}, "reserved for Triton usage"),
        ({"custom": None}, "parameter 'custom' has invalid type"),
        ({"custom": {"a": 1}}, "parameter 'custom' has invalid type"),
    ],
)
async def test_http_refuses_what_triton_refuses(client, service, parameters, words) -> None:
    r = await client.post("/v2/models/add_one/infer", json={**GOOD_V2, "parameters": parameters})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]
    assert not service.calls


# ------------------------------------------------------------------ the metric's bound


def test_the_metric_has_bounded_names_and_logs_each_once(caplog) -> None:
    from app.api.request_params import note_unused

    metrics = Metrics()
    caplog.set_level(logging.INFO, logger="app.api.request_params")
    names = [f"p{i}" for i in range(MAX_PARAMETER_NAMES + 8)]
    for _ in range(3):
        note_unused(metrics, names)
        note_unused(metrics, ["priority"])
    for name in names[:MAX_PARAMETER_NAMES]:
        assert ignored(metrics, name) == 3.0
    assert ignored(metrics, names[-1]) == 0.0
    assert ignored(metrics, "other") == 3.0 * 8
    assert ignored(metrics, "priority") == 3.0  # Triton's names are always labels
    note_unused(metrics, ["x" * 65, "bad\nname"])  # too long, unprintable: other
    assert ignored(metrics, "other") == 3.0 * 8 + 2
    # one line per label the first time: 32 names, priority, and one for `other`
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == MAX_PARAMETER_NAMES + 2
    assert sum("'p0'" in line for line in lines) == 1
    assert sum("counted as name='other'" in line for line in lines) == 1
