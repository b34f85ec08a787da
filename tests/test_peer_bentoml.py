"""bench/peers: the BentoML peer (adaptive batching), its plan, grid and bodies.

BentoML runs in its own venv (``python -m bench.peers.bentoml_launcher
--setup``; its OpenTelemetry pins conflict with the server's). Where that venv
is missing the service tests skip saying so, except under CI (``CI`` set),
where they fail: CI creates it.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.scheduling.profile import LatencyProfile
from bench.loadgen.targets import build_body
from bench.peers.bentoml_grid import bentoml_grid, bentoml_request
from bench.peers.bentoml_launcher import (
    PEER_VENV,
    api_name,
    parse_per_model,
    peer_python_path,
    plan_service,
)
from bench.peers.ray_grid import ModelTarget
from bench.peers.session import free_port, session_processes
from tests.conftest import peer_missing, time_limit

REPO_ROOT = Path(__file__).resolve().parents[1]
LIVE = REPO_ROOT / "bench" / "repositories" / "live"
TEST_LIMIT_S = 120
META = [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]

# ℓ(b) = 20·b + 20 ms with max_latency_ms 30: a batch of one already misses,
# so of a burst all but the first few are shed (none can be served in time).
SLOW_CONFIG = """\
backend: emulated
inputs:
  - {name: input, datatype: FP32, shape: [-1, 4]}
outputs:
  - {name: output, datatype: FP32, shape: [-1, 4]}
max_batch_size: 4
slo_ms: 30
profile: {alpha_ms: 20, beta_ms: 20}
"""


# ------------------------------------------------------------------ plan, grid


def test_plan_defaults_to_each_models_slo_and_max_batch():
    config = plan_service(LIVE, devices=2, models=["resnet50-t4", "xception-1080ti"])
    assert config["device_kind"] == "emulated" and config["workers"] == 2
    assert config["threads"] == 1
    by_name = {m["name"]: m for m in config["models"]}
    assert by_name["resnet50-t4"]["max_latency_ms"] == 25.0
    assert by_name["xception-1080ti"]["max_latency_ms"] == 42.0
    assert {m["max_batch_size"] for m in config["models"]} == {32}
    assert by_name["resnet50-t4"]["route"] == "/infer/resnet50-t4"
    assert by_name["resnet50-t4"]["api"] == api_name("resnet50-t4") == "infer_resnet50_t4"
    assert by_name["resnet50-t4"]["input"] == "input"

    tuned = plan_service(
        LIVE,
        devices=1,
        models=["resnet50-t4", "xception-1080ti"],
        max_latency_ms={"resnet50-t4": 12.5},
        max_batch_size=64,  # capped at the model's 32
    )
    by_name = {m["name"]: m for m in tuned["models"]}
    assert by_name["resnet50-t4"]["max_latency_ms"] == 12.5
    assert by_name["xception-1080ti"]["max_latency_ms"] == 42.0
    assert by_name["resnet50-t4"]["max_batch_size"] == 32


def test_plan_rejects_unknown_models_and_bad_values():
    with pytest.raises(ValueError, match="nope"):
        plan_service(LIVE, devices=1, models=["nope"])
    with pytest.raises(ValueError, match="max_latency_ms must be > 0"):
        plan_service(LIVE, devices=1, models=["resnet50-t4"], max_latency_ms=0)
    with pytest.raises(ValueError, match="max_batch_size must be ≥ 1"):
        plan_service(LIVE, devices=1, models=["resnet50-t4"], max_batch_size=0)
    with pytest.raises(ValueError, match="at least one worker"):
        plan_service(LIVE, devices=0, models=["resnet50-t4"])


def test_parse_per_model():
    assert parse_per_model("25", float) == 25.0
    assert parse_per_model("a=8,b=4", int) == {"a": 8, "b": 4}


def test_grid_is_batch_rules_times_latency_fractions():
    # ℓ(b) = 0.5 b + 5 ms, SLO 20 ms, max batch 32: ℓ(b) ≤ 10 → b = 10.
    tiny = ModelTarget("tiny", LatencyProfile.linear(0.5, 5, 32), 0.020, 32)
    grid = bentoml_grid([tiny])
    assert [(p.rule, p.max_batch_size["tiny"], p.max_latency_ms["tiny"]) for p in grid] == [
        (rule, b, ms) for rule, b in (("max", 32), ("slo/2", 10)) for ms in (20, 15, 10)
    ]
    kwargs = grid[0].start_kwargs()
    assert kwargs == {"max_batch_size": {"tiny": 32}, "max_latency_ms": {"tiny": 20}}
    # Both rules give the same batch when it is small: duplicates dropped.
    fast = ModelTarget("fast", LatencyProfile.linear(0.01, 0.1, 8), 1.0, 8)
    assert len(bentoml_grid([fast], latency_fractions=(1.0,))) == 1
    with pytest.raises(ValueError, match="fractions"):
        bentoml_grid([tiny], latency_fractions=(1.5,))


def test_request_body_is_the_daemons_inputs_with_the_same_data():
    path, body = bentoml_request("resnet50-t4", META, 25.0, seed=7)
    assert path == "/infer/resnet50-t4"
    doc = json.loads(body)
    native = json.loads(build_body("resnet50-t4", META, 25.0, seed=7))
    assert doc == native["inputs"]
    assert np.asarray(doc["input"]).shape == (1, 16)
    with pytest.raises(ValueError, match="one input"):
        bentoml_request("m", [*META, {"name": "b", "datatype": "FP32", "shape": [-1, 2]}], 1.0)


# -------------------------------------------------------------------- service


def _require_peer_venv() -> None:
    if not peer_python_path(PEER_VENV).exists():
        peer_missing(
            f"no BentoML peer venv at {PEER_VENV}: "
            "run `python -m bench.peers.bentoml_launcher --setup`"
        )


@pytest.fixture
def hard_timeout() -> Iterator[None]:
    with time_limit(TEST_LIMIT_S, "BentoML peer test"):
        yield


@pytest.fixture
def started(hard_timeout: None) -> Iterator[list]:
    """Handles the test starts; each is stopped (by its PID) however the test ends."""
    from bench.peers.bentoml_launcher import stop

    _require_peer_venv()
    handles: list = []
    yield handles
    for handle in handles:
        if handle.process.poll() is None:
            stop(handle)


def _batch_histogram(url: str, api: str) -> tuple[float, float]:
    """(requests, batches) BentoML's adaptive-batch-size histogram counted."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for kind in ("sum", "count"):
        m = re.search(
            rf'^bentoml_service_adaptive_batch_size_{kind}\{{[^}}]*method_name="{api}"[^}}]*\}} '
            r"(\S+)$",
            text,
            re.M,
        )
        assert m, f"no adaptive_batch_size_{kind} for {api} in /metrics"
        values[kind] = float(m.group(1))
    return values["sum"], values["count"]


