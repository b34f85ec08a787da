"""`python -m app plan partition [CONFIG.yaml] [--repository DIR | --from URL]
[--out FILE] [--time-limit S] [--current PLAN] [--random [--seed N]]` —
Symphony's partitioning of models into sub-clusters (milp.py) from the
command line. With `--repository` or `--from`, or a cluster file
(`kind: cluster`), it plans the repository's models (app/planning/
cluster_inputs.py); else CONFIG is the YAML below.

Reads the models and bounds from YAML (config.py), solves the MILP within
the time limit (default 10 s; the incumbent when it hits), prints the plan —
per sub-cluster its models, rate and memory; the imbalance factors; the
moves from the current assignment and their cost — and writes it (`--out`,
plan.py's JSON). `--current PLAN` takes the assignment in force from a plan
written before (C_max bounds the change from it). `--random` runs App.
A.2's random baseline for the same time instead. Bad input or an infeasible
problem: a message on stderr saying why, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from app.planning.cluster_cli import (
    ClusterReader,
    add_cluster_arguments,
    load_cluster,
    wants_cluster,
)
from app.planning.cluster_inputs import partition_input
from app.planning.config_input import InputError
from app.planning.partition.config import load_problem, problem_from_dict
from app.planning.partition.milp import DEFAULT_TIME_LIMIT_S, solve
from app.planning.partition.plan import PartitionPlan, read_plan, write_plan
from app.planning.partition.random_solver import solve_random
from app.planning.plan_files import MadeFrom, inputs_of

PROG = "python -m app plan partition"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Partition models into sub-clusters, one scheduling core each "
        "(symphony.txt §4.7, App. A): a MILP on HiGHS under a time limit.",
    )
    parser.add_argument(
        "config",
        type=Path,
        nargs="?",
        help="models, sub-clusters and bounds (YAML), or a cluster file",
    )
    parser.add_argument("--out", type=Path, help="write the plan to this file (JSON)")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help=f"seconds for the solver (default {DEFAULT_TIME_LIMIT_S:g})",
    )
    parser.add_argument(
        "--current", type=Path, help="the plan in force (replaces the config's current)"
    )
    parser.add_argument(
        "--random", action="store_true", help="App. A.2's random baseline, for the same time"
    )
    parser.add_argument("--seed", type=int, default=0, help="the random baseline's seed")
    add_cluster_arguments(parser)
    return parser


def main(
    argv: Sequence[str],
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    cluster_reader: ClusterReader | None = None,
) -> int:
    """`argv` is what follows `plan partition`; `cluster_reader` reads
    `--repository` and `--from` (app/cluster_sources/)."""
    args = build_parser().parse_args(list(argv))
    try:
        current = None if args.current is None else read_plan(args.current).assignment()
        if wants_cluster(args):
            cluster = load_cluster(args, cluster_reader, err)
            problem = problem_from_dict(partition_input(cluster), cluster.source, current)
        elif args.config is None:
            raise InputError("give CONFIG (YAML), --repository DIR or --from URL")
        else:
            problem = load_problem(args.config, current)
        if args.random:
            plan = solve_random(problem, args.time_limit, args.seed)
        else:
            plan = solve(problem, args.time_limit)
    except ValueError as error:
        err.write(f"{PROG}: error: {error}\n")
        return 2
    out.write(format_plan(plan))
    if args.out is not None:
        rates = {m.name: m.rate for m in problem.models}
        made_from = MadeFrom.now("partition", inputs_of(args, "current"), argv, rates)
        write_plan(plan, args.out, made_from)
        out.write(f"plan written to {args.out}\n")
    return 0


def format_plan(plan: PartitionPlan) -> str:
    """The plan as a person reads it."""
    r = plan.result
    models = sum(len(s.models) for s in plan.sub_clusters)
    if r.solver == "milp":
        gap = "n/a" if r.gap is None else f"{r.gap:.3g}"
        how = f"MILP (HiGHS), status {r.status}, gap {gap}"
    else:
        how = f"random baseline, {r.details['tries']} tries ({r.details['feasible']} feasible)"
    lines = [
        f"Symphony partition: {models} models into {len(plan.sub_clusters)} sub-clusters; "
        f"{how}; {r.runtime_s:.2f} s of {r.time_limit_s:g} s",
        f"objective ΔR/R̄ + w·ΔS/S̄ = {plan.objective:.4f} (w {plan.w:g}); imbalance "
        f"(max − min)/avg: load {plan.load_imbalance:.4f}, memory {plan.memory_imbalance:.4f}",
        f"bounds: R_max {plan.r_max:g} requests/s, S_max {plan.s_max_bytes / 1e6:g} MB",
        "",
        f"{'sub-cluster':>11} {'models':>6} {'rate':>10} {'static MB':>10} "
        f"{'memory MB':>10}  models",
    ]
    for s in plan.sub_clusters:
        more = f", … ({len(s.models) - 6} more)" if len(s.models) > 6 else ""
        names = ", ".join(s.models[:6]) + more
        lines.append(
            f"{s.index:>11} {len(s.models):>6} {s.rate:>10.1f} {s.static_bytes / 1e6:>10.0f} "
            f"{s.memory_bytes / 1e6:>10.0f}  {names or '-'}"
        )
    lines.append("")
    bound = "no bound" if plan.c_max is None else f"C_max {plan.c_max:g}"
    lines.append(f"changes: {len(plan.moves)} moves, cost {plan.change_cost:g} ({bound})")
    for m in plan.moves:
        source = "new" if m.source is None else str(m.source)
        lines.append(f"  {m.model}: {source} → {m.target} (cost {m.cost:g})")
    if plan.removed:
        lines.append(f"  no longer served (unloaded): {', '.join(plan.removed)}")
    return "\n".join(lines) + "\n"
