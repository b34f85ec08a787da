"""Triton's names where clients and dashboards read them: platform names,
the texts for unknown models and versions, the extensions listed, the
extensions not offered answered as Triton without them answers (HTTP and
gRPC), and the `nv_inference_*` metrics on a metrics port of their own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.api.context import unknown_model
from app.api.unsupported_routes import NO_LOGGING, NO_TRACING, SHM_DISABLED
from app.grpc import metadata
from app.grpc.lifecycle import start_grpc_endpoint
from app.repository.triton_config import triton_backend, triton_platform
from app.server.metrics import Metrics
from app.server.settings import Settings
from app.server.statistics import Statistics
from app.server.triton_metrics import MetricsEndpoint, render_triton
from bench.daemon_launcher import free_port
from tests.fakes import FakeService, api_config

pytestmark = pytest.mark.anyio


def test_platform_and_backend_names_are_tritons() -> None:
    assert (triton_platform("onnx"), triton_backend("onnx")) == ("onnxruntime_onnx", "onnxruntime")
    assert (triton_platform("torch"), triton_backend("torch")) == ("pytorch_libtorch", "pytorch")
    assert triton_platform("emulated") == "emulated"
    x = [("x", "FP32", (-1, 4))]
    onnx = replace(api_config("m", x, x), backend="onnx")
    assert metadata.model_metadata(onnx).platform == "onnxruntime_onnx"
    config = metadata.model_config(onnx)
    assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")


def test_unknown_model_and_version_in_tritons_words() -> None:
    # triton-inference-server/core: model_repository_manager.cc, model_lifecycle.cc
    assert unknown_model("x") == "Request for unknown model: 'x' is not found"
    assert unknown_model("x", "3") == "Request for unknown model: 'x' version 3 is not found"


async def test_http_metadata_lists_what_is_served(client) -> None:
    meta = (await client.get("/v2")).json()
    assert meta["extensions"] == [
        "binary_tensor_data",
        "model_configuration",
        "statistics",
        "model_repository",
        "parameters",
    ]


async def test_server_name_is_ours_unless_set_to_tritons_for_clients_that_check_it() -> None:
    """Triton's health/metadata examples require `name == "triton"`: SERVER_NAME
    gives it, over HTTP and gRPC alike."""
    from app.api.routes import settings_api

    service = FakeService()
    for settings, name in (
        (Settings(), "deadline-serve"),
        (Settings(server_name="triton"), "triton"),
    ):
        api = settings_api(lambda: service, Metrics(), settings)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/v2")).json()["name"] == name
        settings = replace(settings, grpc_port=free_port())
        endpoint = await start_grpc_endpoint(settings, lambda: service)
        try:
            async with grpc.aio.insecure_channel(endpoint.address) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
                assert meta.name == name
        finally:
            await endpoint.stop()
    assert Settings.from_env({"SERVER_NAME": "triton"}).server_name == "triton"


# (method, path, status, body) as Triton answers without client shared memory,
# tracing and dynamic logging (src/http_server.cc)
UNSUPPORTED = [
    ("GET", "/v2/systemsharedmemory/status", 200, []),
    ("GET", "/v2/cudasharedmemory/status", 200, []),
    (
        "GET",
        "/v2/systemsharedmemory/region/r0/status",
        404,
        {"error": "Unable to find system shared memory region: 'r0'"},
    ),
    ("POST", "/v2/systemsharedmemory/region/r0/register", 501, {"error": SHM_DISABLED}),
    ("POST", "/v2/systemsharedmemory/unregister", 501, {"error": SHM_DISABLED}),
    ("POST", "/v2/cudasharedmemory/region/r0/register", 501, {"error": SHM_DISABLED}),
    ("POST", "/v2/cudasharedmemory/region/r0/unregister", 501, {"error": SHM_DISABLED}),
    ("GET", "/v2/trace/setting", 503, {"error": NO_TRACING}),
    ("POST", "/v2/trace/setting", 503, {"error": NO_TRACING}),
    ("GET", "/v2/models/add_one/trace/setting", 503, {"error": NO_TRACING}),
    ("POST", "/v2/models/add_one/versions/1/trace/setting", 503, {"error": NO_TRACING}),
    ("GET", "/v2/logging", 503, {"error": NO_LOGGING}),
    ("POST", "/v2/logging", 503, {"error": NO_LOGGING}),
]


@pytest.mark.parametrize(("method", "path", "status", "body"), UNSUPPORTED)
async def test_http_unsupported_extensions_answer_as_triton(
    client, method, path, status, body
) -> None:
    r = await client.request(method, path, json={} if method == "POST" else None)
    assert (r.status_code, r.json()) == (status, body)


async def test_grpc_unsupported_extensions_answer_as_triton() -> None:
    service = FakeService()
    endpoint = await start_grpc_endpoint(Settings(grpc_port=free_port()), lambda: service)
    try:
        async with grpc.aio.insecure_channel(endpoint.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def call(rpc: str, request: Any) -> Any:
                try:
                    return await getattr(stub, rpc)(request)
                except grpc.aio.AioRpcError as exc:
                    return exc.code(), exc.details()

            status = await call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
            assert isinstance(status, pb.SystemSharedMemoryStatusResponse)
            assert len(status.regions) == 0
            status = await call("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest())
            assert len(status.regions) == 0
            code, details = await call(
                "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name="r")
            )
            assert code == grpc.StatusCode.UNIMPLEMENTED and details.startswith(SHM_DISABLED)
            code, details = await call("TraceSetting", pb.TraceSettingRequest())
            assert code == grpc.StatusCode.UNAVAILABLE
            assert details.startswith("the server does not support trace")
            code, details = await call("LogSettings", pb.LogSettingsRequest())
            assert code == grpc.StatusCode.UNAVAILABLE and details.startswith(NO_LOGGING)
            meta = await call("ServerMetadata", pb.ServerMetadataRequest())
            assert "parameters" in meta.extensions and "binary_tensor_data" not in meta.extensions
    finally:
        await endpoint.stop()


# ------------------------------------------------------------------ nv_inference_*


def _statistics() -> Statistics:
    stats = Statistics()
    stats.add_model("simple", "1")
    stats.batch_executed("simple", batch="b1", batch_size=3, requests=2, infer_s=0.004)
    stats.request_succeeded(
        "simple",
        items=2,
        total_s=0.010,
        queue_s=0.002,
        input_s=0.0005,
        infer_s=0.004,
        output_s=0.00025,
        at_ms=1,
        batch="b1",
    )
    stats.request_succeeded(
        "simple", items=1, total_s=0.006, queue_s=0.001, input_s=0, infer_s=0.004, output_s=0,
        at_ms=2, batch="b1",
    )  # fmt: skip
    stats.request_failed("simple", total_s=0.5, at_ms=3)
    return stats


def test_nv_inference_families_carry_the_statistics_in_microseconds() -> None:
    text = render_triton(_statistics().report(), lambda name, version: 4)
    samples = {
        line.partition("{")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("nv_")
    }
    assert samples == {
        "nv_inference_request_success": 2,
        "nv_inference_request_failure": 1,
        "nv_inference_request_duration_us": 16_000,
        "nv_inference_queue_duration_us": 3_000,
        "nv_inference_compute_input_duration_us": 500,
        "nv_inference_compute_infer_duration_us": 8_000,
        "nv_inference_compute_output_duration_us": 250,
        "nv_inference_count": 3,
        "nv_inference_exec_count": 1,
        "nv_inference_pending_request_count": 4,
    }
    assert 'nv_inference_count{model="simple",version="1"} 3' in text.splitlines()
    assert "# TYPE nv_inference_request_success counter" in text


async def test_the_metrics_port_serves_tritons_families_beside_ours() -> None:
    metrics = Metrics()
    metrics.request_received("simple")
    endpoint = MetricsEndpoint(metrics.registry, _statistics().report)
    port = await endpoint.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            r = await c.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert 'nv_inference_request_success{model="simple",version="1"} 2' in r.text
            assert 'deadline_serve_requests_total{model="simple"} 1.0' in r.text
            assert (await c.get("/other")).status_code == 404
    finally:
        await endpoint.stop()
