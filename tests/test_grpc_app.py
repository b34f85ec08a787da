"""The KServe v2 gRPC endpoint against the app (app/grpc/, app/main.py), driven
by the real `tritonclient.grpc` client: the app with its lifespan under
uvicorn in a thread, on a repository of the bundled ONNX `mlp` and emulated
models — outputs equal ONNX Runtime's, bad input answered with the right
status, HTTP and gRPC requests batched together — and `python -m app serve`
with gRPC on, whose SIGTERM answers every call.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from tritonclient.grpc import model_config_pb2 as mc

from app.repository.bundled import ensure_bundled_models
from app.server.settings import BUNDLED_REPOSITORY, Settings
from bench.daemon_launcher import free_port

pytestmark = pytest.mark.slow  # an app with executors, a daemon


def _write_config(directory: Path, config: dict[str, Any]) -> None:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(config))


def _bundled_config(name: str, **changes: Any) -> dict[str, Any]:
    config = yaml.safe_load((BUNDLED_REPOSITORY / name / "config.yaml").read_text())
    return {**config, **changes}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bundled `mlp` (ONNX, built here) and `densenet121-emulated`, each
    with an SLO a busy 2-core box meets; mlp with a profile, so that the
    start does not measure one; and `echo`, an emulated model whose batches
    take 100 ms, so that requests arriving meanwhile queue for one batch."""
    root = tmp_path_factory.mktemp("grpc-repo")
    _write_config(
        root / "mlp", _bundled_config("mlp", slo_ms=5000, profile={"alpha_ms": 20, "beta_ms": 5})
    )
    assert ensure_bundled_models(root, ["mlp"]) == ["mlp/model.onnx"]
    _write_config(
        root / "densenet121-emulated", _bundled_config("densenet121-emulated", slo_ms=2000)
    )
    _write_config(
        root / "echo",
        {
            "backend": "emulated",
            "max_batch_size": 32,
            "slo_ms": 2000,
            "profile": {"alpha_ms": 0.5, "beta_ms": 100.0},
            "devices": ["emulated"],
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
        },
    )
    yield root
    (root / "mlp" / "model.onnx").unlink()  # 256 MiB


@pytest.fixture(scope="module")
def served(uvicorn_in_thread: Callable[..., str], repository: Path) -> dict[str, str]:
    """The app (create_app, its lifespan) on an HTTP and a gRPC port."""
    from app.main import create_app

    grpc_port = free_port()
    settings = Settings(
        repository=repository,
        grpc_port=grpc_port,
        cpu_slices=1,
        threads_per_slice=1,
        emulated_devices=1,
    )
    http = uvicorn_in_thread(create_app(settings), start_timeout_s=90, lifespan="on")
    return {"http": f"http://{http}", "grpc": f"127.0.0.1:{grpc_port}"}


@pytest.fixture(scope="module")
def triton(served: dict[str, str]) -> Iterator[Any]:
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(served["grpc"])
    yield client
    client.close()


def test_tritonclient_health_metadata_and_config(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("mlp") and triton.is_model_ready("densenet121-emulated")
    meta = triton.get_model_metadata("mlp")
    assert (meta.name, list(meta.versions), meta.platform) == ("mlp", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("input", "FP32", [-1, 4096])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("output", "FP32", [-1, 4096])
    ]
    config = triton.get_model_config("mlp").config
    assert (config.name, config.platform, config.backend) == (
        "mlp",
        "onnxruntime_onnx",
        "onnxruntime",
    )
    assert config.max_batch_size == 32
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        ("input", "TYPE_FP32", [4096])
    ]
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in config.output] == [
        ("output", "TYPE_FP32", [4096])
    ]
    assert config.parameters["slo_ms"].string_value == "5000"
    index = triton.get_model_repository_index()
    assert {(m.name, m.state) for m in index.models} == {
        ("densenet121-emulated", "READY"),
        ("echo", "READY"),
        ("mlp", "READY"),
    }


