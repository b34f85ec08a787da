"""Re-planning on a rate shift, simulated: Symphony's partitioning into
sub-clusters (symphony.txt §4.7) made again each epoch from the rates just
measured, against the plan made once and against a plan made with
hindsight for each phase.

    python -m bench.replanning            # 3 phases of 30 s, epochs of 5 s (~2 min)
    python -m bench.replanning --quick    # 3 phases of 10 s, epochs of 2.5 s
    python -m bench.replanning --herd     # HERD's groups under flex instead
    python -m bench.replanning --inss     # InSS's placement on its paper setting

The Table 5 zoo (bench/workloads/symphony-table5-zoo.yaml: 35 models, 64
emulated devices, Γ(0.5) arrivals, 4,800 r/s × `--rate-scale`, 1.4 by
default: 6,720 r/s) with skewed popularity — the
i-th model of a phase's order gets a share ∝ 0.9^i of the total — and the
order drawn afresh at each phase (seeded): the rates are permuted every
phase. Policy `symphony`, 4 sub-clusters of 16 devices, weights from
bench/workloads/herd/zoo-memory.yaml; the partition MILP (HiGHS, 2 s) as
`python -m app plan partition` runs it, R_max 5,000 r/s, S_max 11 GB.

* **fixed** — the plan of phase 1's rates, kept throughout;
* **re-planned** — at the end of each epoch, the rates measured over it
  (its arrivals counted) → the planner, from the plan in force (its moves
  cost 1 each, at most `--c-max`) → taken up when its objective (the
  largest sub-cluster's deviation from the average rate, as a fraction of
  it, plus the same for memory) is at least `--gain` (0.2) below the plan
  in force's under the same rates — above the noise of an epoch's measured
  rates, so the plan does not flap — as REPLAN_GAIN does in the daemon;
* **hindsight** — each phase served by the plan of that phase's rates.

With `--inss`, InSS's placement instead (app/server/inss_replanning.py),
on its paper setting (bench/workloads/inss/paper-setting.yaml: 6 models on
4 GPUs of two kinds, the latency model's fits): each phase's rates are the
file's × a factor from 0.4 to 1.6 dealt to the models in an order drawn per
phase; each plan is InSS's exact placement for the rates × (1 + `--gain`),
taken up when it serves more models at the measured rates than the plan in
force, or as many with a Σ throughput `--gain` higher; each epoch simulated
as bench/inss_sim.py serves a plan (each share its own core and device at
its share's ℓ(b), policy `symphony`).

With `--herd`, Shepherd's HERD instead (app/server/herd_replanning.py):
each plan is HERD's ILP (2 s) on the zoo's models (bench/herd.py's
profiles and memory) over the 64 devices, groups of at most 16 among 8
candidates, 1.5 GB a device with 0.5 GB kept for FLEX, the `shared` burst
tolerance; policy `flex` in each group (`simulate_groups`); a re-plan is
taken up when its least burst tolerance under the epoch's rates is at least
`--gain` above the plan in force's.

Each epoch is simulated on its own (`simulate_partitioned`, the same core
the daemon runs, on virtual time), with the same arrivals for the three.
Deviation: the queues are not carried across an epoch's end (the daemon's
switch hands them over, app/server/plan_switch.py); what they hold is
under an SLO (≤ 0.1 s) of work against epochs of seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from app.planning.herd.ilp import SolveOptions
from app.planning.herd.ilp import solve as herd_solve
from app.planning.herd.plan import HerdPlan, least_burst_tolerance
from app.planning.herd.problem import Cluster as HerdCluster
from app.planning.herd.problem import Problem as HerdProblem
from app.planning.herd.problem import Stream as HerdStream
from app.planning.herd.problem import model_streams
from app.planning.inss.config import load_problem as load_inss_problem
from app.planning.inss.placement import solve_exact
from app.planning.inss.plan import Plan as InssPlan
from app.planning.inss.problem import Problem as InssProblem
from app.planning.partition.config import problem_from_dict
from app.planning.partition.milp import solve
from app.planning.partition.problem import PartitionProblem, measure
from app.server.inss_replanning import IDLE_RATE
from app.server.inss_replanning import score as inss_score
from app.simulation.grouped import GroupSpec, simulate_groups
from app.simulation.partitioned import simulate_partitioned
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import Workload, load_workload
from bench.inss_sim import SystemRun, as_served, plan_layout, simulate_layout
from bench.inss_sim import workload as inss_workload
from bench.progress import say

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "bench" / "workloads" / "symphony-table5-zoo.yaml"
MEMORY = ROOT / "bench" / "workloads" / "herd" / "zoo-memory.yaml"
INSS_SETTING = ROOT / "bench" / "workloads" / "inss" / "paper-setting.yaml"
SUB_CLUSTERS = 4
SKEW = 0.9
MIB = 1 << 20
STRATEGIES = ("fixed", "re-planned", "hindsight")


@dataclasses.dataclass
class Setup:
    workload: Workload
    memory_mb: dict[str, float]
    phase_rates: list[np.ndarray]  # per phase, per model (the workload's order)
    rate_scale: float
    phase_s: float
    epoch_s: float
    gain: float
    c_max: float | None
    time_limit_s: float


def phase_rates(workload: Workload, phases: int, seed: int) -> list[np.ndarray]:
    """Per phase, each model's rate: shares ∝ SKEW^i in an order drawn per phase."""
    total = sum(workload.model_rates())
    shares = SKEW ** np.arange(len(workload.models))
    shares /= shares.sum()
    rng = np.random.default_rng(seed)
    return [total * shares[np.argsort(rng.permutation(len(shares)))] for _ in range(phases)]


