"""New scheduling cores taken up while serving, at one instant: the step a
HERD or partition plan (app/server/plan_switch.py) and an InSS plan's new
batch sizes (app/server/inss_switch.py) share.

The new cores are built off the event loop from the models' states, each
device at the speed the cores in force plan it with (a reshared share's);
the dispatcher swaps them in (`Dispatcher.switch_groups`: queued requests
handed over with their deadlines, batches in flight ending on the old
cores); under AUTOSCALE each new group gets an autoscaler from its devices
serving at the switch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from app.server.control_host import ControlHost
from app.server.dispatcher import CoreGroup
from app.server.settings import Settings
from app.server.startup import ModelState, build_groups


@dataclass(frozen=True)
class Swapped:
    """What a swap did: the new groups, the queued requests handed over, and
    how long the swap itself held the event loop."""

    groups: list[CoreGroup]
    handed_over: int
    switch_s: float


async def swap_cores(
    service: ControlHost,
    settings: Settings,
    states: Mapping[str, ModelState],
    speeds: Mapping[int, float] | None = None,
) -> Swapped:
    """Serve `states` from new cores made under `settings` (module
    docstring); `speeds`: each device's, when not those in force."""
    pool, dispatcher = service.pool, service.dispatcher
    assert pool is not None and dispatcher is not None
    speeds = dispatcher.device_speeds() if speeds is None else speeds
    groups = await asyncio.to_thread(
        build_groups, settings, dict(states), service.devices, pool, speeds
    )
    down = [d.id for d in service.devices if not pool.alive(d.id)]
    began = time.monotonic()
    handed = dispatcher.switch_groups(groups, down)
    switch_s = time.monotonic() - began
    if service.scaling is not None:  # AUTOSCALE: an autoscaler per new group
        await service.scaling.regroup(groups)
    return Swapped(groups, handed, switch_s)
