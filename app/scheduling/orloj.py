"""Orloj: batch-aware, distribution-based scheduling of dynamic DNNs
(orloj.txt §3–4, Algorithm 1).

A dynamic model's requests run for different times, and a batch runs as
long as its longest request: ℓ_B = c0 + k·max_r x_r (eq. 3–4). Orloj plans
with the distributions of those times, per application, instead of one
ℓ(b) (app/scheduling/alone_times.py), and ranks requests by the expected
deadline cost that running them now saves, per unit of expected worker time
(eq. 1–2, app/scheduling/orloj_scores.py).

Rules (all times in seconds, `now` from the driver; `due` = the request's
deadline less the core's margin):

1. **Queues per batch size.** The supported sizes are 1..max_batch (items).
   A request is in Q_bs while ``t + delay(bs) + E[L_bs] ≤ due``, E[L_bs] on
   the fastest device. With `batch_estimate="application"` (the default)
   E[L_bs] is the request's own: a batch of bs requests of its application,
   c0 + bs·E[max of bs draws of F_app] (Algorithm 1 line 20's
   EstimateBatchLatency(r, bs)); an application without samples, and every
   request with `batch_estimate="model"` or a model of one application, use
   the mixture of all the model's applications (§4.3). When no size is left
   the request is dropped
   (``DropReason.DEADLINE``); a timer per model fires at the first instant
   that happens to one of its requests (`timers.first_instant_after`), so
   drops are answered promptly while every device is busy.
2. **Batch size** (Algorithm 1 lines 29–35): among the queues holding at
   least bs items, the one whose earliest deadline is the earliest; ties go
   to the larger bs.
3. **The batch** (line 39): the top requests of Q_bs by score (eq. 2),
   removed from every queue. Requests with several items fill it in score
   order, whole (never split), never above bs items. Per application, each
   request is scored with the L_bs histogram of its own kind (eq. 1's E[L]
   is the worker time of the batch it would be in), and a request joins
   only while the batch so far, with it, is expected (eq. 8's product form)
   to finish by every member's due time — rule 1 admitted it for a batch
   of its kind, and a longer request could make the batch too long for it.
4. **Work-conserving**, as Clockwork, which the paper builds on: whenever a
   device is idle and some model has a batch, it is dispatched at
   ``now + delay(k)``; across models, the earliest such deadline first.
   The batch's `finish_at` is its expected latency for the requests it
   holds: c0 + k·E[max_r x_r] with the CDF of the maximum Π_r F_app(r) (the
   product form of eq. 8).
5. **Measurements**: `record_alone_time` feeds the histograms; E[L_bs] and
   the L_bs histograms are recomputed lazily when they changed.

Deviations, each for a reason:

* With per-application estimates the queues are no suffix of one list:
  each is found by a scan of the model's pending requests (tens, not
  thousands, at the loads Orloj is run at), as with several-item requests.
* The queues are not kept one by one. E[L_bs] grows with bs, so Q_bs — the
  requests with ``due ≥ t + cost(bs)`` — is a suffix of one deadline-sorted
  list per model; a bisection finds each queue, and removing a request
  from the list removes it from every queue. Scores are not kept in a
  dynamic convex hull (§4.4): they are evaluated, vectorised, for the one
  queue a batch is taken from, at the time it is taken. Requests whose slack
  exceeds the L_bs histogram's last edge score in deadline order
  (p ∝ e^{−b·D}), so of those only the first bs are evaluated. α and β are
  computed afresh at each selection, so milestones need no bookkeeping;
  the time base still moves (`orloj_scores.needs_rebase`) before
  e^{b(t − base)} grows large.
* Requests with several items: a request of n items is only in the queues
  of bs ≥ n; |Q_bs| counts items; E[L_bs] takes bs draws (one per item, an
  upper bound for fewer, larger requests). While every pending request of
  a model has one item the queues are suffixes; otherwise each queue is
  counted by a scan.
* The score's t is the batch's start, ``now + delay(bs)``, and the
  histograms are scaled to the fastest device; a batch goes to the idle
  device (idle the longest first) on which ``start + E[L_bs]`` still meets
  its earliest due time, and waits for a faster one if there is none.
* Static models (no `ModelInfo.dynamic`) plan with their profile: E[L_k] =
  ℓ(k), a point (for a linear profile the alone-time distribution is the
  point ℓ(1) with c0 = β, and c0 + k·(ℓ(1) − c0) = ℓ(k)); measured
  alone-times of a static model are ignored. A dynamic model without any
  samples yet (no prior, nothing measured) plans with its profile until
  its first samples are in use.
* The requests of a failed batch go back to the queues when some batch
  size still holds them (`can_finish_alone` asks the distributions, not
  the profile), else they get their batch's drop reason.
* Window resets keep the previous window in use until the new one has
  `min_samples` samples (see alone_times.py): a reset never leaves the
  policy blind.

Options: `window_s` (histogram window, s), `min_samples` (samples before a
window's histogram is used), `delay_rate` (b, per second: the paper's 1e-4
per ms), `bins` (histogram bins), `max_samples` (samples kept per
application and window), `batch_estimate` ("application" or "model", rules
1 and 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sortedcontainers import SortedList

from app.scheduling.alone_times import (
    DEFAULT_BINS,
    DEFAULT_MAX_SAMPLES,
    AloneTimes,
    BatchLatency,
    StaticLatency,
)
from app.scheduling.model import ModelInfo
from app.scheduling.orloj_scores import DEFAULT_DELAY_RATE, ScoreTable, needs_rebase
from app.scheduling.replanning import ReplanningScheduler
from app.scheduling.timers import first_instant_after
from app.scheduling.types import DeviceInfo, DropReason, Request

_INF = math.inf
BATCH_ESTIMATES = ("application", "model")


Entry = tuple[float, int, Request]  # (due, id, request): a pending list's item


@dataclass
class ModelState:
    """One model's pending requests and what its plan is computed from."""

    model: ModelInfo
    static: StaticLatency
    dynamic: AloneTimes | None
    # (due, id, request), earliest due first: Q_bs is a suffix of it.
    pending: SortedList = field(default_factory=SortedList)
    multi_item: int = 0  # pending requests with more than one item
    # cost[bs] = delay(bs) + E[L_bs] on the fastest device; min_cost[n] =
    # min over bs ≥ n (index 0 unused). Rebuilt when `key` changes.
    cost: list[float] = field(default_factory=list)
    min_cost: list[float] = field(default_factory=list)
    scores: dict[tuple[str | None, int], ScoreTable] = field(default_factory=dict)
    key: tuple[int, int] | None = None
    # Per-application estimates (rule 1, `batch_estimate="application"`):
    # app → E[L_bs] of a batch of its own kind (raw, device speed 1), its
    # cost and min_cost as above. Empty: every request uses the model's.
    app_expected: dict[str, tuple[float, ...]] = field(default_factory=dict)
    app_cost: dict[str, list[float]] = field(default_factory=dict)
    app_min_cost: dict[str, list[float]] = field(default_factory=dict)
    # The pending entries again, per application (due order): with an
    # estimate per application each one's Q_bs is a suffix of its list.
    by_app: dict[str, SortedList] = field(default_factory=dict)
    # E[L] of formed batches by composition ((app, count) pairs, items):
    # the distributions change rarely, the compositions repeat.
    batch_cache: dict[tuple[tuple[tuple[str, int], ...], int], float] = field(default_factory=dict)

    def expected_batch(self, apps: Sequence[str], items: int) -> float:
        """`latency.expected_batch`, memoised until the distributions change."""
        counts: dict[str, int] = {}
        for app in apps:
            counts[app] = counts.get(app, 0) + 1
        key = (tuple(sorted(counts.items())), items)
        value = self.batch_cache.get(key)
        if value is None:
            value = self.batch_cache[key] = self.latency.expected_batch(apps, items)
        return value

    def cost_of(self, request: Request) -> list[float]:
        return self.app_cost.get(request.app, self.cost)

    def min_cost_of(self, request: Request) -> list[float]:
        return self.app_min_cost.get(request.app, self.min_cost)

    @property
    def latency(self) -> BatchLatency:
        """The dynamic distributions once they have samples, else the profile."""
        if self.dynamic is not None and self.dynamic.has_samples():
            return self.dynamic
        return self.static