def problem(setup: Setup, rates: np.ndarray, current: dict[str, int] | None) -> PartitionProblem:
    models = [
        {"name": m.name, "rate": float(r), "static_mb": setup.memory_mb[m.name]}
        for m, r in zip(setup.workload.models, rates, strict=True)
    ]
    body: dict[str, Any] = {
        "sub_clusters": SUB_CLUSTERS,
        "r_max": 5000,
        "s_max_mb": 11000,
        "models": models,
    }
    if current is not None and setup.c_max is not None:
        body["c_max"] = setup.c_max
    return problem_from_dict(body, "re-plan", current=current or {})


def plan(setup: Setup, rates: np.ndarray, current: dict[str, int] | None) -> dict[str, int]:
    return solve(problem(setup, rates, current), time_limit_s=setup.time_limit_s).assignment()


def assignment_array(setup: Setup, assignment: dict[str, int]) -> np.ndarray:
    return np.array([assignment[m.name] for m in setup.workload.models])


class PartitionPlans:
    """Symphony's partitions: plan, score and simulate one epoch."""

    policy = "symphony"

    def __init__(self, setup: Setup) -> None:
        self.setup = setup

    def plan(self, rates: np.ndarray, current: dict[str, int] | None) -> dict[str, int]:
        return plan(self.setup, rates, current)

    def gain(self, current: dict[str, int], proposed: dict[str, int], rates: np.ndarray) -> float:
        """How much better `proposed` is than `current` under `rates`."""
        scored = problem(self.setup, rates, None)
        now = measure(scored, assignment_array(self.setup, current)).objective
        new = measure(scored, assignment_array(self.setup, proposed)).objective
        return now - new

    def moves(self, current: dict[str, int], proposed: dict[str, int]) -> int:
        return sum(proposed[m] != current[m] for m in current)

    def simulate(self, workload: Workload, in_force: dict[str, int], arrivals: Any) -> Any:
        return simulate_partitioned(workload, in_force, self.policy, arrivals=arrivals).result


class HerdPlans:
    """Shepherd's HERD groups: plan, score and simulate one epoch."""

    policy = "flex"
    objective = "shared"

    def __init__(self, setup: Setup) -> None:
        from bench.herd import model_of, zoo

        self.setup = setup
        self.models = [model_of(entry, entry["name"]) for entry in zoo()]
        devices = len(setup.workload.devices)
        self.cluster = HerdCluster(devices, 1536 * MIB, 16, reserve=512 * MIB, groups=8)

    def problem(self, rates: np.ndarray) -> HerdProblem:
        streams = tuple(
            HerdStream(m.name, max(float(r), 0.1)) for m, r in zip(self.models, rates, strict=True)
        )
        return HerdProblem(tuple(self.models), streams, self.cluster)

    def plan(self, rates: np.ndarray, current: HerdPlan | None) -> HerdPlan:
        options = SolveOptions(self.objective, self.setup.time_limit_s)
        return herd_solve(self.problem(rates), options)

    def gain(self, current: HerdPlan, proposed: HerdPlan, rates: np.ndarray) -> float:
        streams = model_streams(self.problem(rates))
        return least_burst_tolerance(proposed, streams) - least_burst_tolerance(current, streams)

    def moves(self, current: HerdPlan, proposed: HerdPlan) -> int:
        was, now = current.group_of_model(), proposed.group_of_model()
        old_sets = {frozenset(g.models) for g in current.groups}
        return sum(
            frozenset(proposed.groups[now[m]].models) not in old_sets for m in now if m in was
        )

    def simulate(self, workload: Workload, in_force: HerdPlan, arrivals: Any) -> Any:
        groups = [GroupSpec(g.devices, g.models) for g in in_force.groups if g.models and g.devices]
        return simulate_groups(workload, groups, self.policy, arrivals=arrivals)


