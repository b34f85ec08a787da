"""What the live drivers of a scheduling core share: app/server/dispatcher.py
(the single-device cores) and app/server/pipeline_driver.py (`ppipe`).

An executor event that arrives while the driver carries out a core's
decisions is queued and handled right after them (`post`, `_run`), so a
core is never re-entered; the one wakeup timer is re-armed once per round.
`fail_all` answers every waiting request at shutdown and closes the driver:
from then on a request is refused and an executor's later report is not
handed to a core (whose next decision could dispatch requests already
answered)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from app.runtime.events import ExecutorEvent
from app.scheduling.types import Request
from app.server.wakeup import WakeupTimer

log = logging.getLogger(__name__)


class EventDriver(ABC):
    """The event queue, the round and the shutdown of a core's driver.
    A subclass calls `__init__` first, then sets `_wakeup`; its `pending`
    maps request ids to entries with a `.request`."""

    _wakeup: WakeupTimer
    pending: Mapping[int, Any]

    def __init__(self) -> None:
        self._events: deque[ExecutorEvent] = deque()
        self._handling = False
        self.closing = False

    def post(self, event: ExecutorEvent) -> None:
        """An event of the executor pool; handled now, or after the decisions
        being carried out if it arrives while they are. Once `fail_all` has
        answered every request, events are only about batches whose requests
        have their answer, and the cores are not asked again."""
        if self.closing:
            log.debug("after shutdown, not handled: %s", event)
            return
        self._events.append(event)
        if not self._handling:
            self._run(lambda: None)

    def _run(self, work: Callable[[], None]) -> None:
        """Do `work` (ask a core, carry out its decisions), then handle every
        event queued meanwhile, then arm the timer once."""
        self._handling = True
        try:
            work()
            while self._events:
                self._handle(self._events.popleft())
        finally:
            self._handling = False
        self._rearm()

    def fail_all(self, error: Exception) -> int:
        """Answer every request still waiting with `error`; return how many.
        The driver is closed from then on (see the module docstring)."""
        self.closing = True
        self._events.clear()
        waiting = [p.request for p in self.pending.values()]
        self._fail(waiting, error)
        self._wakeup.close()
        return len(waiting)

    @abstractmethod
    def _handle(self, event: ExecutorEvent) -> None:
        """Carry out one executor event."""

    @abstractmethod
    def _rearm(self) -> None:
        """Arm the wakeup timer for the next moment something is due."""

    @abstractmethod
    def _fail(self, requests: list[Request], error: Exception) -> None:
        """Answer `requests` with `error`."""
