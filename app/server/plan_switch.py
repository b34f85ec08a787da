"""A plan applied while serving (`POST /v2/plan`): the groups of a HERD or
partition plan take over from the cores in force at one instant.

The plan is checked as at start-up (app/server/plan_checks.py: every
mismatch with this server's models and devices named) and its groups
placed as `CORE_GROUPS` places them (app/server/core_groups.py). Before
anything changes:

* each model the plan moves onto a device that does not hold it is loaded
  there (app/runtime/model_changes.py, `replace_config`; it keeps its arena);
* a model may not move onto a kind of device it has no profile of (its
  profile was measured on one kind at start-up);
* a plan that fails any of this is refused (409) and nothing changes.

Then the dispatcher swaps the cores (app/server/dispatcher.py,
`switch_groups`): the requests the old cores queue go to the new ones with
their deadlines, the old cores' batches in flight end on them, and each
device is the new core's once they have. Last, in the background, each
model is unloaded from the devices the plan took it off.

Under AUTOSCALE each new group gets an autoscaler from its devices serving
at the switch (app/server/autoscaling.py, `regroup`). The new cores plan
each device at the speed the old ones did (a reshared device's share).

An InSS plan is taken up by app/server/inss_switch.py (new shares and batch
sizes) and app/server/inss_layout.py (models placed otherwise: share
executors added and removed); a PPipe plan by app/server/pipeline_switch.py
(new pipelines started beside those in force). A HERD or partition plan
posted to a server serving a PPipe plan is a 501 naming the restart that
serves it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from app.errors import InvalidInput, ServingError
from app.planning.plan_files import parse_plan_file
from app.repository.config import ModelConfig
from app.repository.loader import RepositoryIndex
from app.runtime.devices import model_allowed_on
from app.server.control_host import ControlHost
from app.server.core_groups import CoreGroupsError, apply_core_groups
from app.server.core_swap import swap_cores
from app.server.inss_switch import switch_inss
from app.server.pipeline_switch import switch_pipelines
from app.server.plan_checks import check_plan
from app.server.plan_moves import (
    PlanNotSwitchable,
    PlanRefused,
    load_where_moved,
    unload_where_moved_off,
)
from app.server.plans import WHAT, InssPlacement, PlanInForce, PlanMismatch, inss_placement
from app.server.startup import ModelState

log = logging.getLogger("app.server")

SWITCHED_KINDS = ("herd-plan", "symphony-partition", "inss-plan", "ppipe-plan")
SETTING = "POST /v2/plan"


class NotAPlan(ServingError):
    """Well-formed JSON that is not a plan file."""

    status = 422
    reason = "invalid_request"


def read_posted_plan(body: bytes, directory: Path) -> PlanInForce:
    """The posted plan file, kept under `directory` (the plan in force
    names its file, as at start-up); 400 when it is not JSON, 422 when it
    is not a plan file."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the posted plan is not valid JSON: {exc}") from None
    try:
        file = parse_plan_file(doc, "the posted plan")
    except (ValueError, TypeError, KeyError) as exc:
        raise NotAPlan(str(exc)) from None
    if file.kind not in SWITCHED_KINDS:
        raise PlanNotSwitchable(
            f"{WHAT[file.kind]} is taken up at start-up only; serve it with PLAN=FILE "
            f"(while serving: {' or '.join(WHAT[k] for k in SWITCHED_KINDS)})"
        )
    inss = None
    if file.kind == "inss-plan":
        try:
            inss = inss_placement(file)
        except (ValueError, TypeError, KeyError) as exc:
            raise NotAPlan(f"the posted InSS plan: {exc}") from None
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=directory, prefix=f"{file.kind}-", suffix=".json", delete=False
    ) as out:
        json.dump(doc, out)
    return PlanInForce(SETTING, Path(out.name), file, inss)