class InssPlans:
    """InSS's placement, as the daemon re-plans it (app/server/inss_replanning.py):
    planned for the rates × (1 + gain), scored on the measured rates (the
    models served at them first, then Σ throughput), simulated as the daemon
    serves a plan (bench/inss_sim.py: each share its own core, policy
    `symphony`)."""

    def __init__(self, setup: Setup, problem: InssProblem) -> None:
        self.setup = setup
        self.problem = problem

    def at(self, rates: np.ndarray) -> InssProblem:
        models = tuple(
            dataclasses.replace(m, rate=max(float(r), IDLE_RATE))
            for m, r in zip(self.problem.models, rates, strict=True)
        )
        return dataclasses.replace(self.problem, models=models)

    def plan(self, rates: np.ndarray, current: InssPlan | None) -> InssPlan:
        return solve_exact(self.at(np.asarray(rates) * (1.0 + self.setup.gain)))

    def gain(self, current: InssPlan, proposed: InssPlan, rates: np.ndarray) -> float:
        """The Σ throughput's gain, as a fraction, when both serve as many
        models at `rates`; ±inf when one serves more."""
        problem = self.at(rates)
        kept, found = inss_score(current, problem), inss_score(proposed, problem)
        if found.served != kept.served:
            return math.inf if found.served > kept.served else -math.inf
        return found.throughput / kept.throughput - 1.0 if kept.throughput > 0 else 0.0

    def moves(self, current: InssPlan, proposed: InssPlan) -> int:
        return sum(current.model(m.model).device != m.device for m in proposed.models)

    def simulate(self, workload: Workload, in_force: InssPlan, arrivals: Any) -> Any:
        problem = self.at(np.array([m.rate for m in workload.models]))
        layout = as_served(plan_layout(problem, in_force))
        return SystemRun(simulate_layout(problem, layout, arrivals, workload.duration_s), layout)


def inss_phase_rates(problem: InssProblem, phases: int, seed: int) -> list[np.ndarray]:
    """Per phase, each model's rate: the file's × a factor from 0.4 to 1.6,
    the factors dealt to the models in an order drawn per phase."""
    base = np.array([m.rate for m in problem.models])
    factors = np.linspace(0.4, 1.6, len(base))
    rng = np.random.default_rng(seed)
    return [base * factors[rng.permutation(len(base))] for _ in range(phases)]


def run(setup: Setup, phases: int, plans: Any = None) -> dict[str, Any]:
    plans = plans or PartitionPlans(setup)
    per_phase = round(setup.phase_s / setup.epoch_s)
    epochs = phases * per_phase
    # HERD's burst tolerance reads absolute rates (the measured ones are scaled).
    scale = setup.rate_scale if isinstance(plans, HerdPlans) else 1.0
    hindsight = [plans.plan(rates * scale, None) for rates in setup.phase_rates]
    in_force = {"fixed": hindsight[0], "re-planned": hindsight[0], "hindsight": hindsight[0]}
    good = dict.fromkeys(STRATEGIES, 0)
    sent = 0
    switches: list[dict[str, Any]] = []
    began = time.monotonic()
    for epoch in range(epochs):
        phase = epoch // per_phase
        rates = setup.phase_rates[phase]
        in_force["hindsight"] = hindsight[phase]
        models = [
            dataclasses.replace(m, rate=float(r))
            for m, r in zip(setup.workload.models, rates, strict=True)
        ]
        workload = dataclasses.replace(
            setup.workload, models=models, duration_s=setup.epoch_s, seed=1000 + epoch
        )
        arrivals = generate_arrivals(workload, setup.rate_scale)
        sent += len(arrivals)
        for strategy in STRATEGIES:
            result = plans.simulate(workload, in_force[strategy], arrivals)
            overall = result.summary["overall"]
            good[strategy] += round(overall["slo_attainment"] * overall["requests"])
        measured = np.bincount(arrivals.model_index, minlength=len(models)) / setup.epoch_s
        current = in_force["re-planned"]
        proposed = plans.plan(measured, current)
        gain = plans.gain(current, proposed, measured)
        if gain >= setup.gain:
            switches.append(
                {
                    "after_epoch": epoch + 1,
                    "gain": round(gain, 4),
                    "moves": plans.moves(current, proposed),
                }
            )
            in_force["re-planned"] = proposed
        say(
            f"epoch {epoch + 1}/{epochs} (phase {phase + 1}): within SLO "
            + ", ".join(f"{s} {good[s] / sent:.1%}" for s in STRATEGIES)
            + f" · elapsed {time.monotonic() - began:.0f} s"
        )
    duration = epochs * setup.epoch_s
    goodput = {s: good[s] / duration for s in STRATEGIES}
    return {
        "sent": sent,
        "duration_s": duration,
        "goodput_rps": goodput,
        "within_slo": {s: good[s] / sent for s in STRATEGIES},
        "re-planned_of_hindsight": goodput["re-planned"] / goodput["hindsight"],
        "fixed_of_hindsight": goodput["fixed"] / goodput["hindsight"],
        "switches": switches,
    }


