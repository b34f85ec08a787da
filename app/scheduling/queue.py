"""Request queues ordered by the deadline the core plans with (`Request.due`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from sortedcontainers import SortedList

from app.scheduling.types import Request


class DeadlineQueue:
    """Requests, earliest due time first (`Request.due`: the deadline less
    the core's margin; "deadline" below means that).

    Entries are `(due, id, request)` tuples so that ordering is done by
    C-level tuple comparison (ids are unique, the request is never compared).
    """

    __slots__ = ("_entries",)

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._entries: SortedList = SortedList((r.due, r.id, r) for r in requests)

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[Request]:
        for entry in self._entries:
            yield entry[2]

    def __contains__(self, request: Request) -> bool:
        return (request.due, request.id, request) in self._entries

    def add(self, request: Request) -> None:
        self._entries.add((request.due, request.id, request))

    def remove(self, request: Request) -> None:
        self._entries.remove((request.due, request.id, request))

    def head(self) -> Request:
        return self._entries[0][2]

    def head_deadline(self) -> float:
        """The head's deadline: the hot path of every policy."""
        return self._entries[0][0]

    def deadline_at(self, index: int) -> float:
        return self._entries[index][0]

    def peek(self, start: int, stop: int) -> list[Request]:
        return [entry[2] for entry in self._entries.islice(start, stop)]

    def pop_range(self, start: int, stop: int) -> list[Request]:
        """Remove and return the requests at positions [start, stop)."""
        taken = [entry[2] for entry in self._entries.islice(start, stop)]
        del self._entries[start:stop]
        return taken

    def pop_front(self, count: int) -> list[Request]:
        return self.pop_range(0, count)

    def pop_expired(self, cutoff: float) -> list[Request]:
        """Remove requests whose deadline is < cutoff (they cannot make it)."""
        index = self._entries.bisect_left((cutoff, -1))
        if index == 0:
            return []
        return self.pop_front(index)

    def count_before(self, deadline: float) -> int:
        """How many queued requests have a deadline < `deadline`."""
        return self._entries.bisect_left((deadline, -1))


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
