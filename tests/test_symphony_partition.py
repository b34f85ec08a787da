"""Symphony's partitioning (app/planning/partition/, symphony.txt App. A):
small problems with a known optimum, each bound binding, infeasible inputs
and why, the random baseline, the command line and its plan files, and a
partitioned simulation (app/simulation/partitioned.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.planning.cli import main as plan_main
from app.planning.partition.config import load_problem
from app.planning.partition.milp import InfeasibleError, solve
from app.planning.partition.plan import read_plan
from app.planning.partition.problem import PartitionModel, PartitionProblem, measure
from app.planning.partition.random_solver import solve_random
from app.results import Outcome
from app.scheduling.profile import LatencyProfile
from app.simulation.partitioned import simulate_partitioned, split_devices
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "bench" / "workloads" / "partition" / "example.yaml"


def _models(rates, static=None, dynamic=None, names="abcdefgh"):
    static = static or [1.0] * len(rates)
    dynamic = dynamic or [0.0] * len(rates)
    return tuple(
        PartitionModel(names[i], float(r), float(s), float(d))
        for i, (r, s, d) in enumerate(zip(rates, static, dynamic, strict=True))
    )


def _groups(plan) -> set[frozenset[str]]:
    return {frozenset(s.models) for s in plan.sub_clusters if s.models}


def test_balances_rates_exactly_when_it_can() -> None:
    problem = PartitionProblem(_models([3, 3, 2, 2]), 2, r_max=100, s_max_bytes=100, w=0.0)
    plan = solve(problem, time_limit_s=10)
    assert plan.result.status == "optimal" and plan.result.gap == 0
    assert _groups(plan) == {frozenset("ac"), frozenset("bd")} or _groups(plan) == {
        frozenset("ad"),
        frozenset("bc"),
    }
    assert [s.rate for s in plan.sub_clusters] == [5.0, 5.0]
    assert plan.objective == pytest.approx(0.0, abs=1e-9)
    assert plan.load_imbalance == pytest.approx(0.0, abs=1e-9)


def test_r_max_binds_and_changes_the_optimum() -> None:
    # rates 5, 3, 2 (R̄ 5), static 1, 1, 4 (S̄ 3); memory balance weighs 10×:
    # {c} | {a, b} (ΔS 1, rate 8) is best until R_max 7 forbids rate 8, then
    # {b, c} | {a} (ΔR 0, ΔS 2) beats {a, c} | {b} (ΔR 2, ΔS 2).
    models = _models([5, 3, 2], static=[1, 1, 4])
    free = solve(PartitionProblem(models, 2, r_max=100, s_max_bytes=100, w=10.0))
    assert _groups(free) == {frozenset("c"), frozenset("ab")}
    assert free.objective == pytest.approx(3 / 5 + 10 * 1 / 3)
    bound = solve(PartitionProblem(models, 2, r_max=7, s_max_bytes=100, w=10.0))
    assert _groups(bound) == {frozenset("bc"), frozenset("a")}
    assert max(s.rate for s in bound.sub_clusters) == 5.0
    assert bound.objective == pytest.approx(0 + 10 * 2 / 3)


def test_s_max_binds_on_static_plus_the_largest_dynamic_memory() -> None:
    # rates 1, 2, 3, 4: only {a, d} | {b, c} balances (5 | 5). a runs with 4
    # units of dynamic memory, c with 3: {a, d} needs 3 + 4 = 7 > S_max 6,
    # {a, c} needs 2 + max(4, 3) = 6 (a sum would be 9) and is the optimum.
    models = _models([1, 2, 3, 4], static=[1, 1, 1, 2], dynamic=[4, 0, 3, 0])
    loose = solve(PartitionProblem(models, 2, r_max=100, s_max_bytes=100, w=0.0))
    assert _groups(loose) == {frozenset("ad"), frozenset("bc")}
    tight = solve(PartitionProblem(models, 2, r_max=100, s_max_bytes=6, w=0.0))
    assert _groups(tight) == {frozenset("ac"), frozenset("bd")}
    memory = {frozenset(s.models): s.memory_bytes for s in tight.sub_clusters}
    assert memory[frozenset("ac")] == 6.0 and memory[frozenset("bd")] == 3.0
    assert tight.objective == pytest.approx(1 / 5)


def test_c_max_bounds_the_change_from_the_current_assignment() -> None:
    # Current {a, b} | {c, d}: rates 6 | 4. One move (cost 2: an unload and
    # a load) cannot improve it; a swap (two moves, cost 4) balances it.
    models = _models([3, 3, 2, 2])
    current = {"a": 0, "b": 0, "c": 1, "d": 1}

    def plan(c_max: float):
        problem = PartitionProblem(models, 2, 100, 100, 0.0, current=current, c_max=c_max)
        return solve(problem)

    for c_max in (0, 2, 3.5):
        stay = plan(c_max)
        assert stay.moves == () and stay.change_cost == 0
        assert stay.objective == pytest.approx(1 / 5)
    swap = plan(4)
    assert swap.objective == pytest.approx(0.0, abs=1e-9)
    assert len(swap.moves) == 2 and swap.change_cost == 4.0 == swap.c_max
    assert {m.cost for m in swap.moves} == {2.0}
    unbounded = solve(PartitionProblem(models, 2, 100, 100, 0.0, current=current))
    assert unbounded.c_max is None and unbounded.objective == pytest.approx(0.0, abs=1e-9)


def test_a_new_model_costs_its_load_and_a_dropped_one_is_listed() -> None:
    models = _models([3, 3, 2, 2, 4], names="abcde")
    current = {"a": 0, "b": 0, "c": 1, "d": 1, "gone": 1}
    problem = PartitionProblem(models, 2, 100, 100, 0.0, current=current, c_max=1)
    plan = solve(problem)
    assert plan.removed == ("gone",)
    (move,) = plan.moves
    assert (move.model, move.source, move.target, move.cost) == ("e", None, 1, 1.0)
    assert plan.change_cost == 1.0


@pytest.mark.parametrize(
    ("problem", "why"),
    [
        (
            PartitionProblem(_models([5, 20]), 2, r_max=10, s_max_bytes=100),
            "model 'b' alone has rate 20 > R_max 10",
        ),
        (
            PartitionProblem(_models([1, 1], dynamic=[0, 2e8]), 2, 10, s_max_bytes=1e8),
            "model 'b' alone needs 200 MB (static + dynamic) > S_max 100 MB",
        ),
        (
            PartitionProblem(_models([8, 8, 8]), 2, r_max=10, s_max_bytes=100),
            "total rate 24 > 2 sub-clusters × R_max 10",
        ),
        (
            PartitionProblem(_models([6, 6, 6]), 2, r_max=10, s_max_bytes=100),
            "HiGHS proved that no assignment meets R_max, S_max together",
        ),
        (
            PartitionProblem(_models([1, 1, 1]), 2, 10, 100, current={"a": 0}, c_max=1),
            "loading the 2 new models costs 2 > C_max 1",
        ),
    ],
)
def test_infeasible_input_says_why(problem: PartitionProblem, why: str) -> None:
    with pytest.raises(InfeasibleError, match="no assignment is feasible") as raised:
        solve(problem)
    assert why in str(raised.value)


def test_the_time_limit_accepts_the_incumbent() -> None:
    rng = np.random.default_rng(3)
    models = tuple(
        PartitionModel(f"m{i}", float(rng.exponential(100)), float(rng.uniform(1e7, 5e8)))
        for i in range(120)
    )
    problem = PartitionProblem(models, 8, r_max=3000, s_max_bytes=11e9)
    plan = solve(problem, time_limit_s=0.3)
    assert plan.result.status == "time-limit" and plan.result.gap is not None
    assert plan.result.gap > 0
    assert measure(problem, _index(problem, plan)).feasible
    start = plan.result.details["start_objective"]
    assert start is not None and plan.objective <= start + 1e-9


def _index(problem: PartitionProblem, plan) -> np.ndarray:
    where = plan.assignment()
    return np.array([where[m.name] for m in problem.models])


def test_the_random_baseline_is_feasible_and_no_better_than_the_optimum() -> None:
    problem = load_problem(EXAMPLE)
    best = solve(problem)
    assert best.result.status == "optimal"
    baseline = solve_random(problem, time_limit_s=60, seed=1, block=100, max_tries=2000)
    assert baseline.result.details["tries"] == 2000
    assert 0 < baseline.result.details["feasible"] <= 2000
    assert measure(problem, _index(problem, baseline)).feasible
    assert baseline.objective >= best.objective - 1e-9
    assert sorted(baseline.assignment()) == sorted(m.name for m in problem.models)


def test_the_random_baseline_keeps_to_c_max() -> None:
    models = _models([3, 3, 2, 2])
    current = {"a": 0, "b": 0, "c": 1, "d": 1}
    problem = PartitionProblem(models, 2, 100, 100, 0.0, current=current, c_max=2)
    plan = solve_random(problem, time_limit_s=60, seed=0, block=50, max_tries=500)
    assert plan.change_cost <= 2 and len(plan.moves) <= 1


def test_random_baseline_with_no_feasible_draw_says_so() -> None:
    problem = PartitionProblem(_models([6, 6, 6]), 2, r_max=10, s_max_bytes=100)
    with pytest.raises(InfeasibleError, match="no feasible assignment among 64 random ones"):
        solve_random(problem, time_limit_s=60, block=64, max_tries=64)


# ------------------------------------------------------------ command line


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = plan_main(["partition", *argv], out, err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_prints_and_writes_a_plan_that_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    code, out, err = _run(str(EXAMPLE), "--out", str(path))
    assert code == 0, err
    plan = read_plan(path)
    assert plan.result.solver == "milp" and plan.result.status == "optimal"
    assert sorted(plan.assignment()) == sorted(m.name for m in load_problem(EXAMPLE).models)
    assert f"load {plan.load_imbalance:.4f}, memory {plan.memory_imbalance:.4f}" in out
    assert "status optimal, gap 0" in out and f"plan written to {path}" in out
    body = json.loads(path.read_text())
    assert body["kind"] == "symphony-partition" and body["version"] == 2
    made = body["made_from"]
    assert made["planner"] == "partition" and made["inputs"] == [str(EXAMPLE.resolve())]
    assert made["command"].startswith("python -m app plan partition ")
    assert made["rates"] == {m.name: m.rate for m in load_problem(EXAMPLE).models}
    assert made["made_at"].endswith("Z")
    for s in plan.sub_clusters:
        assert f"{s.rate:>10.1f}" in out
    assert read_plan(path) == plan


def test_the_command_replans_from_a_current_plan_under_c_max(tmp_path: Path) -> None:
    first = tmp_path / "first.json"
    assert _run(str(EXAMPLE), "--out", str(first))[0] == 0
    body = yaml.safe_load(EXAMPLE.read_text())
    for model in body["models"]:  # the load shifts: the three largest rates double
        if model["rate"] >= 700:
            model["rate"] *= 2
    body["r_max"] = 4000
    body["c_max"] = 4  # two moves at most
    config = tmp_path / "shifted.yaml"
    config.write_text(yaml.safe_dump(body))
    second = tmp_path / "second.json"
    code, out, err = _run(str(config), "--current", str(first), "--out", str(second))
    assert code == 0, err
    plan = read_plan(second)
    assert plan.c_max == 4 and plan.change_cost <= 4 and len(plan.moves) <= 2
    assert f"cost {plan.change_cost:g} (C_max 4)" in out
    before = read_plan(first).assignment()
    moved = {m for m, j in plan.assignment().items() if before[m] != j}
    assert moved == {m.model for m in plan.moves}


def test_the_random_flag_runs_the_baseline() -> None:
    code, out, _ = _run(str(EXAMPLE), "--random", "--time-limit", "0.2", "--seed", "3")
    assert code == 0 and "random baseline" in out and "feasible)" in out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": 1}, "unknown keys ['colour']"),
        ({"r_max": None}, "r_max must be a number, got None"),
        ({"s_max_mb": 0}, "s_max_mb must be > 0, got 0"),
        ({"sub_clusters": 0}, "sub_clusters must be an integer ≥ 1, got 0"),
        ({"w": "high"}, "w must be a number, got 'high'"),
        ({"current": {"ResNet50": 7}}, "current: ResNet50: sub-cluster 7 outside 0..2"),
        ({"models": []}, "models must be a non-empty list"),
        ({"models": [{"name": "x", "rate": 1}]}, "models[0]: missing key 'static_mb'"),
        ({"models": [{"name": "x", "rate": -1, "static_mb": 1}]}, "rate must be ≥ 0, got -1"),
        ({"models": [{"name": "x", "rate": 1, "static_mb": 1, "gpu": 1}]}, "unknown keys ['gpu']"),
    ],
)
def test_config_errors_name_the_bad_key(tmp_path: Path, change: dict, message: str) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body.update(change)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(body, allow_unicode=True))
    code, out, err = _run(str(config))
    assert code == 2 and out == ""
    assert message in err and err.startswith("python -m app plan partition: error:")


def test_missing_key_and_file_errors(tmp_path: Path) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    del body["r_max"]
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(body))
    assert "missing key 'r_max'" in _run(str(config))[2]
    assert "no such file" in _run(str(tmp_path / "none.yaml"))[2]
    assert "no such file" in _run(str(EXAMPLE), "--current", str(tmp_path / "none.json"))[2]
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"kind": "inss-plan", "version": 1}))
    assert "not a Symphony partition plan" in _run(str(EXAMPLE), "--current", str(wrong))[2]


# ------------------------------------------------------------ simulation


def _workload() -> Workload:
    profile = LatencyProfile.linear(2.0, 5.0, 16)
    models = [
        ModelSpec(name, profile, 60.0, 16, rate, ArrivalSpec("poisson", {}))
        for name, rate in (("a", 150.0), ("b", 90.0), ("c", 120.0), ("d", 60.0))
    ]
    return Workload("partitioned", 4.0, 7, [DeviceSpec(f"gpu{i}") for i in range(4)], models)


def test_a_partitioned_run_answers_every_request_once_on_its_own_core(monkeypatch) -> None:
    import app.simulation.partitioned as partitioned

    seen: list[tuple[list[str], list[str], set[str]]] = []  # (models, devices, requests' models)
    run_core = partitioned.run_simulation

    # Recorded where each core is driven (not by wrapping the core's
    # add_request: a compiled core's methods cannot be replaced).
    def recording(core, models, devices, arrival_times, model_index, **options):
        names = [m.name for m in models]
        seen.append((names, [d.name for d in devices], {names[i] for i in model_index.tolist()}))
        return run_core(core, models, devices, arrival_times, model_index, **options)

    monkeypatch.setattr(partitioned, "run_simulation", recording)
    workload = _workload()
    arrivals = generate_arrivals(workload)
    assignment = {"a": 1, "b": 0, "c": 0, "d": 1}
    run = simulate_partitioned(workload, assignment, "symphony", arrivals=arrivals)
    assert [(c.sub_cluster, c.models, c.devices) for c in run.cores] == [
        (0, ("b", "c"), (0, 1)),
        (1, ("a", "d"), (2, 3)),
    ]
    assert seen == [
        (["b", "c"], ["gpu0", "gpu1"], {"b", "c"}),
        (["a", "d"], ["gpu2", "gpu3"], {"a", "d"}),
    ]
    trace = run.result.trace
    n = len(arrivals)
    assert n > 1000 and sum(c.requests for c in run.cores) == n
    # every request answered exactly once: one final outcome each, none pending
    assert (trace.status != Outcome.PENDING).all()
    assert np.isfinite(trace.finish).all()
    assert (trace.model_index == arrivals.model_index).all()
    overall = run.result.summary["overall"]
    assert overall["requests"] == n
    models = run.result.summary["models"]
    counts = arrivals.counts(4)
    assert [models[m]["requests"] for m in "abcd"] == counts.tolist()
    # each core's batches ran on its own devices only
    assert (trace.device_busy > 0).all()
    assert overall["slo_attainment"] > 0.99


def test_a_partitioned_run_is_the_plain_run_with_one_sub_cluster() -> None:
    workload = _workload()
    arrivals = generate_arrivals(workload)
    one = simulate_partitioned(workload, dict.fromkeys("abcd", 0), "symphony", arrivals=arrivals)
    plain = simulate(workload, "symphony", arrivals=arrivals)
    assert (one.result.trace.status == plain.trace.status).all()
    assert np.array_equal(one.result.trace.finish, plain.trace.finish, equal_nan=True)
    assert one.result.summary["overall"] == plain.summary["overall"]


def test_a_partitioned_run_from_a_plan_and_its_errors(tmp_path: Path) -> None:
    workload = _workload()
    problem = PartitionProblem(
        tuple(PartitionModel(m.name, m.rate or 0.0, 1e8) for m in workload.models),
        2,
        r_max=300,
        s_max_bytes=1e9,
    )
    plan = solve(problem)
    run = simulate_partitioned(workload, plan.assignment(), "symphony")
    assert {c.models for c in run.cores} == {s.models for s in plan.sub_clusters}
    with pytest.raises(ValueError, match=r"models without a sub-cluster: \['d'\]"):
        simulate_partitioned(workload, {"a": 0, "b": 0, "c": 1}, "symphony")
    with pytest.raises(ValueError, match="sub-clusters \\[1\\] have models but no devices"):
        simulate_partitioned(
            workload, dict.fromkeys("abcd", 1) | {"a": 0}, "symphony", device_groups={0: [0]}
        )
    with pytest.raises(ValueError, match="3 devices cannot serve 4 sub-clusters"):
        split_devices(3, 4)


@pytest.mark.slow  # over a second
def test_the_bench_compares_with_the_random_baseline_and_keeps_to_c_max(tmp_path: Path) -> None:
    from bench.symphony_partition import configuration, main, zoo

    assert len(zoo()) == 35
    problem = configuration(0, 800, 20)
    assert len(problem.models) == 800 and len({m.name for m in problem.models}) == 800
    assert problem == configuration(0, 800, 20)  # deterministic per seed
    argv = ["--quick", "--configs", "2", "--time-limit", "0.3", "--out", str(tmp_path)]
    assert main(argv) == 0
    body = json.loads((tmp_path / "partition.json").read_text())
    assert body["meta"]["models"] == 60 and len(body["runs"]) == 2
    for run in body["runs"]:
        change = run["change"]
        assert change["within_c_max"] and change["cost"] <= change["c_max"] == 20
        assert change["moves"] <= 10
    text = (tmp_path / "partition.md").read_text()
    assert "Load imbalance factor" in text and "| milp |" in text and "| random |" in text
