"""Autoscaling that acts, in the daemon (`AUTOSCALE=MIN:MAX`): each core's
devices in service follow Symphony's advised device change (symphony.txt
§4.4), carried out by app/scheduling/autoscaler.py's rules — bounds,
cool-down, only idle devices released.

At start-up every device serves and is profiled; then each core group keeps
MIN of its devices (at most MAX, the group's devices capping both) and
parks the others: `pool.parking.park` (app/runtime/parking.py) posts DeviceParked (the dispatcher
takes the device out of its core) and stops the executor. Every
`AUTOSCALE_WINDOW_S` the loop asks each group's autoscaler:

* **scale up** → `pool.parking.unpark` starts the parked executors (a new
  process loading its models; seconds); DeviceUnparked brings the device
  into its core, and the autoscaler counts it as serving from then on;
* **scale down** → the idle devices chosen are parked.

A plan taken up while serving (app/server/plan_switch.py) regroups the
devices: `regroup` gives each new group an autoscaler from the devices of it
that serve then (parking what is above its MAX, starting what it lacks for
its MIN), and the loop goes on.

The decisions are the same as in the simulator (`run_simulation(...,
autoscaler=...)`); the daemon's start-up delay is the executor's real start.
Local executor processes only (the devices the daemon was started with are
the most it can run).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from app.scheduling.autoscaler import Autoscaler, ScaleDown, ScaleUp, ScalingBounds
from app.server.dispatcher import CoreGroup

if TYPE_CHECKING:
    from app.runtime.pool import ExecutorPool
    from app.server.settings import Settings

log = logging.getLogger("app.server")


def group_autoscaler(
    group: CoreGroup, settings: Settings, serving: set[int] | None = None
) -> Autoscaler | None:
    """The autoscaler of one core group under AUTOSCALE (None when unset or
    the group has one device). `serving`: the group's devices in service
    now (a regroup; they come first, within the group's MIN and MAX);
    None: its first MIN devices (start-up)."""
    if settings.autoscale is None or len(group.devices) < 2:
        return None
    low, high = settings.autoscale
    now = set() if serving is None else serving & set(group.devices)
    devices = tuple(sorted(group.devices, key=lambda d: (d not in now, d)))
    high = min(high, len(devices))
    low = min(low, high)
    bounds = ScalingBounds(
        min_devices=low,
        max_devices=high,
        window_s=settings.autoscale_window_s,
        cooldown_s=settings.autoscale_cooldown_s,
    )
    kept = [d for d in devices[:high] if d in now]
    starting = list(devices[len(kept) : low]) if len(kept) < low else []
    return Autoscaler(devices[:high], set(kept + starting) or set(devices[:low]), bounds)


class DeviceScaling:
    """The daemon's autoscalers, one per core group, and their loop."""

    def __init__(self, groups: list[CoreGroup], pool: ExecutorPool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self.window_s = settings.autoscale_window_s
        self.scalers: dict[int, tuple[CoreGroup, Autoscaler]] = {}
        for index, group in enumerate(groups):
            scaler = group_autoscaler(group, settings)
            if scaler is not None:
                self.scalers[index] = (group, scaler)
        self._task: asyncio.Task | None = None
        self._busy: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Park what is not to serve at the start; then run the loop."""
        for group, scaler in self.scalers.values():
            now = asyncio.get_running_loop().time()
            group.scheduler.reset_signals(now)
            for device in sorted(set(group.devices) - scaler.serving):
                await self.pool.parking.park(device)
            log.info(
                "autoscaling %s: %d of %d devices serving (bounds %d..%d)",
                ", ".join(sorted(group.models)),
                len(scaler.serving),
                len(group.devices),
                scaler.bounds.min_devices,
                scaler.bounds.max_devices,
            )
        if self.scalers:
            self._task = asyncio.create_task(self._loop())

    async def regroup(self, groups: list[CoreGroup]) -> None:
        """The groups of a plan taken up while serving (module docstring):
        each one's autoscaler from its devices serving now; what is above
        its MAX is parked, what it lacks for its MIN started."""
        await self.stop()
        self._task, self._busy = None, set()
        parking = self.pool.parking
        self.scalers = {}
        for index, group in enumerate(groups):
            serving = {d for d in group.devices if not parking.parked(d)}
            scaler = group_autoscaler(group, self.settings, serving)
            if scaler is None:
                for device in sorted(d for d in group.devices if parking.parked(d)):
                    await parking.unpark(device)  # no autoscaler: every device serves
                continue
            self.scalers[index] = (group, scaler)
            group.scheduler.reset_signals(asyncio.get_running_loop().time())
            for device in sorted(serving - scaler.serving):
                await parking.park(device)
            for device in sorted(scaler.serving - serving):
                await parking.unpark(device)
            log.info(
                "autoscaling %s after the plan switch: devices %s serving (bounds %d..%d)",
                ", ".join(sorted(group.models)),
                sorted(scaler.serving),
                scaler.bounds.min_devices,
                scaler.bounds.max_devices,
            )
        if self.scalers:
            self._task = asyncio.create_task(self._loop())

    def drives(self, group: CoreGroup) -> bool:
        """Whether an autoscaler reads and resets `group`'s signal window."""
        return any(g is group for g, _ in self.scalers.values())

    def started(self, device: int) -> None:
        """DeviceUnparked: the device serves its core again."""
        for _, scaler in self.scalers.values():
            if device in scaler.starting:
                scaler.started(device)

    async def stop(self) -> None:
        for task in [self._task, *self._busy]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*[t for t in [self._task, *self._busy] if t], return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.window_s)
            now = asyncio.get_running_loop().time()
            for group, scaler in self.scalers.values():
                action = scaler.tick(group.scheduler, now)
                if action is None:
                    continue
                log.info(
                    "autoscaling %s: %s devices %s (bad rate %.3f, idle %.2f, advised %+d)",
                    ", ".join(sorted(group.models)),
                    "starting" if isinstance(action, ScaleUp) else "releasing",
                    list(action.devices),
                    scaler.history[-1].bad_rate,
                    scaler.history[-1].idle_fraction,
                    scaler.history[-1].advised,
                )
                for device in action.devices:
                    if isinstance(action, ScaleUp):
                        work = self.pool.parking.unpark(device)
                    else:
                        assert isinstance(action, ScaleDown)
                        work = self.pool.parking.park(device)
                    task = asyncio.create_task(work)
                    self._busy.add(task)
                    task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._busy.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("autoscaling: a device change failed: %s", task.exception())
