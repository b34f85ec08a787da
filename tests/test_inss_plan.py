"""InSS's placement (app/planning/inss/placement.py): the exact search on
cases solved by hand and against brute force, the greedy heuristic, the
reasons a model is not served, the plan file and the command line."""

from __future__ import annotations

import copy
import io
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.planning.cli import main as plan_main
from app.planning.config_input import InputError
from app.planning.inss.cli import main as inss_main
from app.planning.inss.config import load_problem, problem_from_dict
from app.planning.inss.placement import solve_exact, solve_greedy
from app.planning.inss.plan import Plan, plan_from_dict, plan_to_dict, read_plan
from app.planning.inss.problem import (
    DeviceEvaluator,
    LinearRunningTime,
    Problem,
    Saturation,
    worst_latency,
)
from tests.conftest import ROOT

PAPER_SETTING = ROOT / "bench" / "workloads" / "inss" / "paper-setting.yaml"


def _linear(alpha_ms: float, beta_ms: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"running_time": {"linear_ms": {"alpha": alpha_ms, "beta": beta_ms}}, **extra}


def _kinds(big_ms: float, small_ms: float) -> dict[str, Any]:
    return {"big": _linear(big_ms), "small": _linear(small_ms)}


def _model(name: str, rate: float, slo_ms: float, memory: dict, **latency: Any) -> dict:
    return {"name": name, "rate": rate, "slo_ms": slo_ms, "memory_mb": memory, **latency}


# Two devices, three models; a batch cap of 4 (the memory table) and a lax
# SLO, so every model runs at batch 4 and its throughput is linear in its
# share: h = 4ρ / (4α) = ρ/α (α in s). On `big`: A 1000ρ, B 500ρ, C 250ρ
# req/s; on `small` half that. Smallest shares for the rates (100, 100, 50):
# big A 0.1, B 0.2, C 0.2; small A 0.2, B 0.4; C (2000 MB) does not fit small.
# By hand, C must be on big; the placements:
#   {A, B, C} on big:        A 0.6, B 0.2, C 0.2 → 600 + 100 + 50   =  750
#   {C} big, {A, B} small:   250 + (A 0.6 → 300, B 0.4 → 100)      =  650
#   {B, C} big, {A} small:   (B 0.8 → 400, C 0.2 → 50) + 500        =  950
#   {A, C} big, {B} small:   (A 0.8 → 800, C 0.2 → 50) + 250        = 1100  ← optimum
HAND: dict[str, Any] = {
    "share_step": 0.1,
    "devices": [
        {"name": "big", "memory_mb": 10000, "bandwidth_gb_per_s": 10},
        {"name": "small", "memory_mb": 1000, "bandwidth_gb_per_s": 10},
    ],
    "models": [
        _model("A", 100, 1000, {1: 100, 4: 100}, latency_per_kind=_kinds(1, 2)),
        _model("B", 100, 1000, {1: 100, 4: 100}, latency_per_kind=_kinds(2, 4)),
        _model("C", 50, 1000, {1: 2000, 4: 2000}, latency_per_kind=_kinds(4, 8)),
    ],
}


def _problem(body: dict[str, Any]) -> Problem:
    return problem_from_dict(copy.deepcopy(body), "test")


def _check_feasible(problem: Problem, plan: Plan) -> None:
    """Every served model meets its SLO (worst case) and rate; every device
    holds its shares and memory."""
    for m in plan.models:
        if m.served:
            assert m.worst_latency_s <= m.slo_s + 1e-12, m
            assert m.throughput >= m.rate, m
    time_shared = plan.details.get("time_shared", [])
    for d in plan.devices:
        shares = sum(plan.model(name).share for name in d.models)
        if d.device in time_shared:  # in turn, each on the whole device
            assert len(d.models) > 1 and d.shares_used == 1.0
            assert all(plan.model(name).share == 1.0 for name in d.models)
        else:
            assert shares == pytest.approx(d.shares_used) and shares <= 1 + 1e-9
        memory = sum(plan.model(name).memory_bytes for name in d.models)
        assert memory == pytest.approx(d.memory_used_bytes) and memory <= d.memory_bytes


def test_worst_latency_is_the_first_task_of_a_batch_behind_a_running_one() -> None:
    # max(t_inf, (b − 1)/λ) + t_inf
    assert worst_latency(0.010, 4, 100.0) == pytest.approx(0.040)  # batch forms in 30 ms
    assert worst_latency(0.010, 2, 1000.0) == pytest.approx(0.020)  # device busy 10 ms
    assert worst_latency(0.010, 1, 5.0) == pytest.approx(0.020)  # W = b: 2·t_inf


