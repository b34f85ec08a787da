"""The one timer a live driver keeps for its core's next wakeup.

Both live drivers (app/server/dispatcher.py for the single-device cores,
app/server/pipeline_driver.py for `ppipe`) arm it for the earliest time
their core (and what they hold themselves) needs to be woken, re-arm it
only when that time changes, and, when it fires, handle it as of its due
time if it fired early. The timer itself is made on first use, on the
running loop (a timerfd on Linux, app/server/timerfd.py).
"""

from __future__ import annotations

from collections.abc import Callable

from app.server.timerfd import Timer


class WakeupTimer:
    def __init__(self, factory: Callable[[], Timer], on_fire: Callable[[], None]) -> None:
        self._factory = factory
        self._on_fire = on_fire
        self.timer: Timer | None = None  # made on first use
        self.wake_at: float | None = None  # what the timer is armed for

    def arm(self, wake_at: float | None) -> None:
        """Fire at `wake_at` (None: not at all); nothing to do when it is
        already armed for that time."""
        if wake_at == self.wake_at:
            return
        self.wake_at = wake_at
        if wake_at is None:
            if self.timer is not None:
                self.timer.cancel()
            return
        if self.timer is None:
            self.timer = self._factory()
        self.timer.call_at(wake_at, self._on_fire)

    def fired(self, now: float) -> float:
        """The timer fired at `now`: it is disarmed; the time to handle it
        as — its due time when it fired early."""
        due = self.wake_at
        self.wake_at = None
        return due if due is not None and due > now else now

    def close(self) -> None:
        if self.timer is not None:
            self.timer.close()
            self.timer = None
        self.wake_at = None
