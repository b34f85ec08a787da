"""PPipe's simulated capacity (ppipe.txt §7.2, Figures 6 and 8): PPipe vs NP
vs DART-r plans, all served by the `ppipe` data plane, on the four 100-device
clusters, under Poisson and bursty arrivals.

    python -m bench.ppipe_sim [--groups 1,2] [--clusters HC1,HC2]
        [--variants ppipe,np,dart-r] [--arrivals poisson,maf21,bursty]
        [--plans auto|maf19|maf21] [--trace FILE]
        [--duration 30] [--seed 0] [--max-load 1.0]
        [--burst-amplitude 0.5] [--burst-dwell 0.1] [--out-dir DIR]

Plans are the PPipe artifact's reference plans (`_v4` = PPipe, `_bl` = NP,
`_dart-r` = DART-r), so the comparison does not depend on our planner: as in
the artifact (scripts/run_sim_in_batch.py), Poisson arrivals are served by
the plans made for MAF-2019's workload weights (data/ppipe/plans-maf19/,
0.3/0.33/0.37) and the paper's "Bursty" arrivals, the MAF-2021 trace folded
to each DNN's rate (`maf21`, app/workloads/folded.py; `--trace` the real
trace's CSV, default a synthetic one with its published statistics), by the
plans made for MAF-2021's weights (data/ppipe/plans-maf21/, 0.39/0.26/0.35);
`--plans` forces one set. `bursty` is the earlier chosen-shape MMPP stand-in
(served by the MAF-2019 plans). Groups are the paper's six groups of three
DNNs, numbered 1–6 in the order of their file names; clusters HC1–HC4 are
L4/P4, L4/T4, V100/P4 and V100/T4 (25 high- and 75 low-class devices).

Method (the paper's and its artifact's, scripts/run_sim_in_batch.py): load
factor 1.0 is the PPipe plan's throughput for each DNN, whichever plan
serves it; each DNN runs alone on its own pipelines (the plans give every
DNN its own devices) for `--duration` simulated seconds; its capacity is the
highest load factor on the 0.05 grid up to `--max-load` with ≥ 99 % of
requests within the SLO. The search probes `--max-load` first (PPipe usually
passes there), then bisects the grid, assuming attainment falls with load:
about five runs per DNN instead of twenty.

Reported per group × cluster × arrivals and variant: capacity (mean over
the group's DNNs), low-class utilisation (each DNN's at its capacity, summed:
the DNNs use disjoint devices, so the sum is the cluster's utilisation with
all three at capacity) and, once per group × cluster × arrivals, the data
plane's cost with the three DNNs together on the whole 100-device cluster at
load 0.9 of the PPipe plan: probes and µs in the core per dispatched batch.

Output: a table on stdout, and `<out-dir>/ppipe-sim.json` and `.md`.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from app.planning.ppipe.plan import Plan, read_reference_plan
from app.planning.ppipe.profiles import BUNDLED_DIR, load_profile
from app.simulation.ppipe_run import ARRIVALS, BurstShape, PlanRunResult, simulate_plan
from app.workloads.folded import read_invocation_trace
from bench.progress import about, make_progress, plain_lines

# Plan sets: the workload each was made for -> (folder, the file names' weights).
PLAN_SETS = {"maf19": ("plans-maf19", "0.3-0.33-0.37"), "maf21": ("plans-maf21", "0.39-0.26-0.35")}
OUT_DIR = Path(__file__).resolve().parent / "results" / "ppipe"
CLUSTERS = {"HC1": "L4-P4", "HC2": "L4-T4", "HC3": "V100-P4", "HC4": "V100-T4"}
VARIANTS = {"ppipe": "v4", "np": "bl", "dart-r": "dart-r"}
HIGH_CLASSES = ("L4", "V100")
TARGET = 0.99
STEP = 0.05
COST_LOAD = 0.9
# The paper's averages (§7.2): capacity (load factor) and low-class utilisation.
PAPER = {
    "poisson": {"ppipe": 0.965},
    "maf21": {"ppipe": 0.903, "np": 0.611, "dart-r": 0.694},
    "gain_over_np": {"poisson": 0.48, "maf21": 0.75},
    "gain_over_dart-r": {"poisson": 0.32, "maf21": 0.36},
    "low_utilisation": {"ppipe": 0.736, "np": 0.081, "dart-r": 0.295},
}


def groups(plans: str = "maf19") -> list[str]:
    """The six groups' model strings, in file-name order."""
    folder, weights = PLAN_SETS[plans]
    paths = (BUNDLED_DIR / folder).glob(f"*_{weights}_*.json")
    return sorted({p.name.split(f"_{weights}_")[0] for p in paths})


def plan_set(arrivals: str, choice: str) -> str:
    """The plans an arrival process is served by: `choice`, or with "auto"
    the artifact's pairing (MAF-2021 arrivals, MAF-2021 plans)."""
    if choice != "auto":
        return choice
    return "maf21" if arrivals == "maf21" else "maf19"