def test_exact_finds_the_hand_solved_optimum() -> None:
    plan = solve_exact(_problem(HAND))
    assert plan.feasible and plan.method == "exact"
    assert plan.objective == pytest.approx(1100.0)
    got = {m.model: (m.device, m.share, m.batch) for m in plan.models}
    assert got == {"A": ("big", 0.8, 4), "B": ("small", 1.0, 4), "C": ("big", 0.2, 4)}
    assert plan.model("A").throughput == pytest.approx(800.0)
    assert plan.model("A").exec_s == pytest.approx(0.005)  # 4 ms / 0.8
    assert plan.model("C").worst_latency_s == pytest.approx(0.160)  # max(80, 60) + 80 ms
    assert {d.device: d.models for d in plan.devices} == {"big": ("A", "C"), "small": ("B",)}


def test_greedy_is_feasible_and_no_better_than_exact() -> None:
    problem = _problem(HAND)
    greedy = solve_greedy(problem)
    # B first (hardest: 0.2 alone, highest rate), to big; C only fits big; A
    # then adds most on small: {B, C} big + {A} small = 950.
    assert greedy.feasible and greedy.objective == pytest.approx(950.0)
    _check_feasible(problem, greedy)
    paper = load_problem(PAPER_SETTING)
    exact, heuristic = solve_exact(paper), solve_greedy(paper)
    assert exact.feasible and heuristic.feasible
    _check_feasible(paper, exact)
    _check_feasible(paper, heuristic)
    assert heuristic.objective <= exact.objective + 1e-9


# One device, two models with a fixed cost per batch (t = b + 4 ms at the
# whole device), rate 100 each, SLO 30 ms. Spatially, at 50/50 t = 2(b + 4):
# b = 2 (worst max(12, 10) + 12 = 24 ms; b = 3 gives 34), 166.7 req/s each;
# the best split (40/60) gives 133.3 + 200 = 333.3. In turn on the whole
# device: b = 3 each, cycle D = 7 + 7 = 14 ms, worst max(14, 20) + 7 = 27
# ms, 3 / 14 ms = 214.3 req/s each, 428.6 together (b = 4 would need
# max(15, 30) + 8 = 38 ms).
TURNS: dict[str, Any] = {
    "share_step": 0.1,
    "devices": [{"name": "gpu", "memory_mb": 10000, "bandwidth_gb_per_s": 10}],
    "models": [
        _model("X", 100, 30, {1: 100, 8: 100}, latency_per_kind={"gpu": _linear(1, 4)}),
        _model("Y", 100, 30, {1: 100, 8: 100}, latency_per_kind={"gpu": _linear(1, 4)}),
    ],
}


def test_time_sharing_runs_the_models_in_turn_on_a_duty_cycle() -> None:
    problem = _problem(TURNS)
    evaluator = DeviceEvaluator(problem)
    turns = evaluator.time_share(problem.devices[0], ["X", "Y"])
    assert turns is not None
    assert [(s.share, s.batch) for s in turns] == [(1.0, 3), (1.0, 3)]
    assert [s.exec_s for s in turns] == pytest.approx([0.007, 0.007])
    assert [s.throughput for s in turns] == pytest.approx([3 / 0.014] * 2)
    assert [s.worst_latency_s for s in turns] == pytest.approx([0.027] * 2)
    # Rates the cycle cannot cover within the SLO: no duty cycle serves them.
    tight = copy.deepcopy(TURNS)
    for m in tight["models"]:
        m["rate"] = 400
    assert DeviceEvaluator(_problem(tight)).time_share(problem.devices[0], ["X", "Y"]) is None


def test_the_plan_is_never_below_time_sharing_the_same_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = _problem(TURNS)
    plan = solve_exact(problem)
    assert plan.details["time_shared"] == ["gpu"]
    assert plan.objective == pytest.approx(2 * 3 / 0.014)
    assert [(m.share, m.batch) for m in plan.models] == [(1.0, 3), (1.0, 3)]
    _check_feasible(problem, plan)
    assert solve_greedy(problem).objective == pytest.approx(plan.objective)
    # Without the time-shared option the best is the spatial split (333.3).
    monkeypatch.setattr(DeviceEvaluator, "time_share", lambda *_: None)
    spatial = solve_exact(problem)
    assert spatial.details["time_shared"] == []
    assert spatial.objective == pytest.approx(1000 / 3)


