"""bench/ppipe_live.py's plan search and capacity bisection, on a made-up
block profile and a made-up attainment curve (no measurement)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from app.planning.ppipe.plan import read_reference_plan, write_plan
from app.planning.ppipe.profiles import BUNDLED_DIR, BlockProfile
from bench import ppipe_plan_sim
from bench.ppipe_capacity import bisect
from bench.ppipe_live import search_plan

MS = 0.001


def profile() -> BlockProfile:
    """10 blocks of 1 ms per item on `fast`, 3 ms on `slow`."""
    per_item = np.array([1.0, 2.0, 3.0, 4.0])
    return BlockProfile(
        "m",
        {
            ("fast", 1): np.tile(MS * per_item, (10, 1)),
            ("slow", 1): np.tile(3 * MS * per_item, (10, 1)),
        },
        np.full(9, 1024.0),
    )


def test_the_search_balances_one_fast_instance_against_two_slow_ones():
    plan = search_plan(profile(), {"fast": 1, "slow": 2}, slo_s=0.05, margin=0.4, max_batch=4)
    (pipeline,) = plan.pipelines
    first, second = pipeline.stages
    # fast [0, 6): 6 ms an item; slow [6, 10) on two: 12 ms / 2 = 6 ms an item.
    assert (first.device_class, first.end, second.device_class, second.devices) == (
        "fast",
        6,
        "slow",
        2,
    )
    assert pipeline.batch == 1  # larger batches gain nothing here: the smaller one wins
    assert pipeline.throughput == pytest.approx(1 / 0.006)
    assert plan.cluster.bandwidth_gbps >= 1e6  # shared memory: transfers take ~0 s
    # 18 ms of stages at batch 1 exceed 0.025 × 0.6: nothing fits.
    with pytest.raises(SystemExit, match="no two-stage pipeline fits"):
        search_plan(profile(), {"fast": 1, "slow": 2}, slo_s=0.015, margin=0.4, max_batch=4)


def test_the_bisection_finds_the_edge_within_four_percent():
    def curve(edge: float):
        async def probe(load: float) -> float:
            return 1.0 if load <= edge else 0.9

        return probe

    found, probes = asyncio.run(bisect(curve(0.83), 1.0, 12))
    assert 0.83 / 1.04 <= found <= 0.83 and probes[0] == (1.0, 0.9)
    found, _ = asyncio.run(bisect(curve(2.0), 1.0, 12))
    assert 2.0 / 1.04 <= found <= 2.0
    found, probes = asyncio.run(bisect(curve(0.0), 1.0, 3))
    assert found == 0.0 and [p[0] for p in probes] == [1.0, 0.5, 0.25]


def test_stage_jitter_is_the_log_normal_sigma_of_each_stage_about_its_mean():
    import math

    from app.server.pipeline_types import DriverCounts
    from bench.ppipe_live import stage_jitter

    counts = DriverCounts()
    # Stage 0: ratios 0.9 and 1.1 (CV 0.1); stage 1: always 1.3 (no spread).
    counts.stage_batches = {"0.0": 2, "0.1": 2}
    counts.stage_ratio_sum = {"0.0": 2.0, "0.1": 2.6}
    counts.stage_ratio_squares = {"0.0": 0.81 + 1.21, "0.1": 2 * 1.69}
    assert stage_jitter(counts) == pytest.approx(0.5 * math.sqrt(math.log1p(0.01)))
    assert stage_jitter(DriverCounts()) == 0.0


@pytest.mark.slow  # ~3 s of simulation
def test_the_plan_simulator_reports_a_plan_files_capacity_and_its_overload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.ppipe_plan_sim on a plan file (one of the artifact's reference
    plans, written as `python -m app plan ppipe` writes its own) and its
    block timings: a capacity near the plan's throughput (the simulator
    runs stages as profiled), none late without jitter, and at 1.5 × the
    excess dropped (shed), not served late."""
    source = (
        BUNDLED_DIR
        / "plans-maf19"
        / (
            "colorization-v2-googlenet-v3-pytorch-repvgg-b3_0.3-0.33-0.37_L4-P4_25-75_"
            "bw-gbps-6_sla-multiplier-5_v4.json"
        )
    )
    path = tmp_path / "plan.json"
    write_plan(read_reference_plan(source), path)
    argv = [str(path), "--timings", str(BUNDLED_DIR), "--jitter", "0", "--sim-s", "1", "--json"]
    assert ppipe_plan_sim.main(argv) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert 0.7 <= run["load_factor"] <= 1.2
    at_capacity, over = run["overload"]["1.0"], run["overload"]["1.5"]
    assert at_capacity["late"] == 0 and over["late"] == 0
    assert over["dropped"] >= 0.2 * over["requests"]
    assert at_capacity["dropped"] <= 0.01 * at_capacity["requests"]