def plan_path(group: str, cluster: str, variant: str, plans: str = "maf19") -> Path:
    folder, weights = PLAN_SETS[plans]
    pattern = f"{group}_{weights}_{CLUSTERS[cluster]}_*_{VARIANTS[variant]}.json"
    (path,) = (BUNDLED_DIR / folder).glob(pattern)
    return path


def low_class(plan: Plan) -> str:
    (low,) = [c for c in plan.cluster.classes if c not in HIGH_CLASSES]
    return low


def capacity(
    run: Callable[[float], PlanRunResult], max_steps: int
) -> tuple[float, PlanRunResult | None, int]:
    """(highest passing load factor on the grid, its run, runs made)."""
    runs = 0
    results: dict[int, PlanRunResult] = {}

    def passes(k: int) -> bool:
        nonlocal runs
        runs += 1
        results[k] = run(round(k * STEP, 10))
        return min(results[k].within_slo.values()) >= TARGET

    if passes(max_steps):
        return max_steps * STEP, results[max_steps], runs
    lo, hi = 0, max_steps
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo * STEP, results.get(lo), runs


def run_cell(
    group: str, cluster: str, arrivals: str, variants: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    plans = plan_set(arrivals, args.plans)
    reference_plan = read_reference_plan(plan_path(group, cluster, "ppipe", plans))
    reference = {m.name: m.throughput for m in reference_plan.models}
    profiles = {name: load_profile(name) for name in reference}
    burst = BurstShape(args.burst_amplitude, args.burst_dwell)
    common = {
        "duration_s": args.duration,
        "process": arrivals,
        "seed": args.seed,
        "burst": burst,
        "invocations": args.trace_starts,
    }
    max_steps = round(args.max_load / STEP)
    cell: dict[str, Any] = {"group": group, "cluster": cluster, "arrivals": arrivals}
    cell["plans"] = plans
    for variant in variants:
        plan = read_reference_plan(plan_path(group, cluster, variant, plans))
        low = low_class(plan)
        per_model: dict[str, Any] = {}
        for name in reference:
            started = time.perf_counter()

            def run(load: float, name: str = name, plan: Plan = plan) -> PlanRunResult:
                return simulate_plan(
                    plan, profiles, load, reference=reference, models={name}, **common
                )

            load, result, runs = capacity(run, max_steps)
            elapsed = time.perf_counter() - started
            per_model[name] = {
                "capacity": load,
                "low_utilisation": result.utilisation[low] if result else 0.0,
                "utilisation": result.utilisation if result else {},
                "runs": runs,
                "seconds_per_run": elapsed / runs,
            }
            print(
                f"  {cluster} {arrivals} {variant} {name}: {load:.2f} ({runs} runs, "
                f"{elapsed / runs:.1f} s each)",
                file=sys.stderr,
            )
        cell[variant] = {
            "capacity": sum(m["capacity"] for m in per_model.values()) / len(per_model),
            "low_utilisation": sum(m["low_utilisation"] for m in per_model.values()),
            "models": per_model,
        }
    cost = simulate_plan(reference_plan, profiles, COST_LOAD, **common)
    cell["cost"] = {
        "devices": sum(reference_plan.cluster.classes.values()),
        "probes_per_batch": cost.probes_per_batch,
        "core_us_per_batch": cost.core_us_per_batch,
        "batches": cost.batches,
        "wall_s": cost.wall_seconds,
        "within_slo": cost.within_slo,
    }
    return cell


def summarise(cells: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for arrivals in sorted({c["arrivals"] for c in cells}):
        rows = [c for c in cells if c["arrivals"] == arrivals]
        entry: dict[str, Any] = {}
        for v in variants:
            entry[v] = {
                "capacity": sum(r[v]["capacity"] for r in rows) / len(rows),
                "low_utilisation": sum(r[v]["low_utilisation"] for r in rows) / len(rows),
            }
        for base in ("np", "dart-r"):
            if "ppipe" in variants and base in variants and entry[base]["capacity"] > 0:
                entry[f"gain_over_{base}"] = (
                    entry["ppipe"]["capacity"] / entry[base]["capacity"] - 1
                )
                entry[f"cluster_gain_over_{base}"] = cluster_gains(rows, base)
        entry["probes_per_batch"] = sum(r["cost"]["probes_per_batch"] for r in rows) / len(rows)
        entry["core_us_per_batch"] = sum(r["cost"]["core_us_per_batch"] for r in rows) / len(rows)
        summary[arrivals] = entry
    return summary


def cluster_gains(rows: list[dict[str, Any]], base: str) -> dict[str, float]:
    """PPipe's gain over `base` per cluster (the ratio of the cluster's mean
    capacities over its groups) and their mean, "mean": the paper's
    statistic (§7.2: "+75.1 % ... (161.6 %, 34.1 %, 50.4 % and 54.1 %)" is
    the mean of the four clusters' gains, not the ratio of the means)."""
    gains: dict[str, float] = {}
    for cluster in sorted({r["cluster"] for r in rows}):
        mine = [r for r in rows if r["cluster"] == cluster]
        ppipe = sum(r["ppipe"]["capacity"] for r in mine)
        other = sum(r[base]["capacity"] for r in mine)
        if other > 0:
            gains[cluster] = ppipe / other - 1
    if gains:
        gains["mean"] = sum(gains.values()) / len(gains)
    return gains


def render(cells: list[dict[str, Any]], summary: dict[str, Any], variants: list[str]) -> str:
    head = ["group", "cluster", "arrivals", "plans"]
    head += [f"{v} cap" for v in variants] + [f"{v} low util" for v in variants]
    head += ["probes/batch", "µs/batch"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [str(c["group_index"]), c["cluster"], c["arrivals"], c["plans"]]
        row += [f"{c[v]['capacity']:.2f}" for v in variants]
        row += [f"{100 * c[v]['low_utilisation']:.1f} %" for v in variants]
        row += [f"{c['cost']['probes_per_batch']:.2f}", f"{c['cost']['core_us_per_batch']:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    for arrivals, s in summary.items():
        row = ["mean", "", arrivals, ""]
        row += [f"{s[v]['capacity']:.3f}" for v in variants]
        row += [f"{100 * s[v]['low_utilisation']:.1f} %" for v in variants]
        row += [f"{s['probes_per_batch']:.2f}", f"{s['core_us_per_batch']:.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    gains = [
        f"{arrivals}: PPipe +{100 * s[k]:.0f} % over {k.removeprefix('gain_over_')} "
        f"(per cluster {per_cluster(s['cluster_' + k])})"
        for arrivals, s in summary.items()
        for k in ("gain_over_np", "gain_over_dart-r")
        if k in s
    ]
    return "\n".join(lines) + ("\n\n" + "; ".join(gains) if gains else "") + "\n"


def per_cluster(gains: dict[str, float]) -> str:
    return ", ".join(f"{k} +{100 * v:.0f} %" for k, v in gains.items())


def parse_list(text: str, allowed: list[str], what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise SystemExit(f"--{what}: unknown {bad or text!r}; choose from {', '.join(allowed)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.ppipe_sim", description=__doc__.split("\n")[0]
    )
    p.add_argument("--groups", default="1,2,3,4,5,6", help="groups 1–6 (default all)")
    p.add_argument("--clusters", default=",".join(CLUSTERS), help="HC1..HC4 (default all)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="ppipe,np,dart-r")
    p.add_argument("--arrivals", default="poisson,maf21", help="poisson,maf21,bursty")
    p.add_argument("--plans", default="auto", choices=["auto", *PLAN_SETS])
    p.add_argument("--trace", type=Path, help="MAF-2021 trace CSV for maf21 arrivals")
    p.add_argument("--duration", type=float, default=30.0, help="simulated seconds per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-load", type=float, default=1.0, help="top of the load grid")
    p.add_argument("--burst-amplitude", type=float, default=BurstShape.amplitude)
    p.add_argument("--burst-dwell", type=float, default=BurstShape.dwell_s)
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    all_groups = groups()
    chosen = parse_list(args.groups, [str(i + 1) for i in range(len(all_groups))], "groups")
    clusters = parse_list(args.clusters, list(CLUSTERS), "clusters")
    variants = parse_list(args.variants, list(VARIANTS), "variants")
    arrivals = parse_list(args.arrivals, list(ARRIVALS), "arrivals")
    args.trace_starts = read_invocation_trace(args.trace) if args.trace else None
    if not args.duration > 0 or not args.max_load >= STEP:
        raise SystemExit("--duration must be > 0 and --max-load ≥ 0.05")
    cells: list[dict[str, Any]] = []
    started = time.perf_counter()
    err = Console(stderr=True)
    count = len(chosen) * len(clusters) * len(arrivals)
    # ~26 min for the 48 cells of 3 variants at 30 s on the 2-core test box
    # (BENCHMARKS.md): ~11 s per variant and cell at the default duration.
    guess_s = count * len(variants) * 11.0 * args.duration / 30.0
    err.print(f"{count} cells × {len(variants)} variants: {about(guess_s)}", highlight=False)
    progress = make_progress(err)
    with progress, plain_lines(progress):
        task = progress.add_task("cells", total=count)
        for g in chosen:
            group = all_groups[int(g) - 1]
            for cluster in clusters:
                for process in arrivals:
                    progress.update(task, description=f"group {g} {cluster} {process}")
                    cell = run_cell(group, cluster, process, variants, args)
                    cell["group_index"] = int(g)
                    cells.append(cell)
                    progress.advance(task)
    summary = summarise(cells, variants)
    table = render(cells, summary, variants)
    print(table)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "options": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k != "trace_starts"
        },
        "burst": asdict(BurstShape(args.burst_amplitude, args.burst_dwell)),
        "paper": PAPER,
        "summary": summary,
        "cells": cells,
        "wall_s": time.perf_counter() - started,
    }
    (args.out_dir / "ppipe-sim.json").write_text(json.dumps(body, indent=2) + "\n")
    (args.out_dir / "ppipe-sim.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