def _brute_force(problem: Problem) -> tuple[int, float]:
    """Every assignment (a device or unserved) × every share vector and the
    models in turn on the whole device, no pruning."""
    evaluator = DeviceEvaluator(problem)
    names = [m.name for m in problem.models]
    options = [*range(len(problem.devices)), None]
    best = (0, 0.0)
    for assignment in itertools.product(options, repeat=len(names)):
        count, total = 0, 0.0
        for k, device in enumerate(problem.devices):
            on = [n for n, a in zip(names, assignment, strict=True) if a == k]
            if not on:
                continue
            values = [
                sum(s.throughput for s in served)
                for units in itertools.product(range(1, problem.units + 1), repeat=len(on))
                if sum(units) <= problem.units
                for served in [
                    evaluator.configure(
                        device, {n: u * problem.share_step for n, u in zip(on, units, strict=True)}
                    )
                ]
                if all(s.ok for s in served)
            ]
            if len(on) > 1 and (turns := evaluator.time_share(device, on)):
                values.append(sum(s.throughput for s in turns))  # the models in turn
            if not values:
                break
            count, total = count + len(on), total + max(values)
        else:
            if (count, total) > (best[0], best[1] + 1e-9):
                best = (count, total)
    return best


def test_exact_equals_brute_force_with_interference_and_transfers() -> None:
    latency = {
        "kernels": 50,
        "sched_per_kernel_us": 2,
        "alpha_u": 0.3,
        "beta_u": 0.02,
        "alpha_cache": 1.5,
    }
    body = {
        "share_step": 0.25,
        "devices": [
            {"name": "d0", "memory_mb": 3000, "bandwidth_gb_per_s": 12, "alpha_s_us": 1.0},
            {"name": "d1", "kind": "slow", "memory_mb": 2000, "bandwidth_gb_per_s": 6,
             "alpha_s_us": 2.0, "beta_s_us": -1.0},
            {"name": "d2", "kind": "slow", "memory_mb": 2000, "bandwidth_gb_per_s": 6,
             "alpha_s_us": 2.0, "beta_s_us": -1.0},
        ],
        "models": [
            _model("p", 300, 40, {"base": 500, "per_item": 30}, input_bytes=600000,
                   latency=_linear(0.6, 1.0, **latency)),
            _model("q", 120, 60, {"base": 700, "per_item": 50}, input_bytes=600000,
                   latency=_linear(1.3, 1.5, **latency)),
            _model("r", 500, 30, {"base": 300, "per_item": 15}, input_bytes=150000,
                   latency=_linear(0.3, 0.8, **latency)),
            _model("s", 80, 100, {"base": 900, "per_item": 60}, input_bytes=600000,
                   latency=_linear(3.0, 3.0, **latency)),
        ],
    }  # fmt: skip
    problem = _problem(body)
    exact = solve_exact(problem)
    count, total = _brute_force(problem)
    assert sum(m.served for m in exact.models) == count
    assert exact.objective == pytest.approx(total, rel=1e-12)
    assert solve_greedy(problem).objective <= exact.objective + 1e-9


def test_memory_shared_by_co_runners_steps_batches_down() -> None:
    # Each alone could take b = 15 (850 MB of room beside the other's 150 MB
    # at batch 1); together 200 + 50·(b_x + b_y) ≤ 1000 → 8 + 8.
    same = {"latency": _linear(1.0, 1.0)}
    body = {
        "devices": [{"name": "d", "memory_mb": 1000, "bandwidth_gb_per_s": 10}],
        "models": [
            _model("x", 10, 10000, {"base": 100, "per_item": 50}, **same),
            _model("y", 10, 10000, {"base": 100, "per_item": 50}, **same),
        ],
    }
    problem = _problem(body)
    served = DeviceEvaluator(problem).configure(problem.devices[0], {"x": 0.5, "y": 0.5})
    assert [s.batch for s in served] == [8, 8]
    assert sum(s.memory_bytes for s in served) == pytest.approx(1000e6)
    assert all(s.ok for s in served)