async def switch_plan(service: ControlHost, plan: PlanInForce) -> dict[str, Any]:
    """Take up `plan` while serving (module docstring); what changed."""
    pool = service.pool
    assert pool is not None
    if plan.file.kind == "ppipe-plan":
        return await switch_pipelines(service, plan)
    if service.pipelines is not None:
        raise PlanNotSwitchable(
            f"the server serves a PPipe plan, whose models {WHAT[plan.file.kind]} would take "
            "out of their pipelines only by a restart (with PLAN=FILE)"
        )
    if plan.inss is not None:
        in_force = _inss_in_force(service, plan)
        return await switch_inss(service, plan, in_force, _own_configs(service))
    if service.plan is not None and service.plan.inss is not None:
        raise PlanNotSwitchable(
            "the server serves an InSS plan, whose share executors are made at start-up: "
            f"{WHAT[plan.file.kind]} is taken up by a restart (with PLAN=FILE)"
        )
    began = time.monotonic()
    states = _placed(service, plan)
    loaded = await load_where_moved(service, states)
    swapped = await swap_cores(service, service.settings, states)
    groups, handed, switch_s = swapped.groups, swapped.handed_over, swapped.switch_s
    service.models.update(states)
    service.plan_applied(plan)
    names = {d.id: d.name for d in service.devices}
    shown = [{"models": sorted(g.models), "devices": [names[d] for d in g.devices]} for g in groups]
    for group in shown:
        log.info("plan: core of %s on %s", ", ".join(group["models"]), ", ".join(group["devices"]))
    log.info(
        "plan %s in force: %d cores, %d queued requests handed over, switch %.3f ms",
        plan.file.kind,
        len(groups),
        handed,
        switch_s * 1e3,
    )
    unload_where_moved_off(service, states)
    return {
        "kind": plan.file.kind,
        "version": plan.file.version,
        "groups": shown,
        "loaded": loaded,
        "handed_over": handed,
        "switch_ms": round(switch_s * 1e3, 3),
        "total_ms": round((time.monotonic() - began) * 1e3, 3),
    }


def _own_configs(service: ControlHost) -> dict[str, ModelConfig]:
    """Each served model's config with its own devices (before a plan placed it)."""
    return {
        key: dataclasses.replace(
            state.config, devices=service.own_devices.get(key, state.config.devices)
        )
        for key, state in service.models.items()
    }


def _inss_in_force(service: ControlHost, plan: PlanInForce) -> InssPlacement:
    """The InSS placement in force, once `plan` fits this server
    (PlanRefused otherwise; PlanNotSwitchable without an InSS plan in force)."""
    assert plan.inss is not None
    in_force = service.plan.inss if service.plan is not None else None
    if in_force is None:
        raise PlanNotSwitchable(
            "an InSS plan splits devices into share executors at start-up: serve it with "
            "PLAN=FILE (a server serving one takes up its new shares and batch sizes "
            "while serving)"
        )
    index = RepositoryIndex(service.settings.repository, _own_configs(service))
    try:
        check_plan(plan, service.settings, index)
    except PlanMismatch as exc:
        raise PlanRefused(str(exc)) from None
    return in_force


def _placed(service: ControlHost, plan: PlanInForce) -> dict[str, ModelState]:
    """Each served model's state under `plan`: its config's devices the
    group's, its devices their ids. PlanRefused naming every mismatch."""
    configs = _own_configs(service)
    index = RepositoryIndex(service.settings.repository, dict(configs))
    try:
        check_plan(plan, service.settings, index)
        placed = apply_core_groups(plan.path, configs, service.devices)
    except (PlanMismatch, CoreGroupsError) as exc:
        raise PlanRefused(str(exc)) from None
    by_name = {d.name: d for d in service.devices}
    states: dict[str, ModelState] = {}
    problems: list[str] = []
    for key, config in placed.items():
        state = service.models[key]
        hosts = [by_name[n] for n in config.devices or () if n in by_name]
        hosts = [d for d in hosts if model_allowed_on(config, d)]
        kinds = {service.device(d).kind for d in state.devices}
        foreign = sorted({d.kind for d in hosts} - kinds)
        if not hosts:
            problems.append(f"model {config.model_name!r}: the plan leaves it no device")
        elif foreign:
            problems.append(
                f"model {config.model_name!r} would move onto {', '.join(foreign)} devices; its "
                f"profile is of {', '.join(sorted(kinds))} (restart with PLAN=FILE to profile it)"
            )
        devices = tuple(sorted(d.id for d in hosts))
        states[key] = dataclasses.replace(state, config=config, devices=devices)
    if problems:
        raise PlanRefused(f"{WHAT[plan.file.kind]} cannot be taken up: " + "; ".join(problems))
    return states
