"""Sub-millisecond timers on the running event loop (a Linux timerfd).

uvloop's timers count whole milliseconds of a per-iteration cached clock, so
`loop.call_later` fires up to a millisecond early or late (asyncio's selector
loop: up to a millisecond late, `epoll_wait`'s timeout being whole
milliseconds rounded up). A timerfd armed at an absolute CLOCK_MONOTONIC time
— the clock `time.monotonic()` reads — makes the loop's poll return within
microseconds of it, and never before. Elsewhere, or when no timerfd can be
made, `loop.call_later` stands in.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Timer(Protocol):
    """One timer: at most one callback armed at a time."""

    precise: bool

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` once at `when` (time.monotonic() seconds) or
        just after; replaces whatever was armed."""

    def cancel(self) -> None:
        """Disarm: the armed callback will not run."""

    def close(self) -> None:
        """Release the timer; it cannot be armed again."""


class LoopTimer:
    """The loop's own timer (`call_later`): millisecond precision."""

    precise = False

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        self.cancel()
        # Relative to time.monotonic(): uvloop's loop.time() is cached per
        # iteration in whole milliseconds.
        delay = max(when - time.monotonic(), 0.0)
        self._handle = self._loop.call_later(delay, self._fire, callback, args)

    def _fire(self, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._handle = None
        callback(*args)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        self.cancel()


class TimerfdTimer:
    """A timerfd watched by the loop (`add_reader`). Build with `make_timer`."""

    precise = True

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, libc: ctypes.CDLL) -> None:
        self._loop = loop
        self._fd = fd
        self._libc = libc
        self._callback: tuple[Callable[..., Any], tuple[Any, ...]] | None = None
        loop.add_reader(fd, self._on_readable)

    @property
    def fd(self) -> int:
        return self._fd

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        if self._fd < 0:
            raise RuntimeError("timer is closed")
        self._callback = (callback, args)
        # A time already past would read as "disarm" if it were 0: clamp it
        # to one nanosecond, which fires at once.
        self._arm(max(when, 1e-9))

    def cancel(self) -> None:
        self._callback = None
        if self._fd >= 0:
            self._arm(0.0)

    def close(self) -> None:
        if self._fd >= 0:
            self._callback = None
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _arm(self, when: float) -> None:
        """Arm at absolute `when`; 0 disarms."""
        seconds = int(when)
        value = _Timespec(seconds, int((when - seconds) * 1e9)) if when > 0 else _Timespec(0, 0)
        spec = _Itimerspec(_Timespec(0, 0), value)
        flags = _TFD_TIMER_ABSTIME if when > 0 else 0
        if self._libc.timerfd_settime(self._fd, flags, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def _on_readable(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return  # re-armed or disarmed since it became readable
        armed, self._callback = self._callback, None
        if armed is not None:
            armed[0](*armed[1])


def make_timer(loop: asyncio.AbstractEventLoop, precise: bool = True) -> Timer:
    """A timerfd timer where Linux and the loop allow it (and `precise`),
    else the loop's own."""
    if precise and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0:
            try:
                return TimerfdTimer(loop, fd, libc)
            except NotImplementedError:  # a loop without add_reader
                os.close(fd)
    return LoopTimer(loop)
