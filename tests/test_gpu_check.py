"""The CPU dry run of bench.gpu_check (the GPU run's script, docs/gpu.md):
every step it can run without CUDA, at tiny sizes, so that the script
cannot rot while no GPU runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# One of the script's four policies, the preempting one: the others take the
# same path through the script, at 9 s each on two cores.
POLICIES = ("flex",)
# The dry run times real batches and fits ℓ(b) = α·b + β to them: another
# test worker on the other core makes the times noisy enough to fit α < 0.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    command = ["bench.gpu_check", "--dry-run", "--out", str(out), "--policies", ",".join(POLICIES)]
    done = subprocess.run(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    report["_table"] = (out / "gpu_check.md").read_text()
    return report


@pytest.mark.slow
def test_dry_run_records_every_step(dry_run: dict) -> None:
    steps = dry_run["steps"]
    expected = {"wheels", "environment", "models", "profile", "preemption", "mps"}
    expected |= {"two_executors", "ceiling"} | {f"capacity_{p}" for p in POLICIES}
    assert set(steps) == expected
    assert dry_run["mode"] == "cpu-dry-run"
    assert dry_run["seconds"] <= 60
    for name in ("wheels", "environment", "models", "profile", "preemption", "ceiling"):
        assert steps[name]["status"] == "ok", (name, steps[name])
    # The GPU-only steps say why they did not run.
    for name in ("mps", "two_executors"):
        assert steps[name] == {"status": "skipped", "reason": "skipped: no CUDA"}
    for name, rec in steps.items():
        assert rec["status"] in ("ok", "failed", "skipped"), name
        assert rec["status"] != "failed", (name, rec.get("error"))
        assert rec["status"] == "ok" or rec["reason"].startswith("skipped: "), name
        assert f"| {name} | {rec['status']} |" in dry_run["_table"]


@pytest.mark.slow
def test_dry_run_profile_has_a_fit(dry_run: dict) -> None:
    profile = dry_run["steps"]["profile"]
    for model in ("resnet50", "torchcnn"):
        p = profile[model]
        assert p["device"] == "cpu"
        table = {int(b): ms for b, ms in p["latency_ms"].items()}
        assert set(table) == {1, 2, 4, 8}
        assert all(ms > 0 for ms in table.values())
        assert 0.0 <= p["r2"] <= 1.0
        assert p["alpha_ms"] > 0
        assert p["exit_points"] >= 1
    # The served ResNet takes a smaller image (the same module), profiled apart.
    served = profile["resnet50_served"]
    assert served["image"] == 24 and set(served["latency_ms"]) == {"1", "2", "4", "8"}
    assert 0.0 <= served["r2"] <= 1.0
    slo = profile["slo"]
    assert slo["slo_ms"] == max(slo["three_l1_ms"], slo["min_slo_ms"])
    assert slo["three_l1_ms"] == pytest.approx(3 * served["latency_ms"]["1"])


@pytest.mark.slow
def test_dry_run_serves_every_policy(dry_run: dict) -> None:
    steps = dry_run["steps"]
    slo_ms = steps["profile"]["slo"]["slo_ms"]
    for policy in POLICIES:
        rec = steps[f"capacity_{policy}"]
        assert rec["status"] == "ok", (policy, rec)
        assert rec["policy"] == policy and rec["slo_ms"] == slo_ms
        assert rec["capacity_rps"] > 0, (policy, rec["probes"])
        assert rec["probes"] and all(p["offered_rps"] > 0 for p in rec["probes"])
    assert steps["ceiling"]["capacity_rps"] > 0


@pytest.mark.slow
def test_dry_run_stops_batches_at_exit_points(dry_run: dict) -> None:
    points = dry_run["steps"]["preemption"]["torchcnn"]["points"]
    assert [p["batch"] for p in points] == [1, 8]
    stopped = [p for p in points if p["stops"]]
    assert stopped, points
    for p in stopped:
        assert 0 < p["delay_median_ms"] <= p["delay_p99_ms"]
        # A stop waits for at most the rest of one stage, far less than the batch.
        assert p["delay_median_ms"] < p["normal_ms"]


def test_each_step_records_its_failure_and_the_others_go_on() -> None:
    from bench.gpu_check import Budget, Run

    recorded = []
    run = Run(Budget(100.0), cuda=False, on_record=lambda: recorded.append(len(run.steps)))

    def broken() -> dict:
        raise ValueError("no such model")

    assert run.step("a", broken) is None
    assert run.steps["a"]["status"] == "failed"
    assert run.steps["a"]["error"] == "ValueError: no such model"
    assert "ValueError" in run.steps["a"]["traceback"]
    assert run.step("b", lambda: {"x": 1}, needs=("a",)) is None
    assert run.steps["b"] == {"status": "skipped", "reason": "skipped: needs a"}
    ok = run.step("c", lambda: {"x": 2})
    assert ok is not None and ok["status"] == "ok" and ok["x"] == 2 and ok["seconds"] >= 0
    assert run.step("d", lambda: {"x": 3}, needs_cuda=True) is None
    assert run.steps["d"] == {"status": "skipped", "reason": "skipped: no CUDA"}
    assert recorded == [1, 2, 3, 4]  # the report is written after every step
    spent = Run(Budget(5.0), cuda=True)
    assert spent.step("e", lambda: {"x": 4}, needs_cuda=True, min_s=8.0) is None
    assert spent.steps["e"]["reason"].startswith("skipped: time budget (5 s left, needs 8 s")


def test_the_capacity_search_starts_below_the_front_door() -> None:
    from bench.gpu_check import nominal_rate

    latency = {"1": 2.0, "8": 4.0, "32": 10.0, "64": 30.0}
    # Batches within half the SLO (15 ms): b = 32 gives 3200 r/s, half of it.
    assert nominal_rate(latency, 30.0, None, 0.5) == pytest.approx(1600.0)
    assert nominal_rate(latency, 30.0, 1000.0, 0.5) == pytest.approx(500.0)
    # Nothing fits: half of what batches of one sustain.
    assert nominal_rate({"1": 20.0}, 15.0, None, 0.5) == pytest.approx(25.0)


def test_missing_wheels_are_installed_from_the_folder_named(monkeypatch, tmp_path) -> None:
    import subprocess as sp

    from bench import gpu_check

    monkeypatch.setattr(gpu_check, "NEEDED", {"json": "json", "no_such_mod_gc": "no-such-dist"})
    with pytest.raises(RuntimeError, match=r"missing \['no-such-dist'\] and no --wheels DIR"):
        gpu_check.install_wheels(None)
    calls = []

    def pip(cmd, **kwargs):
        calls.append(cmd)
        return sp.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(gpu_check.subprocess, "run", pip)
    with pytest.raises(RuntimeError, match=r"still missing \['no-such-dist'\].*No matching"):
        gpu_check.install_wheels(tmp_path)
    [cmd] = calls
    find = ["--no-index", "--find-links", str(tmp_path)]
    assert cmd[1:] == ["-m", "pip", "install", "-q", *find, "no-such-dist"]
    monkeypatch.setattr(gpu_check, "NEEDED", {"json": "json"})
    assert gpu_check.install_wheels(None) == {"missing": [], "installed": []}