async def _burst(url: str, path: str, bodies: list[bytes]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(
                client.post(path, content=b, headers={"content-type": "application/json"})
                for b in bodies
            )
        )


@pytest.mark.slow
def test_bentoml_serves_an_emulated_model_batches_and_stops(started):
    from bench.peers.bentoml_launcher import start_bentoml, stop

    # A generous max_latency_ms: this test is about serving and batching, and on
    # a loaded box the SLO's 25 ms would shed part of a burst (tested below).
    handle = start_bentoml(
        LIVE, free_port(), devices=1, models=["resnet50-t4"], max_latency_ms=2000
    )
    started.append(handle)
    assert handle.startup_s > 0 and handle.config["workers"] == 1
    assert handle.config["models"][0]["max_latency_ms"] == 2000
    assert httpx.get(f"{handle.url}/readyz", timeout=10).status_code == 200

    path, body = bentoml_request("resnet50-t4", META, 25.0, seed=3)
    r = httpx.post(handle.url + path, content=body, timeout=30)
    assert r.status_code == 200, r.text
    out = np.asarray(r.json(), dtype=np.float32)
    assert out.shape == (1, 16)
    np.testing.assert_allclose(out, np.asarray(json.loads(body)["input"], np.float32))

    # Bursts of distinct rows: each answer is its own row (echo), and once the
    # dispatcher has warmed up (its first batches are of one) rows share batches.
    rows = [[float(i), i + 0.25] + [0.0] * 14 for i in range(16)]
    bodies = [json.dumps({"input": [row]}).encode() for row in rows]
    for _ in range(4):
        responses = asyncio.run(_burst(handle.url, path, bodies))
        for row, resp in zip(rows, responses, strict=True):
            assert resp.status_code == 200, resp.text
            np.testing.assert_allclose(resp.json(), [row])
    requests, batches = _batch_histogram(handle.url, "infer_resnet50_t4")
    assert requests == 1 + 4 * len(rows)
    assert batches < requests, (requests, batches)  # some batch held more than one

    pid = handle.pid
    assert session_processes(pid)
    result = stop(handle)
    assert result["killed"] == [], result
    assert session_processes(pid) == []
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.slow
def test_bentoml_sheds_requests_predicted_to_miss_max_latency_with_503(started, tmp_path):
    from bench.peers.bentoml_launcher import start_bentoml

    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "config.yaml").write_text(SLOW_CONFIG)
    handle = start_bentoml(tmp_path, free_port(), devices=1, max_latency_ms=30)
    started.append(handle)
    meta = [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    bodies = [bentoml_request("slow", meta, 30.0, seed=i)[1] for i in range(20)]
    responses = asyncio.run(_burst(handle.url, "/infer/slow", bodies))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503}, codes
    # 20 requests at ≥ 40 ms a batch of one cannot all end within 30 ms.
    assert codes.count(503) >= 10, codes


@pytest.mark.slow
def test_bentoml_serves_the_onnx_mlp_like_the_daemons_backend(started):
    from app.repository.loader import load_model_config
    from app.runtime.onnx_backend import OnnxBackend
    from bench.peers.bentoml_launcher import start_bentoml

    models = REPO_ROOT / "app" / "models"
    handle = start_bentoml(models, free_port(), devices=1, models=["mlp"], cpu_threads=1)
    started.append(handle)
    assert handle.config["device_kind"] == "cpu"
    meta = [{"name": "input", "datatype": "FP32", "shape": [-1, 4096]}]
    path, body = bentoml_request("mlp", meta, 100.0, seed=5)
    r = httpx.post(handle.url + path, content=body, timeout=60)
    assert r.status_code == 200, r.text
    out = np.asarray(r.json(), dtype=np.float32)
    assert out.shape == (1, 4096)

    backend = OnnxBackend("cpu", 0, 1)
    backend.load(load_model_config(models / "mlp"))
    x = np.asarray(json.loads(body)["input"], dtype=np.float32)
    expected = backend.run({"input": x})["output"]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
