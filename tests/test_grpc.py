"""The KServe v2 gRPC endpoint (app/grpc/) over the fake service: each RPC's
answer, every error's status code and message, typed and raw tensor
contents, the request limits, and the lifecycle (GRPC_PORT 0, a busy port,
no triton extra). Against the app itself: tests/test_grpc_app.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.errors import InvalidInput
from app.grpc import lifecycle
from app.grpc.lifecycle import GrpcEndpoint, start_grpc_endpoint
from app.grpc.tensors import decode_inputs
from app.server.settings import Settings
from bench.daemon_launcher import free_port
from tests.fakes import FakeService, api_config

# ------------------------------------------------------------------ over the fake service


class FakeEndpoint:
    def __init__(self, service: FakeService, endpoint: GrpcEndpoint, channel: Any) -> None:
        self.service = service
        self.endpoint = endpoint
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def call(self, rpc: str, request: Any) -> Any:
        """The answer, or (code, details) of the error."""
        try:
            return await getattr(self.stub, rpc)(request)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details()


@pytest.fixture
async def fake() -> AsyncIterator[FakeEndpoint]:
    service = FakeService()
    settings = Settings(grpc_port=free_port(), max_body_bytes=1 << 20)
    endpoint = await start_grpc_endpoint(settings, lambda: service)
    assert endpoint.running
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        yield FakeEndpoint(service, endpoint, channel)
    await endpoint.stop()


def infer_request(model: str = "add_one", x: Any = None, **fields: Any) -> pb.ModelInferRequest:
    """A ModelInferRequest of one FP32 input `x` [1, 4], its data raw."""
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32) if x is None else x
    request = pb.ModelInferRequest(model_name=model, **fields)
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    return request


def output(response: pb.ModelInferResponse, index: int, dtype: Any) -> np.ndarray:
    out = response.outputs[index]
    data = np.frombuffer(response.raw_output_contents[index], dtype=dtype)
    return data.reshape(list(out.shape))


@pytest.mark.anyio
async def test_health_metadata_config_and_index(fake):
    assert (await fake.call("ServerLive", pb.ServerLiveRequest())).live
    assert (await fake.call("ServerReady", pb.ServerReadyRequest())).ready
    fake.service.ready = False
    assert not (await fake.call("ServerReady", pb.ServerReadyRequest())).ready
    meta = await fake.call("ServerMetadata", pb.ServerMetadataRequest())
    assert meta.name == "deadline-serve" and "model_configuration" in meta.extensions

    assert (await fake.call("ModelReady", pb.ModelReadyRequest(name="add_one"))).ready
    assert not (await fake.call("ModelReady", pb.ModelReadyRequest(name="cold"))).ready
    code, details = await fake.call("ModelReady", pb.ModelReadyRequest(name="nope"))
    assert (
        code == grpc.StatusCode.NOT_FOUND
        and "Request for unknown model: 'nope' is not found" in details
    )

    typed = await fake.call("ModelMetadata", pb.ModelMetadataRequest(name="typed", version="1"))
    assert typed.name == "typed" and list(typed.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in typed.inputs] == [
        ("a", "INT32", [-1, 2]),
        ("b", "BOOL", [-1, 2]),
        ("c", "FP16", [-1, -1, 3]),
    ]
    code, details = await fake.call(
        "ModelMetadata", pb.ModelMetadataRequest(name="typed", version="7")
    )
    assert code == grpc.StatusCode.NOT_FOUND and "'typed' version 7 is not found" in details

    config = (await fake.call("ModelConfig", pb.ModelConfigRequest(name="typed"))).config
    assert (config.name, config.platform, config.max_batch_size) == ("typed", "emulated", 32)
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        ("a", "TYPE_INT32", [2]),
        ("b", "TYPE_BOOL", [2]),
        ("c", "TYPE_FP16", [-1, 3]),
    ]
    assert config.parameters["slo_ms"].string_value == "50"

    index = await fake.call("RepositoryIndex", pb.RepositoryIndexRequest())
    states = {m.name: (m.version, m.state, m.reason) for m in index.models}
    assert states["cold"] == ("1", "UNAVAILABLE", "loading") and len(states) == 7
    ready = await fake.call("RepositoryIndex", pb.RepositoryIndexRequest(ready=True))
    assert "cold" not in {m.name for m in ready.models} and len(ready.models) == 6
    code, _ = await fake.call("RepositoryIndex", pb.RepositoryIndexRequest(repository_name="x"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.anyio
async def test_infer_raw_and_typed_contents_and_parameters(fake):
    x = np.array([[1.5, -2.0, 3.0, 1e30]], np.float32)
    reply = await fake.call("ModelInfer", infer_request(x=x, id="r1"))
    assert reply.model_name == "add_one" and reply.model_version == "1" and reply.id == "r1"
    np.testing.assert_array_equal(output(reply, 0, np.float32), x + 1)
    assert reply.parameters["batch_size"].int64_param == 4
    assert reply.parameters["queue_ms"].double_param == 1.25
    assert reply.parameters["device"].string_param == "cpu:0"
    assert fake.service.calls[-1]["id"] == "r1"
    assert fake.service.calls[-1]["received_at"] is not None

    typed = pb.ModelInferRequest(model_name="add_one")
    typed.inputs.add(name="x", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend(
        [0, 1, 2, 3]
    )
    typed.parameters["slo_ms"].int64_param = 9
    reply = await fake.call("ModelInfer", typed)
    np.testing.assert_array_equal(output(reply, 0, np.float32), [[1, 2, 3, 4]])
    assert fake.service.calls[-1]["slo_ms"] == 9.0

    request = pb.ModelInferRequest(model_name="typed")
    request.inputs.add(name="a", datatype="INT32", shape=[1, 2]).contents.int_contents.extend(
        [3, -4]
    )
    request.inputs.add(name="b", datatype="BOOL", shape=[1, 2]).contents.bool_contents.extend(
        [False, True]
    )
    c = (np.arange(6, dtype=np.float16) / 3).reshape(1, 2, 3)
    request.inputs.add(name="c", datatype="FP16", shape=[1, 2, 3])
    request.outputs.add(name="nb")
    request.outputs.add(name="a2")
    # FP16 has no typed field: with one input raw, every input is raw
    code, details = await fake.call("ModelInfer", request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("input 'c': FP16 data goes in raw_input_contents"), details
    for tensor in request.inputs:
        tensor.ClearField("contents")
    request.raw_input_contents.extend(
        [np.array([3, -4], np.int32).tobytes(), bytes([0, 1]), c.tobytes()]
    )
    reply = await fake.call("ModelInfer", request)
    assert [o.name for o in reply.outputs] == ["nb", "a2"]
    np.testing.assert_array_equal(output(reply, 0, np.bool_), [[True, False]])
    np.testing.assert_array_equal(output(reply, 1, np.int32), [[6, -8]])
    assert [o.datatype for o in reply.outputs] == ["BOOL", "INT32"]


def _set_shape(request: pb.ModelInferRequest) -> None:
    request.inputs[0].ClearField("shape")
    request.inputs[0].shape.extend([1, 3])


def _shared_memory(request: pb.ModelInferRequest) -> None:
    request.inputs[0].parameters["shared_memory_region"].string_param = "region"


def _parameter(request: pb.ModelInferRequest) -> None:
    request.parameters["priority"].int64_param = -1


def _classification(request: pb.ModelInferRequest) -> None:
    request.outputs.add(name="y").parameters["classification"].int64_param = 2


BAD_REQUESTS: list[tuple[str, Callable[[pb.ModelInferRequest], Any], str]] = [
    ("shape", _set_shape, "input 'x': expected shape [1, 4]"),
    (
        "datatype",
        lambda r: setattr(r.inputs[0], "datatype", "INT32"),
        "input 'x': expected datatype FP32",
    ),
    (
        "raw size",
        lambda r: r.raw_input_contents.__setitem__(0, b"\0" * 12),
        "input 'x': raw_input_contents[0] has 12 bytes but shape [1, 4] of FP32 needs 16 bytes",
    ),
    ("raw count", lambda r: r.raw_input_contents.append(b""), "raw_input_contents has 2 entries"),
    (
        "raw and typed",
        lambda r: r.inputs[0].contents.fp32_contents.append(1.0),
        "input 'x' has both contents and raw_input_contents[0]",
    ),
    ("unknown input", lambda r: setattr(r.inputs[0], "name", "z"), "unknown input 'z'"),
    ("shared memory", _shared_memory, "input 'x': the shared-memory extension is not supported"),
    (
        "parameter",
        _parameter,
        "invalid value for 'priority', expected value >= 0.",
    ),
    ("slo", lambda r: setattr(r.parameters["slo_ms"], "double_param", 1e9), "slo_ms 1e+09"),
    (
        "slo text",
        lambda r: setattr(r.parameters["slo_ms"], "string_param", "9"),
        "parameter slo_ms must be a number of milliseconds, got string_param",
    ),
    ("output", lambda r: r.outputs.add(name="q"), "unknown output 'q'"),
    ("classification", _classification, "output 'y': the classification extension"),
    (
        "version",
        lambda r: setattr(r, "model_version", "2"),
        "Request for unknown model: 'add_one' version 2 is not found",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("change", "expected"),
    [(change, expected) for _, change, expected in BAD_REQUESTS],
    ids=[name for name, _, _ in BAD_REQUESTS],
)
async def test_bad_requests_are_invalid_argument_naming_the_problem(fake, change, expected):
    request = infer_request()
    change(request)
    code, details = await fake.call("ModelInfer", request)
    want = grpc.StatusCode.NOT_FOUND if "version" in expected else grpc.StatusCode.INVALID_ARGUMENT
    assert code == want, details
    assert expected in details
    assert not fake.service.calls  # nothing reached the service
    assert (await fake.call("ModelInfer", infer_request())).outputs  # still serving


@pytest.mark.anyio
async def test_app_id_parameter_is_passed_on_and_echoed(fake):
    request = infer_request()
    request.parameters["app_id"].string_param = "tenant-7"
    reply = await fake.call("ModelInfer", request)
    assert reply.parameters["app_id"].string_param == "tenant-7"
    assert fake.service.calls[-1]["app"] == "tenant-7"
    reply = await fake.call("ModelInfer", infer_request())
    assert reply.parameters["app_id"].WhichOneof("parameter_choice") == "string_param"
    assert reply.parameters["app_id"].string_param == ""
    assert fake.service.calls[-1]["app"] == ""


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("int64_param", 7, "parameter app_id must be a string (string_param), got int64_param"),
        ("bool_param", True, "parameter app_id must be a string (string_param), got bool_param"),
        ("string_param", "", "app_id must be 1 to 128 printable ASCII characters"),
        ("string_param", "x" * 129, "app_id must be 1 to 128 printable ASCII characters"),
        ("string_param", "a\nb", "app_id must be 1 to 128 printable ASCII characters"),
    ],
)
async def test_bad_app_id_is_invalid_argument_naming_it(fake, kind, value, expected):
    request = infer_request()
    setattr(request.parameters["app_id"], kind, value)
    code, details = await fake.call("ModelInfer", request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in details
    assert not fake.service.calls


@pytest.mark.anyio
async def test_service_errors_map_to_the_status_table(fake):
    cases = {
        "nope": (
            grpc.StatusCode.NOT_FOUND,
            "Request for unknown model: 'nope' is not found (reason: model_not_found)",
        ),
        "dropper": (grpc.StatusCode.UNAVAILABLE, "deadline can no longer be met"),
        "busy": (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue of model 'busy' is full"),
        "broken": (grpc.StatusCode.INTERNAL, "internal error (RuntimeError); the server log"),
        "../x": (grpc.StatusCode.INVALID_ARGUMENT, "invalid model name"),
    }
    for model, (code, text) in cases.items():
        got_code, details = await fake.call("ModelInfer", infer_request(model))
        assert (got_code, text in details) == (code, True), (model, details)
    # the NOT_FOUND names the model asked for only
    _, details = await fake.call("ModelInfer", infer_request("nope"))
    assert "add_one" not in details and "typed" not in details
    # "executor exploded" stays in the log
    _, details = await fake.call("ModelInfer", infer_request("broken"))
    assert "exploded" not in details


@pytest.mark.anyio
async def test_statistics_and_model_control_reach_the_service(fake):
    stats = await fake.call("ModelStatistics", pb.ModelStatisticsRequest(name="add_one"))
    assert [(m.name, m.version, m.inference_count) for m in stats.model_stats] == [
        ("add_one", "1", 0)
    ]
    every = await fake.call("ModelStatistics", pb.ModelStatisticsRequest())
    assert {m.name for m in every.model_stats} == set(fake.service.configs)
    code, details = await fake.call("ModelStatistics", pb.ModelStatisticsRequest(name="nope"))
    assert (
        code == grpc.StatusCode.NOT_FOUND
        and "Request for unknown model: 'nope' is not found" in details
    )

    load = pb.RepositoryModelLoadRequest(model_name="add_one")
    load.parameters["config"].string_param = '{"max_batch_size": 4}'
    assert isinstance(await fake.call("RepositoryModelLoad", load), pb.RepositoryModelLoadResponse)
    unload = pb.RepositoryModelUnloadRequest(model_name="add_one")
    assert isinstance(
        await fake.call("RepositoryModelUnload", unload), pb.RepositoryModelUnloadResponse
    )
    assert fake.service.calls[-2:] == [
        {"load": "add_one", "config": '{"max_batch_size": 4}'},
        {"unload": "add_one"},
    ]
    load.parameters["priority"].int64_param = 3
    code, details = await fake.call("RepositoryModelLoad", load)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "'priority'" in details
    code, details = await fake.call(
        "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="../x")
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "invalid model name" in details


@pytest.mark.anyio
async def test_model_control_follows_the_admin_rules_of_the_http_routes():
    service = FakeService()
    unload = pb.RepositoryModelUnloadRequest(model_name="add_one")
    # A public bind without a token: refused, as the HTTP routes are (403).
    settings = Settings(host="0.0.0.0", grpc_port=free_port())
    endpoint = await start_grpc_endpoint(settings, lambda: service)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{settings.grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.RepositoryModelUnload(unload)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "no ADMIN_TOKEN is set" in error.value.details()
    await endpoint.stop()
    # With a token: the call's authorization metadata must carry it (401).
    settings = Settings(grpc_port=free_port(), admin_token="s3cret")
    endpoint = await start_grpc_endpoint(settings, lambda: service)
    async with grpc.aio.insecure_channel(endpoint.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for metadata in (None, (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.RepositoryModelUnload(unload, metadata=metadata)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await stub.RepositoryModelUnload(unload, metadata=(("authorization", "Bearer s3cret"),))
    await endpoint.stop()
    assert service.calls == [{"unload": "add_one"}]


@pytest.mark.anyio
async def test_request_limits_are_the_http_ones(fake):
    # add_one's limit: 64 KiB + max_batch_size (32) × 4 elements of 48 bytes (app.api.limits)
    limit = 64 * 1024 + 32 * 4 * 48
    fits = infer_request(id="i" * (limit - 200))
    assert fits.ByteSize() <= limit
    assert (await fake.call("ModelInfer", fits)).outputs
    over = infer_request(id="i" * (limit + 10))
    code, details = await fake.call("ModelInfer", over)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"request of {over.ByteSize()} bytes exceeds {limit} bytes" in details
    assert "the limit for model 'add_one'" in details
    # beyond the largest model's limit grpc itself refuses the message
    code, details = await fake.call("ModelInfer", infer_request(id="i" * (2 << 20)))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_typed_contents_have_the_json_range_checks():
    config = api_config("m", [("q", "INT8", (-1, 3)), ("u", "UINT64", (-1, 1))], [])
    request = pb.ModelInferRequest(model_name="m")
    q = request.inputs.add(name="q", datatype="INT8", shape=[1, 3])
    q.contents.int_contents.extend([1, -128, 127])
    u = request.inputs.add(name="u", datatype="UINT64", shape=[1, 1])
    u.contents.uint64_contents.append(2**64 - 1)
    inputs = decode_inputs(config, request, 1000)
    assert inputs["q"].dtype == np.int8 and inputs["q"].tolist() == [[1, -128, 127]]
    assert inputs["u"].dtype == np.uint64 and inputs["u"].tolist() == [[2**64 - 1]]
    q.contents.int_contents[0] = 300
    with pytest.raises(InvalidInput, match=r"input 'q': value out of range for INT8 \[-128, 127\]"):
        decode_inputs(config, request, 1000)
    q.contents.int_contents[0] = 1
    u.contents.ClearField("uint64_contents")
    with pytest.raises(
        InvalidInput,
        match=r"input 'u' has no data: give raw_input_contents or contents.uint64_contents",
    ):
        decode_inputs(config, request, 1000)
    u.contents.int64_contents.append(1)
    with pytest.raises(
        InvalidInput, match=r"input 'u': contents.int64_contents is given, but a UINT64"
    ):
        decode_inputs(config, request, 1000)
    u.contents.ClearField("int64_contents")
    u.contents.uint64_contents.extend([1, 2])
    with pytest.raises(InvalidInput, match=r"input 'u': shape \[1, 1\] needs 1 elements, got 2"):
        decode_inputs(config, request, 1000)


# ------------------------------------------------------------------ lifecycle


@pytest.mark.anyio
async def test_grpc_port_0_starts_no_server(monkeypatch):
    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a gRPC server was created")

    monkeypatch.setattr(grpc.aio, "server", no_server)
    endpoint = await start_grpc_endpoint(Settings(grpc_port=0), FakeService)
    assert not endpoint.running
    await endpoint.stop()


@pytest.mark.anyio
async def test_a_busy_port_stops_the_start_naming_the_setting():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        settings = Settings(grpc_port=port)
        with pytest.raises(RuntimeError, match=rf"cannot listen on 127.0.0.1:{port}.*GRPC_PORT"):
            await start_grpc_endpoint(settings, FakeService)


@pytest.mark.anyio
async def test_without_grpcio_http_only_with_an_error(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError
    monkeypatch.delitem(sys.modules, "app.grpc.servicer", raising=False)
    with caplog.at_level(logging.WARNING, logger="app.server"):
        endpoint = await start_grpc_endpoint(Settings(grpc_port=free_port()), FakeService)
    assert not endpoint.running
    assert "pip install 'deadline-serve[triton]'" in caplog.text
    assert "GRPC_PORT is" in caplog.text and "serving HTTP only" in caplog.text
    assert lifecycle.EXTRA in caplog.text
    assert [r.levelname for r in caplog.records if "NO gRPC" in r.getMessage()] == ["ERROR"]


@pytest.mark.anyio
async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout():
    service = FakeService()
    settings = Settings(grpc_port=free_port(), keep_alive_timeout_s=0.3)
    endpoint = await start_grpc_endpoint(settings, lambda: service)
    try:
        async with grpc.aio.insecure_channel(endpoint.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            assert (await stub.ServerLive(pb.ServerLiveRequest())).live
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            for _ in range(40):  # the server's GOAWAY: the channel goes idle
                await asyncio.sleep(0.05)
                if channel.get_state() == grpc.ChannelConnectivity.IDLE:
                    break
            assert channel.get_state() == grpc.ChannelConnectivity.IDLE
            assert (await stub.ServerLive(pb.ServerLiveRequest())).live  # reconnects
    finally:
        await endpoint.stop()


# ------------------------------------------------------------------ bursts (issue 42, item 3)


class _HeldService(FakeService):
    """Holds every inference until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.holding = 0

    async def infer(self, model, inputs, **kwargs):
        self.holding += 1
        await self.release.wait()
        return await super().infer(model, inputs, **kwargs)


