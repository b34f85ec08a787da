"""Sleep until a CLOCK_MONOTONIC time with sub-millisecond precision.

asyncio's selector loop waits in `epoll_wait`, whose timeout is whole
milliseconds rounded up: `asyncio.sleep` wakes up to 1 ms late (0.5 ms on
average), and for a load generator every such delay is a late send that the
measured latency includes. A Linux timerfd armed at the absolute send time
wakes the same loop within microseconds. Elsewhere (or if the timerfd cannot
be made) `asyncio.sleep` is used.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class PreciseSleeper:
    """`await sleeper.sleep_until(when)`: wake at `when` (time.monotonic()
    seconds) or just after, never before. One sleep at a time; `close()`
    when done. `precise` says whether a timerfd is in use."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._fd = -1
        self._libc: ctypes.CDLL | None = None
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            except (AttributeError, OSError):
                fd = -1
            if fd >= 0:
                try:
                    self._loop.add_reader(fd, self._on_fired)
                except NotImplementedError:  # a loop without add_reader
                    os.close(fd)
                else:
                    self._fd, self._libc = fd, libc

    @property
    def precise(self) -> bool:
        return self._fd >= 0

    async def sleep_until(self, when: float) -> None:
        delay = when - time.monotonic()
        if delay <= 0:
            return
        if self._fd < 0:
            await asyncio.sleep(delay)
            while time.monotonic() < when:  # a wake-up the clock calls early
                await asyncio.sleep(0)
            return
        waiter = self._loop.create_future()
        self._waiter = waiter
        self._arm(when)
        try:
            await waiter
        finally:
            self._waiter = None
            if waiter.cancelled():  # the sleep was cancelled: fire for nobody
                self._arm(0.0)

    def _arm(self, when: float) -> None:
        """Arm the timerfd at absolute `when`; 0 disarms it."""
        assert self._libc is not None
        seconds = int(when)
        value = _Timespec(seconds, int((when - seconds) * 1e9)) if when > 0 else _Timespec(0, 0)
        spec = _Itimerspec(_Timespec(0, 0), value)
        flags = _TFD_TIMER_ABSTIME if when > 0 else 0
        if self._libc.timerfd_settime(self._fd, flags, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def _on_fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return  # disarmed or re-armed since it became readable
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