def test_infeasible_models_say_why() -> None:
    body = {
        "share_step": 0.1,
        "devices": [{"name": "d0", "memory_mb": 4000, "bandwidth_gb_per_s": 10}],
        "models": [
            # needs 60 % alone (rate 300 at h = 500ρ), twice over → one of them left out
            _model("big1", 300, 1000, {1: 100, 4: 100}, latency=_linear(2)),
            _model("big2", 300, 1000, {1: 100, 4: 100}, latency=_linear(2)),
            _model("huge", 1, 1000, {"base": 5000}, latency=_linear(1)),
            _model("tight", 1, 5, {"base": 10}, latency=_linear(0, 3)),  # 2·3 ms > 5 ms
            _model("flood", 5000, 1000, {1: 10, 4: 10}, latency=_linear(1)),  # ≤ 1000/s
        ],
    }  # fmt: skip
    for plan in (solve_exact(_problem(body)), solve_greedy(_problem(body))):
        assert not plan.feasible
        why = plan.unserved()
        assert set(why) == {"huge", "tight", "flood", "big2"} or set(why) == {
            "huge",
            "tight",
            "flood",
            "big1",
        }
        assert why["huge"] == "on d0 (d0) alone at 100 %: batch 1 needs 5000 MB > 4000 MB"
        assert why["tight"] == (
            "on d0 (d0) alone at 100 %: even batch 1 misses the SLO (worst latency 6.0 ms > 5 ms)"
        )
        assert why["flood"] == (
            "on d0 (d0) alone at 100 %: at most 1000.0 req/s (batch 4) < rate 5000 req/s"
        )
        left_out = next(name for name in ("big1", "big2") if name in why)
        assert why[left_out].startswith("served alone on d0 from a 60% share, but no placement")
        assert plan.objective == pytest.approx(500.0)  # the other big at 100 %


def test_exact_refuses_a_cluster_too_large() -> None:
    with pytest.raises(ValueError, match="use the greedy"):
        solve_exact(_problem(HAND), max_assignments=26)  # 3^3 = 27


def test_lwr_points_config() -> None:
    # Points from o_r = 2 ms·b / ρ; LWR in log space reproduces it exactly.
    points = [[b, r, 2.0 * b / r] for b in (1, 4, 16, 32) for r in (0.25, 0.5, 0.75, 1.0)]
    body = {
        "devices": [{"name": "d", "memory_mb": 1000, "bandwidth_gb_per_s": 10}],
        "models": [
            _model("m", 100, 500, {1: 10, 8: 10},
                   latency={"running_time": {"points_ms": points, "log_space": True}}),
        ],
    }  # fmt: skip
    plan = solve_exact(_problem(body))
    m = plan.model("m")
    assert (m.device, m.share, m.batch) == ("d", 1.0, 8)
    assert m.exec_s == pytest.approx(0.016, rel=1e-9)


def test_plan_file_round_trips_and_checks_its_kind(tmp_path: Path) -> None:
    plan = solve_exact(_problem(HAND))
    assert plan_from_dict(plan_to_dict(plan)) == plan
    with pytest.raises(ValueError, match="not an InSS plan"):
        plan_from_dict({**plan_to_dict(plan), "kind": "ppipe-plan"})
    with pytest.raises(ValueError, match="plan version 9"):
        plan_from_dict({**plan_to_dict(plan), "version": 9})


def test_cli_writes_a_plan_that_reads_back_equal(tmp_path: Path) -> None:
    config = tmp_path / "hand.yaml"
    config.write_text(yaml.safe_dump(HAND))
    out_file = tmp_path / "plan.json"
    out, err = io.StringIO(), io.StringIO()
    assert plan_main(["inss", str(config), "--out", str(out_file)], out, err) == 0, err.getvalue()
    assert read_plan(out_file) == solve_exact(load_problem(config))
    assert "objective 1100.0 requests/s" in out.getvalue()
    assert f"plan written to {out_file}" in out.getvalue()
    out = io.StringIO()
    assert inss_main([str(config), "--greedy", "--share-step", "0.2"], out, err) == 0
    assert "InSS plan (greedy, 20% share steps)" in out.getvalue()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(extra=1), "unknown keys ['extra']"),
        (lambda b: b["models"][0].pop("rate"), "models[0]: rate is missing"),
        (lambda b: b["models"][0].update(rate="fast"), "rate must be a finite number"),
        (lambda b: b.update(share_step=0.3), "share step must divide 1"),
        (lambda b: b["models"][0]["latency_per_kind"].pop("small"), "no latency fit for device"),
        (lambda b: b["models"][1]["latency_per_kind"]["big"].update(alpha_cache=-1), "α_cache"),
        (lambda b: b["models"][2].update(memory_mb={2: 10}), "must list batch 1"),
        (lambda b: b["devices"][0].pop("memory_mb"), "devices[0]: memory_mb is missing"),
        (lambda b: b["models"][0].update(latency=_linear(1)), "exactly one of latency and"),
        (lambda b: b["models"][0]["latency_per_kind"]["big"].update(running_time={}), "linear_ms"),
    ],
)
def test_cli_rejects_bad_config(tmp_path: Path, change, message: str) -> None:
    body = copy.deepcopy(HAND)
    change(body)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(body))
    out, err = io.StringIO(), io.StringIO()
    assert inss_main([str(config)], out, err) == 2
    assert err.getvalue().startswith("python -m app plan inss: error: ")
    assert message in err.getvalue(), err.getvalue()
    assert out.getvalue() == ""


