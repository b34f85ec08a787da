"""bench.orloj_live: the eq. 3 fit, the workload built in steps (rounding,
one body per (application, steps) pair) and, slow, a `--quick` run end to
end against the daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.repository.dynamic_models import early_exit_input, early_exit_steps
from app.workloads.arrivals import generate_arrivals
from bench.orloj_live import (
    BENCH_SIDE,
    MAX_BATCH,
    MODEL,
    Slack,
    alone_count,
    build_workload,
    main,
    plan_runs,
    request_bodies,
    step_arrivals,
)
from bench.orloj_live_calibration import CalPoint, fit_eq3, per_step_fit

ROOT = Path(__file__).resolve().parents[1]


def _cal(c0: float = 0.3, c1: float = 0.1):
    points = [CalPoint(k, s, c0 + c1 * k * s) for k in (1, 2, 4, 8) for s in (1, 4, 8, 16)]
    return fit_eq3(points, threads=2)


def test_fit_recovers_eq3_and_keeps_c0_non_negative() -> None:
    # A c0 the small points show is kept whatever the largest point does.
    wide = [CalPoint(k, s, 8.0 + 0.6 * k * s) for k in (1, 2, 4) for s in (1, 4, 8, 16)]
    skewed = fit_eq3([*wide, CalPoint(8, 16, 254.0)])
    assert skewed.c0_ms > 6.0
    cal = _cal(0.3, 0.1)
    assert cal.c0_ms == pytest.approx(0.3) and cal.c1_ms == pytest.approx(0.1)
    doc = cal.to_dict()
    assert doc["r2"] == pytest.approx(1.0) and doc["max_abs_residual_pct"] < 1e-9
    # A negative free intercept is refitted through the origin.
    # t = −0.1 + 0.5·k·s exactly: the free intercept is negative.
    steep = fit_eq3([CalPoint(1, 1, 0.4), CalPoint(8, 16, 63.9), CalPoint(4, 8, 15.9)])
    assert steep.c0_ms == 0.0
    # Through the origin, relative residuals: c1 = Σ (k·s/t) / Σ (k·s/t)².
    ratios = np.array([1 / 0.4, 128 / 63.9, 32 / 15.9])
    assert steep.c1_ms == pytest.approx(ratios.sum() / (ratios**2).sum())
    with pytest.raises(ValueError, match="two or more values of k·s"):
        fit_eq3([CalPoint(1, 4, 1.0), CalPoint(2, 2, 1.1)])


def test_per_step_fit_separates_the_loop_cost() -> None:
    points = [
        CalPoint(k, s, 0.2 + 0.05 * s + 0.1 * k * s) for k in (1, 2, 4, 8) for s in (1, 4, 8, 16)
    ]
    fit = per_step_fit(points)
    assert fit is not None
    assert fit["c_step_ms"] == pytest.approx(0.05) and fit["c1_ms"] == pytest.approx(0.1)
    assert per_step_fit([CalPoint(1, 1, 1.0), CalPoint(1, 16, 2.0)]) is None


def test_workload_rate_slo_and_the_daemons_profile() -> None:
    cal = _cal(0.3, 0.1)
    workload = build_workload(cal, load=0.5, slo_multiple=3.0, duration_s=20.0)
    model = workload.models[0]
    assert model.name == MODEL and model.max_batch == MAX_BATCH
    assert model.latency is not None
    assert (model.latency.c0_ms, model.latency.c1) == (pytest.approx(0.3), pytest.approx(0.1))
    # Capacity at the mean: E[steps] = 7.5 (means 3 and 12, shares ½),
    # ℓ(8) = 0.3 + 0.1·8·7.5 = 6.3 ms, 8 / 6.3 ms = 1269.8 r/s; load ½.
    assert model.rate == pytest.approx(0.5 * 8 / 6.3e-3, rel=1e-3)
    assert model.slo_ms == pytest.approx(3.0 * model.latency.alone_p99_ms())
    # The one-ℓ(b) policies plan with ℓ(b) at 16 steps, as the daemon measures it.
    assert model.profile.latency(1) == pytest.approx((0.3 + 0.1 * 16) / 1000)
    assert model.profile.latency(8) == pytest.approx((0.3 + 0.1 * 8 * 16) / 1000)


def test_steps_are_whole_and_work_follows_them() -> None:
    cal = _cal(0.3, 0.1)
    workload = build_workload(cal, load=0.5, slo_multiple=3.0, duration_s=20.0)
    raw = generate_arrivals(workload)
    arrivals, steps = step_arrivals(workload, raw)
    assert len(arrivals) == len(raw) == len(steps) > 10_000
    np.testing.assert_array_equal(arrivals.times, raw.times)
    np.testing.assert_array_equal(arrivals.apps, raw.apps)
    raw_steps = raw.work * 1000.0 / 0.1
    np.testing.assert_array_equal(steps, np.clip(np.rint(raw_steps), 1, 16))
    assert steps.min() >= 1 and steps.max() <= 16
    np.testing.assert_allclose(arrivals.work, 0.1 * steps / 1000.0)
    short, long = steps[raw.apps == "short"], steps[raw.apps == "long"]
    assert abs(short.mean() - 3.0) < 0.1 and abs(long.mean() - 12.0) < 0.1
    assert np.mean(raw.apps == "short") == pytest.approx(0.5, abs=0.02)


def test_one_body_per_app_and_steps_pair() -> None:
    apps = np.array(["short", "long", "short", "long", "short"], dtype=object)
    steps = np.array([3, 12, 3, 16, 2])
    pairs, variants = request_bodies(apps, steps, slo_ms=7.5)
    assert pairs == [("long", 12), ("long", 16), ("short", 2), ("short", 3)]
    assert variants.body_index.tolist() == [3, 0, 3, 1, 2]
    for (app, s), body in zip(pairs, variants.bodies, strict=True):
        doc = json.loads(body)
        assert (doc["model"], doc["app_id"], doc["slo_ms"]) == (MODEL, app, 7.5)
        x = np.asarray(doc["inputs"]["input"], dtype=np.float32)
        assert x.shape == (1, 3, BENCH_SIDE, BENCH_SIDE)
        np.testing.assert_array_equal(x, early_exit_input(s, side=BENCH_SIDE))
        assert early_exit_steps(x).tolist() == [s]


def test_plan_runs_and_alone_count() -> None:
    assert plan_runs(["orloj", "clockwork"], [0.0, 0.2]) == [
        ("orloj", 0.0),
        ("orloj", 0.2),
        ("clockwork", 0.0),
    ]
    page = (
        "# TYPE deadline_serve_alone_seconds histogram\n"
        'deadline_serve_alone_seconds_bucket{model="earlyexit",le="0.001"} 3.0\n'
        'deadline_serve_alone_seconds_count{model="earlyexit"} 41.0\n'
        'deadline_serve_alone_seconds_count{model="other"} 1.0\n'
        'deadline_serve_alone_seconds_sum{model="earlyexit"} 0.05\n'
    )
    assert alone_count(page) == 42.0
    assert Slack(3.0, 2.0).core_options() == {"deadline_margin": 0.003, "timer_lead": 0.002}
    assert Slack(1.5, 0.5).daemon_env() == {"DEADLINE_MARGIN_MS": "1.5", "TIMER_LEAD_MS": "0.5"}


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--policies", "nope"], "unknown policies ['nope']"),
        (["--load", "0"], "--load must be a positive number"),
        (["--duration", "-1"], "--duration must be a positive number"),
    ],
)
def test_bad_arguments_are_named(argv, error, capsys, tmp_path: Path) -> None:
    assert main([*argv, "--quick", "--out", str(tmp_path)]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["--quick", "--policies", "orloj", "--sample-rates", "0.2", "--duration", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert set(doc) == {"calibration", "workload", "slack", "runs"}
    cal = doc["calibration"]
    assert cal["c0_ms"] >= 0.0 and cal["c1_ms_per_row_step"] > 0.0
    assert len(cal["points"]) == 4  # quick: k ∈ {1, 8} × s ∈ {1, 16}
    workload = doc["workload"]
    assert workload["requests"] == sum(workload["requests_per_app"].values()) > 0
    assert sum(workload["steps_histogram"]) == workload["requests"]
    (run,) = doc["runs"]
    assert (run["policy"], run["sample_rate"]) == ("orloj", 0.2)
    for side in ("live", "simulated"):
        assert 0.0 <= run[side]["finish_rate"] <= 1.0
        assert run[side]["goodput_rps"] >= 0.0
        assert run[side]["summary"]["overall"]["requests"] == workload["requests"]
    assert run["live"]["alone_times"] >= 0.0
    assert run["simulated"]["params"] == {"deadline_margin": 0.002, "timer_lead": 0.001}
    summary = (out / "summary.md").read_text()
    assert "| orloj | 0.2 |" in summary


@pytest.mark.slow
def test_sigterm_mid_run_stops_the_daemon(cli_env: dict[str, str]) -> None:
    argv = ["--quick", "--policies", "orloj", "--sample-rates", "0", "--duration", "60"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.orloj_live", *argv, "--out", "/nonexistent/never"],
        cwd=ROOT,
        env=cli_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid = None
        assert bench.stderr is not None
        for line in bench.stderr:
            found = re.search(r"daemon pid (\d+)", line)
            if found:
                pid = int(found.group(1))
                break
        assert pid is not None, "the bench never started a daemon"
        time.sleep(0.5)  # into the load run
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_wide_head_keeps_steps_and_answers_per_row() -> None:
    import onnxruntime as ort

    from app.repository.dynamic_models import build_early_exit, serialize

    wide = build_early_exit(head_width=64)
    gemms = [n for n in wide.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 3  # 32 → 64 → 64 → 10 in place of 32 → 10
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(serialize(wide), so, providers=["CPUExecutionProvider"])
    rows = [early_exit_input(s, seed=s) for s in (2, 9)]
    scores, steps = session.run(None, {"input": np.concatenate(rows)})
    assert steps.ravel().tolist() == [2, 9] and scores.shape == (2, 10)
    alone, _ = session.run(None, {"input": rows[0]})
    np.testing.assert_allclose(scores[:1], alone, rtol=1e-5, atol=1e-6)


def test_the_bench_serves_either_model(tmp_path) -> None:
    from bench.orloj_live import MODELS, one_model_repository

    assert MODELS == {"earlyexit": 0, "earlyexit-wide": 4096}
    with pytest.raises(ValueError, match="model must be one of"):
        one_model_repository(tmp_path, "encoder")
    cal = _cal(8.0, 0.6)
    workload = build_workload(
        cal, load=0.5, slo_multiple=3.0, duration_s=5.0, model="earlyexit-wide"
    )
    assert workload.models[0].name == "earlyexit-wide"
    _, variants = request_bodies(np.array(["short"]), np.array([3]), 40.0, "earlyexit-wide")
    assert json.loads(variants.bodies[0])["model"] == "earlyexit-wide"
