"""Symphony: centralised, non-work-conserving batching (symphony.txt §4.3, App. C).

Per model the core keeps one *candidate*: the batch it would run next, with

* ``exec_at`` — when it should start,
* ``invalid_after = dl − ℓ(bs)`` — the last start that still meets the head
  request's deadline ``dl``,
* ``frontrun_at = dl − ℓ(bs+1)`` — the last moment one more request could
  join and still finish (§4.3: "the latest time at which we can update the
  candidate").

A candidate is *schedulable* once it holds ``βλ`` requests (λ: the model's
measured arrival rate; waiting longer no longer pays, §4.3's cost analysis),
once it is full, or at ``frontrun_at``; before that it is not dispatched even
to an idle device. The work-conserving variant (``symphony-wc``) makes every
candidate schedulable as soon as it is formed.

The rank logic follows Appendix C's RankThread: a model timer fires at
``exec_at − delay(bs)``; if the earliest-free device is free by ``exec_at`` it
is granted at once, otherwise the candidate waits in ``mc``. A device timer
fires when the earliest-free device frees up; candidates whose
``invalid_after`` is before that are removed, and the device goes to the
waiting candidate with the earliest ``exec_at``.

Pruning (the "which tasks are dropped" question of §4.3). Read literally —
keep the earliest-deadline prefix that can still finish — a batch shrinks to
what its oldest request allows, and under load batches collapse to size one
(``pruning="prefix"``, kept for comparison). ``"window"`` keeps the batch at
its target size ``min(queue length, max feasible batch)`` and drops the
*head* requests that cannot finish in a batch of that size (Nexus's sliding
window): right under overload, wasteful under bursts at low load, where it
drops a head to fill a batch that the next device could have shared. The
default, ``"adaptive"``, shrinks the batch to save the head as long as the
smaller batch still sustains the model's measured rate on its share of the
devices (``_needed_batch``), and drops like the window rule otherwise. On
the bursty mix (bench/workloads/live-c-bursty-mix.yaml) it raises the
capacity from 47 to 290 r/s, on Table 4 from 5,183 to 5,500 r/s (ResNet50)
(BENCHMARKS.md). Drop timers fire at ``invalid_after`` so that requests that
can no longer finish are answered early, not when their deadline has passed.

**Bounded hold** (``hold="bounded"``, the default; ``"frontrun"`` is §4.3's
rule as written). A candidate below βλ waits at most until the model's
measured rate can have brought the items it lacks, counted from the model's
last arrival: ``exec_at = min(frontrun_at, last_arrival + (βλ − bs)/λ)``
(never before ``earliest``). §4.3 holds it until ``frontrun_at = dl −
ℓ(bs+1)``, which with a loose SLO is the deadline itself: the last request
of a burst, with λ still measured high, waited on an idle device until its
deadline — 60 s, 5 s and 1 s with SLOs of 60 s, 5 s and 1 s, while the
others took ~10 ms (goodput counts it good; no user would). While requests
keep arriving at the measured rate the batch reaches βλ within the bound,
as §4.3's cost analysis wants; when they stop, the wait ends within β (the
hold is (βλ − bs)/λ = β − bs/λ < β). Table 4 (ResNet50, InceptionResNetV2)
and the Table 5 zoo keep their capacity (BENCHMARKS.md).

Deviations from the pseudo-code, each for a reason:

* App. C computes ``exec_at`` twice (``bs > βλ ? earliest : frontrun_at`` then
  ``max(earliest, frontrun_at)``), which discards the βλ rule; we apply the
  rule as the text says: ``earliest`` if ``bs ≥ βλ`` (or the batch is full),
  else ``max(earliest, frontrun_at)``.
* After a drop timer fires, the new candidate is re-announced to the rank
  logic (App. C leaves it unannounced until the next arrival).
* Requests with several items (`Request.items`): every size — ``bs``, the
  full size, βλ (λ in items/s: the rate meters count items), the adaptive
  rule's needed batch — counts items. A candidate is the head plus the
  requests behind it that fit whole in its size, in deadline order (one
  that does not fit is skipped, never split); a head larger than the full
  size (only when ``max_batch`` or ``stagger_slack`` set it below the
  model's SLO batch) runs alone. ``frontrun_at`` keeps ``ℓ(bs+1)``: the
  smallest request that could still join has one item. Pruning tests the
  head with its own items, so a head too large for its remaining time is
  dropped, never split.
* A freed device goes to the waiting candidate with the least slack (the
  earliest ``invalid_after``), not the earliest ``exec_at`` (App. C's
  RankThread; ``grant_by="exec_at"``). Candidates that wait for a device are
  all schedulable, so their ``exec_at`` is mostly when they became so; under
  a burst that hands the device to a model with 30 ms of slack while another
  model's heads expire. Least slack first raises the Table 5 zoo's capacity
  from 6,424 to ~7,500 r/s and the bursty mix's from 290 to 322 r/s; a single
  model (Table 4) is unaffected.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.queue import DeadlineQueue, ModelQueues
from app.scheduling.timers import first_instant
from app.scheduling.types import Batch, DeviceInfo, DropReason, Request

_INF = float("inf")
_DEVICE_TIMER = "device"
PRUNING_RULES = ("window", "prefix", "adaptive")
HOLD_RULES = ("bounded", "frontrun")


@dataclass(slots=True)
class Candidate:
    bs: int  # items
    exec_at: float
    invalid_after: float
    deadline: float  # the head's (`dl`)
    # Queue positions of its requests; None: the first `bs` (one item each).
    positions: list[int] | None = None

    # Written out (the dataclass keeps it): compiled (app/build_fast.py), the
    # generated __init__ would stay interpreted, and one is made per arrival.
    def __init__(
        self,
        bs: int,
        exec_at: float,
        invalid_after: float,
        deadline: float,
        positions: list[int] | None = None,
    ) -> None:
        self.bs = bs
        self.exec_at = exec_at
        self.invalid_after = invalid_after
        self.deadline = deadline
        self.positions = positions


class SymphonyScheduler(Scheduler):
    """Symphony's non-work-conserving centralised batching (symphony.txt §4.3)."""

    name = "symphony"
    speed_changes = True  # speeds are read when a batch is planned on a device
    # Set by the work-conserving variant (its own class, for its name).
    always_work_conserving: ClassVar[bool] = False

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        work_conserving: bool = False,
        pruning: str = "adaptive",
        max_batch: int | None = None,
        stagger_slack: float | None = None,
        grant_by: str = "slack",
        hold: str = "bounded",
        **options: float,
    ) -> None:
        # Not super().__init__(..., **options): compiled, that call passes the
        # dict as one argument (mypyc/mypyc#1162).
        Scheduler.__init__(self, models, devices, **options)
        if pruning not in PRUNING_RULES:
            raise ValueError(f"pruning must be one of {PRUNING_RULES}, got {pruning!r}")
        if grant_by not in ("exec_at", "slack"):
            raise ValueError(f"grant_by must be 'exec_at' or 'slack', got {grant_by!r}")
        self.grant_by = grant_by
        if hold not in HOLD_RULES:
            raise ValueError(f"hold must be one of {HOLD_RULES}, got {hold!r}")
        self._bounded_hold = hold == "bounded"
        # Per model, its last arrival: where a bounded hold is counted from.
        self._last_arrival: dict[str, float] = {}
        self.work_conserving = work_conserving or self.always_work_conserving
        self.pruning = pruning
        self._window = pruning != "prefix"
        # Timer keys, built once: they are used on every arrival.
        # Timer keys are strings (their hash is cached, unlike a tuple's);
        # `_timer_target` maps each back to (kind, model; "" for the device timer).
        self._model_key: dict[str, str] = {}
        self._drop_key: dict[str, str] = {}
        self._timer_target: dict[Hashable, tuple[str, str]] = {_DEVICE_TIMER: ("device", "")}
        for name in self.models:
            self._add_timer_keys(name)
        self.queues = ModelQueues(list(self.models))
        self.candidates: dict[str, Candidate | None] = dict.fromkeys(self.models)
        # Schedulable candidates waiting for a device (App. C's `mc`).
        self.waiting: dict[str, Candidate] = {}
        self.free_at: dict[int, float] = dict.fromkeys(self.devices, -_INF)
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
        if stagger_slack is not None and stagger_slack < 0:
            raise ValueError(f"stagger_slack must be ≥ 0, got {stagger_slack}")
        self._max_batch, self._stagger_slack = max_batch, stagger_slack
        self._cap = {
            name: self._full_size(m, max_batch, stagger_slack) for name, m in self.models.items()
        }
        # β of ℓ(b) = α·b + β (a table profile's fitted intercept, at least 0)
        self._beta = {name: _intercept(m) for name, m in self.models.items()}

    def _add_timer_keys(self, name: str) -> None:
        self._model_key[name] = model_key = f"model:{name}"
        self._drop_key[name] = drop_key = f"drop:{name}"
        self._timer_target[model_key] = ("model", name)
        self._timer_target[drop_key] = ("drop", name)

    def _full_size(
        self, model: ModelInfo, max_batch: int | None, stagger_slack: float | None
    ) -> int:
        """The batch size at which a candidate is full (schedulable at once).

        By default the largest batch that can meet the SLO at all. With
        `stagger_slack` k, the largest b with (1 + k/N)·ℓ(b) ≤ SLO: eq. 2 of
        symphony.txt §4.2 leaves one stagger interval ℓ(b)/N of queueing;
        k > 1 leaves room for random (Poisson) arrivals, trading a slightly
        smaller batch for fewer heads that miss their device.
        """
        size = model.slo_batch
        if max_batch is not None:
            size = min(size, max_batch)
        if stagger_slack is not None:
            budget = model.slo / (1.0 + stagger_slack / len(self.devices))
            size = min(size, model.profile.max_batch_within(budget))
        return max(1, size)

    # ------------------------------------------------------------------ events

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        name = model.name
        self.queues[name].add(request)
        self._last_arrival[name] = now
        self._update_candidate(model, -_INF, 1.0, now)
        self._inform_candidate(name, now)

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        device = batch.device
        if device not in self.free_at:  # down: device_up sets it afresh
            return
        queued = self.batches_on(device)
        if not queued:
            # The device is free now, earlier or later than predicted.
            if self.free_at[device] != now:
                self.free_at[device] = now
                self._set_device_timer()
            return
        # Later batches are already dispatched to this device (for when this
        # one was predicted to end). If it ended late, they start late: push
        # the prediction back. Without this, under sustained load the device
        # never falls idle, each batch's small overrun (IPC, gathering) adds
        # up, and batches planned "on time" finish ever later.
        if now <= batch.finish_at:
            return
        free = now
        for b in sorted(queued, key=lambda b: b.start_at):
            free = max(free, b.start_at) + (b.finish_at - b.start_at)
        if free > self.free_at[device]:
            self.free_at[device] = free
            self._set_device_timer()

    def _on_timer(self, key: Hashable, now: float) -> None:
        kind, name = self._timer_target[key]
        if kind == "model":
            self._on_model_timer(name, now)
        elif kind == "drop":
            model = self.models[name]
            self._update_candidate(model, -_INF, 1.0, now)
            self._inform_candidate(name, now)
        else:
            self._on_device_timer(now)

    # ------------------------------------------------------------ device faults

    def _on_device_down(self, device: int, now: float) -> None:
        # Out of `free_at`, the device is never the earliest-free one.
        self.free_at.pop(device, None)
        self._set_device_timer()

    def _on_device_up(self, device: int, now: float) -> None:
        self.free_at[device] = now
        # A waiting candidate gets it through the device timer (due now).
        self._set_device_timer()

    def _requeue(self, requests: list[Request], now: float) -> None:
        for name in self.queues.add_all(requests):
            self._update_candidate(self.models[name], -_INF, 1.0, now)
            self._inform_candidate(name, now)

    # ------------------------------------------------------------ model changes

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        name = model.name
        self._add_timer_keys(name)
        self.queues.add_model(name)
        self.candidates[name] = None
        self._cap[name] = self._full_size(model, self._max_batch, self._stagger_slack)
        self._beta[name] = _intercept(model)

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        for key in (self._model_key.pop(name), self._drop_key.pop(name)):
            self.timers.cancel(key)
            del self._timer_target[key]
        del self.candidates[name], self._cap[name], self._beta[name]
        self._last_arrival.pop(name, None)
        if self.waiting.pop(name, None) is not None:
            self._set_device_timer()
        return self.queues.remove_model(name)

    def queued(self) -> int:
        return self.queues.total()

    # ---------------------------------------------------------- model "thread"

    def _update_candidate(
        self, model: ModelInfo, gpu_free_at: float, speed: float, now: float
    ) -> None:
        """App. C `update_candidate`: prune, then recompute the candidate.

        This runs on every arrival, so the common case (nothing to prune) is
        one comparison; the pruning loops run only when the head is in danger.
        """
        name = model.name
        queue = self.queues[name]
        n = len(queue)
        if not n:
            self.candidates[name] = None
            return
        table = model.profile.latency_by_size
        d_ctrl, d_data = self.d_ctrl, self.d_data
        cap = self._cap[name]
        window = self._window
        uniform = queue.uniform
        # Window: the head must finish in a batch of the target size.
        # Prefix: the head must finish alone; the batch then shrinks.
        if uniform:
            bs = (n if n < cap else cap) if window else 1
        else:
            bs = queue.items_of(queue.batch(cap)) if window else queue.head().items
        earliest = now + d_ctrl + d_data * bs
        if gpu_free_at > earliest:
            earliest = gpu_free_at
        dl = queue.head_deadline()
        positions = None
        if earliest + table[bs] / speed > dl:
            n, limit = self._prune(model, queue, table, cap, gpu_free_at, speed, now)
            if n == 0:
                self.candidates[name] = None
                return
            if limit < cap:
                cap = limit
            dl = queue.head_deadline()
            bs, positions, earliest = self._candidate_size(
                model, queue, cap, gpu_free_at, speed, now
            )
        elif not (window and uniform):
            bs, positions, earliest = self._candidate_size(
                model, queue, cap, gpu_free_at, speed, now
            )
        # else (the common case): the pruning test's batch is the candidate.
        invalid_after = dl - table[bs] / speed
        rate = self.rates[name].rate(now)
        wanted = self._beta[name] * rate
        if bs >= cap or self.work_conserving or bs >= wanted:
            exec_at = earliest
        else:
            frontrun_at = dl - table[bs + 1] / speed
            exec_at = frontrun_at if frontrun_at > earliest else earliest
            if self._bounded_hold:
                # At most until the measured rate can have brought the βλ
                # items the batch lacks, counted from the last arrival.
                held = self._last_arrival.get(name, now) + (wanted - bs) / rate
                if held < exec_at:
                    exec_at = held if held > earliest else earliest
        self.candidates[name] = Candidate(bs, exec_at, invalid_after, dl, positions)

    def _candidate_size(
        self,
        model: ModelInfo,
        queue: DeadlineQueue,
        cap: int,
        gpu_free_at: float,
        speed: float,
        now: float,
    ) -> tuple[int, list[int] | None, float]:
        """The candidate's items, its queue positions (None: the first `bs`,
        one item each) and its earliest start, with at most `cap` items."""
        d_ctrl, d_data = self.d_ctrl, self.d_data
        positions = None
        size = cap  # the most items the candidate takes
        if not self._window:
            start = max(now + d_ctrl + d_data, gpu_free_at)
            fit = model.profile.max_batch_within((queue.head_deadline() - start) * speed)
            if fit < size:
                size = max(1, fit)
        if queue.uniform:
            n = len(queue)
            bs = n if n < size else size
        else:
            positions = queue.batch(size)
            bs = queue.items_of(positions)
        earliest = now + d_ctrl + d_data * bs
        if gpu_free_at > earliest:
            earliest = gpu_free_at
        return bs, positions, earliest

    def _prune(
        self,
        model: ModelInfo,
        queue: DeadlineQueue,
        table: tuple[float, ...],
        cap: int,
        gpu_free_at: float,
        speed: float,
        now: float,
    ) -> tuple[int, int]:
        """Drop head requests that cannot finish; return (queue length left,
        the largest batch size that lets its head finish)."""
        d_ctrl, d_data = self.d_ctrl, self.d_data
        window = self._window
        needed = self._needed_batch(model, cap, now) if self.pruning == "adaptive" else cap
        dropped: list[Request] = []
        limit = cap
        while queue:
            if queue.uniform:
                n = len(queue)
                bs = (n if n < cap else cap) if window else 1
            else:
                bs = queue.items_of(queue.batch(cap)) if window else queue.head().items
            start = max(now + d_ctrl + d_data * bs, gpu_free_at)
            head_deadline = queue.head_deadline()
            if start + table[bs] / speed <= head_deadline:
                break
            if needed < bs:
                # Adaptive: a smaller batch that still saves the head is
                # enough for the measured load; the rest waits for the next
                # device instead of the head being dropped.
                fit = model.profile.max_batch_within((head_deadline - start) * speed)
                if fit >= needed and fit >= queue.head().items:
                    limit = fit
                    break
            dropped.extend(queue.pop_front(1))
        self._drop(dropped, DropReason.DEADLINE)
        return len(queue), limit

    def _needed_batch(self, model: ModelInfo, cap: int, now: float) -> int:
        """The smallest batch size whose throughput keeps up with the model's
        measured rate on its share of the devices (its share of the device
        time all models need at full batches); at least 1, at most `cap`."""
        rate = self.rates[model.name].rate(now)
        if rate <= 0.0:
            return 1
        work = {
            name: self.rates[name].rate(now) * m.profile.latency(self._cap[name]) / self._cap[name]
            for name, m in self.models.items()
        }
        total = sum(work.values())
        share = work[model.name] / total if total > 0 else 1.0
        devices = len(self.devices) * share
        table = model.profile.latency_by_size
        for size in range(1, cap + 1):
            # size requests per ℓ(size) on `devices` devices ≥ rate
            if devices * size >= rate * table[size]:
                return size
        return cap

    def _granted_device(self, name: str, device: int, gpu_free_at: float, now: float) -> None:
        """App. C `granted_gpu`: dispatch the candidate on `device` or give it back."""
        model = self.models[name]
        speed = self.devices[device].speed
        self._update_candidate(model, gpu_free_at, speed, now)
        candidate = self.candidates[name]
        if candidate is None:
            self.free_at[device] = max(now, gpu_free_at)
        else:
            queue = self.queues[name]
            if candidate.positions is None:
                requests = queue.pop_front(candidate.bs)
            else:
                requests = queue.pop_positions(candidate.positions)
            batch = self._dispatch(model, requests, device, candidate.exec_at)
            self.free_at[device] = batch.finish_at
            self._update_candidate(model, -_INF, 1.0, now)
        self._set_device_timer()
        self._inform_candidate(name, now)

    # ------------------------------------------------------------- rank logic

    def _inform_candidate(self, name: str, now: float) -> None:
        timers = self.timers
        if self.waiting.pop(name, None) is not None:
            # The drop timer matters only while a candidate waits for a
            # device: one not yet schedulable has its model timer before
            # invalid_after, and that timer re-arms the drop timer if the
            # candidate must wait. (A candidate the device timer found invalid
            # keeps its drop timer: that is what answers its head.)
            timers.cancel(self._drop_key[name])
        candidate = self.candidates[name]
        model_key = self._model_key[name]
        if candidate is None:
            timers.cancel(model_key)
            return
        fire_at = candidate.exec_at - (self.d_ctrl + self.d_data * candidate.bs)
        if fire_at <= now:
            timers.cancel(model_key)
            self._on_model_timer(name, now)
        else:
            timers.reset(model_key, fire_at)

    def _earliest_device(self) -> tuple[int, float]:
        free_at = self.free_at
        if not free_at:  # every device is down: nothing is ever free
            return -1, _INF
        device = min(free_at, key=free_at.__getitem__)
        return device, free_at[device]

    def _on_model_timer(self, name: str, now: float) -> None:
        candidate = self.candidates[name]
        if candidate is None:
            return
        device, free_at = self._earliest_device()
        if free_at <= candidate.exec_at:
            self.free_at[device] = _INF  # reserved until the grant settles it
            self._granted_device(name, device, free_at, now)
        else:
            self.waiting[name] = candidate
            self.timers.reset(self._drop_key[name], self._drop_at(name, candidate, now))
            self._set_device_timer()

    def _drop_at(self, name: str, candidate: Candidate, now: float) -> float:
        """When the waiting candidate's head can no longer finish in its
        batch: the first instant at which _update_candidate's pruning test
        (at speed 1, no device yet) finds it late — and after `now`. The
        adaptive rule sizes a batch by ℓ(b) ≤ dl − start, the pruning test by
        start + ℓ(b) > dl; the two roundings may disagree by a float, and a
        timer at `now` would then find the same candidate again and again."""
        d_ctrl, d_data, bs, dl = self.d_ctrl, self.d_data, candidate.bs, candidate.deadline
        exec_s = self.models[name].profile.latency_by_size[bs]
        cost = d_ctrl + d_data * bs + exec_s
        # The guess includes the dispatch delay: the search walks one float at a time.
        at = first_instant(lambda t: t + d_ctrl + d_data * bs + exec_s / 1.0 > dl, dl - cost)
        return at if at > now else math.nextafter(now, _INF)

    def _set_device_timer(self) -> None:
        if not self.waiting:
            self.timers.cancel(_DEVICE_TIMER)
            return
        _, free_at = self._earliest_device()
        if free_at == _INF:
            self.timers.cancel(_DEVICE_TIMER)
            return
        max_delay = max(self.delay(c.bs) for c in self.waiting.values())
        fire_at = free_at - max_delay
        self.timers.reset(_DEVICE_TIMER, fire_at)

    def _on_device_timer(self, now: float) -> None:
        device, free_at = self._earliest_device()
        if free_at == _INF:  # the device went down since the timer was set
            self._set_device_timer()
            return
        waiting = self.waiting
        for name in [n for n, c in waiting.items() if free_at > c.invalid_after]:
            del waiting[name]
        if waiting:
            if self.grant_by == "slack":
                name = min(waiting, key=lambda n: waiting[n].invalid_after)
            else:
                name = min(waiting, key=lambda n: waiting[n].exec_at)
            self.free_at[device] = _INF
            self._granted_device(name, device, free_at, now)
        self._set_device_timer()


class WorkConservingSymphonyScheduler(SymphonyScheduler):
    """Symphony with every candidate schedulable as soon as it is formed.

    A class of its own for its name ("symphony-wc"): a policy's name is a
    class attribute (`Scheduler.name`), never set per instance."""

    name = "symphony-wc"
    always_work_conserving = True


def _intercept(model: ModelInfo) -> float:
    """β of ℓ(b) = α·b + β (a table profile's fitted intercept, at least 0)."""
    profile = model.profile
    return max(profile.beta if profile.beta is not None else profile.latency(1), 0.0)
