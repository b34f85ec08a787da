"""bench/peers: the real Triton Inference Server peer — its generated model
repository, its grid, its KServe v2 requests, and the server itself (the
``tritonserver`` binary of the nvidia-pytriton wheel, installed with
``pip install --no-deps nvidia-pytriton==0.7.0``; the server tests skip, saying
so, where it is absent)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from app.repository import BUNDLED_REPOSITORY
from app.repository.loader import load_repository
from bench.peers.ray_grid import target_from_config
from bench.peers.session import free_port, session_processes
from bench.peers.triton_grid import pick_best, triton_grid
from bench.peers.triton_launcher import (
    KSERVE_HEADERS,
    TritonHandle,
    TritonUnavailable,
    find_triton,
    kserve_request,
    start_triton,
    stop,
)
from bench.peers.triton_repository import write_triton_repository
from tests.conftest import peer_missing, time_limit

LIVE = Path(__file__).resolve().parents[1] / "bench" / "repositories" / "live"
SERVER_TEST_LIMIT_S = 120
INPUT_16 = [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]


# ------------------------------------------------------------------ repository


def _parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_config_pbtxt_is_a_triton_config_with_the_batcher_and_one_instance_per_device(tmp_path):
    models = write_triton_repository(
        LIVE,
        tmp_path / "models",
        devices=2,
        max_queue_delay_us=3000,
        queue_timeout_us={"resnet50-t4": 18875},
        max_batch_size={"resnet50-t4": 18, "xception-1080ti": 64},
        preferred_batch_sizes=(4, 8, 20),
        models=["resnet50-t4", "xception-1080ti"],
    )
    assert [m.name for m in models] == ["resnet50-t4", "xception-1080ti"]
    resnet = _parse((tmp_path / "models" / "resnet50-t4" / "config.pbtxt").read_text())
    assert resnet.name == "resnet50-t4" and resnet.backend == "python"
    assert resnet.max_batch_size == 18
    assert [(t.name, t.data_type, list(t.dims)) for t in resnet.input] == [
        ("input", model_config_pb2.TYPE_FP32, [16])
    ]
    assert [(t.name, list(t.dims)) for t in resnet.output] == [("output", [16])]
    batching = resnet.dynamic_batching
    assert batching.max_queue_delay_microseconds == 3000
    assert list(batching.preferred_batch_size) == [4, 8]  # 20 > the batch size of 18
    policy = batching.default_queue_policy
    assert policy.timeout_action == policy.REJECT
    assert policy.default_timeout_microseconds == 18875
    assert policy.allow_timeout_override is True
    groups = [(g.name, g.count, g.kind) for g in resnet.instance_group]
    cpu = model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert groups == [("device0", 1, cpu), ("device1", 1, cpu)]
    params = {k: v.string_value for k, v in resnet.parameters.items()}
    assert params["source_directory"] == str((LIVE / "resnet50-t4").resolve())
    assert params["device_kind"] == "emulated" and params["threads"] == "1"
    # Two models share both emulated devices: a lock per device, outside the repository.
    assert params["lock_directory"] == str((tmp_path / "models-devices").resolve())
    assert (tmp_path / "models-devices").is_dir()

    xception = _parse((tmp_path / "models" / "xception-1080ti" / "config.pbtxt").read_text())
    assert xception.max_batch_size == 32  # capped at the model's own maximum
    assert not xception.dynamic_batching.HasField("default_queue_policy")  # no timeout given
    model_py = (tmp_path / "models" / "xception-1080ti" / "1" / "model.py").read_text()
    assert "from bench.peers.triton_model import TritonPythonModel" in model_py
    compile(model_py, "model.py", "exec")


def test_repository_partition_one_model_no_lock_and_errors(tmp_path):
    (solo,) = write_triton_repository(LIVE, tmp_path / "a", devices=3, models=["resnet50-t4"])
    assert solo.device_ids == (0, 1, 2) and solo.lock_directory is None
    assert solo.queue_timeout_us is None and solo.max_queue_delay_us == 0
    split = write_triton_repository(
        LIVE,
        tmp_path / "b",
        devices=3,
        models=["resnet50-t4", "xception-1080ti"],
        device_sharing="partition",
    )
    assert [m.device_ids for m in split] == [(0, 2), (1,)]
    assert all(m.lock_directory is None for m in split)
    with pytest.raises(ValueError, match="not empty"):
        write_triton_repository(LIVE, tmp_path / "b", devices=1)
    with pytest.raises(ValueError, match=r"\['nope'\] are not in"):
        write_triton_repository(LIVE, tmp_path / "c", devices=1, models=["nope"])
    with pytest.raises(ValueError, match="names models not served"):
        write_triton_repository(
            LIVE, tmp_path / "d", devices=1, models=["resnet50-t4"], queue_timeout_us={"x": 5}
        )
    with pytest.raises(ValueError, match="microseconds"):
        write_triton_repository(LIVE, tmp_path / "e", devices=1, max_queue_delay_us=-1)


# ------------------------------------------------------------------------ grid


def test_grid_is_three_delays_by_no_timeout_or_slo_minus_l1():
    config = load_repository(LIVE).models["resnet50-t4"]
    target = target_from_config(config)
    grid = triton_grid([target])
    # ℓ(b) = 1.053 b + 5.072 ms, SLO 25 ms: ℓ(b) ≤ 25 → b = 18; SLO − ℓ(1) = 18.875 ms.
    assert [(p.max_queue_delay_us, dict(p.queue_timeout_us)) for p in grid] == [
        (d, {"resnet50-t4": t}) for d in (0, 1000, 3000) for t in (None, 18875)
    ]
    assert {p.max_batch_size["resnet50-t4"] for p in grid} == {18}
    assert grid[3].launch_options() == {
        "max_batch_size": {"resnet50-t4": 18},
        "max_queue_delay_us": 1000,
        "queue_timeout_us": {"resnet50-t4": 18875},
    }
    results = [{"capacity_rps": c, "overall": {}} for c in (150, 160, 180, 200, 223, 223)]
    best, result = pick_best(zip(grid, results, strict=True))
    assert best == grid[4] and result["capacity_rps"] == 223  # ties: the earlier point


# -------------------------------------------------------------------- requests


def test_kserve_request_is_a_v2_body_of_one_row():
    path, body = kserve_request(
        "m",
        [
            {"name": "x", "datatype": "FP32", "shape": [-1, 2, 3]},
            {"name": "ids", "datatype": "INT64", "shape": [4]},
        ],
        slo_ms=25,
        seed=3,
    )
    assert path == "/v2/models/m/infer"
    doc = json.loads(body)
    assert set(doc) == {"inputs"}
    x, ids = doc["inputs"]
    assert (x["name"], x["datatype"], x["shape"], len(x["data"])) == ("x", "FP32", [1, 2, 3], 6)
    assert all(-1.0 <= v < 1.0 for v in x["data"])
    assert (ids["shape"], len(ids["data"])) == ([1, 4], 4)
    assert all(isinstance(v, int) and 0 <= v < 10 for v in ids["data"])
    assert (
        kserve_request("m", [{"name": "x", "datatype": "FP32", "shape": [2]}], 25, 3)[1]
        != (kserve_request("m", [{"name": "x", "datatype": "FP32", "shape": [2]}], 25, 4)[1])
    )
    with pytest.raises(ValueError, match="variable dimension"):
        kserve_request("m", [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}], 25)


# ---------------------------------------------------------------------- server


@pytest.fixture
def triton_available() -> None:
    try:
        find_triton()
    except TritonUnavailable as exc:
        peer_missing(f"Triton peer not installed: {exc}")


@pytest.fixture
def hard_timeout() -> Iterator[None]:
    with time_limit(SERVER_TEST_LIMIT_S, "Triton test"):
        yield


@contextlib.contextmanager
def running(repository: Path, **options) -> Iterator[TritonHandle]:
    handle = start_triton(repository, free_port(), startup_timeout_s=60, **options)
    try:
        yield handle
    finally:
        stop(handle)


def _assert_gone(handle: TritonHandle) -> None:
    assert handle.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(handle.pid, 0)
    assert session_processes(handle.pid) == []
    assert handle.run_dir is None  # removed: a clean exit


@pytest.mark.slow
@pytest.mark.usefixtures("triton_available", "hard_timeout")
def test_triton_serves_the_emulated_model_batches_echoes_and_stops():
    rows = np.arange(8 * 16, dtype=np.float32).reshape(8, 16) / 7
    with running(LIVE, devices=1, models=["resnet50-t4"], max_queue_delay_us=3000) as handle:
        assert handle.startup_s > 0 and handle.models[0]["devices"] == ["emulated:0"]
        # One stub process per instance, in the server's session.
        stubs = [c for _, c in session_processes(handle.pid) if "python_backend_stub" in c]
        assert len(stubs) == 1

        path, body = kserve_request("resnet50-t4", INPUT_16, slo_ms=25, seed=1)
        one = httpx.post(handle.url + path, content=body, headers=KSERVE_HEADERS, timeout=30)
        assert "content-encoding" not in one.headers
        assert one.status_code == 200, one.text
        (out,) = one.json()["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == ("output", "FP32", [1, 16])
        np.testing.assert_allclose(out["data"], json.loads(body)["inputs"][0]["data"], rtol=1e-6)

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=handle.url, timeout=30) as client:
                return await asyncio.gather(
                    *(
                        client.post(
                            path,
                            json={
                                "inputs": [
                                    {
                                        "name": "input",
                                        "shape": [1, 16],
                                        "datatype": "FP32",
                                        "data": row.tolist(),
                                    }
                                ]
                            },
                        )
                        for row in rows
                    )
                )

        for row, r in zip(rows, asyncio.run(burst()), strict=True):
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json()["outputs"][0]["data"], row, rtol=1e-6)
        stats = httpx.get(f"{handle.url}/v2/models/resnet50-t4/stats").json()["model_stats"][0]
        assert stats["inference_count"] == 9
        assert stats["execution_count"] < 9  # the dynamic batcher batched the burst
    _assert_gone(handle)


SLOW_CONFIG = """\
backend: emulated
inputs:
  - {name: input, datatype: FP32, shape: [-1, 4]}
