"""Discrete-event simulation of a scheduler on emulated devices.

A virtual clock and four event sources — the pre-generated arrival sequence,
device events on a heap (a batch's end, a preempted batch's stop), scripted
device faults, and the core's own timers (`next_wakeup`) — drive the core;
the engine only carries out its decisions, exactly as the live daemon's
dispatcher does, so that both drivers make the same calls in the same order.
One run is a `_Simulation`: its loop takes the earliest of its named steps —
a run of arrivals (`hand_arrivals`), the core's timer (`advance`), a device
event (`device_event`: an end or a stop), a fault (`fault`), an autoscaler
tick (`tick`) — and `apply` carries out what the core decided.

An emulated device runs the batches sent to it in order, each from
`max(batch.release_at, the device free)` for ℓ(b)/speed, optionally scaled
by log-normal jitter. A batch of an input-dependent model
(`ModelInfo.dynamic`) runs (c0 + k·max_r x_r)/speed instead, k its items
and x_r each request's work (orloj.txt eq. 3–4; a request alone runs
c0 + x_r). A Preempt stops the running batch `preemption_delay` later (or
lets it finish, if it ends first); a batch still waiting on the device is
skipped when the device reaches it. The stop is then confirmed to
the core (`batch_stopped`), which has held the batch's requests until then.
A device fault forgets everything on the device and tells the core
(`device_down`); the device returns empty (`device_up`).

The asynchronous profiler (orloj.txt §4.1), simulated: when a batch of an
input-dependent model completes, each of its requests is picked with
probability `profile_sample_rate` (one draw per request, made up front from
the seed, so the picks do not depend on how requests were batched), and its
alone-time c0 + x_r (× jitter) goes to `Scheduler.record_alone_time` at the
batch's end. The re-run costs the device nothing: the profiler runs it only
when the device would otherwise idle, so it never delays a planned batch,
and the simulator does not model the idle slot it takes. The figure is in
the profile's units (a device of speed 1): a device of speed s re-runs it in
a/s and reports it × s, as the core divides every profile time by the speed
of the device it plans on.

At equal times, device events are handled before faults, faults before
timers, and timers before arrivals: a device that frees at t can take a
batch whose timer is due at t.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from app.results import DROP_REASONS, Outcome
from app.scheduling.autoscaler import Autoscaler, ScaleDown, ScaleUp
from app.scheduling.base import Scheduler
from app.scheduling.compiled import mypyc_attr
from app.scheduling.driven import BatchCore
from app.scheduling.model import ModelInfo
from app.scheduling.types import (
    Batch,
    Complete,
    Decision,
    DeviceInfo,
    Dispatch,
    Drop,
    DropReason,
    Preempt,
    Request,
)
from app.workloads.dynamic import DEFAULT_PROFILE_SAMPLE_RATE

# Request outcome codes in `Trace.status` (app.results.Outcome), as plain ints:
# the event loop stores and compares them once per request.
PENDING, GOOD, LATE, DROPPED = (
    int(o) for o in (Outcome.PENDING, Outcome.GOOD, Outcome.LATE, Outcome.DROPPED)
)
_INF = float("inf")
_END, _STOP = 0, 1  # device event kinds


@dataclass(frozen=True)
class DeviceFault:
    """A scripted fault: `device` goes down (its executor died) at `at`, or
    comes back (`up=True`)."""

    at: float
    device: int
    up: bool = False


@dataclass
class Trace:
    """Per-request and per-device record of one simulated run."""

    arrival: np.ndarray  # seconds
    deadline: np.ndarray
    model_index: np.ndarray
    status: np.ndarray  # PENDING / GOOD / LATE / DROPPED
    finish: np.ndarray  # answer time (completion or drop); nan while pending
    start: np.ndarray  # start of the batch the request finished in; nan if none
    batch_size: np.ndarray  # size of that batch in items; 0 if none
    drop_reason: np.ndarray  # index into DROP_REASONS, −1 if not dropped
    device_busy: np.ndarray  # seconds each device spent executing
    batches: int  # batches completed
    preemptions: int
    end_time: float  # virtual time when the last event was handled
    items: np.ndarray | None = None  # each request's items (batch dimension); None: one each
    # With an autoscaler: (time, devices in service) at the start and at each change.
    scaling: list[tuple[float, int]] | None = None


@mypyc_attr(native_class=False)  # compiled, an exception class stays a Python one
class SimulationError(RuntimeError):
    pass


@dataclass
class _Device:
    """An emulated device: the batch it runs, and those waiting behind it."""

    position: int
    speed: float
    waiting: deque[Batch] = field(default_factory=deque)
    running: Batch | None = None
    begin: float = 0.0
    duration: float = 0.0
    stop_at: float | None = None  # a preemption's stop, if before the end
    cancelled: set[int] = field(default_factory=set)  # waiting batches to skip


def run_simulation(
    scheduler: BatchCore,
    models: Sequence[ModelInfo],
    devices: Sequence[DeviceInfo],
    arrival_times: np.ndarray,
    model_index: np.ndarray,
    *,
    jitter: float = 0.0,
    preemption_delay: float = 0.0,
    seed: int = 0,
    deadlines: np.ndarray | None = None,
    seen_times: np.ndarray | None = None,
    faults: Sequence[DeviceFault] = (),
    items: np.ndarray | None = None,
    apps: np.ndarray | None = None,
    work: np.ndarray | None = None,
    profile_sample_rate: float = DEFAULT_PROFILE_SAMPLE_RATE,
    autoscaler: Autoscaler | None = None,
    startup_s: float = 0.0,
) -> Trace:
    """Drive `scheduler` through the arrivals; return what happened to each.

    `deadlines` defaults to arrival + the model's SLO. `seen_times` (default:
    the arrivals) is when the core sees each request — later than its
    arrival on a live path that parses and queues it first; requests are
    handed over in that order and still timed from their arrival. `jitter`
    is the sigma of a log-normal factor (mean 1) on each batch's execution
    time. `items` gives each request's items (its batch dimension; default
    one each): batches run for ℓ(their items), and `Trace.batch_size` counts
    items. `apps` names each request's application (default ""), `work` its
    work x_r in seconds — needed when a model is input-dependent — and
    `profile_sample_rate` is the share of those requests the profiler
    re-runs alone (see the module docstring). `autoscaler` acts on the
    core's signals every `autoscaler.bounds.window_s` (app/scheduling/
    autoscaler.py): its parked devices are down from the start, a device it
    starts serves `startup_s` later, one it releases goes down at once.
    """
    n = len(arrival_times)
    if deadlines is None:
        slos = np.array([m.slo for m in models])
        deadlines = arrival_times + slos[model_index] if n else np.zeros(0)
    sizes: list[int] = [1] * n if items is None else np.asarray(items, dtype=int).tolist()
    if len(sizes) != n:
        raise ValueError(f"items has {len(sizes)} entries for {n} arrivals")
    app_names: list[str] | None = None if apps is None else list(apps)
    if app_names is not None and len(app_names) != n:
        raise ValueError(f"apps has {len(app_names)} entries for {n} arrivals")
    emulation = _emulation(models, n, jitter, preemption_delay, seed, work, profile_sample_rate)
    if autoscaler is not None and (startup_s < 0 or not math.isfinite(startup_s)):
        raise ValueError(f"startup_s must be a finite number ≥ 0, got {startup_s}")
    run = _Simulation(
        scheduler,
        models,
        devices,
        _Arrivals(
            arrival_times.tolist(),
            seen_times,
            model_index.tolist(),
            [m.name for m in models],
            deadlines.tolist(),
            sizes,
            app_names,
        ),
        emulation,
        faults,
        autoscaler,
        startup_s,
    )
    run.run()
    return run.trace(arrival_times, deadlines, model_index, sizes)


def _emulation(
    models: Sequence[ModelInfo],
    n: int,
    jitter: float,
    preemption_delay: float,
    seed: int,
    work: np.ndarray | None,
    profile_sample_rate: float,
) -> _Emulation:
    """How the devices will run batches, each input-dependent request's work
    checked and the profiler's picks drawn."""
    dynamic_c0 = {m.name: m.dynamic.c0 for m in models if m.dynamic is not None}
    work_s: list[float] = []
    sampled: list[bool] = []
    if dynamic_c0:
        if work is None:
            raise ValueError(
                f"models {sorted(dynamic_c0)} are input-dependent: pass each request's work"
            )
        if len(work) != n:
            raise ValueError(f"work has {len(work)} entries for {n} arrivals")
        if not 0.0 <= profile_sample_rate <= 1.0:
            raise ValueError(f"profile_sample_rate must be in [0, 1], got {profile_sample_rate}")
        work_s = np.asarray(work, dtype=float).tolist()
        sampled = (np.random.default_rng([seed, 5]).random(n) < profile_sample_rate).tolist()
    return _Emulation(jitter, preemption_delay, seed, dynamic_c0, work_s, sampled)


