"""Parking a Ray executor and starting it again: what autoscaling does to
actors (app/server/autoscaling.py), as `app.runtime.pool_parking` does to
local executor processes.

`RayExecutorPool` (app/runtime/ray_pool.py) inherits `ActorParking`.

* `park(device)`: the owner is told first (`DeviceParked`: its core stops
  planning on the device), then the actor's `stop` runs after the batches
  sent before it (their replies are handled as usual), and the actor is
  killed for good (`ray.kill`, no restart), giving its resources back to
  the cluster. No DeviceDown, no restart; `alive()` is False, `parked()`
  True.
* `unpark(device)`: a new actor is created where Ray finds the resources
  (or on the node RAY_NODES names) and loads the device's models, retried
  with backoff until one does; then `DeviceUnparked` with how long it took.

Refused (ValueError): an unknown device, parking one that is parked, down
or loading, unparking one that is not parked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from app.runtime.events import BatchFinished, DeviceParked, DeviceUnparked

if TYPE_CHECKING:
    from app.runtime.ray_pool import Actor, RayExecutorPool

log = logging.getLogger("app.runtime.ray_pool")


class ActorParking:
    """Actors stopped and started again on purpose (module docstring)."""

    def parked(self: RayExecutorPool, device_id: int) -> bool:
        return device_id in self._parked

    async def park(self: RayExecutorPool, device_id: int, timeout: float = 5.0) -> None:
        """Stop the device's actor and keep it down (module docstring)."""
        a = self._actor_for(device_id)
        if device_id in self._parked:
            raise ValueError(f"{a.device.name} is parked already")
        if a.dead or a.loading:
            raise ValueError(f"{a.device.name} is not serving (down or starting)")
        self._parked.add(device_id)
        self._post(DeviceParked(device_id))
        try:
            await asyncio.wait_for(a.handle.stop.remote(self._sent(a)), timeout)
        except Exception as exc:
            log.warning("executor %s did not stop cleanly (%s); killing it", a.device.name, exc)
        for _ in range(100):  # replies already in hand are handled first
            if not a.inflight:
                break
            await asyncio.sleep(0.01)
        self._retire(a, f"executor {a.device.name} parked")
        log.info("executor %s parked (Ray actor killed)", a.device.name)

    async def unpark(self: RayExecutorPool, device_id: int) -> float:
        """A new actor for the parked device; the seconds it took to serve."""
        a = self._actor_for(device_id)
        if device_id not in self._parked:
            raise ValueError(f"{a.device.name} is not parked")
        started = time.monotonic()
        backoff = 0.1
        while not self._stopped:
            try:
                self._create(a)
                await asyncio.wait_for(self._bring_up(a), self.load_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("starting executor %s failed: %s", a.device.name, exc)
                self._retire(a, f"executor {a.device.name} failed to start")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            break
        took = time.monotonic() - started
        self._parked.discard(device_id)
        a.down_since = None
        if not self._stopped:
            log.info("executor %s started in %.3f s (Ray actor pid %s)", a.device.name, took, a.pid)
            self._post(DeviceUnparked(device_id, took))
        return took

    def _retire(self: RayExecutorPool, a: Actor, reason: str) -> None:
        """The actor is gone on purpose: replies of its life are stale, its
        batches still in flight fail with `reason`, and it is killed."""
        a.dead = True
        a.loading = False
        a.generation += 1
        a.heartbeat = None
        a.down_since = time.monotonic()
        now = time.monotonic()
        for batch_id in list(a.inflight):
            a.inflight.pop(batch_id, None)
            self._post(BatchFinished(a.device.id, batch_id, now, now, reason))
        a.sizes.clear()
        a.samples_left, a.rerunning = 0, False  # a new process keeps no samples
        self._kill(a)

    def _actor_for(self: RayExecutorPool, device_id: int) -> Actor:
        if device_id not in self._actors:
            raise ValueError(f"no device {device_id} in this pool")
        if not self._started or self._stopped:
            raise ValueError("the pool is not running")
        return self._actors[device_id]
