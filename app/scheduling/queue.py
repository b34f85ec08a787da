"""Request queues ordered by the deadline the core plans with (`Request.due`)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence

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

    __slots__ = ("_entries",)

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._entries: list[tuple[float, int, Request]] = sorted(
            (r.due, r.id, r) for r in requests
        )

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

    def remove(self, request: Request) -> None:
        entries = self._entries
        i = bisect.bisect_left(entries, (request.due, request.id))
        if i == len(entries) or entries[i][2] is not request:
            raise ValueError(f"request {request.id} is not in the queue")
        del entries[i]

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
        return taken

    def pop_front(self, count: int) -> list[Request]:
        return self.pop_range(0, count)

    def pop_expired(self, cutoff: float) -> list[Request]:
        """Remove requests whose deadline is < cutoff (they cannot make it)."""
        index = bisect.bisect_left(self._entries, (cutoff, -1))
        if index == 0:
            return []
        return self.pop_front(index)

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

    def add_model(self, name: str) -> None:
        self[name] = DeadlineQueue()

    def remove_model(self, name: str) -> list[Request]:
        """Forget `name`'s queue; its requests, earliest deadline first."""
        return list(self.pop(name))
