"""A PPipe plan taken up while serving (`POST /v2/plan`): new pipelines
started beside those in force, then the plan's models routed to them at one
instant.

PPipe plans again when the rates or the devices change (ppipe.txt §5: the
MILP runs offline, seconds to minutes, on the rates it is given); a new plan
may cut the models at other blocks, over other classes and instances. The
server goes from one plan to the other blue-green:

1. the posted plan is checked as at start-up (app/server/pipeline_service.py
   `start_pipelines`: its models in the repository, their partitionings and
   block profiles, its classes live ones) and must pipeline the models the
   plan in force does — a plan that takes a model from ordinary serving
   into a pipeline, or back, is a 501 naming it and the restart that serves
   it, since the dispatcher's cores are made for their models at start-up;
2. its pipelines are started — their executors, partitions and arenas,
   each partition run once on each of its executors — while those in force
   serve on; a plan that does not fit is a 409, one whose executors do not
   come up a 503, and then nothing changes;
3. at one instant the plan's models' requests go to the new pipelines;
4. the old pipelines serve every request they accepted — batches in flight
   and queued requests alike, each answered once by the core that took it —
   and are stopped once none is left (a request left after
   `SHUTDOWN_GRACE_S` is answered with a 503 saying why).

Deviation: while both sets of pipelines run (from step 2 to the end of
step 4) the machine holds both plans' executors; on a machine that the plan
in force fills, the new executors' start competes with serving (the
pipelines' executors are processes on this machine's cores).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from app.errors import ServingError
from app.planning.ppipe.plan import read_plan
from app.repository.loader import RepositoryIndex
from app.server.control_host import ControlHost
from app.server.pipeline_service import PipelineService, start_pipelines
from app.server.plan_moves import PlanNotSwitchable, PlanRefused, PlanUnavailable
from app.server.plans import PlanInForce
from app.server.startup import StartupFailed

log = logging.getLogger("app.server")


class PlanChanged(ServingError):
    """A request the pipelines of a plan replaced could not finish in time."""

    status = 503
    reason = "plan_changed"


async def switch_pipelines(service: ControlHost, plan: PlanInForce) -> dict[str, Any]:
    """Take up PPipe `plan` while serving (module docstring); what changed."""
    old = service.pipelines
    if old is None:
        raise PlanNotSwitchable(
            "this server serves no PPipe plan: a PPipe plan takes its models out of the "
            "dispatcher's cores, which are made at start-up; serve it with PLAN=FILE"
        )
    models = set(old.configs)
    try:
        posted = {m.name for m in read_plan(plan.path).models}
    except (ValueError, KeyError, TypeError) as exc:
        raise PlanRefused(f"the posted PPipe plan: {exc}") from None
    if posted != models:
        raise PlanNotSwitchable(
            "the posted PPipe plan pipelines "
            + (", ".join(sorted(posted)) or "no model")
            + f", the plan in force {', '.join(sorted(models))}: a model moves between a "
            "pipeline and the dispatcher's cores only by a restart (with PLAN=FILE)"
        )
    began = time.monotonic()
    settings = dataclasses.replace(service.settings, ppipe_plan=plan.path)
    index = RepositoryIndex(settings.repository, dict(old.configs))
    try:
        new = await start_pipelines(settings, index, service.metrics, service.statistics)
    except StartupFailed as exc:
        raise PlanRefused(str(exc)) from None
    except Exception as exc:  # its executors did not come up
        raise PlanUnavailable(f"the posted PPipe plan's pipelines did not start: {exc}") from None
    assert new is not None
    try:
        await new.live.warm_up()
    except Exception as exc:
        await new.stop()
        raise PlanUnavailable(f"the posted PPipe plan's pipelines did not run: {exc}") from None
    started_s = time.monotonic() - began
    service.pipelines = new  # the one instant: requests from now on go to `new`
    service.settings = settings
    service.plan_applied(plan)
    log.info(
        "plan ppipe-plan in force: its pipelines started in %.3f s; %d requests left to the "
        "old ones",
        started_s,
        old.pending,
    )
    retired = await retire(service, old, settings.shutdown_grace_s)
    return {
        "kind": plan.file.kind,
        "version": plan.file.version,
        "models": sorted(models),
        "pipelines": [
            {
                "model": p.model,
                "batch": p.batch,
                "stages": [
                    {"blocks": [s.start, s.end], "devices": [new.device_name(d) for d in s.devices]}
                    for s in p.stages
                ],
            }
            for p in new.layout.pipelines
        ],
        "started_s": round(started_s, 3),
        **retired,
        "total_s": round(time.monotonic() - began, 3),
    }


async def retire(service: ControlHost, old: PipelineService, grace_s: float) -> dict[str, Any]:
    """Let `old` answer what it accepted (up to `grace_s`; a request left
    then gets PlanChanged), then stop it."""
    service.retiring_pipelines.append(old)
    try:
        began = time.monotonic()
        held = old.pending
        while old.pending and time.monotonic() - began < grace_s:
            await asyncio.sleep(0.01)
        failed = old.fail_all(
            PlanChanged("the plan changed and its old pipelines stopped before this request ended")
        )
        if failed:
            log.warning("plan switch: %d requests of the old pipelines answered 503", failed)
        drained_s = time.monotonic() - began
        await old.stop()
    finally:
        service.retiring_pipelines.remove(old)
    return {"old_held": held, "old_failed": failed, "old_drained_s": round(drained_s, 3)}
