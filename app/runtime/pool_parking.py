"""Parking a device's executor and starting it again: what autoscaling does
to local executors (app/server/autoscaling.py, app/scheduling/autoscaler.py).

`ExecutorPool` (app/runtime/pool.py) inherits `Parking`.

* `park(device)`: the owner is told first (`DeviceParked`, so its core stops
  planning on the device: the autoscaler parks only devices with nothing in
  flight), then the executor is stopped as at shutdown — batches it still
  holds run first and are reported as usual — and stays down: no DeviceDown,
  no respawn; `alive()` is False, `parked()` True.
* `unpark(device)`: a fresh process loads the device's models, as a respawn
  does (retried with backoff until one loads); then `DeviceUnparked` tells
  the owner the device serves, with how long the start took.

Refused (ValueError): an unknown device, parking one that is parked, down,
loading or being reshared, unparking one that is not parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from app.errors import ExecutorFailed
from app.runtime.events import DeviceParked, DeviceUnparked
from app.runtime.messages import Stop
from app.runtime.watchdog import reap

if TYPE_CHECKING:
    from app.runtime.pool import ExecutorPool
    from app.runtime.pool_worker import Worker

log = logging.getLogger("app.runtime.pool")


class Parking:
    """Executors stopped and started again on purpose (module docstring)."""

    def parked(self: ExecutorPool, device_id: int) -> bool:
        return device_id in self._parked

    async def park(self: ExecutorPool, device_id: int, timeout: float = 5.0) -> None:
        """Stop the device's executor and keep it down (module docstring)."""
        w = self._worker_for(device_id)
        if device_id in self._parked:
            raise ValueError(f"{w.device.name} is parked already")
        if w.dead or w.loading or device_id in self._resharing or device_id in self._retiring:
            raise ValueError(f"{w.device.name} is not serving (down, starting or being reshared)")
        self._parked.add(device_id)
        self._post(DeviceParked(device_id))
        w.stopping = True
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(Stop())
        deadline = time.monotonic() + timeout
        while w.process.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if w.process.is_alive():
            log.warning("executor %s did not stop in %.1f s; killing it", w.device.name, timeout)
            w.process.kill()
        if not w.dead:  # its EOF may not have been read yet
            await asyncio.sleep(0)
            self._mark_dead(w, f"executor {w.device.name} parked")
        reap(w.process)
        w.down_since = time.monotonic()
        log.info("executor %s parked", w.device.name)

    async def unpark(self: ExecutorPool, device_id: int) -> float:
        """Start the parked device's executor again; the seconds it took."""
        w = self._worker_for(device_id)
        if device_id not in self._parked:
            raise ValueError(f"{w.device.name} is not parked")
        started = time.monotonic()
        backoff = 0.1
        while not self._stopped:
            w.models, w.load_errors, w.load_info = [], {}, {}
            w.dead, w.stopping, w.loading = False, False, True
            try:
                self._spawn(w)
                await asyncio.wait_for(self._load(w), self.load_timeout_s)
            except (ExecutorFailed, TimeoutError, OSError) as exc:
                log.error("starting executor %s failed: %s", w.device.name, exc)
                if w.process is not None and w.process.is_alive():
                    w.process.kill()
                self._mark_dead(w, f"executor {w.device.name} failed to start")
                reap(w.process)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            w.loading = False
            break
        took = time.monotonic() - started
        self._parked.discard(device_id)
        w.down_since = None
        if not self._stopped:
            log.info("executor %s started in %.3f s (pid %s)", w.device.name, took, w.process.pid)
            self._post(DeviceUnparked(device_id, took))
        return took

    def _worker_for(self: ExecutorPool, device_id: int) -> Worker:
        if device_id not in self._workers:
            raise ValueError(f"no device {device_id} in this pool")
        if not self._started or self._stopped:
            raise ValueError("the pool is not running")
        return self._workers[device_id]
