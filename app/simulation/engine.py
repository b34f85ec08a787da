"""Discrete-event simulation of a scheduler on emulated devices.

A virtual clock, three event sources — the pre-generated arrival sequence,
batch completions on a heap, and the core's own timers (`next_wakeup`) — and
emulated devices that hold a batch for ℓ(b)/speed, optionally scaled by
log-normal jitter. The engine only carries out the core's decisions; all
policy lives in the core, exactly as in the live daemon.

At equal times, completions are handled before timers, and timers before
arrivals: a device that frees at t can take a batch whose timer is due at t.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.results import DROP_REASONS, Outcome
from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.types import DeviceInfo, Dispatch, Drop, Preempt, Request

# Request outcome codes in `Trace.status` (app.results.Outcome), as plain ints:
# the event loop stores and compares them once per request.
PENDING, GOOD, LATE, DROPPED = (
    int(o) for o in (Outcome.PENDING, Outcome.GOOD, Outcome.LATE, Outcome.DROPPED)
)
_INF = float("inf")


@dataclass
class Trace:
    """Per-request and per-device record of one simulated run."""

    arrival: np.ndarray  # seconds
    deadline: np.ndarray
    model_index: np.ndarray
    status: np.ndarray  # PENDING / GOOD / LATE / DROPPED
    finish: np.ndarray  # answer time (completion or drop); nan while pending
    start: np.ndarray  # start of the batch the request finished in; nan if none
    batch_size: np.ndarray  # size of that batch; 0 if none
    drop_reason: np.ndarray  # index into DROP_REASONS, −1 if not dropped
    device_busy: np.ndarray  # seconds each device spent executing
    batches: int  # batches completed
    preemptions: int
    end_time: float  # virtual time when the last event was handled


class SimulationError(RuntimeError):
    pass


def run_simulation(
    scheduler: Scheduler,
    models: Sequence[ModelInfo],
    devices: Sequence[DeviceInfo],
    arrival_times: np.ndarray,
    model_index: np.ndarray,
    *,
    jitter: float = 0.0,
    preemption_delay: float = 0.0,
    seed: int = 0,
    deadlines: np.ndarray | None = None,
) -> Trace:
    """Drive `scheduler` through the arrivals; return what happened to each.

    `deadlines` defaults to arrival + the model's SLO. `jitter` is the sigma
    of a log-normal factor (mean 1) on each batch's execution time.
    """
    n = len(arrival_times)
    times: list[float] = arrival_times.tolist()
    midx: list[int] = model_index.tolist()
    names = [m.name for m in models]
    if deadlines is None:
        slos = np.array([m.slo for m in models])
        deadlines = arrival_times + slos[model_index] if n else np.zeros(0)
    dls: list[float] = deadlines.tolist()
    profiles = {m.name: m.profile for m in models}
    speed = {d.id: d.speed for d in devices}
    device_pos = {d.id: i for i, d in enumerate(devices)}

    status = [PENDING] * n
    finish = [math.nan] * n
    start = [math.nan] * n
    bsize = [0] * n
    reason = [-1] * n
    reason_code = {r: i for i, r in enumerate(DROP_REASONS)}
    busy = [0.0] * len(devices)
    busy_until = dict.fromkeys(speed, 0.0)
    rng = np.random.default_rng(seed)
    # log-normal with mean 1: exp(N(−σ²/2, σ))
    jitter_mu = -0.5 * jitter * jitter

    completions: list[tuple[float, int, int]] = []  # (finish, batch id, device)
    active: dict[int, tuple[list[Request], float]] = {}  # batch id → (requests, start)
    batches_done = 0
    preemptions = 0

    def apply(decisions: list, now: float) -> None:
        nonlocal preemptions
        for decision in decisions:
            if type(decision) is Dispatch:
                batch = decision.batch
                device = batch.device
                begin = max(batch.start_at, busy_until[device], now)
                size = len(batch.requests)
                duration = profiles[batch.model].latency(size) / speed[device]
                if jitter:
                    duration *= math.exp(rng.normal(jitter_mu, jitter))
                end = begin + duration
                busy_until[device] = end
                heapq.heappush(completions, (end, batch.id, device))
                active[batch.id] = (batch.requests, begin)
            elif type(decision) is Drop:
                code = reason_code[decision.reason]
                for request in decision.requests:
                    rid = request.id
                    if status[rid] != PENDING:
                        raise SimulationError(f"request {rid} answered twice (drop)")
                    status[rid] = DROPPED
                    finish[rid] = now
                    reason[rid] = code
            elif type(decision) is Preempt:
                entry = active.pop(decision.batch_id, None)
                if entry is not None:
                    preemptions += 1
                    _, begin = entry
                    device = decision.device
                    busy[device_pos[device]] += max(0.0, now - begin)
                    busy_until[device] = now + preemption_delay

    i = 0
    now = 0.0
    same_time_steps = 0
    next_wakeup = scheduler.next_wakeup
    if type(scheduler).next_wakeup is Scheduler.next_wakeup:
        next_wakeup = scheduler.timers.next_time  # same answer, one call fewer
    add_request = scheduler.add_request
    while True:
        t_arrival = times[i] if i < n else _INF
        t_done = completions[0][0] if completions else _INF
        t_timer = next_wakeup()
        if t_timer is None:
            t_timer = _INF
        elif i == n and not completions and scheduler.queued() == 0:
            break  # only periodic timers (e.g. Nexus epochs) remain: the run is over
        if t_done <= t_timer and t_done <= t_arrival:
            if t_done == _INF:
                break
            end, batch_id, device = heapq.heappop(completions)
            entry = active.pop(batch_id, None)
            if entry is None:
                continue  # preempted: its completion never happens
            requests, begin = entry
            size = len(requests)
            busy[device_pos[device]] += end - begin
            batches_done += 1
            for request in requests:
                rid = request.id
                if status[rid] != PENDING:
                    raise SimulationError(f"request {rid} answered twice (completion)")
                status[rid] = GOOD if end <= request.deadline else LATE
                finish[rid] = end
                start[rid] = begin
                bsize[rid] = size
            step_at = end
            decisions = scheduler.batch_finished(device, batch_id, end)
            if decisions:
                apply(decisions, end)
        elif t_timer <= t_arrival:
            step_at = t_timer
            decisions = scheduler.advance(t_timer)
            if decisions:
                apply(decisions, t_timer)
        else:
            step_at = t_arrival
            request = Request(i, names[midx[i]], t_arrival, dls[i])
            i += 1
            decisions = add_request(request, t_arrival)
            if decisions:
                apply(decisions, t_arrival)
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
    )
