"""bench/peers: the Ray Serve peer and its tuning grid. Ray Serve is in the
`test` extra (and the `peers` one), so the peer's test always runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.scheduling.profile import LatencyProfile
from bench.daemon_launcher import free_port
from bench.peers.ray_grid import ModelTarget, candidate_grid, pick_best, target_from_config
from tests.conftest import require_peer

TINY_CONFIG = """\
backend: emulated
inputs:
  - {name: input, datatype: FP32, shape: [-1, 4]}
outputs:
  - {name: output, datatype: FP32, shape: [-1, 4]}
max_batch_size: 32
slo_ms: 20
profile: {alpha_ms: 0.5, beta_ms: 5}
"""


def _tiny_repository(root: Path) -> Path:
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "config.yaml").write_text(TINY_CONFIG)
    return root


# ----------------------------------------------------------------------- grid


def test_grid_is_half_slo_and_slo_batches_times_waits(tmp_path):
    from app.repository.loader import load_repository

    config = load_repository(_tiny_repository(tmp_path)).models["tiny"]
    target = target_from_config(config)
    # ℓ(b) = 0.5 b + 5 ms, SLO 20 ms: ℓ(b) ≤ 10 → b = 10; ℓ(b) ≤ 20 → b = 30.
    grid = candidate_grid([target])
    assert [(p.rule, p.single_batch_size(), p.batch_wait_timeout_s) for p in grid] == [
        (rule, b, w) for rule, b in (("slo/2", 10), ("slo", 30)) for w in (0, 0.001, 0.002, 0.005)
    ]
    # Capped at the model's max batch; duplicates dropped.
    fast = ModelTarget("fast", LatencyProfile.linear(0.01, 0.1, 8), 1.0, 8)
    assert [p.single_batch_size() for p in candidate_grid([fast], waits_s=(0.0,))] == [8]
    # Several models: one rule for all of them per point.
    both = candidate_grid([target, fast], waits_s=(0.0,))
    assert [dict(p.max_batch_size) for p in both] == [
        {"tiny": 10, "fast": 8},
        {"tiny": 30, "fast": 8},
    ]


def test_pick_best_prefers_capacity_then_goodput_then_attainment():
    grid = candidate_grid(
        [ModelTarget("m", LatencyProfile.linear(0.5, 5, 32), 0.02, 32)], waits_s=(0.0, 0.002)
    )
    results = [
        {"overall": {"goodput_rps": 900, "slo_attainment": 0.99, "latency_p99_ms": 19}},
        {"overall": {"goodput_rps": 950, "slo_attainment": 0.97, "latency_p99_ms": 25}},
        {"overall": {"goodput_rps": 950, "slo_attainment": 0.98, "latency_p99_ms": 30}},
        {"overall": {"goodput_rps": 700, "slo_attainment": 0.90, "latency_p99_ms": 40}},
    ]
    point, result = pick_best(zip(grid, results, strict=True))
    assert point == grid[2] and result is results[2]
    capacities = (800, 600, 500, 810)
    with_capacity = [dict(r, capacity_rps=c) for r, c in zip(results, capacities, strict=True)]
    assert pick_best(zip(grid, with_capacity, strict=True))[0] == grid[3]


# ------------------------------------------------------------------ Ray Serve


@pytest.fixture(scope="module")
def ray_serve(tmp_path_factory):
    require_peer("ray")  # Ray Serve (the `peers` or `test` extra), else skipped saying so
    from bench.peers.ray_serve_launcher import start_ray_serve, stop

    repo = _tiny_repository(tmp_path_factory.mktemp("repo"))
    handle = start_ray_serve(
        repo,
        free_port(),
        devices=1,
        max_batch_size=16,
        batch_wait_timeout_s=0.002,
        cpu_threads=1,
        startup_timeout_s=50,
    )
    yield handle
    stop(handle)


@pytest.mark.slow
def test_ray_serve_echoes_each_row_batches_and_stops_cleanly(ray_serve):
    from bench.peers.ray_serve_launcher import stop
    from bench.peers.session import session_processes

    handle = ray_serve
    assert handle.info["deployments"][0]["replicas"] == 1
    rows = [[float(i), i + 0.25, -float(i), i * 2.0] for i in range(32)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=handle.url, timeout=30) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/infer",
                        json={"model": "tiny", "inputs": {"input": row}, "id": f"r{i}"},
                    )
                    for i, row in enumerate(rows)
                )
            )

    responses = asyncio.run(burst())
    sizes = []
    for i, (row, r) in enumerate(zip(rows, responses, strict=True)):
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["model"] == "tiny" and doc["id"] == f"r{i}"
        out = doc["outputs"]["output"]
        assert out["shape"] == [1, 4] and out["datatype"] == "FP32"
        np.testing.assert_allclose(out["data"], [row])
        timing = doc["timing"]
        assert set(timing) == {"queue_ms", "exec_ms", "batch_size", "device"}
        assert timing["device"] == "emulated:0"
        b = timing["batch_size"]
        # The replica held the device for ℓ(b) = 0.5 b + 5 ms, as EmulatedBackend does.
        assert timing["exec_ms"] >= 0.5 * b + 5 - 0.05
        sizes.append(b)
    assert max(sizes) > 1, sizes
    assert max(sizes) <= 16

    # The daemon's error bodies: 400 invalid input, 404 unknown model.
    with httpx.Client(base_url=handle.url, timeout=10) as client:
        bad = client.post("/infer", json={"model": "tiny", "inputs": {"input": [1, 2, 3]}})
        assert bad.status_code == 400 and bad.json()["reason"] == "invalid_input"
        missing = client.post("/infer", json={"model": "nope", "inputs": {"input": rows[0]}})
        assert missing.status_code == 404 and missing.json()["reason"] == "model_not_found"

    sid = handle.process.pid
    assert session_processes(sid), "Ray's processes run in the launcher's session"
    result = stop(handle)
    assert handle.process.returncode == 0
    assert result["killed"] == [], result  # Ray shut itself down; nothing was left over
    assert session_processes(sid) == []