def test_the_plan_simulator_names_bad_input_instead_of_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    write_plan(read_reference_plan(next((BUNDLED_DIR / "plans-maf19").glob("*_v4.json"))), path)
    cases = [
        ([str(tmp_path / "none.json"), "--timings", str(BUNDLED_DIR)], "none.json: no such file"),
        ([str(path), "--timings", str(tmp_path)], "no block timings for model"),
        ([str(path), "--timings", str(BUNDLED_DIR), "--slo-ms", "0"], "--slo-ms must be > 0"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as stopped:
            ppipe_plan_sim.main(argv)
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err


def test_the_switch_bench_plans_the_model_cut_and_whole_and_shows_each_switch(tmp_path):
    from bench.ppipe_switch import describe, make_plans, render

    plans = make_plans(tmp_path)
    stages = {
        name: [
            [(s["device_class"], s["start"], s["end"]) for s in p["stages"]]
            for p in json.loads(path.read_text())["plan"]["pipelines"]
        ]
        for name, path in plans.items()
    }
    # cut over both classes (the slow class cannot run the model whole in
    # time); whole on the two fast executors
    assert {c for p in stages["cut"] for c, _, _ in p} == {"fast", "slow"}
    assert stages["whole"] == [[("fast", 0, 10)]]
    assert (tmp_path / "timings" / "models" / "chain" / "model.onnx").is_file()

    answer = {
        "pipelines": [
            {"model": "chain", "batch": 1,
             "stages": [{"blocks": [0, 10], "devices": ["fast:0", "fast:1"]}]}
        ],
        "started_s": 0.365, "old_held": 1, "old_drained_s": 0.01, "total_s": 0.47,
        "asked_at_s": 9.0, "switched_at_s": 9.365,
    }  # fmt: skip
    assert describe(answer) == (
        "[0,10) on fast:0,fast:1; started in 0.365 s, old pipelines held 1 and drained in "
        "0.010 s, total 0.470 s"
    )
    run = {
        "sent": 10, "answered": 10, "unanswered": 0, "answered_twice": 0, "within_slo": 0.9,
        "latency_ms_p50_p99": [10.0, 50.0], "switches": [answer],
        "after_switch": [{"within_slo": 1.0}],
        "between_switches": [
            {"from_s": 0.0, "to_s": 9.365, "within_slo": 0.8},
            {"from_s": 9.365, "to_s": 30.0, "within_slo": 1.0},
        ],
    }  # fmt: skip
    steady = {**run, "switches": [], "after_switch": [{"within_slo": None}]}
    table = render({"switched": run, "steady": steady, "steady whole": steady})
    assert "| switched | 10 | 10 | 0 | 0 | 90.00% | 50.0 |" in table
    assert "| switched | 0.0–9.4 s: 80.00%, 9.4–30.0 s: 100.00% |" in table
    assert "| at 9.0 s | fast:0,fast:1 | 0.365 | 1 | 0.010 | 0.470 | 100.0% | — |" in table
