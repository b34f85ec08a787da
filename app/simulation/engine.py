"""Discrete-event simulation of a scheduler on emulated devices.

A virtual clock and four event sources — the pre-generated arrival sequence,
device events on a heap (a batch's end, a preempted batch's stop), scripted
device faults, and the core's own timers (`next_wakeup`) — drive the core;
the engine only carries out its decisions, exactly as the live daemon's
dispatcher does, so that both drivers make the same calls in the same order.

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
from typing import Protocol, cast

import numpy as np

from app.results import DROP_REASONS, Outcome
from app.scheduling.autoscaler import Autoscaler, ScaleDown, ScaleUp
from app.scheduling.base import Scheduler
from app.scheduling.compiled import mypyc_attr
from app.scheduling.model import ModelInfo
from app.scheduling.types import (
    Batch,
    Complete,
    Decision,
    DeviceInfo,
    Dispatch,
    Drop,
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


class DrivenCore(Protocol):
    """What the engine calls on the core: `Scheduler`'s driver API. A
    protocol rather than the class, so that a wrapper around a core (one that
    records the calls, tests/fakes_live.py) drives the compiled engine too."""

    def add_request(self, request: Request, now: float) -> list[Decision]: ...
    def batch_finished(self, device: int, batch_id: int, now: float) -> list[Decision]: ...
    def batch_stopped(self, device: int, batch_id: int, now: float) -> list[Decision]: ...
    def advance(self, now: float) -> list[Decision]: ...
    def next_wakeup(self) -> float | None: ...
    def device_down(self, device: int, now: float) -> list[Decision]: ...
    def device_up(self, device: int, now: float) -> list[Decision]: ...
    def record_alone_time(
        self, model: str, app: str, seconds: float, now: float
    ) -> list[Decision]: ...
    def queued(self) -> int: ...


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
    scheduler: DrivenCore,
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
    arrivals: list[float] = arrival_times.tolist()
    midx: list[int] = model_index.tolist()
    names = [m.name for m in models]
    if deadlines is None:
        slos = np.array([m.slo for m in models])
        deadlines = arrival_times + slos[model_index] if n else np.zeros(0)
    dls: list[float] = deadlines.tolist()
    sizes: list[int] = [1] * n if items is None else np.asarray(items, dtype=int).tolist()
    if len(sizes) != n:
        raise ValueError(f"items has {len(sizes)} entries for {n} arrivals")
    if seen_times is None:
        order: list[int] = list(range(n))
        seen: list[float] = arrivals
    else:
        order = np.argsort(seen_times, kind="stable").tolist()
        seen = seen_times.tolist()
    profiles = {m.name: m.profile for m in models}
    # Input-dependent models: name → c0 (s). Empty for static workloads, whose
    # hot path stays as it was.
    dynamic_c0 = {m.name: m.dynamic.c0 for m in models if m.dynamic is not None}
    app_names: list[str] | None = None if apps is None else list(apps)
    if app_names is not None and len(app_names) != n:
        raise ValueError(f"apps has {len(app_names)} entries for {n} arrivals")
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
    profiled: deque[tuple[str, str, float]] = deque()  # (model, app, alone-time) to feed
    feeding = False
    emulated = {d.id: _Device(i, d.speed) for i, d in enumerate(devices)}

    status = [PENDING] * n
    finish = [math.nan] * n
    start = [math.nan] * n
    bsize = [0] * n
    reason = [-1] * n
    reason_code = {r: i for i, r in enumerate(DROP_REASONS)}
    busy = [0.0] * len(devices)
    rng = np.random.default_rng(seed)
    profile_rng = np.random.default_rng([seed, 6])  # the profiler's re-runs' jitter
    # log-normal with mean 1: exp(N(−σ²/2, σ))
    jitter_mu = -0.5 * jitter * jitter
    durations: dict[int, float] = {}  # batch id → its execution time, drawn at dispatch
    begins: dict[int, float] = {}  # batch id → when it began (for its Complete)
    events: list[tuple[float, int, int, int]] = []  # (time, batch id, device, kind)
    pending_faults = sorted(faults, key=lambda f: f.at)
    fault_index = 0
    batches_done = 0
    preemptions = 0

    def begin_next(device: _Device, device_id: int, now: float) -> None:
        """The device is free at `now`: begin its next batch, if any."""
        while device.waiting:
            batch = device.waiting.popleft()
            if batch.id in device.cancelled:  # skipped: its stop is confirmed now
                device.cancelled.discard(batch.id)
                del durations[batch.id]
                heapq.heappush(events, (now, batch.id, device_id, _STOP))
                continue
            begin = max(batch.release_at, now)
            duration = durations.pop(batch.id)
            device.running, device.begin, device.duration = batch, begin, duration
            device.stop_at = None
            begins[batch.id] = begin
            heapq.heappush(events, (begin + duration, batch.id, device_id, _END))
            return

    def apply(decisions: list[Decision], now: float) -> None:
        nonlocal preemptions
        for decision in decisions:
            if isinstance(decision, Dispatch):
                batch = decision.batch
                c0 = dynamic_c0.get(batch.model) if dynamic_c0 else None
                if c0 is None:
                    duration = profiles[batch.model].latency(batch.size)
                else:
                    duration = c0 + batch.size * max(work_s[r.id] for r in batch.requests)
                device = emulated[batch.device]
                duration /= device.speed
                if jitter:
                    duration *= math.exp(rng.normal(jitter_mu, jitter))
                durations[batch.id] = duration
                device.waiting.append(batch)
                if device.running is None:
                    begin_next(device, batch.device, now)
            elif isinstance(decision, Complete):
                batch = decision.batch
                end, begin = now, begins.pop(batch.id)
                size = batch.size
                for request in decision.requests:
                    rid = request.id
                    if status[rid] != PENDING:
                        raise SimulationError(f"request {rid} answered twice (completion)")
                    status[rid] = GOOD if end <= request.deadline else LATE
                    finish[rid] = end
                    start[rid] = begin
                    bsize[rid] = size
                if dynamic_c0 and batch.model in dynamic_c0:
                    c0 = dynamic_c0[batch.model]
                    for request in decision.requests:
                        if sampled[request.id]:
                            alone = c0 + work_s[request.id]
                            if jitter:
                                alone *= math.exp(profile_rng.normal(jitter_mu, jitter))
                            profiled.append((batch.model, request.app, alone))
            elif isinstance(decision, Drop):
                code = reason_code[decision.reason]
                for request in decision.requests:
                    rid = request.id
                    if status[rid] != PENDING:
                        raise SimulationError(f"request {rid} answered twice (drop)")
                    status[rid] = DROPPED
                    finish[rid] = now
                    reason[rid] = code
            elif isinstance(decision, Preempt):
                device = emulated[decision.device]
                running = device.running
                if running is not None and running.id == decision.batch_id:
                    preemptions += 1
                    stop_at = now + preemption_delay
                    end = device.begin + device.duration
                    if stop_at < end:  # else it ends first: its end confirms the stop
                        device.stop_at = stop_at
                        heapq.heappush(events, (stop_at, running.id, decision.device, _STOP))
                elif any(b.id == decision.batch_id for b in device.waiting):
                    preemptions += 1
                    device.cancelled.add(decision.batch_id)
        if profiled and not feeding:
            feed_profiler(now)

    def feed_profiler(now: float) -> None:
        """Hand the profiled alone-times to the core, after the decisions
        that produced them (a policy may answer with new decisions)."""
        nonlocal feeding
        feeding = True
        try:
            while profiled:
                model, app, seconds = profiled.popleft()
                decisions = scheduler.record_alone_time(model, app, seconds, now)
                if decisions:
                    apply(decisions, now)
        finally:
            feeding = False

    def device_event(now: float, batch_id: int, device_id: int, kind: int) -> None:
        nonlocal batches_done
        device = emulated[device_id]
        running = device.running
        if kind == _STOP and (running is None or running.id != batch_id):
            # A waiting batch skipped (cancelled) when the device reached it.
            apply(scheduler.batch_stopped(device_id, batch_id, now), now)
            return
        if running is None or running.id != batch_id:
            return  # a stale event: the batch was stopped, or its device failed
        if kind == _END and device.stop_at is not None:
            return  # stopped earlier: its STOP event confirmed it
        busy[device.position] += now - device.begin
        device.running = None
        begin_next(device, device_id, now)
        if kind == _END:
            batches_done += 1
            apply(scheduler.batch_finished(device_id, batch_id, now), now)
        else:
            apply(scheduler.batch_stopped(device_id, batch_id, now), now)
        begins.pop(batch_id, None)  # answered (Complete), or stopped

    def fault(now: float, event: DeviceFault) -> None:
        device = emulated[event.device]
        if event.up:
            if autoscaler is not None and event.device in autoscaler.starting:
                autoscaler.started(event.device)
                scaling.append((now, len(autoscaler.serving)))
            apply(scheduler.device_up(event.device, now), now)
            return
        if device.running is not None:
            busy[device.position] += now - device.begin
        if device.running is not None:
            begins.pop(device.running.id, None)
        for batch in device.waiting:
            durations.pop(batch.id, None)
        device.running = None
        device.waiting.clear()
        device.cancelled.clear()
        apply(scheduler.device_down(event.device, now), now)

    def scale(now: float) -> None:
        """The autoscaler's tick: start parked devices, release idle ones."""
        assert autoscaler is not None
        # The autoscaler reads the core's state, beyond the driver API.
        action = autoscaler.tick(cast(Scheduler, scheduler), now)
        if isinstance(action, ScaleUp):
            for device_id in action.devices:
                up = DeviceFault(now + startup_s, device_id, up=True)
                at = bisect.bisect_right([f.at for f in pending_faults[fault_index:]], up.at)
                pending_faults.insert(fault_index + at, up)
        elif isinstance(action, ScaleDown):
            for device_id in action.devices:
                fault(now, DeviceFault(now, device_id))
            scaling.append((now, len(autoscaler.serving)))

    scaling: list[tuple[float, int]] = []
    next_tick = _INF
    if autoscaler is not None:
        if startup_s < 0 or not math.isfinite(startup_s):
            raise ValueError(f"startup_s must be a finite number ≥ 0, got {startup_s}")
        for device_id in autoscaler.parked:
            apply(scheduler.device_down(device_id, 0.0), 0.0)
        scaling.append((0.0, len(autoscaler.serving)))
        next_tick = autoscaler.bounds.window_s

    i = 0
    now = 0.0
    same_time_steps = 0
    add_request = scheduler.add_request
    next_wakeup = scheduler.next_wakeup
    while True:
        t_arrival = seen[order[i]] if i < n else _INF
        t_event = events[0][0] if events else _INF
        t_fault = pending_faults[fault_index].at if fault_index < len(pending_faults) else _INF
        t_timer = next_wakeup()
        if t_timer is None:
            t_timer = _INF
        elif i == n and not events and t_fault == _INF and scheduler.queued() == 0:
            break  # only periodic timers (e.g. Nexus epochs) remain: the run is over
        # The autoscaler ticks while there is work left (as a periodic timer).
        t_tick = next_tick if (i < n or events or scheduler.queued()) else _INF
        if t_tick < _INF and t_tick <= min(t_event, t_fault, t_arrival, t_timer):
            assert autoscaler is not None
            now = max(now, t_tick)
            next_tick = t_tick + autoscaler.bounds.window_s
            scale(t_tick)
            continue
        if t_event <= t_fault and t_event <= t_timer and t_event <= t_arrival:
            if t_event == _INF:
                break
            step_at, batch_id, device_id, kind = heapq.heappop(events)
            device_event(step_at, batch_id, device_id, kind)
        elif t_fault <= t_timer and t_fault <= t_arrival:
            step_at = t_fault
            fault(step_at, pending_faults[fault_index])
            fault_index += 1
        elif t_timer <= t_arrival:
            step_at = t_timer
            decisions = scheduler.advance(t_timer)
            if decisions:
                apply(decisions, t_timer)
        else:
            # A run of arrivals, while each comes before every other source
            # (ties go to the others) and the core decides nothing: the
            # events, faults and tick stay as they are, only the timers move.
            bound = t_event if t_event < t_fault else t_fault
            if t_tick < bound:
                bound = t_tick
            while True:
                rid = order[i]
                if app_names is None:
                    request = Request(rid, names[midx[rid]], arrivals[rid], dls[rid], sizes[rid])
                else:
                    request = Request(
                        rid, names[midx[rid]], arrivals[rid], dls[rid], sizes[rid], app_names[rid]
                    )
                i += 1
                decisions = add_request(request, t_arrival)
                if decisions:
                    apply(decisions, t_arrival)
                    break
                if i == n:
                    break
                t_next = seen[order[i]]
                if t_next >= bound:
                    break
                t_timer = next_wakeup()
                if t_timer is not None and t_timer <= t_next:
                    break
                # The bookkeeping below, for this arrival.
                if t_arrival == now:
                    same_time_steps += 1
                    if same_time_steps > 1_000_000:
                        raise SimulationError(f"no progress at t={now}: a timer keeps re-arming")
                else:
                    same_time_steps = 0
                    now = t_arrival
                t_arrival = t_next
            step_at = t_arrival
        if step_at < now:
            raise SimulationError(f"time went backwards: {step_at} < {now}")
        if step_at == now:
            same_time_steps += 1
            if same_time_steps > 1_000_000:
                raise SimulationError(f"no progress at t={now}: a timer keeps re-arming")
        else:
            same_time_steps = 0
            now = step_at

    pending = [rid for rid in range(n) if status[rid] == PENDING]
    if pending:
        raise SimulationError(
            f"{len(pending)} requests never answered (e.g. request {pending[0]}): "
            "the policy lost them"
        )
    return Trace(
        arrival=np.asarray(arrival_times, dtype=float),
        deadline=np.asarray(deadlines, dtype=float),
        model_index=np.asarray(model_index),
        status=np.array(status, dtype=np.int8),
        finish=np.array(finish),
        start=np.array(start),
        batch_size=np.array(bsize, dtype=np.int32),
        drop_reason=np.array(reason, dtype=np.int8),
        device_busy=np.array(busy),
        batches=batches_done,
        preemptions=preemptions,
        end_time=now,
        items=np.array(sizes, dtype=np.int32),
        scaling=scaling if autoscaler is not None else None,
    )
