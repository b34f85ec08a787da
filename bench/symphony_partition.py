"""Symphony's partitioning MILP against the random baseline (symphony.txt
App. A.2, Figure 15).

    python -m bench.symphony_partition [--configs 20] [--models 800]
        [--sub-clusters 20] [--time-limit 10] [--out DIR] [--quick]

Each configuration (seed s) draws `--models` models from the Table 5 zoo
(bench/workloads/symphony-table5-zoo.yaml, 35 models): each one a variant —
a specialised instance of a zoo model, with its memory — whose request rate
is exponential (mean MEAN_RATE requests/s), into `--sub-clusters`
sub-clusters. The MILP (app/planning/partition/milp.py) and the random
baseline (random_solver.py) each get `--time-limit` seconds; the imbalance
factors (max − min)/avg of load and of static memory of their plans are
compared as percentiles over the configurations (the paper's CDF), beside
the greedy start the MILP begins from. Then a plan change: every rate is
perturbed (× a log-normal factor, σ PERTURB_SIGMA), and the MILP re-solves
from the first plan (read back from its file, as `--current` does) under
C_max; the changes it makes must cost at most C_max.

Inputs the paper does not give, and what is used instead:

* Static memory: each zoo model's weights, the Keras Applications sizes
  (keras.io/api/applications, "Size (MB)"); MobileNetV3Small/Large from
  their parameter counts (2.5 M, 5.5 M, fp32), SSDMobilenet as the TF
  detection zoo's ssd_mobilenet_v2 (≈ 67 MB), BERT-base 110 M fp32.
* Dynamic memory: a batch of 4 (App. B: every SLO admits one) at
  DYNAMIC_MB_PER_ITEM_MS MB per item-millisecond of α — run-time memory
  taken as growing with per-item compute.
* R_max (R_MAX requests/s per core) and S_max (a 1080Ti's 11 GB); w = 1
  on the normalised terms; load cost 1 per load or unload; C_max C_MAX
  (C_MAX / 2 moves).

Writes partition.json (every configuration in full) and partition.md (the
percentile tables) under `--out` (default bench/results/partition).
`--quick` changes the defaults: 60 models into 4 sub-clusters, 3
configurations, 1-s limits.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console

from app.planning.partition.milp import greedy_assignment, solve
from app.planning.partition.plan import PartitionPlan, read_plan, write_plan
from app.planning.partition.problem import PartitionModel, PartitionProblem, measure
from app.planning.partition.random_solver import solve_random
from bench.progress import about, make_progress, plain_lines

ZOO = Path(__file__).parent / "workloads" / "symphony-table5-zoo.yaml"
DEFAULT_OUT = Path(__file__).parent / "results" / "partition"
MB = 1e6
MEAN_RATE = 100.0
R_MAX = 6000.0
S_MAX_BYTES = 11e9
C_MAX = 20.0
PERTURB_SIGMA = 0.3
DYNAMIC_MB_PER_ITEM_MS = 20.0
PERCENTILES = (0, 10, 25, 50, 75, 90, 100)
FULL = {"configs": 20, "models": 800, "sub_clusters": 20, "time_limit": 10.0}
QUICK = {"configs": 3, "models": 60, "sub_clusters": 4, "time_limit": 1.0}

#: Static memory (MB) of the Table 5 models; sources in the module docstring.
STATIC_MB = {
    "NASNetMobile": 23, "MobileNetV3Small": 10, "DenseNet169": 57, "DenseNet121": 33,
    "DenseNet201": 80, "EfficientNetV2B0": 29, "MobileNetV3Large": 22, "InceptionV3": 92,
    "EfficientNetV2B1": 34, "ResNet50V2": 98, "ResNet152V2": 232, "ResNet101V2": 171,
    "InceptionResNetV2": 215, "EfficientNetB0": 29, "MobileNetV2": 14, "ResNet101": 171,
    "EfficientNetB1": 31, "ResNet50": 98, "EfficientNetV2B2": 42, "VGG19": 549,
    "ResNet152": 232, "MobileNet": 16, "VGG16": 528, "EfficientNetB2": 36,
    "EfficientNetV2B3": 59, "NASNetLarge": 343, "EfficientNetV2S": 88, "EfficientNetB3": 48,
    "EfficientNetV2L": 479, "EfficientNetV2M": 220, "EfficientNetB5": 118, "Xception": 88,
    "SSDMobilenet": 67, "EfficientNetB4": 75, "BERT": 440,
}  # fmt: skip


def zoo() -> list[tuple[str, float, float]]:
    """(name, static bytes, dynamic bytes) of the 35 Table 5 models."""
    models = yaml.safe_load(ZOO.read_text())["models"]
    names = [m["name"] for m in models]
    if set(names) != set(STATIC_MB):
        raise ValueError(f"{ZOO}: zoo names differ from STATIC_MB's: {set(names) ^ set(STATIC_MB)}")
    return [
        (
            m["name"],
            STATIC_MB[m["name"]] * MB,
            4 * m["profile"]["alpha_ms"] * DYNAMIC_MB_PER_ITEM_MS * MB,
        )
        for m in models
    ]


def configuration(seed: int, models: int, sub_clusters: int) -> PartitionProblem:
    """Seed `seed`'s draw: `models` variants of zoo models, exponential rates."""
    rng = np.random.default_rng([seed, 24])
    base = zoo()
    picks = rng.integers(len(base), size=models)
    rates = rng.exponential(MEAN_RATE, size=models)
    variants: dict[int, int] = {}
    chosen = []
    for pick, rate in zip(picks, rates, strict=True):
        name, static, dynamic = base[int(pick)]
        variants[int(pick)] = variants.get(int(pick), 0) + 1
        chosen.append(
            PartitionModel(f"{name}-v{variants[int(pick)]}", float(rate), static, dynamic)
        )
    return PartitionProblem(tuple(chosen), sub_clusters, R_MAX, S_MAX_BYTES, w=1.0)


