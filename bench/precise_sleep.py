"""Sleep until a CLOCK_MONOTONIC time with sub-millisecond precision.

asyncio's selector loop waits in `epoll_wait`, whose timeout is whole
milliseconds rounded up: `asyncio.sleep` wakes up to 1 ms late (0.5 ms on
average), and for a load generator every such delay is a late send that the
measured latency includes. A Linux timerfd armed at the absolute send time
(`app.server.timerfd`, the daemon's own timers) wakes the same loop within
microseconds. Elsewhere (or if the timerfd cannot be made) `asyncio.sleep` is
used.
"""

from __future__ import annotations

import asyncio
import time

from app.server.timerfd import make_timer


class PreciseSleeper:
    """`await sleeper.sleep_until(when)`: wake at `when` (time.monotonic()
    seconds) or just after, never before. One sleep at a time; `close()`
    when done. `precise` says whether a timerfd is in use."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._timer = make_timer(self._loop)

    @property
    def precise(self) -> bool:
        return self._timer.precise

    async def sleep_until(self, when: float) -> None:
        delay = when - time.monotonic()
        if delay <= 0:
            return
        if not self._timer.precise:
            await asyncio.sleep(delay)
            while time.monotonic() < when:  # a wake-up the clock calls early
                await asyncio.sleep(0)
            return
        waiter = self._loop.create_future()
        self._timer.call_at(when, _wake, waiter)
        try:
            await waiter
        finally:
            if waiter.cancelled():  # the sleep was cancelled: fire for nobody
                self._timer.cancel()

    def close(self) -> None:
        self._timer.close()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
