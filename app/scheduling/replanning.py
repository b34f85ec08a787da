"""Policies that plan afresh on every event.

The work-conserving baselines (Clockwork, Triton's dynamic batcher) keep no
plan between events: whatever happened — an arrival, a batch that ended, a
timer, a device back in service — one pass over the queues and the idle
devices decides what runs now. A device that goes down needs nothing: the
pass only ever looks at idle devices that are up.
"""

from __future__ import annotations

from collections.abc import Hashable

from app.scheduling.base import Scheduler
from app.scheduling.types import Batch


class ReplanningScheduler(Scheduler):
    """A policy whose every event runs `_schedule(now)`."""

    def _schedule(self, now: float) -> None:
        raise NotImplementedError

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        self._schedule(now)

    def _on_timer(self, key: Hashable, now: float) -> None:
        self._schedule(now)

    def _on_device_down(self, device: int, now: float) -> None:
        pass

    def _on_device_up(self, device: int, now: float) -> None:
        self._schedule(now)
