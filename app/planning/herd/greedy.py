"""A greedy HERD plan: the ILP's warm start (ilp.py), and a plan of its own
when the solver has no time.

Two steps, both load-aware:

1. Placement: model-streams, largest n_k first, each to the group of least
   average load Σ n among those whose memory (c) and affinity set (e) take
   it (longest-processing-time first, the classic balancing rule). When
   memory stops it, the same rule in the order of memory, largest first
   (the tight packing case: 1,000 models in 10 groups), then first fit.
2. Sizes: for a target t, group j needs ⌈r_j(t)⌉ devices, r_j(t) =
   t · max n_k (`paper`) or max_k (L_j + (t − 1) · n_k) (`shared`, L_j the
   group's load) over its model-streams; the largest t whose needs fit in N
   devices and Ḡ per group is found by bisection, and the devices left over
   go one at a time to the group of least burst tolerance below Ḡ (under
   the reading `spread` names).

Deterministic; no solver. Returns None when no placement fits memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.planning.herd.plan import burst_tolerances
from app.planning.herd.problem import ModelStream


@dataclass(frozen=True)
class GreedyPlan:
    sizes: tuple[int, ...]  # devices per candidate group (0: unused)
    group_of: tuple[int, ...]  # model-stream k → its group
    least_bt: float  # the least burst tolerance under the objective it was sized for


def greedy_plan(
    objective: str,
    streams: Sequence[ModelStream],
    memory: Sequence[int],
    affinity: Sequence[int],
    groups: int,
    devices: int,
    max_size: int,
    model_memory: int,
    spread: str | None = None,
) -> GreedyPlan | None:
    """`spread`: the reading whose least burst tolerance picks where the
    devices left over go (default `objective`; ilp.py's tie-break passes
    `shared`: each spare device to the group with the least room per
    stream, which no `paper` optimum forbids)."""
    n = [ms.devices_needed for ms in streams]
    group_of = _place(n, memory, affinity, groups, model_memory)
    if group_of is None:
        return None
    members: list[list[int]] = [[] for _ in range(groups)]
    for k, j in enumerate(group_of):
        members[j].append(k)
    used = [j for j in range(groups) if members[j]]
    if len(used) > devices:
        return None

    def need(j: int, t: float) -> int:
        load = sum(n[k] for k in members[j])
        if objective == "paper":
            r = t * max(n[k] for k in members[j])
        else:
            r = max(load + (t - 1.0) * n[k] for k in members[j])
        return max(1, math.ceil(r - 1e-9))

    def fits(t: float) -> bool:
        needs = [need(j, t) for j in used]
        return max(needs) <= max_size and sum(needs) <= devices

    low, high = 0.0, max_size / min(n)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    sizes = [0] * groups
    for j in used:
        sizes[j] = need(j, low)

    def bt(j: int, reading: str = objective) -> float:
        return min(burst_tolerances(reading, sizes[j], [streams[k] for k in members[j]]).values())

    for _ in range(devices - sum(sizes)):
        open_groups = [j for j in used if sizes[j] < max_size]
        if not open_groups:
            break
        sizes[min(open_groups, key=lambda j: (bt(j, spread or objective), j))] += 1
    return GreedyPlan(tuple(sizes), tuple(group_of), min(bt(j) for j in used))


def _place(
    n: Sequence[float],
    memory: Sequence[int],
    affinity: Sequence[int],
    groups: int,
    capacity: int,
) -> list[int] | None:
    K = len(n)
    by_load = sorted(range(K), key=lambda k: (-n[k], k))
    by_memory = sorted(range(K), key=lambda k: (-memory[k], -n[k], k))
    for order, pick in ((by_load, _least_load), (by_memory, _least_load), (by_memory, _first)):
        placed = _assign(order, n, memory, affinity, groups, capacity, pick)
        if placed is not None:
            return placed
    return None


Pick = Callable[[list[int], list[float]], int]


def _least_load(fits: list[int], load: list[float]) -> int:
    return min(fits, key=lambda j: (load[j], j))


def _first(fits: list[int], load: list[float]) -> int:
    return fits[0]


def _assign(
    order: Sequence[int],
    n: Sequence[float],
    memory: Sequence[int],
    affinity: Sequence[int],
    groups: int,
    capacity: int,
    pick: Pick,
) -> list[int] | None:
    used = [0] * groups
    load = [0.0] * groups
    sets: list[int | None] = [None] * groups
    group_of = [-1] * len(n)
    for k in order:
        fits = [
            j
            for j in range(groups)
            if used[j] + memory[k] <= capacity and sets[j] in (None, affinity[k])
        ]
        if not fits:
            return None
        j = pick(fits, load)
        used[j] += memory[k]
        load[j] += n[k]
        sets[j] = affinity[k]
        group_of[k] = j
    return group_of
