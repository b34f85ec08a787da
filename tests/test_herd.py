"""HERD (app/planning/herd/): the ILP's optimum on hand-made cases, each
constraint binding, infeasible input, the CLI, config errors, the random
baseline; FLEX per group in the simulator (app/simulation/grouped.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from app.planning.cli import main as plan_main
from app.planning.config_input import InputError
from app.planning.herd.config import config_from_dict, load_config
from app.planning.herd.ilp import Infeasible, SolveOptions, solve
from app.planning.herd.plan import read_plan
from app.planning.herd.problem import (
    Cluster,
    Problem,
    Stream,
    model_streams,
    single_device_goodput,
)
from app.planning.herd.random_groups import random_plan
from app.results import Outcome
from app.simulation.grouped import GroupSpec, check_groups, simulate_groups
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import parse_workload

MB = 1 << 20
EXAMPLE = Path(__file__).resolve().parents[1] / "bench/workloads/herd/example.yaml"
# α = 1 ms, β = 0, SLO 20 ms: b = 10 (2·ℓ(b) ≤ SLO), T = 10 / 10 ms = 1000 r/s.
PROFILE = {"alpha_ms": 1.0, "beta_ms": 0.0}


def problem(models, streams, devices, group, memory_mb=1000, groups=None) -> Problem:
    body = {
        "cluster": {
            "devices": devices,
            "device_memory_mb": memory_mb,
            "max_group_size": group,
            **({"groups": groups} if groups else {}),
        },
        "models": [
            {"name": n, "profile": PROFILE, "slo_ms": 20, "memory_mb": mem, "affinity": aff}
            for n, mem, aff in models
        ],
        "streams": [{"model": m, "rate": r} for m, r in streams],
    }
    return config_from_dict(body, "test")[0]


def plan_of(p: Problem, objective: str = "paper"):
    return solve(p, SolveOptions(objective, time_limit_s=10))


def test_goodput_and_devices_needed():
    p = problem([("a", 10, "x")], [("a", 500), ("a", 250)], devices=1, group=1)
    assert single_device_goodput(p.models[0].profile, 0.020, 64) == pytest.approx(1000.0)
    (ms,) = model_streams(p)
    assert ms.devices_needed == pytest.approx(0.75) and ms.streams == (0, 1)


def test_group_size_limit_binds():
    # One stream needing one device: Ḡ = 3 caps its group at 3 of the 8.
    plan = plan_of(problem([("a", 10, "x")], [("a", 1000)], devices=8, group=3, groups=3))
    assert [len(g.devices) for g in plan.groups] == [3]
    assert plan.min_burst_tolerance == pytest.approx(3.0)


def test_memory_limit_binds():
    # 600 + 600 MB > 1000 MB: a and b in separate groups. n_a = 1, n_b = 3:
    # 1 + 3 devices gives min(1/1, 3/3) = 1; 2 + 2 gives min(2, 2/3).
    p = problem([("a", 600, "x"), ("b", 600, "x")], [("a", 1000), ("b", 3000)], 4, 4, groups=2)
    plan = plan_of(p)
    by_model = {g.models: len(g.devices) for g in plan.groups}
    assert by_model == {("a",): 1, ("b",): 3}
    assert plan.min_burst_tolerance == pytest.approx(1.0)


def test_affinity_binds():
    same = problem([("a", 10, "x"), ("b", 10, "x")], [("a", 500), ("b", 500)], 2, 2, groups=2)
    apart = problem([("a", 10, "x"), ("b", 10, "y")], [("a", 500), ("b", 500)], 2, 2, groups=2)
    # One affinity set: both in one group of 2 devices, bt = 2 / 0.5.
    assert plan_of(same).min_burst_tolerance == pytest.approx(4.0)
    plan = plan_of(apart)
    assert sorted(g.models for g in plan.groups) == [("a",), ("b",)]
    assert plan.min_burst_tolerance == pytest.approx(2.0)


def test_shared_reading_counts_co_tenants():
    p = problem([("a", 10, "x"), ("b", 10, "x")], [("a", 1000), ("b", 1000)], 4, 4, groups=2)
    # Together on 4 devices: paper bt 4/1; shared (4 − 2 + 1)/1 = 3 > 2 apart.
    assert plan_of(p, "paper").min_burst_tolerance == pytest.approx(4.0)
    shared = plan_of(p, "shared")
    assert shared.min_burst_tolerance == pytest.approx(3.0)
    assert [g.models for g in shared.groups] == [("a", "b")]


def test_unused_devices_go_to_served_groups():
    # (a) is ≤ N; a plan leaving devices idle gets them back (never idle).
    p = problem([("a", 600, "x"), ("b", 600, "x")], [("a", 1000), ("b", 1000)], 6, 3, groups=3)
    plan = plan_of(p)
    assert sum(len(g.devices) for g in plan.groups) == 6
    assert plan.min_burst_tolerance == pytest.approx(3.0)


def test_infeasible_says_why():
    big = problem([("a", 2000, "x")], [("a", 100)], 2, 2, memory_mb=4000)
    small = Problem(big.models, big.streams, Cluster(2, 1000 * MB, 2))
    with pytest.raises(Infeasible, match=r"\(c\) GPU-memory limit: model 'a'"):
        plan_of(small)
    sets = problem([("a", 10, "x"), ("b", 10, "y")], [("a", 1), ("b", 1)], 1, 1)
    with pytest.raises(Infeasible, match=r"\(e\) affinity sets: 2 affinity sets"):
        plan_of(sets)
    three = problem([(n, 600, "x") for n in "abc"], [(n, 100) for n in "abc"], 4, 2, groups=2)
    with pytest.raises(Infeasible, match="memory does not fit"):
        plan_of(three)
    slow = problem([("a", 10, "x")], [("a", 1)], 1, 1)
    hard = Problem(slow.models, (Stream("a", 1.0, slo=0.001),), slow.cluster)
    with pytest.raises(ValueError, match="half its SLO"):
        plan_of(hard)


def test_cli_writes_a_plan_that_reads_back(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    path = tmp_path / "plan.json"
    assert plan_main(["herd", str(EXAMPLE), "--out", str(path), "--time-limit", "5"], out, err) == 0
    plan = read_plan(path)
    text = out.getvalue()
    assert f"least burst tolerance {plan.min_burst_tolerance:.3f}" in text
    p, _, _ = load_config(EXAMPLE)
    assert sorted(i for g in plan.groups for i in g.streams) == list(range(len(p.streams)))
    # VGG16 and VGG19 (528 + 549 MB) cannot share a group's 1,024 MB.
    group = plan.group_of_model()
    assert group["VGG16"] != group["VGG19"]
    assert group["BERT"] not in (group["ResNet50"], group["VGG16"])  # affinity nlp vs cnn


def test_cli_bad_input_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {devices: 2, device_memory_mb: 10, max_group_size: 1, speed: 2}\n")
    err = io.StringIO()
    assert plan_main(["herd", str(bad)], io.StringIO(), err) == 2
    assert "bad.yaml: missing key 'models'" in err.getvalue()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(solver=1), "unknown keys ['solver']"),
        (lambda b: b["models"][0].pop("memory_mb"), "models[0]: missing key 'memory_mb'"),
        (lambda b: b["streams"][0].update(rate=-1), "streams[0]: rate must be > 0"),
        (lambda b: b["streams"][0].update(model="nope"), "unknown model 'nope'"),
        (lambda b: b["cluster"].update(devices=0), "cluster: devices must be an integer ≥ 1"),
        (lambda b: b.update(objective="mean"), "objective must be one of"),
        (lambda b: b["models"][0]["profile"].pop("beta_ms"), "needs alpha_ms and beta_ms"),
    ],
)
def test_config_errors_name_the_key(change, message):
    body = {
        "cluster": {"devices": 2, "device_memory_mb": 100, "max_group_size": 2},
        "models": [{"name": "a", "profile": dict(PROFILE), "slo_ms": 20, "memory_mb": 10}],
        "streams": [{"model": "a", "rate": 10}],
    }
    change(body)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config_from_dict(body, "test")


def test_random_baseline_is_valid():
    p, _, _ = load_config(EXAMPLE)
    for seed in range(5):
        plan = random_plan(p, seed)
        sizes = [len(g.devices) for g in plan.groups]
        assert max(sizes) <= p.cluster.max_group_size and sum(sizes) <= p.cluster.devices
        models = [m for g in plan.groups for m in g.models]
        assert sorted(models) == sorted(m.name for m in p.models)
        for g in plan.groups:
            assert sum(p.model(m).memory for m in g.models) <= p.cluster.model_memory
            assert len({p.model(m).affinity for m in g.models}) <= 1
        assert sorted(i for g in plan.groups for i in g.streams) == list(range(len(p.streams)))


def grouped_workload():
    return parse_workload(
        {
            "name": "grouped",
            "duration_s": 2,
            "seed": 3,
            "devices": 4,
            "total_rate": 600,
            "popularity": "even",
            "max_batch": 16,
            "arrival": {"process": "gamma", "shape": 0.5},
            "models": [
                {"name": n, "profile": {"alpha_ms": 1.0, "beta_ms": 2.0}, "slo_ms": 30}
                for n in ("a", "b", "c")
            ],
        },
        Path("."),
    )


def test_each_group_core_sees_only_its_models_and_answers_once():
    load = grouped_workload()
    groups = [GroupSpec((0, 1), ("a", "c")), GroupSpec((2, 3), ("b",))]
    arrivals = generate_arrivals(load)
    result = simulate_groups(load, groups, "flex", arrivals=arrivals)
    assert [sorted(run.core.models) for run in result.groups] == [["a", "c"], ["b"]]
    assert [len(run.core.devices) for run in result.groups] == [2, 2]
    # Every request reaches exactly one core and ends answered (none pending).
    seen = np.concatenate([run.model_index for run in result.groups])
    assert np.array_equal(np.bincount(seen, minlength=3), arrivals.counts(3))
    for run in result.groups:
        assert not np.any(run.trace.status == Outcome.PENDING)
    per_model = result.summary["models"]
    assert sum(m["offered"] for m in per_model.values()) == len(arrivals)
    for m in per_model.values():
        assert m["good"] + m["late"] + m["dropped"] == m["offered"] and m["dropped"] >= 0
    assert result.goodput > 0.9 * len(arrivals) / load.duration_s


def test_groups_must_cover_each_model_once():
    load = grouped_workload()
    with pytest.raises(ValueError, match="models in no group: \\['b'\\]"):
        check_groups(load, [GroupSpec((0,), ("a", "c"))])
    with pytest.raises(ValueError, match="device 0 is in groups 0 and 1"):
        check_groups(load, [GroupSpec((0,), ("a", "c")), GroupSpec((0,), ("b",))])


@pytest.mark.slow  # over a second
def test_bench_quick_writes_both_parts(tmp_path, capsys):
    from bench.herd import main as bench_main

    assert bench_main(["--quick", "--out-dir", str(tmp_path)]) == 0
    body = json.loads((tmp_path / "herd.json").read_text())
    assert [(r["workers"], r["start"]) for r in body["solve_time"]] == [
        (20, "greedy"),
        (20, "none"),
        (50, "greedy"),
        (50, "none"),
    ]
    assert all(r["status"] in ("optimal", "time-limit") for r in body["solve_time"])
    g = body["goodput"]
    offered = g["herd-paper"]["offered_rps"]
    # The same arrivals for every grouping; each answered within SLO or not.
    assert g["herd-shared"]["offered_rps"] == g["herd-paper-untied"]["offered_rps"] == offered
    assert all(s["offered_rps"] == offered for s in g["random"]["seeds"])
    assert 0 < g["random"]["goodput_rps"] <= offered
    assert "| herd-paper |" in (tmp_path / "herd.md").read_text()


def test_greedy_balances_load_and_meets_the_bound():
    from app.planning.herd.greedy import greedy_plan

    # n = 4, 2, 1, 1 (α = 1 ms, T = 1000 r/s): LPT puts a alone, b with c and d.
    p = problem(
        [(n, 10, "x") for n in "abcd"],
        [("a", 4000), ("b", 2000), ("c", 1000), ("d", 1000)],
        8,
        4,
        groups=2,
    )
    streams = model_streams(p)
    g = greedy_plan("paper", streams, [10 * MB] * 4, [0] * 4, 2, 8, 4, 1000 * MB)
    assert g is not None
    assert g.group_of == (0, 1, 1, 1) and g.sizes == (4, 4)
    assert g.least_bt == pytest.approx(1.0)  # = min_k Ḡ / n_k: the bound, so optimal


def test_greedy_reports_when_memory_does_not_fit():
    from app.planning.herd.greedy import greedy_plan

    p = problem([(n, 600, "x") for n in "abc"], [(n, 100) for n in "abc"], 4, 2, groups=2)
    g = greedy_plan("paper", model_streams(p), [600 * MB] * 3, [0] * 3, 2, 4, 2, 1000 * MB)
    assert g is None


def test_paper_optimum_tie_break_spreads_the_load():
    # a pins the paper optimum at 4/4 = 1 wherever b and c go; stacked with a
    # they leave a (4 − 6 + 4)/4 = 0.5 devices per unit at its peak, apart 1.
    p = problem(
        [(n, 10, "x") for n in "abc"], [("a", 4000), ("b", 1000), ("c", 1000)], 8, 4, groups=2
    )
    for warm in (True, False):
        plan = solve(p, SolveOptions("paper", 10, warm_start=warm))
        assert plan.min_burst_tolerance == pytest.approx(1.0)
        assert sorted(g.models for g in plan.groups) == [("a",), ("b", "c")]
        assert [len(g.devices) for g in plan.groups] == [4, 4]
    # Without the tie-break, the paper optimum is any of them; still optimal.
    plain = solve(p, SolveOptions("paper", 10, tie_break="none", warm_start=False))
    assert plain.min_burst_tolerance == pytest.approx(1.0)


def test_warm_start_reaches_the_same_optimum():
    # Two affinity sets: the greedy start (2.22) is below the optimum; the search goes on.
    p, _, _ = load_config(EXAMPLE)
    warm = solve(p, SolveOptions("paper", 10, tie_break="none"))
    cold = solve(p, SolveOptions("paper", 10, tie_break="none", warm_start=False))
    assert warm.min_burst_tolerance == pytest.approx(cold.min_burst_tolerance)
    assert warm.solver["status"] == "optimal" and warm.solver["gap"] < 1e-3
    assert warm.solver["greedy_least_bt"] == pytest.approx(2.223, abs=1e-3)
    assert warm.min_burst_tolerance == pytest.approx(2.360, abs=1e-3)


def test_warm_start_meeting_the_bound_skips_the_search():
    # The greedy's least bt equals min_k Ḡ / n_k, t's upper bound: proven optimal.
    p = problem(
        [(n, 10, "x") for n in "abcd"],
        [("a", 4000), ("b", 2000), ("c", 1000), ("d", 1000)],
        8,
        4,
        groups=2,
    )
    plan = solve(p, SolveOptions("paper", 10))
    s = plan.solver
    assert (s["status"], s["gap"], s["runtime_s"]) == ("optimal", 0.0, 0.0)
    assert s["bound"] == pytest.approx(1.0) and s["tie_break"]["runtime_s"] == 0.0


def test_tie_break_option_is_checked():
    with pytest.raises(ValueError, match="tie_break must be one of"):
        SolveOptions(tie_break="lexicographic")
