"""Named one-shot timers on a heap with lazy cancellation.

`set(key, at)` replaces any earlier timer of the same key; stale heap entries
are skipped when they surface. The core exposes the earliest live timer as
`next_wakeup()`, and fires due timers when the driver calls it with `now`.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable


class Timers:
    __slots__ = ("_due", "_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._due: dict[Hashable, tuple[float, int]] = {}
        self._seq = 0

    def set(self, key: Hashable, at: float) -> None:
        self._seq += 1
        self._due[key] = (at, self._seq)
        heapq.heappush(self._heap, (at, self._seq, key))

    def reset(self, key: Hashable, at: float) -> None:
        """`set`, unless the timer is already due exactly at `at`."""
        live = self._due.get(key)
        if live is None or live[0] != at:
            self.set(key, at)

    def cancel(self, key: Hashable) -> None:
        self._due.pop(key, None)

    def when(self, key: Hashable) -> float | None:
        entry = self._due.get(key)
        return entry[0] if entry else None

    def next_time(self) -> float | None:
        heap, due = self._heap, self._due
        while heap:
            at, seq, key = heap[0]
            live = due.get(key)
            if live is not None and live[1] == seq:
                return at
            heapq.heappop(heap)
        return None

    def pop_due(self, now: float) -> Hashable | None:
        """Remove and return the key of one timer due at or before `now`."""
        heap, due = self._heap, self._due
        while heap:
            at, seq, key = heap[0]
            live = due.get(key)
            if live is None or live[1] != seq:
                heapq.heappop(heap)
                continue
            if at > now:
                return None
            heapq.heappop(heap)
            del due[key]
            return key
        return None

    def __len__(self) -> int:
        return len(self._due)
