"""HERD's serving groups made again from the rates the server measures
(`REPLAN_S` with a HERD plan in force; shepherd-nsdi23.txt §4: HERD plans
periodically, on the streams' rates of the last period).

Each epoch, from `app/server/replanning.py`'s loop:

1. the cluster as the server describes itself (`GET /v2/devices`, `GET
   /v2/profiles`) with the epoch's measured rates, narrowed to the plan in
   force: its devices, its models, groups of at most its largest group's
   size, its burst-tolerance objective. A model that got no request in the
   epoch counts at `IDLE_RATE`, so that it keeps a group;
2. HERD's ILP on it (app/planning/herd/ilp.py, at most `SOLVE_LIMIT_S`);
3. the plan in force scored under the same rates: each group's least burst
   tolerance (app/planning/herd/plan.py, `burst_tolerances`) over its
   devices and models, the least over the groups serving any;
4. the new plan is taken up (`POST /v2/plan`, app/server/plan_switch.py)
   only when its least burst tolerance is at least `REPLAN_GAIN` above the
   one in force's: hysteresis above an epoch's noise.

Under the paper's objective a stream's burst tolerance depends on its
group's size only, so regrouping at the same sizes never raises it: the
`shared` objective (the group's load counted) is the one re-planning moves.

Deviation: the paper regroups per stream; the server's streams are its
models (one stream each, at its measured rate), as `python -m app plan herd
--from URL` plans them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from app.planning.cluster_inputs import herd_input
from app.planning.daemon_index import cluster_from_index
from app.planning.herd.cli import on_server_devices
from app.planning.herd.config import config_from_dict
from app.planning.herd.ilp import SolveOptions, solve
from app.planning.herd.plan import HerdPlan, least_burst_tolerance, read_plan
from app.planning.herd.problem import model_streams
from app.planning.plan_files import MadeFrom

KIND = "herd-plan"
SOLVE_LIMIT_S = 2.0
IDLE_RATE = 0.1  # requests/s a model with no request in the epoch counts at


@dataclasses.dataclass(frozen=True)
class HerdReplan:
    """One epoch's re-plan: the least burst tolerance of the plan in force
    and of the new plan under the epoch's rates, and the new plan's file."""

    kept: float
    found: float
    rates: dict[str, float]
    plan: HerdPlan

    def better_by(self, gain: float) -> bool:
        return self.found - self.kept >= gain

    def document(self, command: str) -> dict[str, Any]:
        made_from = MadeFrom.replanned("herd", command, self.rates)
        return self.plan.to_dict(made_from)


def herd_replan(
    in_force_path: Path,
    devices: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    measured: dict[str, float],
    own_devices: dict[str, tuple[str, ...] | None],
) -> HerdReplan:
    """Plan on `measured` (requests/s per model) over the plan in force's
    devices and models, and score both plans (module docstring). A model
    may go where its own config lets it (`own_devices`, None: anywhere),
    not only on the group the plan in force gave it."""
    in_force = read_plan(in_force_path)
    served = [g for g in in_force.groups if g.models]
    names = {m for g in served for m in g.models}
    used = sorted({d for g in served for d in g.devices})
    device_names = [devices[d]["name"] for d in used]
    rates = {m: max(float(measured.get(m, 0.0)), IDLE_RATE) for m in sorted(names)}
    cluster = cluster_from_index(
        devices,
        [
            {**p, "allowed_devices": own_devices.get(p["name"])}
            for p in profiles
            if p["name"] in names
        ],
        rates,
        "REPLAN_S",
        sections={
            "herd": {
                "devices": device_names,
                "max_group_size": max(len(g.devices) for g in served),
                "objective": in_force.objective,
            }
        },
    )
    body, pool = herd_input(cluster)
    problem, objective, _ = config_from_dict(body, "the re-plan")
    kept = least_burst_tolerance(in_force, model_streams(problem))
    plan = solve(problem, SolveOptions(objective, SOLVE_LIMIT_S))
    plan = on_server_devices(plan, pool.devices)
    return HerdReplan(kept, plan.min_burst_tolerance, rates, plan)