class OrlojScheduler(ReplanningScheduler):
    """Orloj: distribution-aware batching and priorities for dynamic models."""

    name = "orloj"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        window_s: float = 60.0,
        min_samples: int = 32,
        delay_rate: float = DEFAULT_DELAY_RATE,
        bins: int = DEFAULT_BINS,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        batch_estimate: str = "application",
        **options: float,
    ) -> None:
        if batch_estimate not in BATCH_ESTIMATES:
            raise ValueError(
                f"batch_estimate must be one of {list(BATCH_ESTIMATES)}, got {batch_estimate!r}"
            )
        self.batch_estimate = batch_estimate
        if not (isinstance(window_s, int | float) and window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"window_s must be a finite number > 0 (seconds), got {window_s!r}")
        if not (
            isinstance(delay_rate, int | float) and delay_rate > 0 and math.isfinite(delay_rate)
        ):
            raise ValueError(
                f"delay_rate must be a finite number > 0 (per second), got {delay_rate!r}"
            )
        self.min_samples = _count("min_samples", min_samples, 1)
        self.bins = _count("bins", bins, 1)
        self.max_samples = _count("max_samples", max_samples, self.min_samples)
        self.window_s = float(window_s)
        self.delay_rate = float(delay_rate)
        super().__init__(models, devices, **options)
        self._speed = max(d.speed for d in self.devices.values())
        self._base = 0.0  # time base of the scores' e^{b(t − base)}
        self.states: dict[str, ModelState] = {}
        for model in self.models.values():
            self._add_state(model)

    def alone_time_quantiles(self, qs: Sequence[float]) -> dict[tuple[str, str], tuple[float, ...]]:
        """(model, application) → its alone-times at the quantiles `qs`,
        from the samples each model's histograms are built from now: what
        the daemon exports per application (a metric family)."""
        out: dict[tuple[str, str], tuple[float, ...]] = {}
        for name, state in self.states.items():
            if state.dynamic is None:
                continue
            for app in state.dynamic.apps():
                out[(name, app)] = state.dynamic.quantiles(app, qs)
        return out

    def queued(self) -> int:
        return sum(len(s.pending) for s in self.states.values())

    def queue(self, model: str, bs: int, now: float) -> list[Request]:
        """Q_bs of `model` at `now`, earliest due first: its pending requests
        of at most bs items with ``now + delay(bs) + E[L_bs] ≤ due`` (for
        inspection; the policy never builds the queues)."""
        queue = self._queue_of(model, bs, now)
        if isinstance(queue, list):
            return [e[2] for e in queue]
        return [e[2] for e in self.states[model].pending.islice(queue) if e[2].items <= bs]

    def select(self, model: str, bs: int, now: float) -> list[Request]:
        """The top requests of Q_bs by score at `now` (at most bs items,
        best first), left in the queue: what a batch of size bs would take."""
        queue = self._queue_of(model, bs, now)
        return [e[2] for e in self._select(self.states[model], bs, queue, now)]

    def next_batch(self, model: str, now: float) -> list[Request]:
        """The batch Algorithm 1 forms for `model` at `now` (batch size, then
        the top requests by score), left in the queue; [] when none."""
        state = self.states[model]
        self._refresh(state)
        found = self._batch_size(state, now) if state.pending else None
        if found is None:
            return []
        _, bs, start = found
        return [e[2] for e in self._select(state, bs, start, now)]

    def can_finish_alone(self, request: Request, now: float, device: int | None = None) -> bool:
        """Whether some batch size still holds `request` (rule 1): what a
        stopped or failed batch's requests are judged by, so that they are
        dropped with the reason of their batch, not requeued to be dropped."""
        state = self.states.get(request.model)
        if state is None or device is not None:
            return super().can_finish_alone(request, now, device)
        self._refresh(state)
        return now + state.min_cost_of(request)[request.items] <= request.due

    def _queue_of(self, model: str, bs: int, now: float) -> int | list[Entry]:
        """Q_bs: where it starts in the pending list when it is a suffix
        (one estimate for every request), else its entries."""
        state = self.states[model]
        if not 1 <= bs < len(state.cost):
            raise ValueError(f"model {model!r} has batch sizes 1..{len(state.cost) - 1}, not {bs}")
        self._refresh(state)
        if state.app_cost:
            return _members(state, bs, now) if state.multi_item else _members_by_app(state, bs, now)
        return state.pending.bisect_left((now + state.cost[bs],))

    def expected_latency(self, model: str, bs: int) -> float:
        """E[L_bs] of `model` on the fastest device (seconds)."""
        state = self.states[model]
        self._refresh(state)
        return state.latency.expected(bs) / self._speed

    # ------------------------------------------------------------------ hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        self._enqueue(self.states[model.name], request)
        self._schedule(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        for request in requests:
            self._enqueue(self.states[request.model], request)
        self._schedule(now)

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        self._add_state(model)

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        self.timers.cancel(("drop", name))
        state = self.states.pop(name)
        return [entry[2] for entry in state.pending]

    def _on_alone_time(self, model: ModelInfo, app: str, seconds: float, now: float) -> None:
        state = self.states[model.name]
        if state.dynamic is None:
            return  # a static model plans with its profile
        state.dynamic.record(app, seconds, now)
        self._schedule(now)

    # ----------------------------------------------------------------- policy

    def _schedule(self, now: float) -> None:
        if needs_rebase(now, self._base, self.delay_rate):
            self._base = now
        for state in self.states.values():
            self._refresh(state)
            self._drop_hopeless(state, now)

        idle = self.idle_devices()
        passed: set[str] = set()  # models whose batch fits no idle device
        while idle:
            best: tuple[float, str, int, int] | None = None
            for name, state in self.states.items():
                if name in passed or not state.pending:
                    continue
                found = self._batch_size(state, now)
                if found is not None and (best is None or found[0] < best[0]):
                    best = (found[0], name, found[1], found[2])
            if best is None:
                break
            deadline, name, bs, queue = best
            state = self.states[name]
            device = self._device_for(state, bs, queue, deadline, idle, now)
            if device is None:
                passed.add(name)
                continue
            requests = self._take_batch(state, bs, queue, now)
            self._dispatch_batch(state, requests, device, now)
            idle.remove(device)

        for name, state in self.states.items():
            self._set_drop_timer(name, state)

    def _batch_size(
        self, state: ModelState, now: float
    ) -> tuple[float, int, int | list[Entry]] | None:
        """Algorithm 1 lines 29–35: (the earliest deadline of Q_bs, bs, Q_bs
        — the index it starts at in the pending list, or its entries when
        it is no suffix), or None when no queue holds bs items."""
        pending, cost = state.pending, state.cost
        n = len(pending)
        if state.app_cost and state.multi_item:
            found: tuple[float, int, int | list[Entry]] | None = None
            for bs in range(1, len(cost)):
                members = _members(state, bs, now)
                enough = members and sum(e[2].items for e in members) >= bs
                if enough and (found is None or members[0][0] <= found[0]):
                    found = (members[0][0], bs, members)
            return found
        if state.app_cost:
            # Each application's Q_bs is a suffix of its own list: count and
            # head by bisection, the entries only for the size chosen.
            chosen: tuple[float, int] | None = None
            for bs in range(1, len(cost)):
                count, head = 0, _INF
                for app, entries in state.by_app.items():
                    start = entries.bisect_left((now + state.app_cost.get(app, cost)[bs],))
                    if start < len(entries):
                        count += len(entries) - start
                        head = min(head, entries[start][0])
                if count >= bs and (chosen is None or head <= chosen[0]):
                    chosen = (head, bs)
            if chosen is None:
                return None
            return chosen[0], chosen[1], _members_by_app(state, chosen[1], now)
        best: tuple[float, int, int] | None = None
        if not state.multi_item:
            # Nested suffixes: D_Q grows and |Q_bs| shrinks with bs, so the
            # first eligible bs has the earliest deadline and the larger bs
            # with the same deadline follow it directly.
            for bs in range(1, len(cost)):
                start = pending.bisect_left((now + cost[bs],))
                if n - start < bs:
                    break  # and so is every larger bs
                deadline = pending[start][0]
                if best is not None and deadline != best[0]:
                    break
                best = (deadline, bs, start)
            return best
        for bs in range(1, len(cost)):
            start = pending.bisect_left((now + cost[bs],))
            members = [e for e in pending.islice(start) if e[2].items <= bs]
            if sum(e[2].items for e in members) >= bs:
                deadline = members[0][0]
                if best is None or deadline <= best[0]:
                    best = (deadline, bs, start)
        return best

    def _take_batch(
        self, state: ModelState, bs: int, queue: int | list[Entry], now: float
    ) -> list[Request]:
        """The top requests of Q_bs by score, at most bs items, removed."""
        chosen = self._select(state, bs, queue, now)
        for entry in chosen:
            _forget(state, entry)
        return [entry[2] for entry in chosen]

    def _select(
        self, state: ModelState, bs: int, queue: int | list[Entry], now: float
    ) -> list[tuple[float, int, Request]]:
        """The top entries of Q_bs (from index `queue` in the pending list,
        or the entries `queue`) by score, at most bs items, best first."""
        pending = state.pending
        t = now + self.delay(bs)
        if isinstance(queue, list) and state.app_cost:
            return self._select_by_application(state, bs, queue, t)
        table = self._score_table(state, bs)
        if isinstance(queue, list):
            entries = queue
        elif state.multi_item:
            start = queue
            entries = [e for e in pending.islice(start) if e[2].items <= bs]
        else:
            # Beyond the last edge scores keep the deadline order: only the
            # first bs there can make the batch.
            start = queue
            cut = pending.bisect_left((t + table.last_edge, _INF))
            entries = list(pending.islice(start, max(cut, start) + bs))
        due = np.fromiter((e[0] for e in entries), float, len(entries))
        alpha, beta = table.alpha_beta(due, t, self._base)
        scores = alpha * math.exp(self.delay_rate * (t - self._base)) + beta
        order = np.argsort(-scores, kind="stable")  # ties: the earlier deadline
        chosen: list[tuple[float, int, Request]] = []
        items = 0
        for i in order:
            entry = entries[int(i)]
            if items + entry[2].items <= bs:
                chosen.append(entry)
                items += entry[2].items
                if items == bs:
                    break
        return chosen

    def _select_by_application(
        self, state: ModelState, bs: int, entries: list[Entry], t: float
    ) -> list[Entry]:
        """Rule 3 with an estimate per application: each request scored with
        the L_bs of a batch of its own kind (eq. 1's E[L] is the worker time
        of the batch it is in), best first; a request joins only while the
        batch formed so far, with it, is still expected (eq. 8's product
        form) to finish by every member's due time."""
        scores = np.empty(len(entries))
        by_app: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            by_app.setdefault(entry[2].app, []).append(i)
        for app, index in by_app.items():
            table = self._score_table(state, bs, app if app in state.app_cost else None)
            due = np.fromiter((entries[i][0] for i in index), float, len(index))
            alpha, beta = table.alpha_beta(due, t, self._base)
            scores[index] = alpha * math.exp(self.delay_rate * (t - self._base)) + beta
        order = np.argsort(-scores, kind="stable")  # ties: the earlier deadline
        chosen: list[Entry] = []
        apps: list[str] = []
        items = 0
        first_due = _INF
        for i in order:
            entry = entries[int(i)]
            if items + entry[2].items > bs:
                continue
            due = min(first_due, entry[0])
            if chosen:
                runs = state.expected_batch([*apps, entry[2].app], items + entry[2].items)
                if t + runs / self._speed > due:
                    continue
            chosen.append(entry)
            apps.append(entry[2].app)
            items += entry[2].items
            first_due = due
            if items == bs:
                break
        return chosen

    def _device_for(
        self,
        state: ModelState,
        bs: int,
        queue: int | list[Entry],
        deadline: float,
        idle: list[int],
        now: float,
    ) -> int | None:
        if isinstance(queue, list) and state.app_expected:
            # What the request due first expects of a batch of its own kind.
            head = queue[0][2]
            expected = state.app_expected.get(head.app, state.latency.tables().expected)[bs]
        else:
            expected = state.latency.expected(bs)
        start = now + self.delay(bs)
        for device in idle:
            if start + expected / self.devices[device].speed <= deadline:
                return device
        return None

    def _dispatch_batch(
        self, state: ModelState, requests: list[Request], device: int, now: float
    ) -> None:
        items = sum(r.items for r in requests)
        start = now + self.delay(items)
        batch = self._dispatch(state.model, requests, device, start)
        latency = state.latency
        if latency is not state.static:
            runs = state.expected_batch([r.app for r in requests], items)
            batch.finish_at = start + runs / self.devices[device].speed

    def _drop_hopeless(self, state: ModelState, now: float) -> None:
        pending, min_cost = state.pending, state.min_cost
        hopeless: list[tuple[float, int, Request]] = []
        if state.app_cost and not state.multi_item:
            for app, entries in state.by_app.items():
                threshold = now + state.app_min_cost.get(app, min_cost)[1]
                while entries and threshold > entries[0][0]:
                    hopeless.append(entries[0])
                    pending.remove(entries.pop(0))
            hopeless.sort()
        elif state.app_cost:
            hopeless = [e for e in pending if now + state.min_cost_of(e[2])[e[2].items] > e[0]]
            for entry in hopeless:
                _forget(state, entry)
        elif not state.multi_item:
            threshold = now + min_cost[1]
            while pending and threshold > pending[0][0]:
                entry = pending.pop(0)
                state.by_app[entry[2].app].remove(entry)
                hopeless.append(entry)
        else:
            # Only requests due before now + the largest cost can be hopeless.
            limit = now + min_cost[-1]
            for entry in pending.irange(maximum=(limit, _INF)):
                if now + min_cost[entry[2].items] > entry[0]:
                    hopeless.append(entry)
            for entry in hopeless:
                _forget(state, entry)
        if hopeless:
            self._drop([e[2] for e in hopeless], DropReason.DEADLINE)

    def _set_drop_timer(self, name: str, state: ModelState) -> None:
        key = ("drop", name)
        pending, min_cost = state.pending, state.min_cost
        if not pending:
            self.timers.cancel(key)
            return
        if state.app_cost and not state.multi_item:
            at = min(
                first_instant_after(entries[0][0], state.app_min_cost.get(app, min_cost)[1])
                for app, entries in state.by_app.items()
                if entries
            )
            self.timers.reset(key, at)
            return
        if state.app_cost:
            at = min(
                first_instant_after(due, state.min_cost_of(request)[request.items])
                for due, _, request in pending
            )
            self.timers.reset(key, at)
            return
        at = first_instant_after(pending[0][0], min_cost[pending[0][2].items])
        if state.multi_item:
            # A later request with more items may run out of sizes first.
            horizon = pending[0][0] + min_cost[-1] - min_cost[1]
            for due, _, request in pending.irange(maximum=(horizon, _INF)):
                at = min(at, first_instant_after(due, min_cost[request.items]))
        self.timers.reset(key, at)

    # -------------------------------------------------------------- helpers

    def _add_state(self, model: ModelInfo) -> None:
        dynamic = None
        if model.dynamic is not None:
            dynamic = AloneTimes(
                model.dynamic.c0,
                model.max_batch,
                window_s=self.window_s,
                min_samples=self.min_samples,
                prior=model.dynamic.prior,
                bins=self.bins,
                max_samples=self.max_samples,
            )
        state = ModelState(model, StaticLatency(model.profile, model.max_batch), dynamic)
        self.states[model.name] = state
        self._refresh(state)

    def _enqueue(self, state: ModelState, request: Request) -> None:
        entry = (request.due, request.id, request)
        state.pending.add(entry)
        state.by_app.setdefault(request.app, SortedList()).add(entry)
        if request.items > 1:
            state.multi_item += 1

    def _refresh(self, state: ModelState) -> None:
        """Recompute the per-size costs when the distributions changed."""
        latency = state.latency
        key = (id(latency), latency.version)
        if key == state.key:
            return
        state.key = key
        max_batch = state.model.max_batch
        cost = [0.0] + [
            self.delay(bs) + latency.expected(bs) / self._speed for bs in range(1, max_batch + 1)
        ]
        min_cost = list(cost)
        for bs in range(max_batch - 1, 0, -1):
            min_cost[bs] = min(min_cost[bs], min_cost[bs + 1])
        state.cost, state.min_cost = cost, min_cost
        state.scores = {}
        state.batch_cache = {}
        state.app_expected, state.app_cost, state.app_min_cost = {}, {}, {}
        if (
            self.batch_estimate == "application"
            and isinstance(latency, AloneTimes)
            and len(latency.apps()) > 1
        ):
            for app in latency.apps():
                expected = latency.expected_alike(app)
                app_cost = [0.0] + [
                    self.delay(bs) + expected[bs] / self._speed for bs in range(1, max_batch + 1)
                ]
                app_min = list(app_cost)
                for bs in range(max_batch - 1, 0, -1):
                    app_min[bs] = min(app_min[bs], app_min[bs + 1])
                state.app_expected[app] = expected
                state.app_cost[app] = app_cost
                state.app_min_cost[app] = app_min

    def _score_table(self, state: ModelState, bs: int, app: str | None = None) -> ScoreTable:
        """Eq. 2's table for L_bs: of the model's mixture (app None), or of a
        batch of `app`'s own kind."""
        table = state.scores.get((app, bs))
        if table is None:
            latency = state.latency
            if app is None or not isinstance(latency, AloneTimes):
                edges, masses = latency.histogram(bs)
                expected = latency.expected(bs)
            else:
                edges, masses = latency.histogram_alike(app, bs)
                expected = state.app_expected[app][bs]
            expected = max(expected, 1e-12) / self._speed
            table = ScoreTable(edges / self._speed, masses, expected, self.delay_rate)
            state.scores[(app, bs)] = table
        return table


def _forget(state: ModelState, entry: Entry) -> None:
    """Remove a pending entry from both lists."""
    state.pending.remove(entry)
    state.by_app[entry[2].app].remove(entry)
    if entry[2].items > 1:
        state.multi_item -= 1


def _members_by_app(state: ModelState, bs: int, now: float) -> list[Entry]:
    """`_members` from the per-application lists (requests of one item):
    each application's suffix, merged in due order."""
    entries: list[Entry] = []
    for app, pending in state.by_app.items():
        start = pending.bisect_left((now + state.app_cost.get(app, state.cost)[bs],))
        entries.extend(pending.islice(start))
    entries.sort()
    return entries


def _members(state: ModelState, bs: int, now: float) -> list[Entry]:
    """Q_bs with an estimate per request: its pending requests of at most bs
    items with ``now + cost_of(r)[bs] ≤ due``, earliest due first."""
    return [e for e in state.pending if e[2].items <= bs and now + state.cost_of(e[2])[bs] <= e[0]]


def _count(option: str, value: object, least: int) -> int:
    """An integer option (a JSON number like 32.0 is taken as 32)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"{option} must be an integer ≥ {least}, got {value!r}")
    if value < least:
        raise ValueError(f"{option} must be an integer ≥ {least}, got {value!r}")
    return int(value)
