"""How the executor pool tells a hung executor from a busy one.

Each pool's watchdog (`watch_for_hangs`, on the event loop, every
`check_interval` seconds; the same loop for executor processes and Ray
actors) asks `hang_of` about each serving executor, which applies two rules:

* **Silence.** Each executor process runs a thread that writes
  `time.monotonic()` into a shared 8-byte `Heartbeat` every
  `beat_interval(timeout)` seconds (5 beats per timeout, at most 0.2 s).
  A process that is stopped (SIGSTOP), frozen or starved stops beating; one
  that runs a long batch does not: the thread beats beside the batch, since
  the backends release the GIL while they compute (ONNX Runtime, torch) or
  wait (the emulated device sleeps). An executor silent for longer than the
  timeout is hung, idle or busy — which the next rule cannot see while no
  batch is in flight.
* **An overdue batch.** The oldest batch running longer than
  factor·ℓ(b) + margin by its latency profile: the process beats but its
  batch never ends (a stuck kernel, a deadlock inside the backend).

The beat is a shared value, not a message: it costs the event loop no
wake-up per beat, and since the executor stamps its own times on the
system-wide CLOCK_MONOTONIC, a stall of the parent (a busy event loop) never
counts against an executor. Silence is counted from the last beat or from
when the executor had loaded its models, whichever is later: the pool does
not judge an executor while it starts or loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

# Beats per timeout: a few late beats (a busy box) are not yet a hang.
BEATS_PER_TIMEOUT = 5
MAX_BEAT_INTERVAL_S = 0.2
MAX_CHECK_INTERVAL_S = 0.1


class Heartbeat:
    """The time of an executor's last beat, in memory shared with its parent,
    and how often it beats.

    Created by the parent (spawn context) and passed to the process as an
    argument; an aligned 8-byte store is atomic, so no lock is needed."""

    def __init__(self, context: Any, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"a heartbeat timeout must be > 0, got {timeout_s}")
        self.interval_s = beat_interval(timeout_s)
        self._value = context.RawValue("d", time.monotonic())

    def beat(self) -> None:
        self._value.value = time.monotonic()

    @property
    def last(self) -> float:
        return float(self._value.value)


def keep_beating(heartbeat: Heartbeat, stop: threading.Event) -> None:
    """The executor's heartbeat thread: beat until `stop` is set."""
    heartbeat.beat()
    while not stop.wait(heartbeat.interval_s):
        heartbeat.beat()


def beat_interval(timeout_s: float) -> float:
    """How often an executor beats for a given silence timeout (> 0)."""
    return min(MAX_BEAT_INTERVAL_S, timeout_s / BEATS_PER_TIMEOUT)


def check_interval(stuck_factor: float, stuck_margin_s: float, heartbeat_timeout_s: float) -> float:
    """How often the watchdog looks: a quarter of the shortest allowance of
    the rules in force (factor or timeout 0: off), every 10–100 ms."""
    margin = stuck_margin_s if stuck_factor > 0 else 0.0
    allowances = [t for t in (margin, heartbeat_timeout_s) if t > 0]
    shortest = min(allowances, default=MAX_CHECK_INTERVAL_S * 4)
    return min(MAX_CHECK_INTERVAL_S, max(shortest / 4, 0.01))


def silent_for(last_beat: float, since: float, now: float, timeout_s: float) -> float | None:
    """How long an executor has been silent, if longer than `timeout_s` —
    counted from its last beat, or from `since` (when it started serving)
    if that is later; None while it beats (or the rule is off: timeout 0)."""
    if timeout_s <= 0:
        return None
    silence = now - max(last_beat, since)
    return silence if silence > timeout_s else None


def batch_overdue(
    running_since: float, now: float, expected_s: float, factor: float, margin_s: float
) -> bool:
    """Whether a batch running since `running_since`, whose profile says
    `expected_s`, runs past factor·ℓ(b) + margin (factor 0: the rule is off)."""
    return factor > 0 and now - running_since > factor * expected_s + margin_s


