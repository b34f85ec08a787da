"""Request queues ordered by the deadline the core plans with (`Request.due`).

A queue also counts items (`Request.items`, a request's batch dimension):
policies size batches in items and take whole requests. While every queued
request has one item (the common case) item counts are request counts and
the item helpers cost nothing extra.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence

from app.scheduling.types import Request


class DeadlineQueue:
    """Requests, earliest due time first (`Request.due`: the deadline less
    the core's margin; "deadline" below means that).

    Entries are `(due, id, request)` tuples in a plain sorted list, ordered
    by C-level tuple comparison (ids are unique, the request is never
    compared). A queue holds what can still meet its deadline — a few
    hundred requests even under heavy overload — where a list's insert (a
    memmove) beats a balanced structure and its head is one index away: the
    head is read on every arrival.
    """

    __slots__ = ("_entries", "_extra")

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._entries: list[tuple[float, int, Request]] = sorted((r.due, r.id, r) for r in requests)
        # Items beyond one per request: 0 while every request has one item.
        self._extra = sum(e[2].items - 1 for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[Request]:
        for entry in self._entries:
            yield entry[2]

    def __contains__(self, request: Request) -> bool:
        entries = self._entries
        i = bisect.bisect_left(entries, (request.due, request.id))
        return i < len(entries) and entries[i][2] is request

    def add(self, request: Request) -> None:
        bisect.insort(self._entries, (request.due, request.id, request))
        self._extra += request.items - 1

    def remove(self, request: Request) -> None:
        entries = self._entries
        i = bisect.bisect_left(entries, (request.due, request.id))
        if i == len(entries) or entries[i][2] is not request:
            raise ValueError(f"request {request.id} is not in the queue")
        del entries[i]
        self._extra -= request.items - 1

    def head(self) -> Request:
        return self._entries[0][2]

    def head_deadline(self) -> float:
        """The head's deadline: the hot path of every policy."""
        return self._entries[0][0]

    def deadline_at(self, index: int) -> float:
        return self._entries[index][0]

    def peek(self, start: int, stop: int) -> list[Request]:
        return [entry[2] for entry in self._entries[start:stop]]

    def pop_range(self, start: int, stop: int) -> list[Request]:
        """Remove and return the requests at positions [start, stop)."""
        entries = self._entries
        taken = [entry[2] for entry in entries[start:stop]]
        del entries[start:stop]
        if self._extra:
            self._extra -= sum(r.items for r in taken) - len(taken)
        return taken

    def pop_front(self, count: int) -> list[Request]:
        return self.pop_range(0, count)

    def pop_expired(self, cutoff: float) -> list[Request]:
        """Remove requests whose deadline is < cutoff (they cannot make it)."""
        index = bisect.bisect_left(self._entries, (cutoff, -1))
        if index == 0:
            return []
        return self.pop_front(index)

    # ------------------------------------------------------------------ items

    @property
    def items(self) -> int:
        """Items queued (the sum of the requests' items)."""
        return len(self._entries) + self._extra

    @property
    def uniform(self) -> bool:
        """Whether every queued request has one item."""
        return not self._extra

    def items_in(self, start: int, stop: int) -> int:
        """Items of the requests at positions [start, stop)."""
        if not self._extra:
            return max(0, min(stop, len(self._entries)) - start)
        return sum(entry[2].items for entry in self._entries[start:stop])

    def select(self, budget: int, start: int = 0) -> list[int]:
        """Positions of the requests a batch of at most `budget` items takes
        from position `start` on: in deadline order, each request that still
        fits the items left, skipping (never splitting) one that does not.
        """
        n = len(self._entries)
        if not self._extra:
            return list(range(start, min(n, start + max(budget, 0))))
        chosen: list[int] = []
        left = budget
        entries = self._entries
        for i in range(start, n):
            if left <= 0:
                break
            items = entries[i][2].items
            if items <= left:
                chosen.append(i)
                left -= items
        return chosen

    def items_of(self, positions: list[int]) -> int:
        """Items of the requests at `positions`."""
        if not self._extra:
            return len(positions)
        entries = self._entries
        return sum(entries[i][2].items for i in positions)

    def batch(self, budget: int) -> list[int]:
        """Positions of a batch led by the head: the head (alone when it has
        more than `budget` items), then what `select` adds within the rest."""
        if not self._entries:
            return []
        if not self._extra:
            return list(range(min(len(self._entries), max(budget, 1))))
        head = self._entries[0][2].items
        return [0, *self.select(budget - head, 1)]

    def prefix(self, budget: int, start: int = 0) -> int:
        """How many requests from `start` on, in order, fit in `budget` items
        (stopping at the first that does not fit)."""
        n = len(self._entries)
        if not self._extra:
            return max(0, min(n - start, budget))
        count = 0
        left = budget
        for entry in self._entries[start:]:
            items = entry[2].items
            if items > left:
                break
            left -= items
            count += 1
        return count

    def pop_positions(self, positions: list[int]) -> list[Request]:
        """Remove and return the requests at `positions` (ascending)."""
        if not positions:
            return []
        first, last = positions[0], positions[-1]
        if last - first + 1 == len(positions):
            return self.pop_range(first, last + 1)
        entries = self._entries
        taken = [entries[i][2] for i in positions]
        for i in reversed(positions):
            del entries[i]
        self._extra -= sum(r.items for r in taken) - len(taken)
        return taken

    def pop_hopeless(self, now: float, cost: Callable[[int], float]) -> list[Request]:
        """Remove requests that cannot finish alone: due < now + cost(items).

        With one item each that is a prefix (`pop_expired`); otherwise a
        request with more items may be hopeless while an earlier one is not.
        """
        if not self._extra:
            return self.pop_expired(now + cost(1))
        entries = self._entries
        most = max(entry[2].items for entry in entries)
        horizon = now + cost(most)
        lost = [
            i
            for i in range(self.count_before(horizon))
            if entries[i][0] < now + cost(entries[i][2].items)
        ]
        return self.pop_positions(lost)

    def first_hopeless(self, at: Callable[[float, int], float]) -> float | None:
        """The earliest `at(due, items)` over the queue: when its first
        request can no longer finish alone (`at` grows with due and
        shrinks with items)."""
        entries = self._entries
        if not entries:
            return None
        if not self._extra:
            return at(entries[0][0], 1)
        return min(at(due, request.items) for due, _, request in entries)

    def count_before(self, deadline: float) -> int:
        """How many queued requests have a deadline < `deadline`."""
        return bisect.bisect_left(self._entries, (deadline, -1))


class ModelQueues(dict[str, DeadlineQueue]):
    """One DeadlineQueue per model, as most policies keep them."""

    def __init__(self, models: Sequence[str]) -> None:
        super().__init__((name, DeadlineQueue()) for name in models)

    def add_all(self, requests: Iterable[Request]) -> list[str]:
        """Queue `requests`; the models whose queues grew, in first-seen order."""
        changed: dict[str, None] = {}
        for request in requests:
            self[request.model].add(request)
            changed[request.model] = None
        return list(changed)

    def total(self) -> int:
        return sum(len(queue) for queue in self.values())

    def total_items(self) -> int:
        return sum(queue.items for queue in self.values())

    def add_model(self, name: str) -> None:
        self[name] = DeadlineQueue()

    def remove_model(self, name: str) -> list[Request]:
        """Forget `name`'s queue; its requests, earliest deadline first."""
        return list(self.pop(name))
