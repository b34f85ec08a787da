"""Named one-shot timers on a heap with lazy cancellation, and the one rule
for "just after" that every policy's timers use.

`set(key, at)` replaces any earlier timer of the same key; stale heap entries
are skipped when they surface. The core exposes the earliest live timer as
`next_wakeup()`, and fires due timers when the driver calls it with `now`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable


def first_instant(fails: Callable[[float], bool], guess: float) -> float:
    """The first float t at which `fails(t)` holds, searched from `guess`
    one float at a time (`fails` is false before some instant, true from it
    on; `guess` is within a few floats of it).

    A request that finishes exactly at its deadline is on time, so a drop
    timer must fire not at `deadline − cost` but at the first instant at
    which the policy's own test finds the request late — evaluated as that
    test evaluates it, float for float. A timer at an earlier float would
    find nothing to drop and re-arm for the same time forever."""
    at = guess
    if fails(at):
        while fails(earlier := math.nextafter(at, -math.inf)):
            at = earlier
        return at
    while not fails(at):
        at = math.nextafter(at, math.inf)
    return at


def first_instant_after(deadline: float, cost: float) -> float:
    """The first float t with t + cost > deadline: when a request due at
    `deadline` that needs `cost` from now can no longer make it."""
    return first_instant(lambda t: t + cost > deadline, deadline - cost)


class Timers:
    """The heap holds `(at, seq, key)` entries; `_due` maps each key to its
    live entry, so an entry is live exactly when it equals the one `_due`
    holds (no second tuple per timer). Equal, not identical: sequence numbers
    are unique, and the compiled build (app/build_fast.py) keeps a fixed-size
    tuple unboxed, making a new object each time it stores one."""

    __slots__ = ("_due", "_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, tuple[float, int, Hashable]] = {}
        self._seq = 0

    def set(self, key: Hashable, at: float) -> None:
        self._seq = seq = self._seq + 1
        self._due[key] = entry = (at, seq, key)
        heapq.heappush(self._heap, entry)

    def reset(self, key: Hashable, at: float) -> None:
        """`set`, unless the timer is already due exactly at `at`."""
        live = self._due.get(key)
        if live is None or live[0] != at:
            self._seq = seq = self._seq + 1
            self._due[key] = entry = (at, seq, key)
            heapq.heappush(self._heap, entry)

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def when(self, key: Hashable) -> float | None:
        entry = self._due.get(key)
        return entry[0] if entry else None

    def due(self, now: float, lead: float = 0.0) -> bool:
        """Whether a timer may be due at `now` (`lead` early) — the hot
        path's cheap test (it may be a cancelled one; `pop_due` then finds
        nothing)."""
        heap = self._heap
        return bool(heap) and heap[0][0] - lead <= now

    def next_time(self) -> float | None:
        heap, due = self._heap, self._due
        while heap:
            entry = heap[0]
            if due.get(entry[2]) == entry:
                return entry[0]
            heapq.heappop(heap)
        return None

    def pop_due(self, now: float, lead: float = 0.0) -> tuple[Hashable, float] | None:
        """Remove one timer due at or before `now` (`lead` early): (its key,
        its time). `at − lead ≤ now` is the test, the very expression the
        core's `next_wakeup` gives the driver, so that a wakeup at that time
        always finds its timer due."""
        heap, due = self._heap, self._due
        while heap:
            entry = heap[0]
            at, _, key = entry
            if due.get(key) != entry:
                heapq.heappop(heap)
                continue
            if at - lead > now:
                return None
            heapq.heappop(heap)
            del due[key]
            return key, at
        return None

    def __len__(self) -> int:
        return len(self._due)
