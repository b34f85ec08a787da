"""A thread that watches the event loop's own latency, so that liveness and
SIGTERM keep working whatever a handler on the loop does.

Everything the server does runs on one asyncio loop. A callback that never
yields (a bug, or work too large for the loop) stops everything: health
checks go unanswered and a SIGTERM is only noted — Python runs the signal
handler between two bytecodes, but the handler hands the shutdown to the
loop, which never gets to it — so only SIGKILL would end the process, its
executors and shared memory left behind.

`LoopWatchdog` runs beside the loop in a daemon thread. Every `interval_s`
it asks the loop to note the time (`call_soon_threadsafe`); how long ago the
loop last did so is its lag.

- A lag over `WARN_S` is logged once per stall, with where the loop's
  thread is (its stack), so that the stall can be found;
- a lag over `stall_exit_s` (`STALL_EXIT_S`, 60 s; 0: never) means the
  loop is wedged: the process exits (status `EXIT_STATUS`) so that a
  supervisor restarts it, as a failed liveness probe would have it;
- once a stop signal was received (`signalled`, called by the signal
  handler itself, app/server/stop_signals.py), the process must be gone
  within the grace period, uvicorn's safety net and `exit_margin_s`; if not
  (a wedged loop cannot run the shutdown), it exits.

Before such an exit `on_exit` runs in the watchdog's thread (the server
kills its executor processes and unlinks its shared memory there: nothing
on the loop can be relied on any more), then `os._exit`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

log = logging.getLogger("app.server")

INTERVAL_S = 0.25
WARN_S = 2.0
STALL_EXIT_S = 60.0
EXIT_MARGIN_S = 10.0
EXIT_STATUS = 70  # EX_SOFTWARE


class LoopWatchdog:
    """See the module docstring. `start` it from the loop's thread."""

    def __init__(
        self,
        loop: object,
        *,
        grace_s: float,
        on_exit: Callable[[], None] = lambda: None,
        stall_exit_s: float = STALL_EXIT_S,
        exit_margin_s: float = EXIT_MARGIN_S,
        interval_s: float = INTERVAL_S,
        warn_s: float = WARN_S,
        exit: Callable[[int], object] = os._exit,
    ) -> None:
        from app.server.stop_signals import safety_net_s

        self._loop = loop
        self._stop_within_s = safety_net_s(grace_s) + exit_margin_s
        self._on_exit = on_exit
        self._stall_exit_s = stall_exit_s
        self._interval_s = interval_s
        self._warn_s = warn_s
        self._exit = exit
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._signalled_at: float | None = None
        self.worst_lag_s = 0.0
        self.exited: str | None = None  # why it made the process exit

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self._interval_s + 1.0)

    def signalled(self) -> None:
        """A stop signal arrived (safe to call from a signal handler)."""
        if self._signalled_at is None:
            self._signalled_at = time.monotonic()

    def _noted(self) -> None:
        self._beat = time.monotonic()

    def _run(self) -> None:
        warned = False
        while not self._stopped.wait(self._interval_s):
            try:
                self._loop.call_soon_threadsafe(self._noted)  # type: ignore[attr-defined]
            except RuntimeError:  # the loop is closed: nothing left to watch
                return
            now = time.monotonic()
            lag = now - self._beat
            self.worst_lag_s = max(self.worst_lag_s, lag)
            if lag < self._warn_s:
                warned = False
            elif not warned:
                warned = True
                log.warning("event loop stalled for %.1f s; it is at:\n%s", lag, self._loop_stack())
            if self._stall_exit_s and lag > self._stall_exit_s:
                self._force(
                    f"event loop stalled for {lag:.1f} s (more than {self._stall_exit_s:g} s)"
                )
                return
            signalled = self._signalled_at
            if signalled is not None and now - signalled > self._stop_within_s:
                self._force(
                    f"still running {now - signalled:.1f} s after a stop signal (the grace "
                    f"period and its safety net allow {self._stop_within_s:.1f} s; event loop "
                    f"lag {lag:.1f} s)"
                )
                return

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return "  (unknown)"
        return "".join(traceback.format_stack(frame)[-8:]).rstrip()

    def _force(self, why: str) -> None:
        self.exited = why
        log.critical("%s: exiting with status %d; at:\n%s", why, EXIT_STATUS, self._loop_stack())
        try:
            self._on_exit()
        except Exception:
            log.exception("freeing the executors and shared memory before exiting")
        for handler in logging.getLogger().handlers + logging.getLogger("app").handlers:
            with contextlib.suppress(Exception):  # exiting anyway
                handler.flush()
        self._exit(EXIT_STATUS)
