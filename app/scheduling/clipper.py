"""Clipper as a baseline: adaptive batch size per model by AIMD, deadline-unaware batching.

This is Clipper's batching *behaviour* (Crankshaw et al., "Clipper: A
Low-Latency Online Prediction Serving System", NSDI '17, §4.3 "Adaptive
batching") as orloj.txt §2.3 and §5 use it as a baseline for dynamic DNNs
("Clipper monitors request execution time reactively, but it cannot keep up
under tight SLO settings"), re-implemented on this project's sans-IO core:

* Clipper §4.3 — each model container has its own batching queue; when the
  container is free it takes the next batch, of at most the container's
  current maximum batch size, found by AIMD: "additively increase the batch
  size by a fixed amount until the latency to process a batch exceeds the
  latency objective. At this point, we perform a small multiplicative
  backoff, reducing the optimal batch size by 10%."
* Clipper's released task executor (``ModelQueue`` in
  ``src/libclipper/include/clipper/task_executor.hpp``) keeps that queue
  ordered by deadline — the query's arrival plus its latency SLO — and
  removes "tasks with elapsed deadlines" (deadline ≤ now) whenever it forms
  a batch: a query past its deadline is never evaluated.

Rules (all times in seconds, `now` from the driver):

1. **AIMD batch cap per model.** Each model has a cap c (a float, starting
   at ``initial_batch``). When one of its batches finishes at `now`, its
   measured latency is ``now − batch.start_at``; if that is ≤ the model's
   SLO (the latency objective) then c ← min(c + ``aimd_increase``,
   ``max_batch``), else c ← max(c × ``aimd_backoff``, 1). A batch takes at
   most ⌊c⌋ items. Clipper's defaults: +1, × 0.9.
2. **Queue.** One queue per model in deadline order (`Request.due`); every
   request of a model has the same SLO, so that is arrival order (FIFO),
   ties by request id, i.e. by arrival. A request requeued after a failed
   batch goes back to its place.
3. **Work-conserving.** Whenever a device is idle and some queue is
   non-empty, a batch is dispatched at once, on the device idle the
   longest; ``start_at = now + delay(k)`` as elsewhere in the core. The
   batch is the queue's front requests, in order, while their items fit in
   ⌊c⌋ (stopping at the first that does not fit, never skipping it); a
   front request larger than ⌊c⌋ goes alone (it is ≤ ``max_batch``, the
   core refuses larger ones at admission).
4. **Deadline-unaware, apart from elapsed deadlines.** Clipper knows no
   latency profile: a batch is never sized or refused for its deadline, so
   it may finish late, and the cap only adapts after the fact. A queued
   request whose deadline has passed (``due ≤ now``) is dropped with
   ``DropReason.DEADLINE`` — the released code's
   ``remove_tasks_with_elapsed_deadlines``; a timer per model fires at the
   queue head's `due`, so the answer comes when the deadline passes even
   while every device is busy (Clipper's frontend likewise answers a query
   when its SLO runs out). Under overload the queue builds up, batches run
   requests close to their deadline and finish late, and few requests
   finish in time — what orloj.txt's tables show for Clipper.

Deviations, on purpose:

* **One cap per model, devices shared.** Clipper runs one container per
  model replica, each with its own queue and AIMD state. Here every device
  serves every model: the cap is per model (learnt from its batches on
  every device), and when a device falls idle the model whose queue head
  is due first goes (ties: lower request id), as requests of one shared
  queue would.
* **The latency objective is the model's SLO** (`ModelInfo.slo`); Clipper
  configures it per application. The measurement spans the batch's planned
  start to its reported end (the driver's clock), so it covers the
  execution and what the driver adds around it.
* **Increase on every batch within the objective**, full or not, as §4.3
  states it; the cap is bounded by ``max_batch`` and a batch never waits to
  fill (Clipper's optional "delayed batching" timeout is not modelled).
* **The fractional cap.** ×0.9 of an integer cap is kept as a float and
  floored when a batch is formed (10 → 9 → 8.1 → 9.1 → …); Clipper
  does not say how it rounds.
* **Stopped batches teach nothing.** A batch stopped without finishing (an
  executor's error, reported as stopped) leaves the cap unchanged: its
  time is not a batch latency.
* Clipper's other layers — model selection and ensembles, the prediction
  cache, straggler mitigation across replicas — are not modelled; the
  "default prediction" Clipper returns when an SLO runs out is a drop here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.scheduling.model import ModelInfo
from app.scheduling.queue import ModelQueues
from app.scheduling.replanning import ReplanningScheduler
from app.scheduling.types import Batch, Decision, DeviceInfo, DropReason, Request


class ClipperScheduler(ReplanningScheduler):
    """Clipper baseline: AIMD batch cap per model, work-conserving, deadline-unaware."""

    name = "clipper"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        initial_batch: float = 1.0,
        aimd_increase: float = 1.0,
        aimd_backoff: float = 0.9,
        **options: float,
    ) -> None:
        super().__init__(models, devices, **options)
        if not (initial_batch >= 1.0 and math.isfinite(initial_batch)):
            raise ValueError(f"initial_batch must be a finite number ≥ 1, got {initial_batch}")
        if not (aimd_increase > 0.0 and math.isfinite(aimd_increase)):
            raise ValueError(f"aimd_increase must be a finite number > 0, got {aimd_increase}")
        if not 0.0 < aimd_backoff < 1.0:
            raise ValueError(f"aimd_backoff must be in (0, 1), got {aimd_backoff}")
        self.initial_batch = initial_batch
        self.aimd_increase = aimd_increase
        self.aimd_backoff = aimd_backoff
        self.queues = ModelQueues(list(self.models))
        # The AIMD cap per model, in items (rule 1).
        self.cap: dict[str, float] = {
            name: min(initial_batch, float(m.max_batch)) for name, m in self.models.items()
        }
        # Set while the base handles a stopped batch: its time is no measurement.
        self._stopped: int | None = None

    def queued(self) -> int:
        return self.queues.total()

    def batch_cap(self, name: str) -> int:
        """The most items a batch of model `name` takes now: ⌊cap⌋."""
        return int(self.cap[name])

    def batch_stopped(self, device: int, batch_id: int, now: float) -> list[Decision]:
        self._stopped = batch_id
        try:
            return super().batch_stopped(device, batch_id, now)
        finally:
            self._stopped = None

    # ------------------------------------------------------------------ hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        self.queues[model.name].add(request)
        self._schedule(now)

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        if batch.id != self._stopped and batch.model in self.models:
            self._adapt(self.models[batch.model], now - batch.start_at)
        self._schedule(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        self.queues.add_all(requests)
        self._schedule(now)

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        self.queues.add_model(model.name)
        self.cap[model.name] = min(self.initial_batch, float(model.max_batch))

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        self.timers.cancel(("drop", name))
        del self.cap[name]
        return self.queues.remove_model(name)

    # ---------------------------------------------------------------- policy

    def _adapt(self, model: ModelInfo, latency: float) -> None:
        """Rule 1: additive increase within the objective, multiplicative
        decrease past it."""
        cap = self.cap[model.name]
        if latency <= model.slo:
            cap = min(cap + self.aimd_increase, float(model.max_batch))
        else:
            cap = max(cap * self.aimd_backoff, 1.0)
        self.cap[model.name] = cap

    def _schedule(self, now: float) -> None:
        queues = self.queues
        for queue in queues.values():
            if queue and queue.head_deadline() <= now:
                # Rule 4: due ≤ now, i.e. due < the next float after now.
                self._drop(queue.pop_expired(math.nextafter(now, math.inf)), DropReason.DEADLINE)

        idle = self.idle_devices()
        while idle:
            waiting = [(q.head_deadline(), q.head().id, name) for name, q in queues.items() if q]
            if not waiting:
                break
            name = min(waiting)[2]
            queue = queues[name]
            count = max(1, queue.prefix(self.batch_cap(name)))
            requests = queue.pop_front(count)
            items = sum(r.items for r in requests)
            self._dispatch(self.models[name], requests, idle.pop(0), now + self.delay(items))

        for name, queue in queues.items():
            key = ("drop", name)
            if queue:
                self.timers.reset(key, queue.head_deadline())
            else:
                self.timers.cancel(key)
