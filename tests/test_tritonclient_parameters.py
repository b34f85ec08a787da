"""The published tritonclient (HTTP, HTTP aio, gRPC, gRPC aio) through what a
Triton user sends and reads (docs/triton.md): Triton's request parameters
(`priority`, `timeout`, sequence ones, custom `parameters`), the deadline a
`timeout` sets, times readable as int64, unknown models in Triton's words,
Triton's platform names, and the extensions not offered answered as Triton
without them answers. Over a real uvicorn server and a real gRPC endpoint in
front of the fake service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import numpy as np
import pytest

from app.api.unsupported_routes import NO_LOGGING, NO_TRACING, SHM_DISABLED
from app.grpc.lifecycle import start_grpc_endpoint
from app.server.metrics import Metrics
from app.server.settings import Settings
from bench.daemon_launcher import free_port
from tests.fakes import FakeService

X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


def ignored(metrics: Metrics, name: str) -> float:
    sample = metrics.prefix + "ignored_parameters_total"
    return metrics.registry.get_sample_value(sample, {"name": name}) or 0.0


# ------------------------------------------------------------------------ HTTP


@pytest.mark.slow
def test_tritonclient_http_sends_tritons_parameters(live_server, triton) -> None:
    import tritonclient.http as th

    service = live_server[1]
    inp = th.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    result = triton.infer(
        "add_one",
        [inp],
        priority=2,
        timeout=4000,  # µs: tighter than add_one's 50 ms SLO
        sequence_id=7,
        sequence_start=True,
        parameters={"tenant": "a", "retries": 1},
    )
    np.testing.assert_array_equal(result.as_numpy("y"), X + 1)
    assert service.calls[-1]["slo_ms"] == 4.0
    triton.infer("add_one", [inp], timeout=200_000)  # looser: the model's SLO stays
    assert service.calls[-1]["slo_ms"] is None


@pytest.mark.slow
def test_tritonclient_http_meets_tritons_answers(live_server, triton) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    inp = th.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(X)
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope'"):
        triton.infer("nope", [inp])
    assert triton.get_system_shared_memory_status() == []
    assert triton.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException) as shm:
        triton.register_system_shared_memory("r0", "/r0", 64)
    assert SHM_DISABLED in shm.value.message()
    with pytest.raises(InferenceServerException) as trace:
        triton.get_trace_settings()
    assert NO_TRACING in trace.value.message()
    with pytest.raises(InferenceServerException) as logging:
        triton.get_log_settings()
    assert NO_LOGGING in logging.value.message()
    assert "parameters" in triton.get_server_metadata()["extensions"]


@pytest.mark.slow
@pytest.mark.anyio
async def test_tritonclient_http_aio_sends_tritons_parameters(live_server) -> None:
    import tritonclient.http.aio as tha

    service = live_server[1]
    client = tha.InferenceServerClient(live_server[0])
    try:
        inp = tha.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        result = await client.infer("add_one", [inp], priority=1, timeout=3000)
        np.testing.assert_array_equal(result.as_numpy("y"), X + 1)
        assert service.calls[-1]["slo_ms"] == 3.0
    finally:
        await client.close()


# ------------------------------------------------------------------------ gRPC


@pytest.fixture
async def grpc_fake() -> AsyncIterator[tuple[str, FakeService, Metrics]]:
    service, metrics = FakeService(), Metrics()
    service.configs["onnx_like"] = replace(service.configs["add_one"], backend="onnx")
    endpoint = await start_grpc_endpoint(Settings(grpc_port=free_port()), lambda: service, metrics)
    yield endpoint.address, service, metrics
    await endpoint.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_tritonclient_grpc_aio_sends_tritons_parameters(grpc_fake) -> None:
    import tritonclient.grpc.aio as tga

    address, service, metrics = grpc_fake
    client = tga.InferenceServerClient(address)
    try:
        inp = tga.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        result = await client.infer(
            "add_one",
            [inp],
            priority=3,
            timeout=6000,
            sequence_id=9,
            sequence_start=True,
            parameters={"tenant": "a", "retries": 2, "urgent": True},
        )
        np.testing.assert_array_equal(result.as_numpy("y"), X + 1)
        assert service.calls[-1]["slo_ms"] == 6.0
        params = result.get_response().parameters
        assert params["queue_us"].int64_param == 1250 and params["exec_us"].int64_param == 3500
        for name in ("priority", "sequence_id", "tenant", "retries", "urgent"):
            assert ignored(metrics, name) == 1.0, name
        meta = await client.get_model_metadata("onnx_like")
        assert meta.platform == "onnxruntime_onnx"
        config = (await client.get_model_config("onnx_like")).config
        assert (config.platform, config.backend) == ("onnxruntime_onnx", "onnxruntime")
        status = await client.get_system_shared_memory_status()
        assert len(status.regions) == 0
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope'"):
            await client.infer("nope", [inp])
        with pytest.raises(InferenceServerException, match="does not support trace"):
            await client.get_trace_settings()
    finally:
        await client.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_tritonclient_grpc_sends_tritons_parameters(grpc_fake) -> None:
    """The synchronous client (a thread of its own: the endpoint runs on this
    test's event loop)."""
    import tritonclient.grpc as tg

    address, service, metrics = grpc_fake

    def call() -> object:
        client = tg.InferenceServerClient(address)
        try:
            inp = tg.InferInput("x", [1, 4], "FP32")
            inp.set_data_from_numpy(X)
            return client.infer("add_one", [inp], priority=1, timeout=2500)
        finally:
            client.close()

    result = await asyncio.to_thread(call)
    np.testing.assert_array_equal(result.as_numpy("y"), X + 1)  # type: ignore[attr-defined]
    assert service.calls[-1]["slo_ms"] == 2.5
    assert ignored(metrics, "priority") == 1.0