def perturbed(problem: PartitionProblem, seed: int, current: dict[str, int]) -> PartitionProblem:
    """Every rate × a log-normal factor (mean 1); `current` in force; C_max."""
    rng = np.random.default_rng([seed, 25])
    factor = rng.lognormal(-(PERTURB_SIGMA**2) / 2, PERTURB_SIGMA, size=len(problem.models))
    models = tuple(
        replace(m, rate=m.rate * float(f)) for m, f in zip(problem.models, factor, strict=True)
    )
    return replace(problem, models=models, current=current, c_max=C_MAX)


def _scores(plan: PartitionPlan) -> dict[str, Any]:
    r = plan.result
    return {
        "objective": plan.objective,
        "load_imbalance": plan.load_imbalance,
        "memory_imbalance": plan.memory_imbalance,
        "status": r.status,
        "gap": r.gap,
        "runtime_s": r.runtime_s,
        **{k: v for k, v in r.details.items() if k in ("tries", "feasible", "start_objective")},
    }


def run_configuration(seed: int, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    problem = configuration(seed, args.models, args.sub_clusters)
    milp = solve(problem, args.time_limit)
    baseline = solve_random(problem, args.time_limit, seed=seed)
    greedy = greedy_assignment(problem, np.full(len(problem.models), -1))
    start = None if greedy is None else measure(problem, greedy)
    path = scratch / f"plan-{seed}.json"
    write_plan(milp, path)
    current = read_plan(path).assignment()  # what `--current PLAN` reads
    changed = perturbed(problem, seed, current)
    index = np.array([current[m.name] for m in changed.models])
    stay = measure(replace(changed, c_max=None), index)
    replan = solve(changed, args.time_limit)
    return {
        "seed": seed,
        "milp": _scores(milp),
        "random": _scores(baseline),
        "greedy": None
        if start is None
        else {
            "objective": start.objective,
            "load_imbalance": start.load_imbalance,
            "memory_imbalance": start.memory_imbalance,
            "feasible": start.feasible,
        },
        "change": {
            "c_max": C_MAX,
            "moves": len(replan.moves),
            "cost": replan.change_cost,
            "within_c_max": replan.change_cost <= C_MAX,
            "kept_objective": stay.objective,
            "kept_load_imbalance": stay.load_imbalance,
            "kept_feasible": stay.feasible,
            "objective": replan.objective,
            "load_imbalance": replan.load_imbalance,
            "memory_imbalance": replan.memory_imbalance,
            "status": replan.result.status,
        },
    }


def percentiles(runs: list[dict[str, Any]], solver: str, key: str) -> list[float]:
    values = [r[solver][key] for r in runs if r[solver] is not None]
    return [float(np.percentile(values, q)) for q in PERCENTILES]


def render(body: dict[str, Any]) -> str:
    meta, runs = body["meta"], body["runs"]
    head = "| solver | " + " | ".join(f"p{q}" for q in PERCENTILES) + " |"
    rule = "|---" * (len(PERCENTILES) + 1) + "|"
    lines = [
        "# Symphony's partitioning: MILP against the random baseline (App. A.2)",
        "",
        f"`{meta['command']}`: {meta['models']} models (Table 5 zoo variants, exponential "
        f"rates, mean {MEAN_RATE:g} requests/s) into {meta['sub_clusters']} sub-clusters, "
        f"{len(runs)} configurations, {meta['time_limit_s']:g} s per solve (HiGHS on one "
        f"thread; the random baseline for the same time). R_max {R_MAX:g} requests/s, "
        f"S_max {S_MAX_BYTES / 1e9:g} GB, w 1.",
        "",
    ]
    for key, title in (("load_imbalance", "Load"), ("memory_imbalance", "Static memory")):
        lines += [f"{title} imbalance factor (max − min)/avg, percentiles over configurations:"]
        lines += ["", head, rule]
        for solver in ("milp", "random", "greedy"):
            cells = " | ".join(f"{v:.4f}" for v in percentiles(runs, solver, key))
            lines.append(f"| {solver} | {cells} |")
        lines.append("")
    statuses = sorted({r["milp"]["status"] for r in runs})
    tries = [r["random"]["tries"] for r in runs]
    better = sum(r["milp"]["objective"] <= r["random"]["objective"] for r in runs)
    lines += [
        f"MILP status: {', '.join(statuses)}; MILP objective ≤ random's in {better} of "
        f"{len(runs)}; random tries per solve: {min(tries)}–{max(tries)}.",
        "",
        f"Plan change (rates × log-normal, σ {PERTURB_SIGMA:g}; re-solved from the first plan "
        f"under C_max {C_MAX:g}, one load or unload costing 1):",
        "",
        "| seed | moves | cost | ≤ C_max | load imbalance kept | after | objective kept | after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        c = r["change"]
        lines.append(
            f"| {r['seed']} | {c['moves']} | {c['cost']:g} | {c['within_c_max']} | "
            f"{c['kept_load_imbalance']:.4f} | {c['load_imbalance']:.4f} | "
            f"{c['kept_objective']:.4f} | {c['objective']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, help="configurations (seeds 0..N-1; 20)")
    parser.add_argument("--models", type=int, help="models per configuration (800)")
    parser.add_argument("--sub-clusters", type=int, help="sub-clusters (20)")
    parser.add_argument("--time-limit", type=float, help="seconds per solve (10)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--quick", action="store_true", help="defaults 3 configurations of 60 models, 4, 1 s"
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    runs = []
    err = Console(stderr=True)
    # Each configuration: the MILP, the random baseline and the re-plan, each
    # stopped at the time limit at the latest.
    err.print(
        f"{args.configs} configurations of {args.models} models, each up to 3 solves of "
        f"{args.time_limit:g} s: {about(args.configs * 3 * args.time_limit)} at most",
        highlight=False,
    )
    progress = make_progress(err)
    with tempfile.TemporaryDirectory() as scratch, progress, plain_lines(progress):
        task = progress.add_task("configurations", total=args.configs)
        for seed in range(args.configs):
            progress.update(task, description=f"configuration {seed + 1}/{args.configs}")
            run = run_configuration(seed, args, Path(scratch))
            progress.advance(task)
            runs.append(run)
            m, r, c = run["milp"], run["random"], run["change"]
            print(
                f"seed {seed}: MILP load {m['load_imbalance']:.4f} memory "
                f"{m['memory_imbalance']:.4f} ({m['status']}); random load "
                f"{r['load_imbalance']:.4f} memory {r['memory_imbalance']:.4f}; change: "
                f"{c['moves']} moves, cost {c['cost']:g} ≤ {c['c_max']:g}",
                flush=True,
            )
    command = (
        f"python -m bench.symphony_partition --configs {args.configs} --models {args.models} "
        f"--sub-clusters {args.sub_clusters} --time-limit {args.time_limit:g}"
    )
    meta = {
        "command": command,
        "configs": args.configs,
        "models": args.models,
        "sub_clusters": args.sub_clusters,
        "time_limit_s": args.time_limit,
        "r_max": R_MAX,
        "s_max_bytes": S_MAX_BYTES,
        "c_max": C_MAX,
        "mean_rate": MEAN_RATE,
        "perturb_sigma": PERTURB_SIGMA,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
    }
    body = {"meta": meta, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "partition.json").write_text(json.dumps(body, indent=2) + "\n")
    (args.out / "partition.md").write_text(render(body))
    print(f"written: {args.out / 'partition.json'}, {args.out / 'partition.md'}")
    return 0 if all(r["change"]["within_c_max"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
