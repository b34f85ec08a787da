"""HERD (shepherd-nsdi23.txt §4, §7.3): the ILP's solve time, and simulated
goodput of HERD's groups + FLEX against random groups + FLEX.

    python -m bench.herd            # the full run (minutes)
    python -m bench.herd --quick    # small sizes, short runs (CI)
    python -m bench.herd --goodput measured   # (b) with measured T_i

Writes bench/results/herd/herd.json and herd.md (`--out-dir`).

(a) Solve time (Table 5 of the paper: 0.55 s at 200 workers, 13.26 s at
1,000, its own solver, 10 groups): W workers, W models drawn from the Table 5
zoo (bench/workloads/symphony-table5-zoo.yaml) with variants (α, β and the SLO × a
uniform factor in [0.8, 1.2]; weights from bench/workloads/herd/
zoo-memory.yaml), one model-stream each at an exponential rate (the paper
aggregates its 1,000 streams per model into model-streams before the ILP),
10 candidate groups of ≤ W/10 devices, 16 GB per device (2 GB reserved),
one affinity set, loads summing to 70 % of W devices; HiGHS, one thread, a
60-s limit (incumbent accepted, gap reported), from the greedy start
(app/planning/herd/greedy.py) and from none.

(b) Goodput: the 35 zoo models on 32 emulated devices, groups of ≤ 8 among
6 candidates, 1.5 GB per device with 0.5 GB for FLEX (so the zoo's 4.6 GB of
weights needs several groups), exponential popularity, the average load 70 %
of the devices (Σ n_i = 0.7·N). Arrivals, Azure-trace-like: each model an
on-off MMPP: 3× its mean rate for dwells of mean 1 s, ⅓ of it for dwells of
mean 3 s (random order; the mean stays the model's rate); the same arrivals
for every grouping.
Groupings: HERD (`paper` burst tolerance with its optima tie-broken by the
`shared` reading, the default; `paper` untied, from no start: whichever
optimum HiGHS ends with; `shared`) and random groups (seeds 0 … 4, mean
and range), each group its own `flex` core
(app/simulation/grouped.py). `--goodput measured` takes (b)'s T_i from
app/simulation/herd_goodput.py (one capacity search per zoo model, seconds
in all) for the load and the groupings alike; (a) keeps the analytic T, as
its W variants would cost W searches.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from app.planning.herd.ilp import SolveOptions, solve
from app.planning.herd.plan import HerdPlan
from app.planning.herd.problem import (
    Cluster,
    Goodput,
    Model,
    Problem,
    Stream,
    model_streams,
    single_device_goodput,
)
from app.planning.herd.random_groups import random_plan
from app.scheduling.profile import LatencyProfile
from app.simulation.grouped import GroupSpec, simulate_groups
from app.simulation.herd_goodput import MeasuredGoodput
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import parse_workload

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "bench/workloads/symphony-table5-zoo.yaml"
MEMORY = ROOT / "bench/workloads/herd/zoo-memory.yaml"
MB = 1 << 20
MAX_BATCH = 64


#: HERD's groupings in (b): the paper's objective with its optima tie-broken
#: by the shared reading (the default), the paper's objective with whichever
#: optimum HiGHS ends with from no start (as before the tie-break), and the
#: shared reading as the objective.
VARIANTS: dict[str, dict[str, Any]] = {
    "herd-paper": {"objective": "paper"},
    "herd-paper-untied": {"objective": "paper", "tie_break": "none", "warm_start": False},
    "herd-shared": {"objective": "shared"},
}


def zoo() -> list[dict[str, Any]]:
    memory = yaml.safe_load(MEMORY.read_text())
    models = yaml.safe_load(ZOO.read_text())["models"]
    for m in models:
        m["memory_mb"] = memory[m["name"]]
    return models


def model_of(entry: dict[str, Any], name: str, scale: float = 1.0) -> Model:
    p = entry["profile"]
    profile = LatencyProfile.linear(p["alpha_ms"] * scale, p["beta_ms"] * scale, MAX_BATCH)
    # A variant's SLO scales with its latency: the zoo's SLOs are set from each
    # model's own ℓ(b), and a slower variant with the original SLO may not be
    # servable at all (NASNetMobile × 1.2: ℓ(1) = 17.9 ms > half of 33 ms).
    return Model(name, profile, entry["slo_ms"] * scale / 1000.0, entry["memory_mb"] * MB)


def loaded_streams(
    models: list[Model],
    weights: np.ndarray,
    devices: float,
    goodput: Goodput = single_device_goodput,
) -> list[Stream]:
    """Rates ∝ weights with Σ n_i = `devices` (n_i from `goodput`'s T_i)."""
    probe = Problem(
        tuple(models),
        tuple(Stream(m.name, float(w)) for m, w in zip(models, weights, strict=True)),
        Cluster(1, 1 << 40, 1),
    )
    need = sum(ms.devices_needed for ms in model_streams(probe, goodput))
    return [Stream(m.name, float(w) * devices / need) for m, w in zip(models, weights, strict=True)]


def solve_time(
    workers: int, time_limit: float, seed: int, warm_start: bool = True
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    base = zoo()
    models = []
    for i in range(workers):
        entry = base[int(rng.integers(len(base)))]
        models.append(model_of(entry, f"{entry['name']}-{i}", float(rng.uniform(0.8, 1.2))))
    streams = loaded_streams(models, rng.exponential(1.0, workers), 0.7 * workers)
    cluster = Cluster(workers, 16 << 30, max(1, workers // 10), reserve=2 << 30, groups=10)
    problem = Problem(tuple(models), tuple(streams), cluster)
    began = time.perf_counter()
    plan = solve(problem, SolveOptions("paper", time_limit, warm_start=warm_start))
    wall = time.perf_counter() - began
    s = plan.solver
    return {
        "workers": workers,
        "start": "greedy" if warm_start else "none",
        "greedy_least_bt": s["greedy_least_bt"],
        "bound": s["bound"],
        "tie_break": s.get("tie_break"),
        "models": workers,
        "groups": len(plan.groups),
        "status": s["status"],
        "solver_s": s["runtime_s"],
        "total_s": wall,
        "gap": s["gap"],
        "variables": s["variables"],
        "rows": s["rows"],
        "min_burst_tolerance": plan.min_burst_tolerance,
    }


def goodput_problem(devices: int, seed: int, goodput: Goodput = single_device_goodput) -> Problem:
    rng = np.random.default_rng(seed)
    models = [model_of(e, e["name"]) for e in zoo()]
    weights = rng.exponential(1.0, len(models))
    streams = loaded_streams(models, weights, 0.7 * devices, goodput)
    cluster = Cluster(devices, 1536 * MB, 8, reserve=512 * MB, groups=6)
    return Problem(tuple(models), tuple(streams), cluster)


def bursty_workload(problem: Problem, duration: float, dwell: float, seed: int):
    models = []
    for m, s in zip(problem.models, problem.streams, strict=True):
        # On at 3× the mean a quarter of the time, off at ⅓ the rest: mean 1×.
        high, low = 3.0 * s.rate, s.rate / 3.0
        states = [{"rate": high, "dwell_s": dwell / 2}, {"rate": low, "dwell_s": 1.5 * dwell}]
        models.append(
            {
                "name": m.name,
                "profile": {"latency_ms": {b: m.profile.latency(b) * 1e3 for b in (1, MAX_BATCH)}},
                "slo_ms": m.slo * 1e3,
                "arrival": {"process": "mmpp", "states": states, "order": "random"},
            }
        )
    doc = {
        "name": "herd-zoo-bursty",
        "duration_s": duration,
        "seed": seed,
        "devices": problem.cluster.devices,
        "max_batch": MAX_BATCH,
        "models": models,
    }
    return parse_workload(doc, ROOT)


def run_grouping(load, arrivals, plan: HerdPlan) -> dict[str, Any]:
    groups = [GroupSpec(g.devices, g.models) for g in plan.groups if g.models and g.devices]
    result = simulate_groups(load, groups, "flex", arrivals=arrivals)
    o = result.summary["overall"]
    return {
        "goodput_rps": o["goodput_rps"],
        "slo_attainment": o["slo_attainment"],
        "offered_rps": o["offered_rps"],
        "min_burst_tolerance": plan.min_burst_tolerance,
        "groups": [[len(g.devices), len(g.models)] for g in plan.groups],
    }


def goodput(args: argparse.Namespace) -> dict[str, Any]:
    t: Goodput = MeasuredGoodput() if args.goodput == "measured" else single_device_goodput
    problem = goodput_problem(args.devices, args.seed, t)
    load = bursty_workload(problem, args.duration, args.dwell, args.seed)
    arrivals = generate_arrivals(load)
    out: dict[str, Any] = {}
    for name, options in VARIANTS.items():
        plan = solve(problem, SolveOptions(time_limit_s=args.time_limit, **options), t)
        out[name] = run_grouping(load, arrivals, plan)
        print(f"  {name}: {out[name]['goodput_rps']:.0f} r/s", file=sys.stderr)
    randoms = [
        run_grouping(load, arrivals, random_plan(problem, s, goodput=t))
        for s in range(args.randoms)
    ]
    values = [r["goodput_rps"] for r in randoms]
    out["random"] = {
        "goodput_rps": statistics.mean(values),
        "goodput_rps_min": min(values),
        "goodput_rps_max": max(values),
        "seeds": randoms,
    }
    print(f"  random: {out['random']['goodput_rps']:.0f} r/s", file=sys.stderr)
    return out


def render(body: dict[str, Any]) -> str:
    lines = ["# HERD", "", "## Solve time (paper Table 5: 0.55 s at 200, 13.26 s at 1,000)", ""]
    lines += ["| workers | models | groups | start | status | solver s | gap | least bt |"]
    lines += ["|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in body["solve_time"]:
        lines.append(
            f"| {r['workers']} | {r['models']} | {r['groups']} | {r['start']} | {r['status']} | "
            f"{r['solver_s']:.2f} | {r['gap']:.2%} | {r['min_burst_tolerance']:.3f} |"
        )
    g = body["goodput"]
    kind = body["options"].get("goodput", "analytic")
    lines += ["", f"## Goodput, Table 5 zoo, bursty arrivals, FLEX per group ({kind} T_i)", ""]
    lines += ["| grouping | goodput r/s | within SLO | least bt |", "|---|---:|---:|---:|"]
    for name in VARIANTS:
        r = g[name]
        lines.append(
            f"| {name} | {r['goodput_rps']:.0f} | {r['slo_attainment']:.2%} | "
            f"{r['min_burst_tolerance']:.3f} |"
        )
    r = g["random"]
    lines.append(
        f"| random (mean of {len(r['seeds'])}) | {r['goodput_rps']:.0f} "
        f"({r['goodput_rps_min']:.0f}–{r['goodput_rps_max']:.0f}) | "
        f"{statistics.mean(s['slo_attainment'] for s in r['seeds']):.2%} | "
        f"{statistics.mean(s['min_burst_tolerance'] for s in r['seeds']):.3f} |"
    )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.herd", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, short runs")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench/results/herd")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--goodput",
        choices=("analytic", "measured"),
        default="analytic",
        help="T_i for the goodput part: analytic (default) or measured in the simulator",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.workers = [20, 50] if args.quick else [200, 1000]
    args.time_limit = 10.0 if args.quick else 60.0
    args.devices = 32
    args.duration = 3.0 if args.quick else 30.0
    args.dwell = 2.0
    args.randoms = 2 if args.quick else 5
    solve_rows = []
    for w in args.workers:
        for warm in (True, False):
            solve_rows.append(solve_time(w, args.time_limit, args.seed, warm))
            r = solve_rows[-1]
            print(
                f"  {w} workers, start {r['start']}: {r['status']} in {r['solver_s']:.2f} s",
                file=sys.stderr,
            )
    body = {
        "options": {k: v for k, v in vars(args).items() if k != "out_dir"},
        "solve_time": solve_rows,
        "goodput": goodput(args),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "herd.json").write_text(json.dumps(body, indent=2, default=str) + "\n")
    text = render(body)
    (args.out_dir / "herd.md").write_text(text)
    print(text)
    return 0 if all(math.isfinite(r["solver_s"]) for r in solve_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
