"""Real-time (SCHED_FIFO) scheduling for the daemon's latency-critical threads.

Opt-in (`REALTIME_PRIORITY`, 0 = off). A batch is planned to the millisecond,
but on a busy box the kernel wakes an ordinary thread late: on the 2-core
benchmark VM an idle process's timer fires p99 +1.3–2.0 ms late while the
daemon serves 850 r/s beside it, against +0.16–0.18 ms at SCHED_FIFO
(docs/benchmark-history.md, 2026-11-23, "real-time scheduling"). A shorter EEVDF slice
(`sched_setattr` runtime) did not help there: the daemon's threads are busy,
and a busy thread is not eligible to preempt however short its slice.

The event loop runs at the given priority and the emulated and GPU executors
one below it, so the loop (intake, timers, answers) can preempt an executor
that spins out the last fraction of a millisecond before a batch's start or
end; CPU executors, which compute, return to normal scheduling. Threads and
processes started afterwards inherit the policy. Linux's real-time throttling
(`sched_rt_runtime_us`, 95 % by default) keeps a runaway thread from locking
the box. Needs CAP_SYS_NICE (root, or `RLIMIT_RTPRIO` ≥ the priority): where
that is missing, start-up fails with a message saying so rather than serving
with timing the operator did not ask for.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

MAX_PRIORITY = 99


class RealtimeUnavailable(RuntimeError):
    """The process may not use SCHED_FIFO at the requested priority."""


@dataclass(frozen=True)
class SchedState:
    """A thread's scheduling policy and priority, to restore later."""

    policy: int
    priority: int


def executor_priority(loop_priority: int, device_kind: str) -> int:
    """Executors that wait on a device (emulated, GPU) run one below the event
    loop (never below 1). CPU executors compute: real-time priority would only
    let them (and ONNX Runtime's spinning worker threads) starve everything
    else on their cores, so they run at normal priority (0)."""
    if loop_priority <= 0 or device_kind == "cpu":
        return 0
    return max(loop_priority - 1, 1)


def check_priority(priority: int, setting: str = "REALTIME_PRIORITY") -> None:
    if not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(f"{setting} must be 0 (off) to {MAX_PRIORITY}, got {priority}")


def current() -> SchedState:
    return SchedState(os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)


def fifo_priority() -> int:
    """The calling thread's SCHED_FIFO priority; 0 under any other policy."""
    if not hasattr(os, "sched_getscheduler"):
        return 0
    state = current()
    return state.priority if state.policy == os.SCHED_FIFO else 0


def set_fifo(priority: int, setting: str = "REALTIME_PRIORITY") -> SchedState:
    """Put the calling thread under SCHED_FIFO at `priority`; return its
    previous state. 0 does nothing. Raises RealtimeUnavailable with the reason
    (platform, permission), naming `setting`, when the kernel refuses."""
    check_priority(priority, setting)
    if priority == 0:
        return current() if hasattr(os, "sched_getscheduler") else SchedState(0, 0)
    if not hasattr(os, "sched_setscheduler"):
        raise RealtimeUnavailable(f"{setting} needs Linux (SCHED_FIFO)")
    before = current()
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        import resource  # POSIX only, like SCHED_FIFO itself

        soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
        raise RealtimeUnavailable(
            f"{setting}={priority}: the kernel refused SCHED_FIFO (needs root or "
            f"CAP_SYS_NICE, or `ulimit -r` ≥ {priority}; it is {soft}); "
            f"set {setting}=0 to run without it"
        ) from None
    except OSError as exc:
        raise RealtimeUnavailable(f"{setting}={priority}: {exc}") from None
    return before


def check_permitted(priority: int, setting: str = "REALTIME_PRIORITY") -> None:
    """Raise RealtimeUnavailable now if `set_fifo(priority)` would be refused
    (tried on the calling thread, then undone)."""
    if priority:
        restore(set_fifo(priority, setting))


@contextlib.contextmanager
def fifo_while(priority: int, setting: str = "REALTIME_PRIORITY") -> Iterator[None]:
    """The calling thread at SCHED_FIFO `priority` (0: unchanged) inside the block."""
    before = set_fifo(priority, setting)
    try:
        yield
    finally:
        restore(before)


NORMAL = SchedState(os.SCHED_OTHER, 0) if hasattr(os, "SCHED_OTHER") else SchedState(0, 0)


def restore(state: SchedState) -> None:
    """Return the calling thread to `state` (lowering is always allowed)."""
    if hasattr(os, "sched_setscheduler"):
        os.sched_setscheduler(0, state.policy, os.sched_param(state.priority))
