"""SIGTERM and SIGINT while serving: the drain starts at the signal.

uvicorn (0.54) catches both signals itself (`Server.capture_signals`); its
handler only sets `should_exit`. Its main loop then closes the listeners,
asks every connection to close after its current response, waits for them
(without limit unless `timeout_graceful_shutdown` is set, after which it
cancels the request tasks, answered `500 text/plain`), and only then runs the
app's lifespan shutdown — so left alone, the service's own drain would start
after uvicorn's wait, not at the signal. Afterwards uvicorn raises the
caught signal again, so the process dies of it instead of exiting 0; and a
second SIGINT sets `force_exit`, which skips the lifespan shutdown: executors
and shared memory would be left behind.

So while the service runs, `StopSignals` wraps the handler the server
installed. On the first signal the service begins its drain at once (new
requests are refused with 503 shutting_down; those accepted get the grace
period to finish) and uvicorn is told to exit as its own handler would tell
it — `should_exit` — without being handed the signal: nothing is raised
again, and the process exits 0 once the lifespan shutdown is done. If no
graceful-shutdown timeout was configured, it gets `safety_net_s(grace)`, so
that a connection the drain cannot answer (a body that never finishes
arriving) cannot hold the exit forever. A later signal (but the first
one again within `REPEAT_WINDOW_S`: `timeout` sends one to the process and
one to its group at once) cuts the grace short; it is never passed on, so
`force_exit` cannot skip freeing executors and shared memory. Should the
loop be wedged, app/server/loop_watchdog.py ends the process anyway.

Under another server, a previous handler that is a Python callable is
called after ours; one that is not (SIG_DFL, SIG_IGN) is left alone, and so
is a service run outside the main thread (only it may handle signals).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("app.server")

HANDLED = (signal.SIGTERM, signal.SIGINT)

# uvicorn's last resort after a signal, beyond the grace period: the drain
# answers every inference request when the grace ends; this only bounds a
# connection the drain cannot answer.
SAFETY_NET_S = 1.0

# The first signal again this soon after it is the same stop sent twice, not
# a request to hurry: `timeout(1)` signals its child and then the child's
# process group, so the server gets SIGTERM twice at once.
REPEAT_WINDOW_S = 0.1


def safety_net_s(grace_s: float) -> float:
    """The `timeout_graceful_shutdown` to give uvicorn for a grace period."""
    return grace_s + SAFETY_NET_S


Handler = Callable[[int, FrameType | None], Any] | int | None


class StopSignals:
    """Hooks SIGTERM and SIGINT on the running loop while the service serves:
    `on_first(name)` on the first one, `on_again(name)` on each later one,
    both called on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        grace_s: float,
        on_first: Callable[[str], None],
        on_again: Callable[[str], None],
        on_received: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._on_received = on_received
        self._first_at: float | None = None
        self._first_signal = 0
        self._grace_s = grace_s
        self._on_first = on_first
        self._on_again = on_again
        self._previous: dict[int, Handler] = {}
        self.received = 0

    def install(self) -> bool:
        """Wrap the current handlers; False when nothing could be hooked."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in HANDLED:
            previous = signal.getsignal(sig)
            if callable(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._handle)
        return bool(self._previous)

    def restore(self) -> None:
        """Put the wrapped handlers back (the server restores its own later)."""
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # A Python signal handler runs on the main thread between two
        # bytecodes of whatever the loop was doing: only hand over to the loop.
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self._on_received is not None:
            self._on_received()  # the loop watchdog's clock starts (app/server/loop_watchdog.py)
        if self._first_at is None:
            self._first_at, self._first_signal = now, signum
            self._loop.call_soon_threadsafe(self._on_first, name)
        elif (
            self.received == 1
            and signum == self._first_signal
            and now - self._first_at < REPEAT_WINDOW_S
        ):  # the same stop, sent twice (`timeout` signals the child, then its group)
            log.info("%s twice within %.1f s: one stop", name, REPEAT_WINDOW_S)
        else:
            self._loop.call_soon_threadsafe(self._on_again, name)
        self.received += 1
        previous = self._previous.get(signum)
        server = _uvicorn_server(previous)
        if server is not None:
            server.should_exit = True
            if server.config.timeout_graceful_shutdown is None:
                server.config.timeout_graceful_shutdown = safety_net_s(self._grace_s)
        elif callable(previous):
            previous(signum, frame)


def uvicorn_server() -> Any:
    """The uvicorn Server running this process (found through the SIGTERM
    handler it installed), else None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return _uvicorn_server(signal.getsignal(signal.SIGTERM))


def _uvicorn_server(handler: Handler) -> Any:
    """The uvicorn Server whose `handle_exit` `handler` is, else None."""
    owner = getattr(handler, "__self__", None)
    if owner is None:
        return None
    try:
        from uvicorn import Server
    except ImportError:  # pragma: no cover - uvicorn is a dependency
        return None
    return owner if isinstance(owner, Server) else None
