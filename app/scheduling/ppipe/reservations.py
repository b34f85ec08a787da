"""Reservation tables: when each resource of a pooled pipeline is spoken for.

ppipe.txt §5.4 and App. A.3 (Algorithm 2): the data plane keeps, for every
device (an instance: a whole device or a share of one) and for every link
(each node's uplink and its downlink), the future intervals it has promised
to batches. A table is a list of disjoint half-open intervals [start, end)
sorted by start, each with an owner (`(batch id, stage)`).

* `earliest_slot(t, length)` — the paper's `earliestSlot([res], t, l)`: the
  first start ≥ t of a free gap of `length`. Gaps between reservations are
  used (a short batch fits before a later one).
* `earliest_common_slot(tables, t, length)` — the same over several tables
  at once: a transfer needs the sender's uplink and the receiver's downlink
  free together (Algorithm 2, lines 12–14).
* `reserve` / `release` — mark and unmark an owner's interval.
* `correct(owner, start, end)` — feedback correction (§5.4): an executor
  reported when the reserved work actually ran. The owner's interval becomes
  what happened; reservations behind it that now overlap are moved later by
  the overlap, keeping their lengths (a device runs its reservations in
  order, so a late batch delays the ones after it by as much). The moved
  owners are returned, so the caller can update what it planned for them.
* `prune(before)` — forget intervals that ended by `before` (the past no
  longer constrains a probe, which always starts at or after now).

Times are seconds on the caller's clock; nothing here reads a clock.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Sequence

# Float slack for "fits in the gap": probes add latencies to times, so a gap
# that fits exactly may miss by an ulp.
EPS = 1e-12


class ReservationTable:
    """One resource's reservations: disjoint [start, end) intervals."""

    __slots__ = ("_ends", "_owners", "_starts", "name")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._owners: list[Hashable] = []

    def __len__(self) -> int:
        return len(self._starts)

    def intervals(self) -> list[tuple[float, float, Hashable]]:
        """(start, end, owner) in time order."""
        return list(zip(self._starts, self._ends, self._owners, strict=True))

    def interval_of(self, owner: Hashable) -> tuple[float, float] | None:
        for s, e, o in zip(self._starts, self._ends, self._owners, strict=True):
            if o == owner:
                return s, e
        return None

    def free_at(self) -> float:
        """When the last reservation ends (−inf if none)."""
        return self._ends[-1] if self._ends else float("-inf")

    def earliest_slot(self, t: float, length: float) -> float:
        """The earliest start ≥ t of a free gap of `length`."""
        ends = self._ends
        i = bisect_right(ends, t)
        starts = self._starts
        n = len(starts)
        while i < n:
            if starts[i] >= t + length - EPS:
                return t
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def reserve(self, start: float, end: float, owner: Hashable) -> None:
        """Mark [start, end) as `owner`'s. It must not overlap another
        reservation (a probe only returns free gaps)."""
        if not end >= start:
            raise ValueError(f"{self.name}: reservation ends before it starts ({start}, {end})")
        i = bisect_left(self._starts, start)
        if i > 0 and self._ends[i - 1] > start + EPS:
            raise ValueError(
                f"{self.name}: [{start}, {end}) for {owner} overlaps "
                f"[{self._starts[i - 1]}, {self._ends[i - 1]}) of {self._owners[i - 1]}"
            )
        if i < len(self._starts) and self._starts[i] < end - EPS:
            raise ValueError(
                f"{self.name}: [{start}, {end}) for {owner} overlaps "
                f"[{self._starts[i]}, {self._ends[i]}) of {self._owners[i]}"
            )
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        self._owners.insert(i, owner)

    def release(self, owner: Hashable) -> bool:
        """Forget `owner`'s interval; False if it holds none."""
        try:
            i = self._owners.index(owner)
        except ValueError:
            return False
        del self._starts[i], self._ends[i], self._owners[i]
        return True

    def correct(
        self, owner: Hashable, start: float, end: float
    ) -> list[tuple[Hashable, float, float]]:
        """`owner` actually used the resource over [start, end): record it and
        move the reservations it now overlaps later by the overlap (each
        cascading to the next). Returns (owner, new start, new end) of each
        moved reservation."""
        if not end >= start:
            raise ValueError(f"{self.name}: report ends before it starts ({start}, {end})")
        self.release(owner)
        i = bisect_right(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        self._owners.insert(i, owner)
        moved: list[tuple[Hashable, float, float]] = []
        edge = end
        for j in range(i + 1, len(self._starts)):
            overlap = edge - self._starts[j]
            if overlap <= EPS:
                break
            self._starts[j] += overlap
            self._ends[j] += overlap
            edge = self._ends[j]
            moved.append((self._owners[j], self._starts[j], self._ends[j]))
        return moved

    def prune(self, before: float) -> None:
        """Forget intervals that ended at or before `before`."""
        k = bisect_right(self._ends, before)
        if k:
            del self._starts[:k], self._ends[:k], self._owners[:k]


def earliest_common_slot(tables: Sequence[ReservationTable], t: float, length: float) -> float:
    """The earliest start ≥ t at which every table has `length` free."""
    while True:
        moved = False
        for table in tables:
            s = table.earliest_slot(t, length)
            if s > t:
                t = s
                moved = True
        if not moved:
            return t