def _table(report: dict[str, Any]) -> str:
    lines = ["| plan | goodput r/s | within SLO | of hindsight |", "|---|---:|---:|---:|"]
    hindsight = report["goodput_rps"]["hindsight"]
    for s in STRATEGIES:
        g = report["goodput_rps"][s]
        lines.append(f"| {s} | {g:,.0f} | {report['within_slo'][s]:.1%} | {g / hindsight:.3f} |")
    moves = [s["moves"] for s in report["switches"]]
    lines.append("")
    lines.append(
        f"{report['sent']:,} requests over {report['duration_s']:g} s; the re-planned run took "
        f"up {len(moves)} plans (moves each: {moves})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replanning", description=__doc__)
    parser.add_argument("--phases", type=int, default=3)
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--epoch-s", type=float, default=5.0)
    parser.add_argument("--gain", type=float, default=0.2, help="hysteresis (default 0.2)")
    parser.add_argument("--rate-scale", type=float, default=1.4)
    parser.add_argument("--c-max", type=float, default=None, help="moves per re-plan at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="phases of 10 s, epochs of 2.5 s")
    parser.add_argument("--json", type=Path, help="write the report here too")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--herd", action="store_true", help="HERD's groups under flex")
    mode.add_argument("--inss", action="store_true", help="InSS's placement (its paper setting)")
    parser.add_argument(
        "--time-limit-s", type=float, default=2.0, help="per plan's MILP solve (default 2)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.phase_s, args.epoch_s = 10.0, 2.5
    if args.time_limit_s <= 0:
        parser.error("--time-limit-s must be > 0")
    if args.phase_s < args.epoch_s or args.phases < 1:
        parser.error("a phase holds at least one epoch, and there is at least one phase")
    if args.inss:
        inss_problem = load_inss_problem(INSS_SETTING)
        workload = inss_workload(inss_problem, "poisson", args.phase_s, 0.0, args.seed)
        rates = inss_phase_rates(inss_problem, args.phases, args.seed)
        memory: dict[str, float] = {}
        args.rate_scale = 1.0
    else:
        workload = load_workload(ZOO)
        memory = {str(k): float(v) for k, v in yaml.safe_load(MEMORY.read_text()).items()}
        rates = phase_rates(workload, args.phases, args.seed)
    setup = Setup(
        workload,
        memory,
        rates,
        args.rate_scale,
        args.phase_s,
        args.epoch_s,
        args.gain,
        args.c_max,
        args.time_limit_s,
    )
    say(
        f"{args.phases} phases of {args.phase_s:g} s, epochs of {args.epoch_s:g} s, "
        f"{len(workload.models)} models on "
        + (f"{len(inss_problem.devices)} GPUs" if args.inss else f"{len(workload.devices)} devices")
    )
    plans: Any = None
    if args.herd:
        plans = HerdPlans(setup)
    elif args.inss:
        plans = InssPlans(setup, inss_problem)
    report = run(setup, args.phases, plans)
    report["planner"] = "herd" if args.herd else "inss" if args.inss else "partition"
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(_table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
