"""InSS's placement made again from the rates the server measures (`REPLAN_S`
with an InSS plan in force; inss.txt §5.3: InSS re-plans when the rates
change, and takes the new shares up through shadow executors).

Each epoch, from app/server/replanning.py's loop:

1. the cluster as the server describes itself (`GET /v2/devices`, `GET
   /v2/profiles`) with the epoch's measured rates, narrowed to the plan in
   force: its whole devices and its models, at its share step. A model that
   got no request in the epoch counts at `IDLE_RATE`, so that it keeps a
   place;
2. InSS's placement on it for the measured rates × (1 + `REPLAN_GAIN`)
   (app/planning/inss/placement.py: the exact search when the problem is
   small enough, else the greedy one): a plan made for the rates just
   measured has no room for the next epoch's noise, and one a little above
   them would be replaced each time a rate crept up;
3. both plans scored on the measured rates: each of a plan's devices
   configured as it says — its models at their shares, or in turn on the
   whole device — by the same evaluator (problem.py), a model counting when
   it meets its SLO, memory and measured rate there;
4. the new plan is taken up (`POST /v2/plan`: app/server/inss_switch.py,
   app/server/inss_layout.py when it moves models) when it serves more of
   the models at their measured rates, or as many with a Σ throughput at
   least `REPLAN_GAIN` (a fraction) above the plan in force's: hysteresis
   above an epoch's noise, so that the plan does not flap.

Deviation: the paper's objective is Σ throughput with every model at its
rate; the lexicographic score (models served first) is the planner's own
(placement.py), so that a plan in force that no longer meets a rate is
always replaced by one that does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from app.planning.cluster_inputs import inss_input
from app.planning.daemon_index import cluster_from_index
from app.planning.inss.config import problem_from_dict
from app.planning.inss.placement import MAX_ASSIGNMENTS, solve_exact, solve_greedy
from app.planning.inss.plan import Plan, plan_to_dict, read_plan
from app.planning.inss.problem import DeviceEvaluator, Problem
from app.planning.plan_files import MadeFrom
from app.runtime.shares import SHARE_SEP

KIND = "inss-plan"
IDLE_RATE = 0.1  # requests/s a model with no request in the epoch counts at


@dataclasses.dataclass(frozen=True)
class Score:
    """A plan under an epoch's rates: the models it serves at them, and
    their Σ throughput (requests/s)."""

    served: int
    throughput: float

    def __str__(self) -> str:
        return f"{self.served} served, Σ {self.throughput:.1f} r/s"


@dataclasses.dataclass(frozen=True)
class InssReplan:
    """One epoch's re-plan: the plan in force's score and the new plan's
    under the epoch's rates, and the new plan."""

    kept: Score
    found: Score
    rates: dict[str, float]
    plan: Plan

    def better_by(self, gain: float) -> bool:
        if self.found.served != self.kept.served:
            return self.found.served > self.kept.served
        return self.found.throughput >= self.kept.throughput * (1.0 + gain) - 1e-9

    def document(self, command: str) -> dict[str, Any]:
        made_from = MadeFrom.replanned("inss", command, self.rates)
        return plan_to_dict(self.plan, made_from)


def inss_replan(
    in_force_path: Path,
    devices: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    measured: dict[str, float],
    own_devices: dict[str, tuple[str, ...] | None],
    headroom: float = 1.0,
) -> InssReplan:
    """Plan on `measured` (requests/s per model) × `headroom` over the plan
    in force's devices and models, and score both plans on the measured
    rates (module docstring). A model may go where its own config lets it
    (`own_devices`, None: anywhere)."""
    in_force = read_plan(in_force_path)
    names = {m.model for m in in_force.models}
    planned = {d.device for d in in_force.devices}
    rates = {m: max(float(measured.get(m, 0.0)), IDLE_RATE) for m in sorted(names)}
    on_devices = [d for d in devices if str(d["name"]).partition(SHARE_SEP)[0] in planned]
    allowed = [
        {**p, "allowed_devices": own_devices.get(p["name"])} for p in profiles if p["name"] in names
    ]

    def problem_at(at: dict[str, float]) -> Problem:
        cluster = cluster_from_index(on_devices, allowed, at, "REPLAN_S")
        body = {**inss_input(cluster), "share_step": in_force.share_step}
        return problem_from_dict(body, "the re-plan")

    problem = problem_at(rates)
    wanted = problem_at({m: r * headroom for m, r in rates.items()})
    small = (len(wanted.devices) + 1) ** len(wanted.models) <= MAX_ASSIGNMENTS
    plan = solve_exact(wanted) if small else solve_greedy(wanted)
    return InssReplan(score(in_force, problem), score(plan, problem), rates, plan)


def score(plan: Plan, problem: Problem) -> Score:
    """`plan`'s devices configured as it says, evaluated on `problem` (its
    rates and latency models): the models served and their throughput."""
    evaluator = DeviceEvaluator(problem)
    by_name = {d.name: d for d in problem.devices}
    known = {m.name for m in problem.models}
    time_shared = set(plan.details.get("time_shared", ()))
    served, throughput = 0, 0.0
    for device_plan in plan.devices:
        device = by_name.get(device_plan.device)
        models = [m for m in device_plan.models if m in known]
        if device is None or not models:
            continue
        if device_plan.device in time_shared and len(models) > 1:
            outcomes = evaluator.time_share(device, models) or ()
        else:
            shares = {m: float(plan.model(m).share or 1.0) for m in models}
            outcomes = evaluator.configure(device, shares)
        for outcome in outcomes:
            if outcome.ok:
                served += 1
                throughput += outcome.throughput
    return Score(served, throughput)
