"""`python -m app plan inss [CONFIG.yaml] [--repository DIR | --from URL]
[--out FILE] [--exact|--greedy|--learned]
[--share-step 0.1] [--train-steps N] [--seed S] [--policy-out FILE | --policy FILE]`
— InSS's placement (placement.py, learned.py) from the command line.

Reads the devices and models from YAML (config.py) — or, with
`--repository`, `--from` or a cluster file, the repository's models on the
server's devices (app/planning/cluster_inputs.py) — prints the plan and
writes it (`--out`, plan.py's JSON). `--exact` is the branch and bound,
`--greedy` the heuristic; without either, the exact search when the problem
is within its size limit, else the greedy. `--learned` trains the SAC-D
agent for `--train-steps` steps with `--seed` (or loads a trained one with
`--policy`; `--policy-out` saves the one trained) and prints its plan and,
when the exact search can be run, the exact objective and the gap. Bad
input: a message on stderr naming the problem, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from app.planning.cluster import device_pool
from app.planning.cluster_cli import (
    ClusterReader,
    add_cluster_arguments,
    left_out,
    load_cluster,
    wants_cluster,
)
from app.planning.cluster_inputs import inss_input
from app.planning.config_input import InputError
from app.planning.inss.config import load_problem, problem_from_dict
from app.planning.inss.placement import MAX_ASSIGNMENTS, solve_exact, solve_greedy
from app.planning.inss.plan import Plan, write_plan
from app.planning.inss.problem import Problem
from app.planning.plan_files import MadeFrom, inputs_of

PROG = "python -m app plan inss"
DEFAULT_TRAIN_STEPS = 20_000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Place models on shared devices with MPS shares and BDA batch sizes "
        "(inss.txt problem (1)): an exact search for small clusters or a greedy heuristic.",
    )
    parser.add_argument(
        "config", type=Path, nargs="?", help="devices and models (YAML), or a cluster file"
    )
    parser.add_argument("--out", type=Path, help="write the plan to this file (JSON)")
    method = parser.add_mutually_exclusive_group()
    method.add_argument("--exact", action="store_true", help="exhaustive search with pruning")
    method.add_argument("--greedy", action="store_true", help="the greedy heuristic")
    method.add_argument("--learned", action="store_true", help="the SAC-D agent (needs torch)")
    parser.add_argument(
        "--share-step", type=float, help="share grid step, a fraction (over the config's; 0.1)"
    )
    learned = parser.add_argument_group("--learned")
    learned.add_argument(
        "--train-steps", type=int, help=f"training steps (default {DEFAULT_TRAIN_STEPS})"
    )
    learned.add_argument("--seed", type=int, help="training seed (default 0)")
    policy = learned.add_mutually_exclusive_group()
    policy.add_argument("--policy-out", type=Path, help="save the trained policy here")
    policy.add_argument("--policy", type=Path, help="load a trained policy instead of training")
    add_cluster_arguments(parser)
    return parser


def main(
    argv: Sequence[str],
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    cluster_reader: ClusterReader | None = None,
) -> int:
    """`argv` is what follows `plan inss`; `cluster_reader` reads
    `--repository` and `--from` (app/cluster_sources/)."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    learned_flags = [f"--{name.replace('_', '-')}" for name in _LEARNED if getattr(args, name)]
    if learned_flags and not args.learned:
        parser.error(f"{', '.join(learned_flags)} only with --learned")
    try:
        problem = _problem(args, cluster_reader, err)
        small = (len(problem.devices) + 1) ** len(problem.models) <= MAX_ASSIGNMENTS
        if args.learned:
            plan, note = _learned(problem, args, small, out)
        else:
            note = ""
            plan = solve_greedy(problem) if args.greedy or not (args.exact or small) else None
            if plan is None:
                plan = solve_exact(problem)
    except ValueError as error:
        err.write(f"{PROG}: error: {error}\n")
        return 2
    out.write(format_plan(plan) + note)
    if args.out is not None:
        rates = {m.model: m.rate for m in plan.models}
        write_plan(plan, args.out, MadeFrom.now("inss", inputs_of(args), argv, rates))
        out.write(f"plan written to {args.out}\n")
    return 0


