"""Ray executors re-running sampled requests alone (the asynchronous
profiler, app/runtime/alone_profiler.py): `AloneReruns`, owned by
`RayExecutorPool`, which tells it when a batch with samples is sent, when
one is about to be sent, and when a device has nothing in flight.

A local executor re-runs its kept samples whenever its pipe stays empty for
`IDLE_GRACE_S`. An actor cannot see that the pool has nothing for it, so
the pool decides: once a device that was sent samples has nothing in
flight for `IDLE_GRACE_S`, it calls the actor's `rerun_alone` (one sample
per call, in the actor's default group, so it runs between batches), and
again while samples are left and the device stays idle. A batch sent
meanwhile first stops the re-run (`interrupt_alone`, in the control group)
and then runs, as on a local executor; the stopped sample is tried again
later. Each report is the same AloneTimed / AloneStopped event a local
executor's gives.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from app.runtime.alone_profiler import IDLE_GRACE_S, alone_event
from app.runtime.events import ExecutorEvent
from app.runtime.ray_records import Actor

log = logging.getLogger("app.runtime.ray_pool")


class RerunHost(Protocol):
    """What the re-runs need of the pool."""

    @property
    def stopped(self) -> bool: ...
    def post(self, event: ExecutorEvent) -> None: ...
    def background(self, coro: Coroutine[Any, Any, None]) -> None: ...


class AloneReruns:
    """Samples re-run alone on idle actors (module docstring)."""

    def __init__(self, pool: RerunHost) -> None:
        self.pool = pool

    def sent(self, a: Actor) -> None:
        """A batch with samples was sent: the actor keeps them."""
        a.samples_left = max(a.samples_left, 1)

    def interrupt(self, a: Actor) -> None:
        """A batch is being sent: stop the re-run in progress."""
        if a.rerunning:
            try:
                a.handle.interrupt_alone.remote()
            except Exception:  # the actor is gone: its watch reports it
                log.debug("interrupting executor %s failed", a.device.name, exc_info=True)

    def idle(self, a: Actor) -> None:
        """The device has nothing in flight: re-run its samples if it stays so."""
        if a.samples_left > 0 and not a.rerunning and not a.dead:
            a.rerunning = True
            self.pool.background(self._rerun_while_idle(a, a.generation))

    async def _rerun_while_idle(self, a: Actor, generation: int) -> None:
        try:
            while not self.pool.stopped and a.generation == generation and a.samples_left > 0:
                await asyncio.sleep(IDLE_GRACE_S)
                if a.inflight or a.dead or a.generation != generation:
                    return  # busy again: the batch's end calls idle
                try:
                    report, left = await a.handle.rerun_alone.remote()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    return  # it died: its watch reports it
                if a.generation != generation:
                    return  # a reply of an earlier life
                a.samples_left = left
                if report is not None:
                    self.pool.post(alone_event(a.device.id, report))
                if a.inflight:
                    return
        finally:
            if a.generation == generation:
                a.rerunning = False
