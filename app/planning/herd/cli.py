"""`python -m app plan herd [CONFIG.yaml] [--repository DIR | --from URL]
[--out FILE] [--time-limit S]
[--objective paper|shared] [--tie-break shared|none] [--random SEED]
[--goodput analytic|measured]`
— HERD's serving groups (ilp.py) from the command line.

Reads the cluster, models and streams from YAML (config.py) — or, with
`--repository`, `--from` or a cluster file, the repository's models on a
pool of the server's devices (app/planning/cluster_inputs.py; the plan's
device indices are then the server's) — prints the plan
(each group's devices, models, streams and burst tolerance; the minimum)
and writes it (`--out`, plan.py's JSON). `--random SEED` prints the random
grouping baseline (random_groups.py) instead. `--goodput` picks how T_i is
had: `analytic` (problem.py, the default) or `measured`
(app/simulation/herd_goodput.py, passed in by `python -m app`, a
simulated capacity search per model and SLO); the output names which, and
with `measured` lists each model's measured T beside the analytic one and
the seconds the measuring took. Bad input or an infeasible problem: a
message on stderr naming the problem, exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TextIO

from app.planning.cluster import Pool
from app.planning.cluster_cli import (
    ClusterReader,
    add_cluster_arguments,
    left_out,
    load_cluster,
    wants_cluster,
)
from app.planning.cluster_inputs import herd_input
from app.planning.config_input import InputError
from app.planning.herd.config import config_from_dict, load_config
from app.planning.herd.ilp import TIE_BREAKS, SolveOptions, solve
from app.planning.herd.plan import OBJECTIVES, HerdPlan, write_plan
from app.planning.herd.problem import Goodput, Problem, model_streams, single_device_goodput
from app.planning.herd.random_groups import random_plan
from app.planning.plan_files import MadeFrom, inputs_of
from app.scheduling.profile import LatencyProfile

PROG = "python -m app plan herd"
GOODPUTS = ("analytic", "measured")


class GoodputMeasurer(Protocol):
    """Measured T_i (app/simulation/herd_goodput.py's `MeasuredGoodput`): the
    planner takes it from its caller, since planning sits below the
    simulator in the layout (`python -m app` passes it)."""

    def __call__(self, profile: LatencyProfile, slo: float, max_batch: int) -> float: ...

    def report(self, problem: Problem, wall_s: float) -> str: ...


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Group streams, models and devices into serving groups maximising the "
        "least burst tolerance (shepherd-nsdi23.txt §4), an ILP on HiGHS.",
    )
    parser.add_argument(
        "config", type=Path, nargs="?", help="cluster, models and streams (YAML), or a cluster file"
    )
    parser.add_argument("--out", type=Path, help="write the plan to this file (JSON)")
    parser.add_argument("--time-limit", type=float, help="solver seconds (over the config's)")
    parser.add_argument("--objective", choices=OBJECTIVES, help="over the config's")
    parser.add_argument(
        "--tie-break",
        choices=TIE_BREAKS,
        default="shared",
        help="among the paper objective's optima take the one of the largest least shared "
        "burst tolerance (shared, default) or whichever the solver ends with (none)",
    )
    parser.add_argument("--random", type=int, metavar="SEED", help="the random baseline")
    parser.add_argument(
        "--goodput",
        choices=GOODPUTS,
        default="analytic",
        help="each stream's single-device goodput T_i: analytic (2·ℓ(b) ≤ SLO, instant) or "
        "measured (a simulated capacity search with FLEX per model and SLO); default analytic",
    )
    add_cluster_arguments(parser)
    return parser


def main(
    argv: Sequence[str],
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    measurer: Callable[[], GoodputMeasurer] | None = None,
    cluster_reader: ClusterReader | None = None,
) -> int:
    """`argv` is what follows `plan herd`; `measurer` makes the measured T_i
    of `--goodput measured`; `cluster_reader` reads `--repository` and
    `--from` (app/cluster_sources/)."""
    args = build_parser().parse_args(list(argv))
    try:
        problem, objective, time_limit, pool = _problem(args, cluster_reader, err)
        objective = args.objective or objective
        if args.time_limit is not None:
            time_limit = args.time_limit
        goodput: Goodput = single_device_goodput
        goodput_text = "single-device goodput T_i: analytic (largest b with 2·ℓ(b) ≤ SLO, b/ℓ(b))\n"
        if args.goodput == "measured":
            if measurer is None:
                raise ValueError(
                    "--goodput measured runs the simulator: use `python -m app plan herd`"
                )
            measured = measurer()
            began = time.perf_counter()
            model_streams(problem, measured)  # every search, once; the plan reads the cache
            goodput_text = measured.report(problem, time.perf_counter() - began)
            goodput = measured
        if args.random is not None:
            plan = random_plan(problem, args.random, objective, goodput=goodput)
        else:
            plan = solve(
                problem, SolveOptions(objective, time_limit, tie_break=args.tie_break), goodput
            )
        if pool is not None:
            plan = on_server_devices(plan, pool.devices)
    except ValueError as error:
        err.write(f"{PROG}: error: {error}\n")
        return 2
    out.write(format_plan(plan, problem, goodput_text))
    if args.out is not None:
        rates: dict[str, float] = {}
        for stream in problem.streams:
            rates[stream.model] = rates.get(stream.model, 0.0) + stream.rate
        write_plan(plan, args.out, MadeFrom.now("herd", inputs_of(args), argv, rates))
        out.write(f"plan written to {args.out}\n")
    return 0


def _problem(
    args: argparse.Namespace, reader: ClusterReader | None, err: TextIO
) -> tuple[Problem, str, float, Pool | None]:
    """The problem, objective and time limit of HERD's own YAML, or of the
    cluster (with its pool of devices)."""
    if not wants_cluster(args):
        if args.config is None:
            raise InputError("give CONFIG (YAML), --repository DIR or --from URL")
        return (*load_config(args.config), None)
    cluster = load_cluster(args, reader, err)
    body, pool = herd_input(cluster)
    left_out(pool.left_out, err)
    return (*config_from_dict(body, cluster.source), pool)


def on_server_devices(plan: HerdPlan, devices: Sequence[int]) -> HerdPlan:
    """`plan` with its groups' devices renumbered from the pool's 0 … N−1
    to the server's indices `devices` (GET /v2/devices' order)."""
    groups = tuple(
        dataclasses.replace(g, devices=tuple(devices[i] for i in g.devices)) for g in plan.groups
    )
    return dataclasses.replace(plan, groups=groups)


def format_plan(plan: HerdPlan, problem: Problem, goodput_text: str = "") -> str:
    """The plan as a person reads it; `goodput_text` (how T_i was had) goes
    under its title."""
    s = plan.solver
    how = (
        f"{s['status']} in {s['runtime_s']:.2f} s, gap {s['gap']:.2%}"
        if plan.method == "ilp"
        else f"seed {s['seed']}"
    )
    lines = [
        f"HERD plan ({plan.method}, {how}; burst tolerance: {plan.objective}) on "
        f"{problem.cluster.devices} devices, groups of ≤ {problem.cluster.max_group_size}",
        *goodput_text.splitlines(),
        f"least burst tolerance {plan.min_burst_tolerance:.3f}",
        "",
        f"{'group':>5} {'devices':<12} {'streams':>7} {'req/s':>9} {'bt':>7}  models",
    ]
    for j, g in enumerate(plan.groups):
        span = f"{g.devices[0]}–{g.devices[-1]}" if g.devices else "none"
        rate = sum(problem.streams[i].rate for i in g.streams)
        lines.append(
            f"{j:>5} {span:<12} {len(g.streams):>7} {rate:>9.1f} {g.burst_tolerance:>7.3f}  "
            + ", ".join(g.models)
        )
    return "\n".join(lines) + "\n"
