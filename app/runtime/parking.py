"""Parking a device's executor and starting it again: what autoscaling does
(app/server/autoscaling.py, app/scheduling/autoscaler.py), written once for
executor processes (app/runtime/pool.py) and Ray actors
(app/runtime/ray_pool.py). Each pool owns a `Parking` over the narrow
`ExecutorLifecycle` it implements for its kind of executor.

* `park(device)`: the owner is told first (`DeviceParked`, so its core stops
  planning on the device: the autoscaler parks only devices with nothing in
  flight), then the executor is stopped — the batches it still holds run
  first and are reported as usual — and stays down: no DeviceDown, no
  respawn; `alive()` is False, `parked()` True.
* `unpark(device)`: a fresh executor loads the device's models, as a
  respawn does (retried with backoff until one loads); then
  `DeviceUnparked` tells the owner the device serves, with how long the
  start took.

Refused (ValueError): an unknown device, parking one that is parked, down,
loading or being reshared, unparking one that is not parked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from app.runtime.events import DeviceParked, DeviceUnparked, ExecutorEvent

log = logging.getLogger("app.runtime.pool")

# Between failed starts of an unparked executor: doubling from the first.
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


class ExecutorLifecycle(Protocol):
    """What parking needs of a pool: its executors' life, one per device."""

    load_timeout_s: float

    @property
    def stopped(self) -> bool:
        """The pool is stopping or stopped: starting no more executors."""
        ...

    def executor_name(self, device_id: int) -> str:
        """The device's executor's name; ValueError for an unknown device or
        a pool that is not running."""
        ...

    def refuse_park(self, device_id: int) -> str | None:
        """Why the device's executor cannot be parked now (None: it can)."""
        ...

    def post(self, event: ExecutorEvent) -> None: ...

    async def stop_parked(self, device_id: int, timeout: float) -> None:
        """Stop the executor after the batches it holds, for good: no
        DeviceDown, no respawn."""
        ...

    async def start_executor(self, device_id: int) -> None:
        """A fresh executor for the device, its models loaded; raises when
        it cannot start."""
        ...

    def failed_start(self, device_id: int, reason: str) -> None:
        """Clean up after a start that raised."""
        ...

    def serving(self, device_id: int) -> str:
        """The executor serves again (no longer down); what to log of it."""
        ...


class Parking:
    """Executors stopped and started again on purpose (module docstring)."""

    def __init__(self, pool: ExecutorLifecycle) -> None:
        self._pool = pool
        self._parked: set[int] = set()

    def parked(self, device_id: int) -> bool:
        return device_id in self._parked

    def forget(self, device_id: int) -> None:
        """The device is gone for good (its executor removed)."""
        self._parked.discard(device_id)

    async def park(self, device_id: int, timeout: float = 5.0) -> None:
        """Stop the device's executor and keep it down (module docstring)."""
        name = self._pool.executor_name(device_id)
        if device_id in self._parked:
            raise ValueError(f"{name} is parked already")
        why = self._pool.refuse_park(device_id)
        if why is not None:
            raise ValueError(f"{name} is not serving ({why})")
        self._parked.add(device_id)
        self._pool.post(DeviceParked(device_id))
        await self._pool.stop_parked(device_id, timeout)
        log.info("executor %s parked", name)

    async def unpark(self, device_id: int) -> float:
        """Start the parked device's executor again; the seconds it took."""
        pool = self._pool
        name = pool.executor_name(device_id)
        if device_id not in self._parked:
            raise ValueError(f"{name} is not parked")
        started = time.monotonic()
        backoff = FIRST_BACKOFF_S
        while not pool.stopped:
            try:
                await asyncio.wait_for(pool.start_executor(device_id), pool.load_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.error("starting executor %s failed: %s", name, exc)
                pool.failed_start(device_id, f"executor {name} failed to start")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            break
        took = time.monotonic() - started
        self._parked.discard(device_id)
        what = pool.serving(device_id)
        if not pool.stopped:
            log.info("executor %s started in %.3f s (%s)", name, took, what)
            pool.post(DeviceUnparked(device_id, took))
        return took
