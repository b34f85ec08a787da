"""FLEX: Shepherd's online scheduler with preemption (shepherd-nsdi23.txt §5.2).

Algorithm 1. One deadline-ordered queue per model. On a batch completion the
device runs the largest feasible batch across all model queues (BATCHGEN,
Algorithm 2). On an arrival, for each device: an idle device runs its
BATCHGEN batch at once (FLEX is work-conserving); a busy device is preempted
when the new batch is at least λ times the running one (|B_g| ≥ λ·|B_c|,
λ ≈ 3.03, Theorem 5.2), and runs the new batch. The preempted batch's
requests that can still meet their deadline are re-enqueued as new arrivals
(line 19) and the others dropped. The running batch's requests count towards
B_g when it is of the same model (Algorithm 2 lines 6–7). `flex-np` is the
same without preemption (Figure 11(a)'s SHEPHERD-NP).

BATCHGEN with the errata that Shepherd's first author confirmed to the
authors of Symphony's re-implementation of FLEX (nexuslb,
`tools/shepherd/flex_scheduler.cpp`, notes of 2023-11-20 and 2023-12-19):

* Line 4: requests that cannot finish even alone are dropped.
* Lines 8–13, *size*: line 10 tests batch size |B|+1 (not |B|) against the
  earliest deadline already in the candidate batch, scanning S by
  *descending* deadline: the size k is the largest with
  start + delay(k) + ℓ(k) ≤ D[n−k] (D ascending; capped at the maximum
  batch, 128 by default, §5.2). A binary search finds it: the left side
  rises and the right side falls with k.
* Lines 8–13, *members*: the batch is then filled in *ascending*-deadline
  order.
* Lines 7–8 of Algorithm 1 (BATCHGEN for every device after a completion)
  are redundant; BATCHGEN on a completion considers all models. On an
  arrival a busy device considers the arriving model (and the running
  one's, whose window did not grow): Algorithm 2 line 2.

Deviations, each for a reason:

* Members: the ascending fill starts at the first request that can meet its
  deadline in a batch of k (start + delay(k) + ℓ(k) ≤ its deadline), not at
  the head. Filling from the head would run requests the scheduler knows
  will be late; this server answers such a request at once as dropped
  instead of serving it late, and the slot goes to a request that makes it.
  The skipped heads stay queued: a smaller batch may still serve them, or
  their drop timer answers them.
* Preemption completes in the core (app/scheduling/base.py): until the
  stop is confirmed the preempted batch's requests are held; the new batch
  on the same device may include them (the device starts it after the
  stop), and the rest are re-enqueued (line 19) or dropped when the stop is
  confirmed, not at once — until then the stopping batch may still write
  their outputs.
* The new batch of a preempted device starts `preemption_delay_ms` after
  the decision (the expected stop delay; 0 by default).
* Requests with several items (`Request.items`): sizes — |B|, the cap,
  the λ test — count items. BATCHGEN's scan adds whole requests (one that
  would pass the cap is skipped, never split) and stops at the first that
  cannot make it; the members are then filled in ascending deadline order
  with the requests that fit whole in the size found. Line 4 and the drop
  timers test each request with its own items (delay(n) + ℓ(n)).
* Drop timers answer the hopeless promptly, not only when a device next
  looks at the queue.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.queue import DeadlineQueue, ModelQueues
from app.scheduling.types import Batch, DeviceInfo, DropReason, Request

_DROP_TIMER = ("drop", None)


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
        if preemption_delay_ms < 0:
            raise ValueError(f"preemption_delay_ms must be ≥ 0, got {preemption_delay_ms}")
        self.preemption = preemption
        self.threshold = threshold
        self.preemption_delay = preemption_delay_ms / 1000.0
        if not preemption:
            self.name = "flex-np"
        self._max_batch = max_batch
        self._cap = {name: min(m.max_batch, max_batch) for name, m in self.models.items()}
        self.queues = ModelQueues(list(self.models))

    def queued(self) -> int:
        return self.queues.total()

    # ------------------------------------------------------------------ events

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        self.queues[model.name].add(request)
        self._offer_to_devices(now, model.name)
        self._set_drop_timer(now)

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        device = batch.device
        if device not in self.down and not self.batches_on(device):
            self._run_next(device, now)
        self._set_drop_timer(now)

    def _on_timer(self, key: Hashable, now: float) -> None:
        self._drop_infeasible(now)
        for device in self.devices_up():
            if not self.batches_on(device):
                self._run_next(device, now)
        self._set_drop_timer(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        # Line 19: the preempted (or failed) batch's requests are new arrivals.
        for name in self.queues.add_all(requests):
            self._offer_to_devices(now, name)
        self._set_drop_timer(now)

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        self._cap[model.name] = min(model.max_batch, self._max_batch)
        self.queues.add_model(model.name)

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        del self._cap[name]
        queued = self.queues.remove_model(name)
        self._set_drop_timer(now)  # one timer for every queue: re-armed without it
        return queued

    # ------------------------------------------------------------ device faults

    def _on_device_down(self, device: int, now: float) -> None:
        pass  # Algorithm 1 loops over the devices up; a device down gets no work

    def _on_device_up(self, device: int, now: float) -> None:
        self._run_next(device, now)
        self._set_drop_timer(now)

    # ---------------------------------------------------------------- decisions

    def _offer_to_devices(self, now: float, changed: str) -> None:
        """Algorithm 1 lines 11–18 after requests of model `changed` arrived.

        Only that model's window can have grown since the last decision
        (windows of the other queues only shrink as time passes, and they
        were below every threshold already), so a busy device checks just
        that model — Algorithm 2 line 2.
        """
        queue = self.queues[changed]
        cap = self._cap[changed]
        threshold = self.threshold
        for device in self.devices_up():
            queued = len(queue)
            if not queued:
                return
            running = self.running_on(device)
            if running is None:
                # An idle device already saw every other queue; only new
                # work can give it a batch.
                self._run_next(device, now)
                continue
            if not self.preemption:
                continue
            # Cheap bound first: the new batch cannot exceed the queue (plus
            # the running batch's own requests, lines 6–7), in items.
            size = running.size
            items = queue.items
            most = items + size if running.model == changed else items
            if min(cap, most) < threshold * size:
                continue
            if self._should_preempt(device, running, changed, now):
                self._preempt(running, now)
                self._run_next(device, now, start=now + self.preemption_delay)

    def _should_preempt(self, device: int, running: Batch, name: str, now: float) -> bool:
        """Would model `name`'s largest feasible batch on `device` be ≥ λ·|B_c|?"""
        need = self.threshold * running.size
        start = now + self.preemption_delay
        queue = self.queues[name]
        size = self._batchgen(queue, name, start, device)[1]
        # Algorithm 2 lines 6–7: the running batch's requests count (so do
        # requests held for the device from an earlier stop). Only checked
        # when they could tip the balance: the window over the union is at
        # most the queue's window plus them.
        extra = [r for r in self.held_on(device) if r.model == name] if self.stopping else []
        if running.model == name:
            extra += running.requests
        if size >= need or size + sum(r.items for r in extra) < need:
            return size >= need
        with _joined(queue, extra) as joined:
            size = self._batchgen(joined, name, start, device)[1]
        return size >= need

    def _run_next(self, device: int, now: float, start: float | None = None) -> None:
        """Algorithm 1 lines 5–6: run the largest feasible batch on `device`."""
        start = now if start is None else start
        self._drop_infeasible(start)
        held = self.held_on(device) if self.stopping else []
        # (size in items, positions, model, the held requests of that model)
        best: tuple[int, list[int], str, list[Request]] | None = None
        for name, queue in self.queues.items():
            extra = [r for r in held if r.model == name] if held else []
            if extra:
                with _joined(queue, extra) as joined:
                    positions, size = self._batchgen(joined, name, start, device)
            elif queue:
                positions, size = self._batchgen(queue, name, start, device)
            else:
                continue
            if size and (best is None or size > best[0]):
                best = (size, positions, name, extra)
        if best is None:
            return
        size, positions, name, extra = best
        with _joined(self.queues[name], extra) as queue:
            requests = queue.pop_positions(positions)
        if extra:
            self.take_held(requests)
        self._dispatch(self.models[name], requests, device, start)

    def _batchgen(
        self, queue: DeadlineQueue, name: str, start: float, device: int
    ) -> tuple[list[int], int]:
        """Algorithm 2 lines 8–13 for one model: (queue positions, size in
        items) of its largest feasible batch started at `start` on `device`."""
        n = len(queue)
        if not n:
            return [], 0
        table = self.models[name].profile.latency_by_size
        speed = self.devices[device].speed
        d_ctrl, d_data = self.d_ctrl, self.d_data
        cap = self._cap[name]
        if not queue.uniform:
            return self._batchgen_items(queue, table, speed, cap, start)
        # Size: the largest k with start + delay(k) + ℓ(k) ≤ D[n − k].
        lo, hi = 0, min(n, cap)  # invariant: lo feasible (0 trivially)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if start + (d_ctrl + d_data * mid + table[mid] / speed) <= queue.deadline_at(n - mid):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return [], 0
        # Members: ascending deadlines from the first that meets its deadline.
        end = start + (d_ctrl + d_data * lo + table[lo] / speed)
        first = min(queue.count_before(end), n - lo)
        return list(range(first, first + lo)), lo

    def _batchgen_items(
        self,
        queue: DeadlineQueue,
        table: tuple[float, ...],
        speed: float,
        cap: int,
        start: float,
    ) -> tuple[list[int], int]:
        """`_batchgen` when some queued request has several items: the scan
        by descending deadline adds whole requests (skipping one that would
        take the batch past `cap` items); the size is the largest item count
        k it reaches with start + delay(k) + ℓ(k) ≤ the earliest deadline
        taken."""
        d_ctrl, d_data = self.d_ctrl, self.d_data
        size = 0
        total = 0
        requests = list(queue)
        for index in range(len(requests) - 1, -1, -1):
            items = requests[index].items
            if total + items > cap:
                continue
            total += items
            end = start + (d_ctrl + d_data * total + table[total] / speed)
            if end <= queue.deadline_at(index):
                size = total
            else:
                break  # the left side only rises and the right side only falls from here
        if not size:
            return [], 0
        end = start + (d_ctrl + d_data * size + table[size] / speed)
        positions = queue.select(size, queue.count_before(end))
        return positions, queue.items_of(positions)

    def _drop_infeasible(self, now: float) -> None:
        """Algorithm 2 line 4: requests that cannot finish even alone."""
        for name, queue in self.queues.items():
            if queue:
                expired = self.pop_hopeless(queue, self.models[name], now)
                if expired:
                    self._drop(expired, DropReason.DEADLINE)

    def _set_drop_timer(self, now: float) -> None:
        earliest: float | None = None
        for name, queue in self.queues.items():
            if queue:
                at = self.queue_hopeless_at(queue, self.models[name])
                assert at is not None
                if earliest is None or at < earliest:
                    earliest = at
        if earliest is None:
            self.timers.cancel(_DROP_TIMER)
        else:
            self.timers.reset(_DROP_TIMER, max(earliest, now))


class _joined:
    """`queue` with `extra` requests in it for the duration of a with-block."""

    def __init__(self, queue: DeadlineQueue, extra: Iterable[Request]) -> None:
        self.queue = queue
        self.extra = list(extra)

    def __enter__(self) -> DeadlineQueue:
        for request in self.extra:
            self.queue.add(request)
        return self.queue

    def __exit__(self, *exc: object) -> None:
        for request in self.extra:
            if request in self.queue:
                self.queue.remove(request)
