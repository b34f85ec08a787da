"""Re-planning while serving (`REPLAN_S`): Symphony's partitioning into
sub-clusters (symphony.txt §4.7), Shepherd's HERD groups
(app/server/herd_replanning.py), InSS's placement
(app/server/inss_replanning.py) or PPipe's pipelines
(app/server/ppipe_replanning.py), made again from the rates the server
measures, and taken up while serving when it is better enough.

Every `REPLAN_S` seconds, with a partition plan in force (a HERD, InSS or
PPipe plan: the same loop, its own planner and score):

1. each model's rate over the last epoch, from the statistics' request
   counts (answered and failed);
2. the partition MILP on those rates, the plan in force as its `current`
   assignment (a model's move costs its load cost), its R_max, S_max and w,
   the weights from each model's profile index (`GET /v2/profiles`);
3. the new plan is taken up (app/server/plan_switch.py, as `POST /v2/plan`)
   only when its objective — the largest sub-cluster's deviation from the
   average rate as a fraction of it, plus w × the same for memory — is at
   least `REPLAN_GAIN` below the plan in force's under the same rates:
   hysteresis above the noise of an epoch's measured rates, so that the
   plan does not flap.

The epoch's rates and the decision are logged; a re-plan that cannot be
taken up (a model's executor restarting) is logged and tried again next
epoch. Symphony's autoscaler (AUTOSCALE) keeps acting within each core.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import ServingError
from app.planning.partition.config import problem_from_dict
from app.planning.partition.milp import solve
from app.planning.partition.plan import plan_to_dict, read_plan
from app.planning.partition.problem import measure
from app.planning.plan_files import MadeFrom
from app.server import herd_replanning, inss_replanning, ppipe_replanning
from app.server.control_host import ControlHost

log = logging.getLogger("app.server")

KIND = "symphony-partition"
# The plans REPLAN_S re-plans.
KINDS = (KIND, herd_replanning.KIND, inss_replanning.KIND, ppipe_replanning.KIND)
SOLVE_LIMIT_S = 2.0
MB = 1e6


class Replanner:
    """The re-planning loop of one service (module docstring). `apply`
    takes a plan file's bytes up while serving (Management.apply_plan)."""

    def __init__(
        self,
        service: ControlHost,
        apply: Callable[[bytes], Awaitable[dict[str, Any]]],
        every_s: float,
        gain: float,
        profiles: Callable[[], list[dict[str, Any]]],
        clock: Callable[[], float] = time.monotonic,
        devices: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.service = service
        self.apply = apply
        self.every_s = every_s
        self.gain = gain
        self.profiles = profiles
        self.clock = clock
        self.devices = devices  # GET /v2/devices' entries (HERD re-plans over them)
        self.taken_up = 0  # re-plans taken up so far

    async def run(self) -> None:
        """Re-plan every `every_s` until cancelled."""
        counts, since = self.counts(), self.clock()
        while True:
            await asyncio.sleep(self.every_s)
            now_counts, now = self.counts(), self.clock()
            elapsed = max(now - since, 1e-9)
            rates = {m: (now_counts[m] - counts.get(m, 0)) / elapsed for m in now_counts}
            counts, since = now_counts, now
            try:
                await self.replan(rates)
            except ServingError as exc:
                log.warning("re-plan not taken up: %s", exc)
            except ValueError as exc:  # the planner's: no plan fits these rates
                log.warning("no re-plan on the rates measured: %s", exc)
            except Exception:
                log.exception("re-planning failed")

    def counts(self) -> dict[str, int]:
        """Requests answered or failed so far, per model (all its versions)."""
        out: dict[str, int] = {}
        for stat in self.service.statistics.report()["model_stats"]:
            stats = stat["inference_stats"]
            n = int(stats["success"]["count"]) + int(stats["fail"]["count"])
            out[stat["name"]] = out.get(stat["name"], 0) + n
        return out

    async def replan(self, rates: dict[str, float]) -> dict[str, Any] | None:
        """Plan on `rates` (requests/s per model) and take the plan up when
        it is better enough; what the switch did, or None (plan kept)."""
        plan = self.service.plan
        if plan is not None and plan.file.kind in PLACED:
            return await self.replan_placed(plan.file.kind, plan.path, rates)
        if plan is None or plan.file.kind != KIND:
            return None
        in_force = read_plan(plan.path)
        current = in_force.assignment()
        memory = {p["name"]: float(p.get("memory_bytes") or 0.0) for p in self.profiles()}
        models = [
            {"name": name, "rate": float(rates.get(name, 0.0)), "static_mb": memory[name] / MB}
            for name in sorted(memory)
            if name in current
        ]
        body: dict[str, Any] = {
            "sub_clusters": len(in_force.sub_clusters),
            "r_max": in_force.r_max,
            "s_max_mb": in_force.s_max_bytes / MB,
            "w": in_force.w,
            "models": models,
        }
        problem = problem_from_dict(body, "the re-plan", current=current)
        kept = measure(problem, np.array([current[m["name"]] for m in models])).objective
        new = await asyncio.to_thread(solve, problem, SOLVE_LIMIT_S)
        shown = ", ".join(f"{m['name']} {m['rate']:.1f}" for m in models)
        if kept - new.objective < self.gain:
            log.info(
                "re-plan on rates %s: objective %.4f against %.4f in force; plan kept",
                shown,
                new.objective,
                kept,
            )
            return None
        made_from = MadeFrom.replanned(
            "partition",
            f"REPLAN_S={self.every_s:g} REPLAN_GAIN={self.gain:g}",
            {m["name"]: m["rate"] for m in models},
        )
        switched = await self.apply(json.dumps(plan_to_dict(new, made_from)).encode())
        self.taken_up += 1
        log.info(
            "re-plan on rates %s: objective %.4f against %.4f in force; %d move(s) taken up",
            shown,
            new.objective,
            kept,
            len(new.moves),
        )
        return switched

    async def replan_placed(
        self, kind: str, path: Path, rates: dict[str, float]
    ) -> dict[str, Any] | None:
        """HERD's groups (herd_replanning.py), InSS's placement
        (inss_replanning.py) or PPipe's pipelines (ppipe_replanning.py) on
        `rates`, taken up when the planner's score says it is `gain` better
        than the plan in force's."""
        assert self.devices is not None, "HERD and InSS re-plan over the server's devices"
        service = self.service
        own = {
            state.config.model_name: service.own_devices.get(key, state.config.devices)
            for key, state in service.models.items()
        }
        planner, measure = PLACED[kind]
        if kind == inss_replanning.KIND:  # InSS plans with room above the rates
            planner = functools.partial(planner, headroom=1.0 + self.gain)
        found = await asyncio.to_thread(planner, path, self.devices(), self.profiles(), rates, own)
        shown = ", ".join(f"{m} {r:.1f}" for m, r in found.rates.items())
        scores = f"{measure} {_shown(found.found)} against {_shown(found.kept)} in force"
        if not found.better_by(self.gain):
            log.info("re-plan on rates %s: %s; plan kept", shown, scores)
            return None
        command = f"REPLAN_S={self.every_s:g} REPLAN_GAIN={self.gain:g}"
        switched = await self.apply(json.dumps(found.document(command)).encode())
        self.taken_up += 1
        log.info("re-plan on rates %s: %s; taken up", shown, scores)
        return switched


# Plans whose re-planner works over the server's devices: kind → (the
# re-planner, what its score measures).
PLACED: dict[str, tuple[Callable[..., Any], str]] = {
    herd_replanning.KIND: (herd_replanning.herd_replan, "least burst tolerance"),
    inss_replanning.KIND: (inss_replanning.inss_replan, "models at their rates and throughput"),
    ppipe_replanning.KIND: (ppipe_replanning.ppipe_replan, "load factor"),
}


def _shown(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