_LEARNED = ("train_steps", "seed", "policy_out", "policy")


def _problem(args: argparse.Namespace, reader: ClusterReader | None, err: TextIO) -> Problem:
    """The problem of InSS's own YAML, or of the cluster."""
    if not wants_cluster(args):
        if args.config is None:
            raise InputError("give CONFIG (YAML), --repository DIR or --from URL")
        return load_problem(args.config, args.share_step)
    cluster = load_cluster(args, reader, err)
    left_out(device_pool(cluster, "inss").left_out, err)
    return problem_from_dict(inss_input(cluster), cluster.source, args.share_step)


def _learned(
    problem: Problem, args: argparse.Namespace, small: bool, out: TextIO
) -> tuple[Plan, str]:
    """Train (or load) the policy, its plan, and the line comparing it with
    the exact plan when that can be searched."""
    from app.planning.inss.learned import (
        gap_percent,
        load_policy,
        save_policy,
        solve_learned,
        train,
    )

    if args.policy is not None:
        policy = load_policy(args.policy)
    else:
        steps = DEFAULT_TRAIN_STEPS if args.train_steps is None else args.train_steps
        policy = train(problem, steps, 0 if args.seed is None else args.seed)
        if args.policy_out is not None:
            save_policy(policy, args.policy_out)
            out.write(f"policy written to {args.policy_out}\n")
    plan = solve_learned(problem, policy)
    if not small:
        return plan, "exact: not searched (the problem is over the exact search's size limit)\n"
    exact = solve_exact(problem)
    gap = gap_percent(exact.objective, plan.objective)
    return plan, (
        f"exact objective {exact.objective:.1f} requests/s "
        f"({'feasible' if exact.feasible else 'INFEASIBLE'}); learned gap {gap:.2f} %\n"
    )


def format_plan(plan: Plan) -> str:
    """The plan as a person reads it."""
    verdict = "feasible" if plan.feasible else "INFEASIBLE (not every model is served)"
    lines = [
        f"InSS plan ({plan.method}, {plan.share_step:.0%} share steps) on "
        f"{len(plan.devices)} devices, {len(plan.models)} models: {verdict}",
        f"objective {plan.objective:.1f} requests/s (Σ throughput of the served models)",
        "",
        f"{'model':<14} {'rate':>7} {'SLO ms':>7} {'device':<8} {'share':>5} {'batch':>5} "
        f"{'t_inf ms':>8} {'worst ms':>8} {'req/s':>8}",
    ]
    for m in plan.models:
        head = f"{m.model:<14} {m.rate:>7g} {m.slo_s * 1e3:>7g} "
        if m.served:
            lines.append(
                head + f"{m.device:<8} {m.share:>5.0%} {m.batch:>5} {m.exec_s * 1e3:>8.2f} "
                f"{m.worst_latency_s * 1e3:>8.2f} {m.throughput:>8.1f}"
            )
        else:
            lines.append(head + "not served")
    for model, reason in plan.unserved().items():
        lines.append(f"  {model}: {reason}")
    lines += ["", f"{'device':<8} {'kind':<10} {'shares':>6} {'memory MB':>14}  models"]
    for d in plan.devices:
        lines.append(
            f"{d.device:<8} {d.kind:<10} {d.shares_used:>6.0%} "
            f"{d.memory_used_bytes / 1e6:>6.0f}/{d.memory_bytes / 1e6:<7.0f}  "
            + (", ".join(d.models) or "-")
        )
    lines += ["", "search: " + ", ".join(f"{k} {v}" for k, v in plan.details.items())]
    return "\n".join(lines) + "\n"
