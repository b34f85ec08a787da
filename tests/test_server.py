"""The daemon end to end: a real `python -m app serve` process on an ephemeral
loopback port, real executor processes and ONNX Runtime, a tiny repository."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.http as tritonhttp
from onnx import TensorProto, helper

from tests.fakes import segments_of

pytestmark = pytest.mark.slow  # one daemon for the module


def _dense_model(path: Path, seed: int = 3, width: int = 8) -> None:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((width, width)).astype(np.float32) / np.sqrt(width)
    bias = rng.standard_normal(width).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "W"], ["hidden"]),
            helper.make_node("Add", ["hidden", "B"], ["pre"]),
            helper.make_node("Relu", ["pre"], ["output"]),
        ],
        "dense",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
        [
            helper.make_tensor("W", TensorProto.FLOAT, weight.shape, weight.flatten()),
            helper.make_tensor("B", TensorProto.FLOAT, bias.shape, bias),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _repository(root: Path) -> Path:
    dense = root / "dense"
    dense.mkdir(parents=True)
    _dense_model(dense / "model.onnx")
    (dense / "config.yaml").write_text(
        "backend: onnx\n"
        "model_file: model.onnx\n"
        "max_batch_size: 16\n"
        "slo_ms: 200\n"
        "inputs: [{name: input, datatype: FP32, shape: [-1, 8]}]\n"
        "outputs: [{name: output, datatype: FP32, shape: [-1, 8]}]\n"
    )
    echo = root / "echo"
    echo.mkdir()
    (echo / "config.yaml").write_text(
        "backend: emulated\n"
        "max_batch_size: 32\n"
        "slo_ms: 500\n"
        "profile: {alpha_ms: 0.5, beta_ms: 10.0}\n"
        "devices: [emulated]\n"
        "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]\n"
    )
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, launch_daemon):
    repo = _repository(tmp_path_factory.mktemp("repo"))
    handle = launch_daemon(
        repo,
        cpu_slices=1,
        threads_per_slice=1,
        emulated_devices=1,
        extra_env={"PROFILE_BATCH_SIZES": "1,4,16"},
        log_level="info",
    )
    return {"url": handle.url, "process": handle.process, "repo": repo, "log": handle.log_path}


def test_infer_matches_onnxruntime(server):
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    reply = httpx.post(
        f"{server['url']}/infer",
        json={"model": "dense", "inputs": {"input": x.tolist()}, "app_id": "tenant-7"},
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    got = np.array(body["outputs"]["output"]["data"], dtype=np.float32).reshape(1, 8)
    session = onnxruntime.InferenceSession(str(server["repo"] / "dense" / "model.onnx"))
    (expected,) = session.run(None, {"input": x})
    assert np.allclose(got, expected, atol=1e-5)
    assert body["timing"]["batch_size"] >= 1
    assert body["timing"]["app_id"] == "tenant-7"  # through the live service and back


def test_tritonclient_binary_and_json(server):
    client = tritonhttp.InferenceServerClient(server["url"].removeprefix("http://"))
    x = np.random.default_rng(1).standard_normal((1, 8)).astype(np.float32)
    session = onnxruntime.InferenceSession(str(server["repo"] / "dense" / "model.onnx"))
    (expected,) = session.run(None, {"input": x})
    for binary in (True, False):
        tensor = tritonhttp.InferInput("input", [1, 8], "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        wanted = tritonhttp.InferRequestedOutput("output", binary_data=binary)
        result = client.infer("dense", [tensor], outputs=[wanted])
        assert np.allclose(result.as_numpy("output"), expected, atol=1e-5)


def test_concurrent_requests_are_batched_and_rows_stay_with_their_request(server):
    async def burst():
        async with httpx.AsyncClient(base_url=server["url"], timeout=10) as client:
            rows = [np.full((1, 4), i, dtype=np.float32) for i in range(64)]
            replies = await asyncio.gather(
                *[
                    client.post("/infer", json={"model": "echo", "inputs": {"x": r.tolist()}})
                    for r in rows
                ]
            )
            return rows, replies

    rows, replies = asyncio.run(burst())
    assert all(r.status_code == 200 for r in replies), [
        r.text for r in replies if r.status_code != 200
    ]
    for row, reply in zip(rows, replies, strict=True):
        assert reply.json()["outputs"]["y"]["data"] == row.tolist()
    sizes = [reply.json()["timing"]["batch_size"] for reply in replies]
    assert max(sizes) > 1
    metrics = httpx.get(f"{server['url']}/metrics").text
    values = {}
    for line in metrics.splitlines():
        if line.startswith(("deadline_serve_batch_size_sum{", "deadline_serve_batch_size_count{")):
            name, value = line.rsplit(" ", 1)
            if 'model="echo"' in name:
                values[name.split("{")[0].removeprefix("deadline_serve_")] = float(value)
    # Mean executed batch size for the echo model, as /metrics reports it.
    assert values["batch_size_count"] >= 2
    assert values["batch_size_sum"] / values["batch_size_count"] > 1.0


def test_impossible_slo_is_dropped_with_503_and_reason(server):
    reply = httpx.post(
        f"{server['url']}/infer",
        json={"model": "echo", "inputs": {"x": [[1, 2, 3, 4]]}, "slo_ms": 0.01},
    )
    assert reply.status_code == 503
    assert "deadline" in reply.text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "nope", "inputs": {"x": [[1, 2, 3, 4]]}}, 404),
        ({"model": "echo", "inputs": {"x": [[1, 2, 3]]}}, 400),
        ({"model": "echo", "inputs": {"wrong": [[1, 2, 3, 4]]}}, 400),
        ({"model": "echo"}, 400),
    ],
)
def test_malformed_requests_get_4xx_and_server_keeps_serving(server, body, status):
    reply = httpx.post(f"{server['url']}/infer", json=body)
    assert reply.status_code in (status, 422) if status == 400 else reply.status_code == status
    assert "error" in reply.json()
    ok = httpx.post(
        f"{server['url']}/infer", json={"model": "echo", "inputs": {"x": [[1, 2, 3, 4]]}}
    )
    assert ok.status_code == 200, ok.text


def test_sigterm_shuts_down_and_frees_shared_memory(server):
    process = server["process"]
    process.send_signal(signal.SIGTERM)
    # The app takes the signal from uvicorn (app/server/stop_signals.py):
    # nothing is raised again after the graceful shutdown.
    assert process.wait(timeout=30) == 0
    log = server["log"].read_text()
    assert "Application shutdown complete" in log, log
    # Only this daemon's arenas (their names carry its pid): tests of other
    # checkouts on the same machine create and remove segments meanwhile.
    assert not segments_of(process.pid)
