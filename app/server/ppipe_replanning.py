"""PPipe's pipelines made again from the rates the server measures (`REPLAN_S`
with a PPipe plan in force; ppipe.txt §5: the MILP plans for each model's
weight, the share of the load it must carry).

Each epoch, from app/server/replanning.py's loop:

1. each pipelined model's weight is its rate measured over the epoch (a
   model that got no request counts at `IDLE_RATE`, so that it keeps a
   pipeline), its SLO and the cluster (classes, links) the plan in force's,
   its block profiles those the plan was made from (its `timings`);
2. the PPipe MILP on them (app/planning/ppipe/planner.py, the plan's
   variant, `SOLVE_LIMIT_S`), warm-started from the plan in force;
3. both plans scored the MILP's way under the measured rates: the least
   over the models of the throughput their pipelines plan ÷ the model's
   rate — how many times the measured load the plan carries;
4. the new plan is taken up (`POST /v2/plan`: app/server/pipeline_switch.py,
   its pipelines started beside those in force) when that load factor is at
   least `REPLAN_GAIN` (a fraction) above the plan in force's: hysteresis
   above an epoch's noise, and a switch starts executors, which on a small
   machine costs late answers while they start (BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from app.planning.plan_files import MadeFrom
from app.planning.ppipe.milp import PlannerOptions
from app.planning.ppipe.options import ModelDemand
from app.planning.ppipe.plan import Plan, plan_to_dict, read_plan
from app.planning.ppipe.planner import plan as plan_pipelines
from app.planning.ppipe.profiles import load_profile
from app.planning.ppipe.reference import timings_root

KIND = "ppipe-plan"
IDLE_RATE = 0.1  # requests/s a model with no request in the epoch counts at
SOLVE_LIMIT_S = 2.0


@dataclasses.dataclass(frozen=True)
class PpipeReplan:
    """One epoch's re-plan: the load factor of the plan in force and of the
    new plan under the epoch's rates, and the new plan."""

    kept: float
    found: float
    rates: dict[str, float]
    plan: Plan

    def better_by(self, gain: float) -> bool:
        return self.found >= self.kept * (1.0 + gain) - 1e-9

    def document(self, command: str) -> dict[str, Any]:
        made_from = MadeFrom.replanned("ppipe", command, self.rates)
        return plan_to_dict(self.plan, made_from)


def ppipe_replan(
    in_force_path: Path,
    devices: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    measured: dict[str, float],
    own_devices: dict[str, tuple[str, ...] | None],
) -> PpipeReplan:
    """Plan the plan in force's models again for `measured` (requests/s per
    model) and score both plans (module docstring). The devices, profiles
    and configs the other planners read are not PPipe's: it plans over the
    plan's classes with the block profiles it was made from."""
    in_force = read_plan(in_force_path)
    timings = in_force.details.get("timings")
    if timings is None:
        raise ValueError("the PPipe plan in force does not say where its block profiles are")
    root = timings_root(Path(timings))
    rates = {m.name: max(float(measured.get(m.name, 0.0)), IDLE_RATE) for m in in_force.models}
    classes = in_force.cluster.classes
    demands = [
        ModelDemand(m.name, rates[m.name], m.slo_s, load_profile(m.name, root, classes))
        for m in in_force.models
    ]
    options = PlannerOptions(variant=in_force.variant, time_limit_s=SOLVE_LIMIT_S)
    new = plan_pipelines(in_force.cluster, demands, options, start=in_force)
    new = dataclasses.replace(new, details={**new.details, "timings": timings})
    return PpipeReplan(load_factor(in_force, rates), load_factor(new, rates), rates, new)


def load_factor(plan: Plan, rates: dict[str, float]) -> float:
    """The least over `rates`' models of the throughput `plan`'s pipelines
    plan for the model ÷ its rate."""
    return min(
        sum(p.throughput for p in plan.pipelines_of(model)) / rate for model, rate in rates.items()
    )
