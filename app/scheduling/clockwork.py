"""Clockwork as a baseline: greedy, work-conserving, earliest deadline first.

This is Clockwork's scheduling *behaviour* as the papers we compare against
describe and measure it, re-implemented on this project's sans-IO core:

* symphony.txt §5.2.2 — "Clockwork's algorithm picks an execution candidate
  merely based on the deadline, not taking batch size into account";
* symphony.txt §5.3 — "picks the next batch merely based on the top result
  ordered by a candidate's earliest execution time and often dispatches small
  batches that are close to their deadlines"; its scheduler is
  work-conserving (§1 and §4.4: "Clockwork's work-conserving scheduler
  exhibits low GPU idle times even when the offered load is much lower");
* shepherd-nsdi23.txt §7.1–7.2 — Clockwork "prioritizes requests based on
  how close their deadline is" and "greedily schedules many small batches of
  requests with tight deadlines"; it never preempts.

Rules (all times in seconds, `now` from the driver):

1. **Drop the hopeless.** A queued request that cannot finish even alone —
   ``now + delay(1) + ℓ(1) > deadline`` with ℓ on the fastest device — is
   dropped with ``DropReason.DEADLINE``; it is never dispatched late.
2. **Work-conserving.** Whenever a device is idle (no batch of ours in
   flight on it) and some queue is non-empty, a batch is dispatched at once.
3. **EDF across models.** The model whose queue head has the earliest
   deadline goes first (ties: lower request id).
4. **Batch = head + followers while the head's deadline holds.** From the
   deadline-ordered queue take the largest prefix k ≤ ``max_batch`` with
   ``start + ℓ(k) ≤ head.deadline`` where ``start = now + delay(k)``. Every
   follower has a deadline ≥ the head's, so the whole batch is on time.
   Batch size is not otherwise optimised (no waiting for a fuller batch).
5. **Device.** The idle device that has been free the longest (earliest
   ``free_at``, ties by id) among those on which the head can still finish;
   ``start_at = now + delay(k)`` as in Symphony App. C's ``exec_at``.
6. **Drop timers.** Per model, a timer fires at the first instant the queue
   head can no longer finish alone — the first float ``t`` with
   ``t + delay(1) + ℓ(1) > deadline`` (`Scheduler.hopeless_at`) — so drops
   are answered promptly even while every device is busy. A batch finishing
   exactly at its deadline is within SLO. Like every event, the timer runs
   the whole pass again (app/scheduling/replanning.py): with heterogeneous
   devices, dropping a head may let the next one fit an idle slower device.

Simplified or left out, on purpose:

* Clockwork's own controller (Gujarati et al., OSDI '20; not in papers/)
  plans *actions* a few ms ahead — INFER and LOAD actions, each with an
  [earliest, latest] window that workers enforce and cancel if missed.
  Here decisions are made only when a device is idle, and the worker side
  never cancels: the core's latency prediction is trusted.
* Model loading/unloading (Clockwork's LOAD/UNLOAD and its cache of models
  in GPU memory) is not modelled: every device holds every model, as in
  Shepherd's evaluation setup (§7, models stay resident).
* Clockwork supports only power-of-two batch sizes (TVM); Symphony's
  evaluation added arbitrary sizes (§5, setup), and so do we.
* Requests with several items (`Request.items`): rule 1 takes a request's
  own items (delay(n) + ℓ(n)); rule 4 sizes the batch in items (at most
  ``max_batch`` items) and fills it in deadline order with the requests
  that fit whole, skipping (never splitting) one that does not fit the
  items left; the head always fits, or the device is passed over.
* Heterogeneous devices: rule 1 uses the fastest device; a head that fits
  only on a faster, busy device waits for it (another model may use the
  idle slower one meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.scheduling.model import ModelInfo
from app.scheduling.queue import ModelQueues
from app.scheduling.replanning import ReplanningScheduler
from app.scheduling.types import DeviceInfo, DropReason, Request


class ClockworkScheduler(ReplanningScheduler):
    """Clockwork baseline: greedy work-conserving EDF, batch size not optimised."""

    name = "clockwork"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        **options: float,
    ) -> None:
        super().__init__(models, devices, **options)
        self.queues = ModelQueues(list(self.models))

    def queued(self) -> int:
        return self.queues.total()

    # ------------------------------------------------------------------ hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        self.queues[model.name].add(request)
        self._schedule(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        self.queues.add_all(requests)
        self._schedule(now)

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        self.queues.add_model(model.name)

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        self.timers.cancel(("drop", name))
        return self.queues.remove_model(name)

    # ---------------------------------------------------------------- policy

    def _schedule(self, now: float) -> None:
        for name in self.models:
            self._drop_hopeless(name, now)

        idle = self.idle_devices()
        while idle:
            dispatched = False
            for name in self._edf_order():
                model = self.models[name]
                queue = self.queues[name]
                deadline = queue.deadline_at(0)
                for device in idle:
                    head = queue.head().items
                    k = self._batch_size(model, head, queue.items, deadline, device, now)
                    if k == 0:
                        continue  # only a faster device can still serve the head
                    requests = queue.pop_positions(queue.select(k))
                    items = sum(r.items for r in requests)
                    self._dispatch(model, requests, device, now + self.delay(items))
                    idle.remove(device)
                    dispatched = True
                    break
                if dispatched:
                    break
            if not dispatched:
                break

        for name in self.models:
            self._set_drop_timer(name)

    def _edf_order(self) -> list[str]:
        """Models with queued requests, earliest head deadline first."""
        heads = [
            (queue.deadline_at(0), queue.head().id, name)
            for name, queue in self.queues.items()
            if queue
        ]
        heads.sort()
        return [name for _, _, name in heads]

    def _batch_size(
        self, model: ModelInfo, head: int, queued: int, deadline: float, device: int, now: float
    ) -> int:
        """Largest k ≤ min(queued, max_batch) items with now + delay(k) + ℓ(k)
        ≤ deadline; 0 when not even the head's `head` items fit.

        Both delay and ℓ are non-decreasing in k, so feasibility is monotone
        and a bisection finds the boundary.
        """
        if now + self.delay(head) + self.latency(model, head, device) > deadline:
            return 0
        lo, hi = head, min(queued, model.max_batch)  # invariant: lo feasible
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if now + self.delay(mid) + self.latency(model, mid, device) <= deadline:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _drop_hopeless(self, name: str, now: float) -> None:
        # deadline < now + cost  ⇔  now + cost > deadline (rule 1).
        hopeless = self.pop_hopeless(self.queues[name], self.models[name], now)
        if hopeless:
            self._drop(hopeless, DropReason.DEADLINE)

    def _set_drop_timer(self, name: str) -> None:
        key = ("drop", name)
        queue = self.queues[name]
        at = self.queue_hopeless_at(queue, self.models[name])
        if at is None or at == float("inf"):
            self.timers.cancel(key)
            return
        self.timers.reset(key, at)