@dataclass
class _Arrivals:
    """The requests to hand over, and in what order (by `seen` time)."""

    times: list[float]
    seen_times: np.ndarray | None
    model_index: list[int]
    names: list[str]
    deadlines: list[float]
    sizes: list[int]
    apps: list[str] | None


@dataclass
class _Emulation:
    """How the emulated devices run batches: jitter, a preemption's delay,
    and the work of input-dependent models' requests (with the profiler's
    picks)."""

    jitter: float
    preemption_delay: float
    seed: int
    dynamic_c0: dict[str, float]  # input-dependent models: name → c0 (s)
    work_s: list[float]
    sampled: list[bool]


class _Simulation:
    """One run: the virtual clock, the emulated devices, each request's
    outcome, and the steps the loop takes — a run of arrivals, a timer, a
    device event (an end or a stop), a fault, an autoscaler tick."""

    def __init__(
        self,
        scheduler: BatchCore,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        arrivals: _Arrivals,
        emulation: _Emulation,
        faults: Sequence[DeviceFault],
        autoscaler: Autoscaler | None,
        startup_s: float,
    ) -> None:
        n = len(arrivals.times)
        self.scheduler = scheduler
        self.arrivals = arrivals
        self.n = n
        if arrivals.seen_times is None:
            self.order: list[int] = list(range(n))
            self.seen: list[float] = arrivals.times
        else:
            self.order = np.argsort(arrivals.seen_times, kind="stable").tolist()
            self.seen = arrivals.seen_times.tolist()
        self.profiles = {m.name: m.profile for m in models}
        self.emulation = emulation
        # Input-dependent models: empty for static workloads, whose hot path
        # stays as it was.
        self.dynamic_c0 = emulation.dynamic_c0
        self.profiled: deque[tuple[str, str, float]] = deque()  # (model, app, alone-time)
        self.feeding = False
        self.emulated = {d.id: _Device(i, d.speed) for i, d in enumerate(devices)}
        self.status = [PENDING] * n
        self.finish = [math.nan] * n
        self.start = [math.nan] * n
        self.bsize = [0] * n
        self.reason = [-1] * n
        self.reason_code = {r: i for i, r in enumerate(DROP_REASONS)}
        self.busy = [0.0] * len(devices)
        self.rng = np.random.default_rng(emulation.seed)
        self.profile_rng = np.random.default_rng([emulation.seed, 6])  # re-runs' jitter
        # log-normal with mean 1: exp(N(−σ²/2, σ))
        self.jitter_mu = -0.5 * emulation.jitter * emulation.jitter
        self.durations: dict[int, float] = {}  # batch id → its execution time, drawn at dispatch
        self.begins: dict[int, float] = {}  # batch id → when it began (for its Complete)
        self.events: list[tuple[float, int, int, int]] = []  # (time, batch id, device, kind)
        self.pending_faults = sorted(faults, key=lambda f: f.at)
        self.fault_index = 0
        self.batches_done = 0
        self.preemptions = 0
        self.autoscaler = autoscaler
        self.startup_s = startup_s
        self.scaling: list[tuple[float, int]] = []
        self.next_tick = _INF
        self.i = 0  # the next arrival, in `order`
        self.now = 0.0
        self.same_time_steps = 0

    # ------------------------------------------------------------- the loop

    def run(self) -> None:
        """Take the earliest step until every request is answered."""
        scheduler = self.scheduler
        autoscaler = self.autoscaler
        if autoscaler is not None:
            for device_id in autoscaler.parked:
                self.apply(scheduler.device_down(device_id, 0.0), 0.0)
            self.scaling.append((0.0, len(autoscaler.serving)))
            self.next_tick = autoscaler.bounds.window_s
        n, seen, order = self.n, self.seen, self.order
        events, faults = self.events, self.pending_faults  # changed in place only
        next_wakeup = scheduler.next_wakeup
        while True:
            i = self.i
            t_arrival = seen[order[i]] if i < n else _INF
            t_event = events[0][0] if events else _INF
            t_fault = faults[self.fault_index].at if self.fault_index < len(faults) else _INF
            t_timer = next_wakeup()
            if t_timer is None:
                t_timer = _INF
            elif i == n and not events and t_fault == _INF and scheduler.queued() == 0:
                break  # only periodic timers (e.g. Nexus epochs) remain: the run is over
            # The autoscaler ticks while there is work left (as a periodic timer).
            t_tick = self.next_tick if (i < n or events or scheduler.queued()) else _INF
            if t_tick < _INF and t_tick <= min(t_event, t_fault, t_arrival, t_timer):
                self.tick(t_tick)
                continue
            if t_event <= t_fault and t_event <= t_timer and t_event <= t_arrival:
                if t_event == _INF:
                    break
                step_at, batch_id, device_id, kind = heapq.heappop(events)
                self.device_event(step_at, batch_id, device_id, kind)
            elif t_fault <= t_timer and t_fault <= t_arrival:
                step_at = t_fault
                self.fault(step_at, faults[self.fault_index])
                self.fault_index += 1
            elif t_timer <= t_arrival:
                step_at = t_timer
                decisions = scheduler.advance(t_timer)
                if decisions:
                    self.apply(decisions, t_timer)
            else:
                bound = min(t_event, t_fault, t_tick)
                step_at = self.hand_arrivals(t_arrival, bound)
            self.moved_to(step_at)

    def moved_to(self, step_at: float) -> None:
        """The clock after a step: never backwards, never stuck."""
        if step_at < self.now:
            raise SimulationError(f"time went backwards: {step_at} < {self.now}")
        if step_at == self.now:
            self.same_time_steps += 1
            if self.same_time_steps > 1_000_000:
                raise SimulationError(f"no progress at t={self.now}: a timer keeps re-arming")
        else:
            self.same_time_steps = 0
            self.now = step_at

    def hand_arrivals(self, t_arrival: float, bound: float) -> float:
        """A run of arrivals, while each comes before `bound` (every other
        source; ties go to the others) and the core decides nothing: the
        events, faults and tick stay as they are, only the timers move.
        Returns the time of the last one handed over."""
        arrivals = self.arrivals
        times, names, midx = arrivals.times, arrivals.names, arrivals.model_index
        deadlines, sizes, apps = arrivals.deadlines, arrivals.sizes, arrivals.apps
        order, seen, n = self.order, self.seen, self.n
        add_request = self.scheduler.add_request
        next_wakeup = self.scheduler.next_wakeup
        i = self.i
        while True:
            rid = order[i]
            if apps is None:
                request = Request(rid, names[midx[rid]], times[rid], deadlines[rid], sizes[rid])
            else:
                request = Request(
                    rid, names[midx[rid]], times[rid], deadlines[rid], sizes[rid], apps[rid]
                )
            i += 1
            decisions = add_request(request, t_arrival)
            if decisions:
                self.i = i
                self.apply(decisions, t_arrival)
                break
            if i == n:
                break
            t_next = seen[order[i]]
            if t_next >= bound:
                break
            t_timer = next_wakeup()
            if t_timer is not None and t_timer <= t_next:
                break
            # The clock's bookkeeping (`moved_to`), written out: this is the
            # simulator's hottest loop.
            if t_arrival == self.now:
                self.same_time_steps += 1
                if self.same_time_steps > 1_000_000:
                    raise SimulationError(f"no progress at t={self.now}: a timer keeps re-arming")
            else:
                self.same_time_steps = 0
                self.now = t_arrival
            t_arrival = t_next
        self.i = i
        return t_arrival

    # ------------------------------------------------------------- decisions

    def apply(self, decisions: list[Decision], now: float) -> None:
        """Carry out the core's decisions (the hot path: dispatches and
        completions are written out here)."""
        for decision in decisions:
            if isinstance(decision, Dispatch):
                batch = decision.batch
                c0 = self.dynamic_c0.get(batch.model) if self.dynamic_c0 else None
                if c0 is None:
                    duration = self.profiles[batch.model].latency(batch.size)
                else:
                    work_s = self.emulation.work_s
                    duration = c0 + batch.size * max(work_s[r.id] for r in batch.requests)
                device = self.emulated[batch.device]
                duration /= device.speed
                jitter = self.emulation.jitter
                if jitter:
                    duration *= math.exp(self.rng.normal(self.jitter_mu, jitter))
                self.durations[batch.id] = duration
                device.waiting.append(batch)
                if device.running is None:
                    self.begin_next(device, batch.device, now)
            elif isinstance(decision, Complete):
                batch = decision.batch
                status, finish, start, bsize = self.status, self.finish, self.start, self.bsize
                begin = self.begins.pop(batch.id)
                size = batch.size
                for request in decision.requests:
                    rid = request.id
                    if status[rid] != PENDING:
                        raise SimulationError(f"request {rid} answered twice (completion)")
                    status[rid] = GOOD if now <= request.deadline else LATE
                    finish[rid] = now
                    start[rid] = begin
                    bsize[rid] = size
                if self.dynamic_c0 and batch.model in self.dynamic_c0:
                    self.sample_alone_times(batch, decision.requests)
            elif isinstance(decision, Drop):
                self.drop(decision.requests, decision.reason, now)
            elif isinstance(decision, Preempt):
                self.preempt(decision.device, decision.batch_id, now)
        if self.profiled and not self.feeding:
            self.feed_profiler(now)

    def sample_alone_times(self, batch: Batch, requests: list[Request]) -> None:
        """The profiler's picks among a completed batch's requests: their
        alone-times, to feed the core after the decisions in hand."""
        emulation = self.emulation
        c0 = self.dynamic_c0[batch.model]
        for request in requests:
            if emulation.sampled[request.id]:
                alone = c0 + emulation.work_s[request.id]
                if emulation.jitter:
                    alone *= math.exp(self.profile_rng.normal(self.jitter_mu, emulation.jitter))
                self.profiled.append((batch.model, request.app, alone))

    def drop(self, requests: list[Request], reason: DropReason, now: float) -> None:
        code = self.reason_code[reason]
        status = self.status
        for request in requests:
            rid = request.id
            if status[rid] != PENDING:
                raise SimulationError(f"request {rid} answered twice (drop)")
            status[rid] = DROPPED
            self.finish[rid] = now
            self.reason[rid] = code

    def preempt(self, device_id: int, batch_id: int, now: float) -> None:
        device = self.emulated[device_id]
        running = device.running
        if running is not None and running.id == batch_id:
            self.preemptions += 1
            stop_at = now + self.emulation.preemption_delay
            end = device.begin + device.duration
            if stop_at < end:  # else it ends first: its end confirms the stop
                device.stop_at = stop_at
                heapq.heappush(self.events, (stop_at, running.id, device_id, _STOP))
        elif any(b.id == batch_id for b in device.waiting):
            self.preemptions += 1
            device.cancelled.add(batch_id)

    def feed_profiler(self, now: float) -> None:
        """Hand the profiled alone-times to the core, after the decisions
        that produced them (a policy may answer with new decisions)."""
        self.feeding = True
        try:
            while self.profiled:
                model, app, seconds = self.profiled.popleft()
                decisions = self.scheduler.record_alone_time(model, app, seconds, now)
                if decisions:
                    self.apply(decisions, now)
        finally:
            self.feeding = False

    # ------------------------------------------------------------- devices

    def begin_next(self, device: _Device, device_id: int, now: float) -> None:
        """The device is free at `now`: begin its next batch, if any."""
        while device.waiting:
            batch = device.waiting.popleft()
            if batch.id in device.cancelled:  # skipped: its stop is confirmed now
                device.cancelled.discard(batch.id)
                del self.durations[batch.id]
                heapq.heappush(self.events, (now, batch.id, device_id, _STOP))
                continue
            begin = max(batch.release_at, now)
            duration = self.durations.pop(batch.id)
            device.running, device.begin, device.duration = batch, begin, duration
            device.stop_at = None
            self.begins[batch.id] = begin
            heapq.heappush(self.events, (begin + duration, batch.id, device_id, _END))
            return

    def device_event(self, now: float, batch_id: int, device_id: int, kind: int) -> None:
        device = self.emulated[device_id]
        running = device.running
        scheduler = self.scheduler
        if kind == _STOP and (running is None or running.id != batch_id):
            # A waiting batch skipped (cancelled) when the device reached it.
            self.apply(scheduler.batch_stopped(device_id, batch_id, now), now)
            return
        if running is None or running.id != batch_id:
            return  # a stale event: the batch was stopped, or its device failed
        if kind == _END and device.stop_at is not None:
            return  # stopped earlier: its STOP event confirmed it
        self.busy[device.position] += now - device.begin
        device.running = None
        self.begin_next(device, device_id, now)
        if kind == _END:
            self.batches_done += 1
            self.apply(scheduler.batch_finished(device_id, batch_id, now), now)
        else:
            self.apply(scheduler.batch_stopped(device_id, batch_id, now), now)
        self.begins.pop(batch_id, None)  # answered (Complete), or stopped

    def fault(self, now: float, event: DeviceFault) -> None:
        device = self.emulated[event.device]
        autoscaler = self.autoscaler
        if event.up:
            if autoscaler is not None and event.device in autoscaler.starting:
                autoscaler.started(event.device)
                self.scaling.append((now, len(autoscaler.serving)))
            self.apply(self.scheduler.device_up(event.device, now), now)
            return
        if device.running is not None:
            self.busy[device.position] += now - device.begin
            self.begins.pop(device.running.id, None)
        for batch in device.waiting:
            self.durations.pop(batch.id, None)
        device.running = None
        device.waiting.clear()
        device.cancelled.clear()
        self.apply(self.scheduler.device_down(event.device, now), now)

    def tick(self, now: float) -> None:
        """The autoscaler's tick: start parked devices, release idle ones."""
        autoscaler = self.autoscaler
        assert autoscaler is not None
        self.now = max(self.now, now)
        self.next_tick = now + autoscaler.bounds.window_s
        # The autoscaler reads the core's state, beyond the driver API.
        action = autoscaler.tick(cast(Scheduler, self.scheduler), now)
        if isinstance(action, ScaleUp):
            faults, first = self.pending_faults, self.fault_index
            for device_id in action.devices:
                up = DeviceFault(now + self.startup_s, device_id, up=True)
                at = bisect.bisect_right([f.at for f in faults[first:]], up.at)
                faults.insert(first + at, up)
        elif isinstance(action, ScaleDown):
            for device_id in action.devices:
                self.fault(now, DeviceFault(now, device_id))
            self.scaling.append((now, len(autoscaler.serving)))

    # ------------------------------------------------------------- the record

    def trace(
        self,
        arrival_times: np.ndarray,
        deadlines: np.ndarray,
        model_index: np.ndarray,
        sizes: list[int],
    ) -> Trace:
        pending = [rid for rid in range(self.n) if self.status[rid] == PENDING]
        if pending:
            raise SimulationError(
                f"{len(pending)} requests never answered (e.g. request {pending[0]}): "
                "the policy lost them"
            )
        return Trace(
            arrival=np.asarray(arrival_times, dtype=float),
            deadline=np.asarray(deadlines, dtype=float),
            model_index=np.asarray(model_index),
            status=np.array(self.status, dtype=np.int8),
            finish=np.array(self.finish),
            start=np.array(self.start),
            batch_size=np.array(self.bsize, dtype=np.int32),
            drop_reason=np.array(self.reason, dtype=np.int8),
            device_busy=np.array(self.busy),
            batches=self.batches_done,
            preemptions=self.preemptions,
            end_time=self.now,
            items=np.array(sizes, dtype=np.int32),
            scaling=self.scaling if self.autoscaler is not None else None,
        )