def test_cli_rejects_bad_yaml_and_missing_files(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("devices: [unclosed\n")
    err = io.StringIO()
    assert inss_main([str(config)], io.StringIO(), err) == 2
    assert "broken.yaml: not valid YAML" in err.getvalue()
    err = io.StringIO()
    assert inss_main([str(tmp_path / "none.yaml")], io.StringIO(), err) == 2
    assert "none.yaml: no such file" in err.getvalue()
    err = io.StringIO()
    assert plan_main([], io.StringIO(), err) == 2
    assert "name a planner: ppipe, inss, herd or partition" in err.getvalue()


@pytest.mark.slow
def test_python_m_app_plan_inss_exits_2_on_bad_input(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("devices: []\nmodels: []\n")
    done = subprocess.run(
        [sys.executable, "-m", "app", "plan", "inss", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "devices must be a non-empty list" in done.stderr


def test_a_saturating_running_time_gains_nothing_above_the_share_a_batch_fills() -> None:
    # Work α·b + β = 1·b + 3 ms·share; the whole device at batch 1 is 4 / 0.25
    # = 16 ms, at batch 13 (full) 16 ms: a flat floor f(b) = 16 ms up to 13.
    line = LinearRunningTime(1e-3, 3e-3, Saturation(share_at_b1=0.25, full_at_batch=13))
    assert line.floor(1) == pytest.approx(0.016) and line.floor(13) == pytest.approx(0.016)
    assert line.predict(1, 0.1) == pytest.approx(0.040)  # below the knee: 4 / 0.1
    assert line.predict(1, 0.5) == pytest.approx(0.016)  # above: the floor, not 8 ms
    assert line.predict(1, 1.0) == pytest.approx(0.016)
    assert line.predict(13, 1.0) == pytest.approx(0.016)  # full: the line again
    assert line.predict(20, 1.0) == pytest.approx(0.023)
    for share in (0.1, 0.3, 0.6, 1.0):  # never falls with b, never rises with ρ
        times = [line.predict(b, share) for b in range(1, 33)]
        assert all(a <= b + 1e-15 for a, b in itertools.pairwise(times))
    assert all(
        line.predict(4, lo) >= line.predict(4, hi) for lo, hi in itertools.pairwise((0.1, 0.5, 1))
    )
    with pytest.raises(ValueError, match=r"at batch 2 .* is faster than at batch 1"):
        LinearRunningTime(1e-3, 3e-3, Saturation(share_at_b1=0.25, full_at_batch=2))
    with pytest.raises(ValueError, match="full_at_batch must be ≥ 2"):
        Saturation(0.5, 1)


def test_a_saturation_in_a_config_is_checked() -> None:
    body = copy.deepcopy(HAND)
    fit = body["models"][0]["latency_per_kind"]["big"]["running_time"]["linear_ms"]
    fit.update(alpha=1.0, beta=3.0, saturation={"share_at_b1": 0.25, "full_at_batch": 13})
    running = _problem(body).models[0].latency["big"].running_time
    assert running.predict(1, 1.0) == pytest.approx(0.016)
    fit["saturation"] = {"share_at_b1": 0.25, "full_at_batch": 13.5}
    with pytest.raises(InputError, match=r"full_at_batch must be an integer, got 13\.5"):
        _problem(body)
    fit["saturation"] = {"share_at_b1": 0.25, "full": 13}
    with pytest.raises(InputError, match="full"):
        _problem(body)