outputs:
  - {name: output, datatype: FP32, shape: [-1, 4]}
max_batch_size: 1
slo_ms: 1000
profile: {alpha_ms: 0, beta_ms: 300}
"""


@pytest.mark.slow
@pytest.mark.usefixtures("triton_available", "hard_timeout")
def test_triton_rejects_a_request_past_its_queue_timeout(tmp_path):
    # Batches of one that hold the device 300 ms, a 10 ms queue timeout: of two
    # requests sent together one runs, the other waits far past its timeout.
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "config.yaml").write_text(SLOW_CONFIG)
    with running(tmp_path, devices=1, queue_timeout_us=10_000) as handle:
        path, body = kserve_request(
            "slow", [{"name": "input", "datatype": "FP32", "shape": [4]}], 1
        )

        def send(_: int) -> httpx.Response:
            return httpx.post(handle.url + path, content=body, timeout=30)

        with ThreadPoolExecutor(2) as pool:
            answers = sorted(pool.map(send, range(2)), key=lambda r: r.status_code)
        assert [r.status_code for r in answers] == [200, 503]
        # Triton's answer to a REJECTed request.
        assert answers[1].json() == {"error": "Request timeout expired"}
    _assert_gone(handle)


@pytest.mark.slow
@pytest.mark.usefixtures("triton_available", "hard_timeout")
def test_triton_runs_the_bundled_onnx_mlp():
    from app.repository.bundled import ensure_bundled_models

    ensure_bundled_models(BUNDLED_REPOSITORY, ["mlp"])
    with running(BUNDLED_REPOSITORY, devices=1, models=["mlp"], cpu_threads=1) as handle:
        assert handle.models[0]["devices"] == ["cpu:0"]
        meta = [{"name": "input", "datatype": "FP32", "shape": [-1, 4096]}]
        path, body = kserve_request("mlp", meta, slo_ms=100, seed=2)
        r = httpx.post(handle.url + path, content=body, timeout=60)
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == ("output", "FP32", [1, 4096])
        # The same numbers as the daemon's ONNX backend on the same input.
        from app.runtime.onnx_backend import OnnxBackend

        config = load_repository(BUNDLED_REPOSITORY).models["mlp"]
        backend = OnnxBackend("cpu", 0, 1)
        backend.load(config)
        x = np.asarray(json.loads(body)["inputs"][0]["data"], dtype=np.float32).reshape(1, 4096)
        expected = backend.run({"input": x})["output"]
        np.testing.assert_allclose(out["data"], expected[0], rtol=1e-4, atol=1e-5)
    _assert_gone(handle)


# ------------------------------------------------------------- what it needs


def test_missing_wheel_or_shared_libpython_is_a_clear_error(monkeypatch):
    import importlib.util
    import sysconfig

    from bench.peers import triton_launcher

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TritonUnavailable, match=r"pip install --no-deps nvidia-pytriton==0\.7\.0"):
        triton_launcher.find_triton()
    monkeypatch.undo()

    real = sysconfig.get_config_var
    fake = {"LIBDIR": "/nonexistent/lib", "LIBPL": None, "INSTSONAME": "libpython3.11.so.1.0"}
    monkeypatch.setattr(sysconfig, "get_config_var", lambda key: fake.get(key, real(key)))
    with pytest.raises(TritonUnavailable, match=r"libpython3\.11\.so\.1\.0.*--enable-shared"):
        triton_launcher.libpython_dir()


def test_instances_know_their_device_from_the_group_name():
    from bench.peers.triton_model import device_index, split_rows

    assert device_index("device0") == 0 and device_index("device12_0") == 12
    with pytest.raises(ValueError, match="device<k>"):
        device_index("resnet50-t4_0_0")
    pieces = split_rows(np.arange(12).reshape(6, 2), [1, 3, 2])
    assert [p.tolist() for p in pieces] == [[[0, 1]], [[2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11]]]