@pytest.mark.anyio
async def test_a_burst_beyond_the_cap_is_refused_with_resource_exhausted_never_cancelled(caplog):
    from app.server.metrics import Metrics

    service = _HeldService()
    metrics = Metrics()
    settings = Settings(grpc_port=free_port(), max_connections=8)
    endpoint = await start_grpc_endpoint(settings, lambda: service, metrics)
    try:
        async with grpc.aio.insecure_channel(endpoint.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def one(i: int) -> tuple[Any, str, str]:
                try:
                    reply = await stub.ModelInfer(infer_request(id=f"r{i}"))
                    return grpc.StatusCode.OK, reply.id, ""
                except grpc.aio.AioRpcError as exc:
                    reason = dict(exc.trailing_metadata() or ()).get("reason", "")
                    return exc.code(), exc.details(), reason

            with caplog.at_level(logging.WARNING, logger="app.server"):
                # 1,500 at once: more than grpcio's core holds by default
                # (1,000) before cancelling calls silently.
                calls = [asyncio.create_task(one(i)) for i in range(1500)]
                while service.holding < 8 or sum(t.done() for t in calls) < 1492:
                    await asyncio.sleep(0.01)
                live = await stub.ServerLive(pb.ServerLiveRequest())  # health gets through
                service.release.set()
                answers = await asyncio.gather(*calls)
    finally:
        await endpoint.stop()
    codes = [code for code, _, _ in answers]
    assert codes.count(grpc.StatusCode.OK) == 8 and service.holding == 8
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 1492, Counter(codes)
    assert grpc.StatusCode.CANCELLED not in codes
    refused = [(details, reason) for code, details, reason in answers if code != grpc.StatusCode.OK]
    assert all(r == "overloaded" and "8 calls in progress" in d for d, r in refused), refused[0]
    assert sorted(int(i[1:]) for code, i, _ in answers if code == grpc.StatusCode.OK) == sorted(
        int(call["id"][1:]) for call in service.calls
    )
    assert live.live is True
    sample = metrics.registry.get_sample_value(
        f"{metrics.prefix}grpc_refused_total", {"method": "ModelInfer"}
    )
    assert sample == 1492.0
    warnings = [r for r in caplog.records if "RESOURCE_EXHAUSTED overloaded" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited: one line for the burst


@pytest.mark.anyio
async def test_a_load_failure_names_no_server_path_over_grpc(tmp_path, monkeypatch):
    """Issue 42, item 9: `load_failed` answers carried absolute server paths."""
    from app.errors import LoadFailed
    from app.server import model_control
    from app.server.live import LiveService
    from app.server.metrics import Metrics

    repository = tmp_path / "models"
    service = LiveService(Settings(repository=repository), Metrics())
    service.ready, service.dispatcher = True, object()  # type: ignore[assignment]

    async def failing(_service, name, _override=None):
        raise LoadFailed(
            f"failed to load model {name!r}: {repository}/alpha/model.onnx: truncated; "
            "see /var/cache/deadline-serve/profiles/alpha.json"
        )

    monkeypatch.setattr(model_control, "load", failing)
    settings = Settings(grpc_port=free_port())
    endpoint = await start_grpc_endpoint(settings, lambda: service)
    try:
        async with grpc.aio.insecure_channel(endpoint.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="alpha"))
    finally:
        await endpoint.stop()
    details = error.value.details()
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details == (
        "failed to load model 'alpha': alpha/model.onnx: truncated; see alpha.json "
        "(reason: load_failed)"
    ), details
    assert str(tmp_path) not in details and "/var/cache" not in details