# ------------------------------------------------------- the pool's view
class _Device(Protocol):
    @property
    def name(self) -> str: ...


class _Beat(Protocol):
    @property
    def last(self) -> float: ...


class Watched(Protocol):
    """What the watchdog reads of one executor (the pool's `Worker`, app.runtime.pool_worker):
    `heartbeat` None when it does not beat (the rule is off),
    `serving_since` when it had loaded its models, `progress_at` its last
    reply (or work given to it idle), `inflight` batch id → model oldest
    first, `sizes` batch id → (size, start_at)."""

    @property
    def device(self) -> _Device: ...
    @property
    def heartbeat(self) -> _Beat | None: ...
    @property
    def serving_since(self) -> float: ...
    @property
    def progress_at(self) -> float: ...
    @property
    def inflight(self) -> dict[int, str]: ...
    @property
    def sizes(self) -> dict[int, tuple[int, float]]: ...


class Rules(Protocol):
    """The watchdog's settings (the pool's attributes)."""

    @property
    def stuck_factor(self) -> float: ...
    @property
    def stuck_margin_s(self) -> float: ...
    @property
    def heartbeat_timeout_s(self) -> float: ...
    @property
    def expected_latency(self) -> Callable[[str, int], float | None] | None: ...


def hang_of(w: Watched, now: float, rules: Rules) -> str | None:
    """Why the executor counts as hung at `now`, or None."""
    if w.heartbeat is not None:
        timeout = rules.heartbeat_timeout_s
        silence = silent_for(w.heartbeat.last, w.serving_since, now, timeout)
        if silence is not None:
            n = len(w.inflight)
            doing = f"{n} batch{'es' if n > 1 else ''} in flight" if n else "idle"
            return f"executor {w.device.name} hung: no heartbeat for {silence:.2f} s ({doing})"
    latency_of = rules.expected_latency
    if latency_of is None or not w.inflight:
        return None
    batch_id = next(iter(w.inflight))  # executors run batches in order
    model = w.inflight[batch_id]
    size, start_at = w.sizes.get(batch_id, (1, now))
    expected = latency_of(model, size)
    if expected is None:
        return None
    running_since = max(start_at, w.progress_at)
    if not batch_overdue(running_since, now, expected, rules.stuck_factor, rules.stuck_margin_s):
        return None
    return (
        f"executor {w.device.name} stuck: batch {batch_id} of {model} ×{size} "
        f"running {now - running_since:.2f} s, profile says {expected * 1000:.1f} ms"
    )


def reap(process: Any) -> None:
    """Make sure a dead executor's process is gone and joined (no zombie)."""
    if process is None:
        return
    with contextlib.suppress(Exception):
        if process.is_alive():
            process.kill()
        process.join(1.0)


W = TypeVar("W", bound=Watched, covariant=True)


class HangWatch(Rules, Protocol[W]):
    """A pool as its watchdog sees it: its rules, whether it has stopped,
    and its executors to judge (those starting, loading or stopping left out)."""

    @property
    def stopped(self) -> bool: ...
    def watched(self) -> Iterable[W]: ...


E = TypeVar("E", bound=Watched)


async def watch_for_hangs(pool: HangWatch[E], on_hung: Callable[[E, str], None]) -> None:
    """Until the pool stops: every `check_interval`, `on_hung(executor,
    reason)` for each executor `hang_of` finds hung (the pool kills it and
    takes it down as a dead one)."""
    interval = check_interval(pool.stuck_factor, pool.stuck_margin_s, pool.heartbeat_timeout_s)
    while not pool.stopped:
        await asyncio.sleep(interval)
        now = time.monotonic()
        for executor in list(pool.watched()):
            reason = hang_of(executor, now, pool)
            if reason is not None:
                on_hung(executor, reason)
