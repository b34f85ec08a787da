"""An InSS plan taken up while serving (`POST /v2/plan`; inss.txt §5.3):
new shares through shadow executors, new batch sizes through new cores.

InSS plans again when the rates change, and mostly keeps its placement —
the same models on the same devices, at other shares and batch sizes. That
is what is taken up while serving:

* the plan is checked as at start-up (app/server/plan_checks.py), against
  an InSS plan in force (the server started with one, `PLAN=FILE`, or took
  one up since);
* a plan that places models otherwise — moves a model, splits a device into
  another number of shares — is taken up by app/server/inss_layout.py
  (share executors added and removed); what follows is a plan with the
  placement in force;
* each share that changes is reshared (app/server/reallocation.py: a shadow
  executor at the new share takes over, the old one ends its batches). The
  shrinking shares go first, so a device's shares sum to ≤ 1 at every step;
* when its batch sizes differ and the policy takes them (`inss`'s `batch`,
  `triton`'s `max_batch`: app/server/plans.py), the cores are built again
  with them and swapped at one instant, as a HERD plan's are
  (`Dispatcher.switch_groups`), each device at the speed its share gives;
* under a policy that forms its own batches (`symphony`, the default), the
  caps on time-shared models' batches are the start-up plan's
  (`place_inss`): new ones in the posted plan are kept out, said in a
  warning and in the answer's `caps_kept`, and taken up by a restart.

A reshare that fails (its shadow does not come up: 503) stops the switch
there: the shares reshared before it stay (GET /v2/devices shows each
device's share) and the plan in force is unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from app.repository.config import ModelConfig
from app.runtime.shares import SHARE_SEP
from app.server import reallocation
from app.server.control_host import ControlHost
from app.server.core_swap import swap_cores
from app.server.inss_layout import switch_layout
from app.server.plans import BATCH_OPTION, InssPlacement, PlanInForce, time_shared_batches
from app.server.settings import Settings

log = logging.getLogger("app.server")


def placement_differences(in_force: InssPlacement, posted: InssPlacement) -> list[str]:
    """How `posted` places models otherwise than `in_force` (empty: the same
    models on the same shares of the same devices)."""
    differences = []
    for model in sorted(set(in_force.device_of) | set(posted.device_of)):
        was, will = in_force.device_of.get(model), posted.device_of.get(model)
        if was != will:
            differences.append(f"model {model!r} on {was or 'no device'} → {will or 'none'}")
    for device in sorted(set(in_force.shares) | set(posted.shares)):
        was, will = len(in_force.shares.get(device, ())), len(posted.shares.get(device, ()))
        if was != will:
            differences.append(f"device {device!r} in {was or 'no'} shares → {will or 'no'}")
    return differences


def caps_kept(in_force: InssPlacement, posted: InssPlacement, policy: str) -> dict[str, int]:
    """The posted plan's batch caps on time-shared models that differ from
    those in force and that `policy` (one forming its own batches) does not
    take up while serving: model → the posted cap."""
    if policy in BATCH_OPTION:
        return {}
    old, new = time_shared_batches(in_force), time_shared_batches(posted)
    return {model: cap for model, cap in sorted(new.items()) if old.get(model) != cap}


def reshare_steps(in_force: InssPlacement, posted: InssPlacement) -> list[tuple[str, float]]:
    """(share's device name, new share) for each share that changes: every
    shrink before any growth, so each device's shares stay ≤ 1 in sum."""
    steps = [
        (f"{device}{SHARE_SEP}{i}", new, new - old)
        for device, shares in posted.shares.items()
        for i, (old, new) in enumerate(zip(in_force.shares[device], shares, strict=True))
        if abs(new - old) > 1e-9
    ]
    return [(name, share) for name, share, _ in sorted(steps, key=lambda step: step[2] > 0)]


async def switch_inss(
    service: ControlHost,
    plan: PlanInForce,
    in_force: InssPlacement,
    own: Mapping[str, ModelConfig],
) -> dict[str, Any]:
    """Take up InSS `plan` while serving, the plan `in_force` its placement
    (module docstring); `own`: each model's config before a plan placed it.
    What changed."""
    posted = plan.inss
    assert posted is not None
    option = BATCH_OPTION.get(service.settings.policy)
    settings = service.settings
    if option is not None:
        options = {**settings.policy_options, option: dict(posted.batch)}
        settings = dataclasses.replace(settings, policy_options=options)
    kept = caps_kept(in_force, posted, settings.policy)
    if kept:
        log.warning(
            "plan inss-plan: the time-shared batch caps %s are kept from start-up under policy "
            "%s; a restart with PLAN=FILE takes them up",
            ", ".join(f"{m} ≤ {b}" for m, b in kept.items()),
            settings.policy,
        )
    head = {"kind": plan.file.kind, "version": plan.file.version}
    if placement_differences(in_force, posted):
        done = await switch_layout(service, plan, settings, own)
        batch = dict(posted.batch) if option is not None else None
        return {**head, **done, "batch": batch, "caps_kept": kept}
    return {**head, **await _switch_shares(service, plan, in_force, settings), "caps_kept": kept}


async def _switch_shares(
    service: ControlHost, plan: PlanInForce, in_force: InssPlacement, settings: Settings
) -> dict[str, Any]:
    """The same placement at new shares and batch sizes (module docstring)."""
    posted = plan.inss
    assert posted is not None
    began = time.monotonic()
    reshared = []
    for name, share in reshare_steps(in_force, posted):
        done = await reallocation.reshare(service, name, share)
        reshared.append({"device": name, "share": share, "total_s": done.get("total_s")})
    rebuilt = settings.policy in BATCH_OPTION and posted.batch != in_force.batch
    handed, switch_s = 0, 0.0
    if rebuilt:
        swapped = await swap_cores(service, settings, service.models)
        handed, switch_s = swapped.handed_over, swapped.switch_s
        service.settings = settings  # a model loaded later gets the plan's batch too
    service.plan_applied(plan)
    log.info(
        "plan inss-plan in force: %d share(s) reshared, batch sizes %s, %d queued requests "
        "handed over",
        len(reshared),
        "taken up" if rebuilt else "unchanged",
        handed,
    )
    return {
        "reshared": reshared,
        "batch": dict(posted.batch) if rebuilt else None,
        "handed_over": handed,
        "switch_ms": round(switch_s * 1e3, 3),
        "total_ms": round((time.monotonic() - began) * 1e3, 3),
    }