def test_the_model_config_reads_alike_over_http_and_grpc_as_tritons_does(served, triton):
    """tritonclient's get_model_config over HTTP gets the JSON form of the
    ModelConfig its gRPC call gets (proto JSON writes int64 dims as
    strings; Triton's HTTP endpoint as numbers), our own fields beside it."""
    import tritonclient.http as th

    http = th.InferenceServerClient(served["http"].removeprefix("http://"))
    try:
        for model in ("mlp", "densenet121-emulated"):
            over_http = http.get_model_config(model)
            over_grpc = triton.get_model_config(model, as_json=True)["config"]
            for tensors in ("input", "output"):
                for tensor in over_grpc[tensors]:
                    tensor["dims"] = [int(d) for d in tensor["dims"]]
            for key in ("name", "platform", "backend", "max_batch_size", "input", "output",
                        "parameters"):  # fmt: skip
                assert over_http[key] == over_grpc[key], (model, key)
        mlp = http.get_model_config("mlp")
    finally:
        http.close()
    assert (mlp["platform"], mlp["backend"], mlp["runtime"]) == (
        "onnxruntime_onnx",
        "onnxruntime",
        "onnx",
    )
    assert mlp["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [4096]}]
    assert mlp["parameters"]["slo_ms"] == {"string_value": "5000"} and mlp["slo_ms"] == 5000


def test_tritonclient_infer_mlp_equals_onnxruntime(triton, repository):
    import onnxruntime
    import tritonclient.grpc as tg

    x = np.random.default_rng(7).standard_normal((4, 4096)).astype(np.float32)
    tensor = tg.InferInput("input", [4, 4096], "FP32")  # a request of 4 items
    tensor.set_data_from_numpy(x)
    result = triton.infer("mlp", [tensor], outputs=[tg.InferRequestedOutput("output")])
    session = onnxruntime.InferenceSession(
        str(repository / "mlp" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (expected,) = session.run(None, {"input": x})
    got = result.as_numpy("output")
    assert got.shape == (4, 4096) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert np.abs(expected).max() > 0.1  # not an all-zero output
    assert result.get_response().parameters["batch_size"].int64_param >= 4


def test_tritonclient_infer_emulated_and_errors(triton):
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    x = np.arange(16, dtype=np.float32).reshape(1, 16) / 7
    tensor = tg.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    result = triton.infer("densenet121-emulated", [tensor], request_id="e1")
    np.testing.assert_array_equal(result.as_numpy("output"), x)  # emulated models echo
    response = result.get_response()
    assert response.id == "e1" and response.model_name == "densenet121-emulated"
    assert response.parameters["device"].string_param == "emulated:0"

    bad = tg.InferInput("input", [1, 4095], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 4095), np.float32))
    with pytest.raises(InferenceServerException) as error:
        triton.infer("mlp", [bad])
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        "input 'input': expected shape [1, 4096] (or n items: [n, 4096], n ≤ max_batch_size 32), "
        "got [1, 4095]" in error.value.message()
    )

    with pytest.raises(InferenceServerException) as error:
        triton.infer("nope", [tensor])
    assert error.value.status() == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'nope' is not found" in error.value.message()
    assert "mlp" not in error.value.message()  # names only the model asked for
    assert triton.is_server_live()


def test_http_and_grpc_requests_for_one_model_are_batched_together(served):
    """k requests over each protocol at once: an answer from a batch of more
    than k requests over either protocol shows a batch holding both."""
    import tritonclient.grpc.aio as tga
    from tritonclient.grpc import InferInput

    k = 8

    async def burst() -> tuple[list[int], list[int]]:
        rows = [np.full((1, 4), i, np.float32) for i in range(2 * k)]
        async with httpx.AsyncClient(base_url=served["http"], timeout=30) as http:
            grpc_client = tga.InferenceServerClient(served["grpc"])

            async def over_grpc(row: np.ndarray) -> int:
                tensor = InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(row)
                result = await grpc_client.infer("echo", [tensor])
                np.testing.assert_array_equal(result.as_numpy("y"), row)
                return result.get_response().parameters["batch_size"].int64_param

            async def over_http(row: np.ndarray) -> int:
                body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32"}]}
                body["inputs"][0]["data"] = row.ravel().tolist()
                reply = await http.post("/v2/models/echo/infer", json=body)
                assert reply.status_code == 200, reply.text
                assert reply.json()["outputs"][0]["data"] == row.ravel().tolist()
                return reply.json()["parameters"]["batch_size"]

            try:
                sizes = await asyncio.gather(
                    *(over_grpc(row) for row in rows[:k]), *(over_http(row) for row in rows[k:])
                )
            finally:
                await grpc_client.close()
        return sizes[:k], sizes[k:]

    over_grpc, over_http = asyncio.run(burst())
    assert max(over_grpc) > k, (over_grpc, over_http)
    assert max(over_http) > k, (over_grpc, over_http)


