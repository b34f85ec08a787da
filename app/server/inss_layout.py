"""An InSS plan that places models otherwise, taken up while serving
(`POST /v2/plan`; inss.txt §5.3): share executors added and removed, models
moved, new cores swapped in at one instant.

InSS plans again as the rates change; a new plan may move a model to
another device, and so split a device into another number of shares (each
placed model has a share of its own, app/server/plans.py). The server goes
from the executors in force to the plan's (`split_devices` of the whole
devices by the plan's shares), matched by name:

1. **Shrinks first.** Each executor kept (its name in both layouts) whose
   share shrinks is reshared (app/server/reallocation.py: a shadow at the
   new share takes over).
2. **Added.** Each executor the plan has and the server does not is
   started at its share (`ExecutorPool.add_executor`, a new device id).
3. **Loaded.** Each model is loaded where the plan newly puts it, before
   the switch (as a HERD plan's moves: app/server/plan_switch.py); a load
   that fails puts the configs back, removes the executors added, and
   refuses the plan (409).
4. **Switch.** New cores from the models' new states take over at one
   instant (`swap_cores`): queued requests are handed over with their
   deadlines, batches in flight end on the old cores.
5. **Removed.** Each executor the plan does not have runs the batches it
   holds and is stopped for good (`ExecutorPool.remove_executor`).
6. **Unloaded.** Each model is unloaded from the executors the plan took it
   off (after the batches sent there before).
7. **Growths last.** Each kept executor whose share grows is reshared now,
   so that a device's shares never pass 1 by reshares; the cores hear of
   the new speed as of any reshare (`DeviceReshared`).

Each model's latency profile is carried to its new executor by InSS's
running time ∝ 1/share (inss.txt §4.1; a CPU share's by its cores:
`speed_ratio`), from the speed its core plans it at now; the new cores plan
every device of the plan at speed 1 against those profiles. This is exact
for an emulated share and an estimate for a real one, as a reshare's is.

Deviations, each for a reason:

* Between steps 2 and 5 a device's executors may hold more than the whole
  of it (the old layout's and the new one's side by side), as a reshare's
  shadow does beside the executor it replaces; the old ones take no new
  batches once the switch is made.
* The batch caps of time-shared models stay those in force (`caps_kept`
  says which the plan would change): a model's arena was made for them.
* Executors on Ray are placed by Ray at start-up: a plan that moves models
  there is taken up by a restart (501).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.repository.config import ModelConfig
from app.runtime.devices import ExecutorDevice, model_allowed_on, split_devices
from app.runtime.pool import ExecutorPool
from app.runtime.pool_reshare import speed_ratio
from app.scheduling.profile import LatencyProfile
from app.server import reallocation
from app.server.control_host import ControlHost
from app.server.core_swap import swap_cores
from app.server.plan_moves import (
    PlanNotSwitchable,
    PlanRefused,
    PlanUnavailable,
    load_where_moved,
)
from app.server.plans import PlanInForce, place_inss, whole_devices
from app.server.settings import Settings
from app.server.startup import ModelState

log = logging.getLogger("app.server")


@dataclass(frozen=True)
class LayoutChange:
    """The executors in force against a plan's, by name: those kept (now,
    then), those the plan adds (with new ids) and those it removes."""

    kept: dict[str, tuple[ExecutorDevice, ExecutorDevice]]
    added: list[ExecutorDevice]
    removed: list[ExecutorDevice]

    def shrinks(self) -> list[tuple[str, float]]:
        """(name, new share) of each kept executor whose share shrinks."""
        return [(n, new.share) for n, (old, new) in self.kept.items() if new.share < old.share]

    def growths(self) -> list[tuple[str, float]]:
        """(name, new share) of each kept executor whose share grows."""
        return [(n, new.share) for n, (old, new) in self.kept.items() if new.share > old.share]

    def devices(self) -> list[ExecutorDevice]:
        """The executors once the change is made (kept ones as they are now)."""
        return [old for old, _ in self.kept.values()] + self.added


def layout_change(
    current: Sequence[ExecutorDevice], planned: Sequence[ExecutorDevice], next_id: int
) -> LayoutChange:
    """Match the executors in force with the `planned` ones by name; an
    added one gets an id from `next_id` on."""
    now = {d.name: d for d in current}
    kept: dict[str, tuple[ExecutorDevice, ExecutorDevice]] = {}
    added: list[ExecutorDevice] = []
    for device in planned:
        was = now.get(device.name)
        if was is not None:
            kept[device.name] = (was, dataclasses.replace(device, id=was.id))
        else:
            added.append(dataclasses.replace(device, id=next_id + len(added)))
    names = {d.name for d in planned}
    return LayoutChange(kept, added, [d for d in current if d.name not in names])


def carried_profile(
    profile: LatencyProfile | None, at: ExecutorDevice, speed: float, to: ExecutorDevice
) -> LatencyProfile | None:
    """A profile the core plans at `speed` on `at`, as it runs on `to` at
    speed 1 (module docstring)."""
    if profile is None:
        return None
    return profile.scaled(1.0 / (speed * speed_ratio(at, to)))


def moved_states(
    models: Mapping[str, ModelState],
    placed: Mapping[str, ModelConfig],
    change: LayoutChange,
    speeds: Mapping[int, float],
) -> tuple[dict[str, ModelState], dict[int, float], list[str]]:
    """Each model's state under the plan (`placed`: its configs, as
    `place_inss` gives them), the speed each device is planned at, and
    every model that cannot move (a kind of device it has no profile of,
    or no device left)."""
    by_name = {d.name: d for d in change.devices()}
    by_id = {d.id: d for d in change.devices()} | {d.id: d for d in change.removed}
    new_speeds = {
        d.id: speeds.get(d.id, 1.0) if d.name in change.kept else 1.0 for d in by_name.values()
    }
    states: dict[str, ModelState] = {}
    problems: list[str] = []
    for key, state in models.items():
        config = dataclasses.replace(
            placed[key],
            max_batch_size=state.config.max_batch_size,  # caps kept (docstring)
        )
        hosts = [d for d in by_name.values() if model_allowed_on(config, d)]
        kinds = {by_id[d].kind for d in state.devices}
        if not hosts:
            problems.append(f"model {config.model_name!r}: the plan leaves it no device")
        elif {d.kind for d in hosts} - kinds:
            problems.append(
                f"model {config.model_name!r} would move onto {hosts[0].kind} devices; its "
                f"profile is of {', '.join(sorted(kinds))} (restart with PLAN=FILE to profile it)"
            )
        profile = state.profile
        if len(hosts) == 1 and len(state.devices) == 1:  # a placed model: carried over
            (at,) = state.devices
            profile = carried_profile(profile, by_id[at], speeds.get(at, 1.0), hosts[0])
            new_speeds[hosts[0].id] = 1.0
        devices = tuple(sorted(d.id for d in hosts))
        states[key] = dataclasses.replace(state, config=config, devices=devices, profile=profile)
    return states, new_speeds, problems


async def switch_layout(
    service: ControlHost, plan: PlanInForce, settings: Settings, own: Mapping[str, ModelConfig]
) -> dict[str, Any]:
    """Take up InSS `plan`, which places models otherwise than the plan in
    force (module docstring), under `settings` (the plan's batch sizes in
    its policy's options); `own`: each model's config before a plan placed
    it. What changed."""
    pool, dispatcher = service.pool, service.dispatcher
    assert dispatcher is not None and plan.inss is not None
    if not isinstance(pool, ExecutorPool):
        raise PlanNotSwitchable(
            "the posted InSS plan places models otherwise than the one in force, and executors "
            "on Ray are placed at start-up: restart with PLAN=FILE to serve it"
        )
    down = [d.name for d in service.devices if not pool.alive(d.id) and not pool.parked(d.id)]
    if down:
        raise PlanRefused(f"the executors of {', '.join(down)} are not serving; retry once they do")
    began = time.monotonic()
    planned = split_devices(whole_devices(settings), plan.inss.shares)
    placed = place_inss(plan, dict(own), whole_devices(settings), settings.policy)
    change = _change(service, planned)
    _, _, problems = moved_states(service.models, placed, change, dispatcher.device_speeds())
    if problems:
        raise PlanRefused("the posted InSS plan cannot be taken up: " + "; ".join(problems))
    reshared = [await _reshare(service, n, s) for n, s in change.shrinks()]
    change = _change(service, planned)  # the kept executors at their shares now
    speeds = dispatcher.device_speeds()
    states, new_speeds, _ = moved_states(service.models, placed, change, speeds)
    added = await _add(service, pool, change.added)
    try:
        loaded = await load_where_moved(service, states)
    except BaseException:
        await _remove(service, pool, added)
        raise
    swapped = await swap_cores(service, settings, states, new_speeds)
    service.models.update(states)
    await _remove(service, pool, change.removed)
    # A growing executor's shadow loads what the executor holds: the models
    # moved off it are unloaded first.
    await asyncio.gather(*(pool.model_changes.trim(name) for name in states))
    reshared += [await _reshare(service, n, s) for n, s in change.growths()]
    service.settings = dataclasses.replace(settings, device_shares=plan.inss.shares or None)
    service.plan_applied(plan)
    log.info(
        "plan inss-plan in force: executors %s added, %s removed, %d share(s) reshared, "
        "%d queued requests handed over, switch %.3f ms",
        ", ".join(d.name for d in added) or "none",
        ", ".join(d.name for d in change.removed) or "none",
        len(reshared),
        swapped.handed_over,
        swapped.switch_s * 1e3,
    )
    return {
        "added": [d.name for d in added],
        "removed": [d.name for d in change.removed],
        "reshared": reshared,
        "loaded": loaded,
        "handed_over": swapped.handed_over,
        "switch_ms": round(swapped.switch_s * 1e3, 3),
        "total_ms": round((time.monotonic() - began) * 1e3, 3),
    }


def _change(service: ControlHost, planned: Sequence[ExecutorDevice]) -> LayoutChange:
    pool = service.pool
    assert isinstance(pool, ExecutorPool)
    return layout_change(service.devices, planned, pool.next_device_id())


async def _reshare(service: ControlHost, name: str, share: float) -> dict[str, Any]:
    done = await reallocation.reshare(service, name, share)
    return {"device": name, "share": share, "total_s": done.get("total_s")}


async def _add(
    service: ControlHost, pool: ExecutorPool, devices: Sequence[ExecutorDevice]
) -> list[ExecutorDevice]:
    """Start the executors the plan adds, one at a time; when one does not
    come up, those started are removed again and the plan refused (503)."""
    added: list[ExecutorDevice] = []
    for device in devices:
        try:
            await pool.add_executor(device)
        except Exception as exc:
            await _remove(service, pool, added)
            raise PlanUnavailable(
                f"executor {device.name} did not start ({exc}); the plan in force is unchanged"
            ) from None
        added.append(device)
        service.devices = [*service.devices, device]
    return added


async def _remove(
    service: ControlHost, pool: ExecutorPool, devices: Sequence[ExecutorDevice]
) -> None:
    """Stop executors for good after their batches; then the service
    forgets them (their batches' answers name them until then)."""
    await asyncio.gather(*(pool.remove_executor(d.id) for d in devices))
    gone = {d.id for d in devices}
    service.devices = [d for d in service.devices if d.id not in gone]
