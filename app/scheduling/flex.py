"""FLEX: Shepherd's online scheduler with preemption (shepherd-nsdi23.txt §5.2).

Algorithm 1. One deadline-ordered queue per model. On a batch completion the
device runs the largest feasible batch across all model queues (BATCHGEN,
Algorithm 2). On an arrival, for each device: an idle device runs its
BATCHGEN batch at once (FLEX is work-conserving); a busy device is preempted
when the new batch is at least λ times the running one (|B_g| ≥ λ·|B_c|,
λ ≈ 3.03, Theorem 5.2). The preempted batch's requests that can still meet
their deadline are re-enqueued as new arrivals (line 19) and the others are
dropped. The running batch's requests count towards B_g when it is of the same
model (Algorithm 2 lines 6–7).

BATCHGEN. Algorithm 2 scans each queue in deadline order and keeps requests
that "can meet the SLO with the batch size so far"; taken literally that check
ignores the earlier members' deadlines. We compute what it is meant to find:
the largest window of consecutive requests (in deadline order) such that a
batch of that size started now finishes before the window's first deadline,
capped at the maximum batch (128 by default, §5.2). Windows are found by a
binary search over the start position, so a decision costs O(M·log²Q).
Requests that cannot finish even alone are dropped (Algorithm 2 line 4), also
by a drop timer so they are answered promptly. `flex-np` is the same without
preemption (Figure 11(a)'s SHEPHERD-NP).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence

from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.queue import DeadlineQueue
from app.scheduling.types import Batch, DeviceInfo, DropReason, Request

_EPSILON = 1e-9


class FlexScheduler(Scheduler):
    """Shepherd's FLEX: largest feasible batch first, preempt at λ× (shepherd §5.2)."""

    name = "flex"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        preemption: bool = True,
        threshold: float = 3.03,
        max_batch: int = 128,
        preemption_delay_ms: float = 0.0,
        **options: float,
    ) -> None:
        super().__init__(models, devices, **options)
        if threshold <= 1.0:
            raise ValueError(f"preemption threshold λ must be > 1, got {threshold}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
        self.preemption = preemption
        self.threshold = threshold
        self.preemption_delay = preemption_delay_ms / 1000.0
        if not preemption:
            self.name = "flex-np"
        self._cap = {name: min(m.max_batch, max_batch) for name, m in self.models.items()}
        self.current: dict[int, Batch | None] = dict.fromkeys(self.devices)

    # ------------------------------------------------------------------ events

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        self.queues[model.name].add(request)
        self._offer_to_devices(now, model.name)
        self._set_drop_timer(now)

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        if self.current.get(batch.device) is batch:
            self.current[batch.device] = None
        self._run_next(batch.device, now)
        self._set_drop_timer(now)

    def _on_timer(self, key: Hashable, now: float) -> None:
        self._drop_infeasible(now)
        for device, batch in self.current.items():
            if batch is None:
                self._run_next(device, now)
        self._set_drop_timer(now)

    # ------------------------------------------------------------ device faults

    def _on_device_down(self, device: int, now: float) -> None:
        # Algorithm 1 loops over `current`: a device not in it gets no work.
        self.current.pop(device, None)

    def _on_device_up(self, device: int, now: float) -> None:
        self.current[device] = None
        self._run_next(device, now)
        self._set_drop_timer(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        for name in self._enqueue(requests):
            self._offer_to_devices(now, name)
        self._set_drop_timer(now)

    # ---------------------------------------------------------------- decisions

    def _offer_to_devices(self, now: float, changed: str) -> None:
        """Algorithm 1 lines 11–19 after requests of model `changed` arrived.

        Only that model's window can have grown since the last decision
        (windows of the other queues only shrink as time passes, and they
        were below every threshold already), so a busy device checks just
        that model — Algorithm 2 line 2. A preemption re-enqueues the stopped
        batch's requests as new arrivals of its model (line 19) and the loop
        runs again for them.
        """
        pending = [changed]
        rounds = 0
        while pending and rounds <= len(self.devices):
            name = pending.pop()
            rounds += 1
            queue = self.queues[name]
            queued = len(queue)
            cap = self._cap[name]
            threshold = self.threshold
            for device, running in self.current.items():
                if running is None:
                    # An idle device already saw every other queue; only new
                    # work can give it a batch.
                    if queued:
                        self._run_next(device, now)
                        queued = len(queue)
                    continue
                if not self.preemption:
                    continue
                # Cheap bound first: the new batch cannot exceed the queue
                # (plus the running batch's own requests, lines 6–7).
                size = len(running.requests)
                most = queued + size if running.model == name else queued
                if min(cap, most) < threshold * size:
                    continue
                if self._should_preempt(device, running, name, now):
                    self._preempt(running, now)
                    self.current[device] = None
                    self._run_next(device, now, start=now + self.preemption_delay)
                    pending.append(running.model)
                    queued = len(queue)

    def _should_preempt(self, device: int, running: Batch, name: str, now: float) -> bool:
        """Would model `name`'s largest feasible batch be ≥ λ·|B_c|?"""
        need = self.threshold * running.size
        start = now + self.preemption_delay
        speed = self.devices[device].speed
        queue = self.queues[name]
        cap = self._cap[name]
        model = self.models[name]
        size = _largest_window(queue, model, cap, start, speed, self.delay)[1]
        if size >= need or name != running.model or size + running.size < need:
            return size >= need
        # Algorithm 2 lines 6–7: the running batch's requests count. Only
        # checked when they could tip the balance (the window over the union
        # is at most the queue's window plus |B_c|).
        for request in running.requests:
            queue.add(request)
        size = _largest_window(queue, model, cap, start, speed, self.delay)[1]
        for request in running.requests:
            queue.remove(request)
        return size >= need

    def _run_next(self, device: int, now: float, start: float | None = None) -> None:
        """Algorithm 1 lines 5–6: run the largest feasible batch on `device`."""
        start = now if start is None else start
        self._drop_infeasible(start)
        speed = self.devices[device].speed
        best: tuple[int, int, str] | None = None  # (size, -first, model) of the best window
        for name, queue in self.queues.items():
            if not queue:
                continue
            first, size = _largest_window(
                queue, self.models[name], self._cap[name], start, speed, self.delay
            )
            if size and (best is None or size > best[0]):
                best = (size, first, name)
        if best is None:
            return
        size, first, name = best
        requests = self.queues[name].pop_range(first, first + size)
        self.current[device] = self._dispatch(self.models[name], requests, device, start)

    def _drop_infeasible(self, now: float) -> None:
        """Algorithm 2 line 4: requests that cannot finish even alone."""
        for name, queue in self.queues.items():
            if queue:
                cutoff = now + self.delay(1) + self.latency(self.models[name], 1)
                expired = queue.pop_expired(cutoff)
                if expired:
                    self._drop(expired, DropReason.DEADLINE)

    def _set_drop_timer(self, now: float) -> None:
        earliest: float | None = None
        for name, queue in self.queues.items():
            if queue:
                at = queue.head_deadline() - self.delay(1) - self.latency(self.models[name], 1)
                if earliest is None or at < earliest:
                    earliest = at
        if earliest is None:
            self.timers.cancel(("drop", None))
        else:
            at = max(earliest + _EPSILON, now)
            self.timers.reset(("drop", None), at)


def _largest_window(
    queue: DeadlineQueue,
    model: ModelInfo,
    cap: int,
    start: float,
    speed: float,
    delay,
) -> tuple[int, int]:
    """(first index, size) of the largest batch of consecutive queued requests
    that, started at `start`, finishes by the deadline of its first request.

    With deadlines D sorted, a window starting at i can hold
    g(i) = min(cap, b_max(D[i] − start)) requests and at most h(i) = n − i
    remain; g rises and h falls with i, so the best window sits where they
    cross: binary-search the first i with g(i) ≥ h(i) and compare it with i−1.
    Ties go to the earlier start (tighter deadlines).
    """
    n = len(queue)
    table = model.profile.latency_by_size

    def fits(i: int) -> int:
        budget = (queue.deadline_at(i) - start) * speed
        # b_max: largest b with delay(b)·speed + ℓ(b) ≤ budget; delay is tiny
        # and linear, so check the b found for ℓ alone and step down if needed.
        b = bisect.bisect_right(table, budget) - 1
        b = min(b, cap)
        while b > 0 and table[b] + delay(b) * speed > budget:
            b -= 1
        return b

    lo, hi = 0, n  # first i in [0, n) with fits(i) ≥ n − i, or n if none
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid) >= n - mid:
            hi = mid
        else:
            lo = mid + 1
    best_first, best_size = 0, 0
    if lo > 0:
        size = fits(lo - 1)  # < n − (lo − 1) by the search
        best_first, best_size = lo - 1, size
    if lo < n and n - lo > best_size:
        best_first, best_size = lo, n - lo
    return best_first, min(best_size, cap)