def _received(url: str, model: str) -> float:
    """Requests the daemon has received for `model` (its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    pattern = re.compile(rf'requests_total\{{model="{re.escape(model)}"\}} (\S+)$', re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def test_sigterm_answers_every_grpc_call_and_refuses_new_ones(tmp_path, launch_daemon):
    """`python -m app serve` with gRPC on: batches of one that hold the one
    device 0.8 s, five calls in flight, SIGTERM with a 1 s grace. The running
    call finishes, the queued ones are answered UNAVAILABLE shutting_down at
    the grace's end, a call arriving during the drain is refused the same way
    at once, and the daemon exits 0."""
    import tritonclient.grpc.aio as tga
    from tritonclient.grpc import InferInput
    from tritonclient.utils import InferenceServerException

    _write_config(
        tmp_path / "hold",
        {
            "backend": "emulated",
            "max_batch_size": 1,
            "slo_ms": 600000,
            "profile": {"alpha_ms": 0.0, "beta_ms": 800.0},
            "devices": ["emulated"],
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        },
    )
    grpc_port = free_port()
    daemon = launch_daemon(
        tmp_path,
        policy="clockwork",
        emulated_devices=1,
        extra_env={"GRPC_PORT": str(grpc_port), "CPU_SLICES": "0", "SHUTDOWN_GRACE_S": "1"},
        log_level="info",
    )
    row = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)

    async def scenario() -> tuple[list[Any], Any]:
        client = tga.InferenceServerClient(f"127.0.0.1:{grpc_port}")

        async def one() -> Any:
            tensor = InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(row)
            try:
                return (await client.infer("hold", [tensor], client_timeout=30)).as_numpy("x")
            except InferenceServerException as exc:
                return exc

        try:
            calls = [asyncio.create_task(one()) for _ in range(5)]
            while await asyncio.to_thread(_received, daemon.url, "hold") < 5:
                await asyncio.sleep(0.02)
            daemon.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            late = await one()
            return list(await asyncio.gather(*calls)), late
        finally:
            await client.close()

    answers, late = asyncio.run(scenario())
    code = daemon.process.wait(timeout=30)
    log = daemon.log_path.read_text()
    assert code == 0, log[-3000:]
    served = [a for a in answers if isinstance(a, np.ndarray)]
    refused = [a for a in answers if not isinstance(a, np.ndarray)]
    assert len(served) >= 1 and len(refused) >= 3, answers
    for result in served:
        np.testing.assert_array_equal(result, row)
    for error in [*refused, late]:
        assert isinstance(error, InferenceServerException), error
        assert error.status() == "StatusCode.UNAVAILABLE", error
        assert "(reason: shutting_down)" in error.message(), error
    assert f"gRPC endpoint on 127.0.0.1:{grpc_port} stopped" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_tritonclient_statistics_and_model_control(triton):
    """Statistics count what was sent; unload and load go through the live
    service (the server binds loopback without ADMIN_TOKEN: allowed)."""
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    def inferences() -> tuple[int, int]:
        (stats,) = triton.get_inference_statistics("densenet121-emulated").model_stats
        return stats.inference_stats.success.count, stats.inference_count

    before_requests, before_items = inferences()
    for items in (1, 3, 2):
        tensor = tg.InferInput("input", [items, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((items, 16), np.float32))
        triton.infer("densenet121-emulated", [tensor])
    assert inferences() == (before_requests + 3, before_items + 6)

    triton.unload_model("densenet121-emulated")
    assert not triton.is_model_ready("densenet121-emulated")
    tensor = tg.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as error:
        triton.infer("densenet121-emulated", [tensor])
    assert error.value.status() == "StatusCode.UNAVAILABLE"
    assert "unloaded" in error.value.message()
    triton.load_model("densenet121-emulated", config='{"max_batch_size": 8}')
    assert triton.is_model_ready("densenet121-emulated")
    assert triton.get_model_config("densenet121-emulated").config.max_batch_size == 8
    np.testing.assert_array_equal(
        triton.infer("densenet121-emulated", [tensor]).as_numpy("output"), np.ones((1, 16))
    )
