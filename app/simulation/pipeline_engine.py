"""Discrete-event simulation of pooled pipelines (ppipe.txt §7: the 100-GPU
simulated clusters) driving the `ppipe` data plane.

The engine is the core's driver, as the daemon's is: it hands arrivals to
the core's `add_request` (a `StageCore`, app/scheduling/driven.py), fires
its timers (`next_wakeup`/`advance`),
carries out its decisions — hands each `StageStart` to its instance and
each `TransferStart` to its links — and reports every stage's and
transfer's actual start and end (`stage_finished`, `transfer_finished`),
which the core uses for feedback correction. The core decides when each
piece of work is handed over (app/scheduling/ppipe/sequencer.py), for this
engine and for the daemon's driver alike (app/server/pipeline_driver.py).

What it emulates (`Layout`, app/scheduling/ppipe/layout.py):

* device instances — whole devices or 1/share of one (MPS); each runs the
  stages sent to it one at a time, for the stage's profiled latency at that
  share and batch size (shares of one device run side by side, each at its
  own profiled speed: the profiles were measured with every share busy);
* each node's uplink and downlink; a transfer holds the sender's uplink and
  the receiver's downlink together for bytes × 8 / bandwidth (none between
  instances on one node);
* optional log-normal jitter (`jitter`, sigma; mean 1) on every stage's
  latency, to exercise the feedback correction; 0 by default, as the
  authors' simulator; or, per device class, a ratio drawn from measured
  runs over their profile (`stage_ratios`: bench/ppipe_live.py replays a
  live run's stage times, tails and all, which a log-normal spread fitted
  to their variance leaves out).

A resource runs its work in the order of the reserved starts, never before
a reserved start, and never before the work's input is there — a
pipeline's hand-over (`PoolPipeline.handoff_s`) after the previous stage's
end or the transfer's (the core hands it over then). Without jitter
everything then runs exactly as reserved; with it, late work delays what
follows on the same resource, and a request whose batch falls too far
behind is dropped when its next stage is due (policy.py, "Late work is
shed"). A batch re-dispatched after a device
fault replaces its stages from the re-dispatched one on; what the failed
device was running is lost.

At equal times: ends of stages first, then of transfers, faults, the core's
timers (work that became due is handed over there), and arrivals last.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from app.results import DROP_REASONS
from app.scheduling.driven import StageCore
from app.scheduling.ppipe.batches import (
    PipelineComplete,
    PipelineDecision,
    StageStart,
    TransferStart,
)
from app.scheduling.ppipe.layout import Layout
from app.scheduling.types import Drop, Request
from app.simulation.engine import DROPPED, GOOD, LATE, PENDING

# Event kinds, in the order they are handled at equal times.
_STAGE_END, _XFER_END, _FAULT, _TIMER = range(4)


@dataclass(frozen=True)
class InstanceFault:
    """Instance `device` fails at `at` (or comes back, `up=True`)."""

    at: float
    device: int
    up: bool = False


@dataclass
class PipelineTrace:
    arrival: np.ndarray
    deadline: np.ndarray
    model_index: np.ndarray
    status: np.ndarray  # PENDING / GOOD / LATE / DROPPED (app.results.Outcome)
    finish: np.ndarray  # answer time; nan while pending
    drop_reason: np.ndarray  # index into DROP_REASONS, −1 if not dropped
    batch_size: np.ndarray  # items of the batch that served it; 0 if none
    device_busy: np.ndarray  # seconds each instance spent running stages
    busy_intervals: list[list[tuple[float, float]]]  # per instance: (start, end) of each stage
    batches: int
    end_time: float
    core_seconds: float  # wall time spent inside the core's calls


class _Run:
    """The engine's state; one per simulation: the emulated instances and
    links, carrying out the core's `StageStart`s and `TransferStart`s."""

    def __init__(
        self,
        scheduler: StageCore,
        jitter: float,
        seed: int,
        stage_ratios: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        self.core = scheduler
        self.layout: Layout = scheduler.layout
        self.jitter = jitter
        self.stage_ratios = {
            cls: np.asarray(ratios, dtype=float)
            for cls, ratios in (stage_ratios or {}).items()
            if len(ratios)
        }
        self.rng = np.random.default_rng(seed)
        n_dev = len(self.layout.devices)
        self.events: list[tuple[float, int, int, tuple]] = []
        self.seq = 0
        # Per instance: the stages handed to it and not begun, in order, and
        # when it is free of the one it runs.
        self.waiting: list[deque[StageStart]] = [deque() for _ in range(n_dev)]
        self.running: list[StageStart | None] = [None] * n_dev
        self.epoch = [0] * n_dev  # bumped by a fault: what ran there is lost
        self.busy_s = [0.0] * n_dev
        self.intervals: list[list[tuple[float, float]]] = [[] for _ in range(n_dev)]
        self.core_seconds = 0.0
        self.timer_at = math.inf
        self.completed = 0
        self.outcomes: list[tuple[Request, int, float, int, int]] = []

    def push(self, at: float, kind: int, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, payload))

    def call(self, method, now: float, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        """Call the core at `now` and carry out its decisions."""
        t0 = time.perf_counter()
        decisions: list[PipelineDecision] = method(*args, **kwargs)
        wake = self.core.next_wakeup()
        self.core_seconds += time.perf_counter() - t0
        for decision in decisions:
            if isinstance(decision, StageStart):
                self.waiting[decision.device].append(decision)
                self.begin_next(decision.device, now)
            elif isinstance(decision, TransferStart):
                batch = decision.batch
                pipeline = self.layout.pipelines[batch.pipeline]
                length = pipeline.stages[decision.stage].transfer_in[batch.size - 1]
                payload = (batch.id, decision.stage, decision.run, now)
                self.push(now + length, _XFER_END, payload)
            elif isinstance(decision, PipelineComplete):
                size = decision.batch.size
                self.completed += 1
                for r in decision.requests:
                    self.outcomes.append((r, GOOD if now <= r.deadline else LATE, now, -1, size))
            elif isinstance(decision, Drop):
                code = DROP_REASONS.index(decision.reason)
                for r in decision.requests:
                    self.outcomes.append((r, DROPPED, now, code, 0))
        # One timer, re-armed for the core's next wakeup after every call, as
        # the daemon's driver arms its own: an earlier arming is void.
        wake = math.inf if wake is None else wake
        if wake != self.timer_at:
            self.timer_at = wake
            if wake < math.inf:
                self.push(wake, _TIMER, (wake,))

    def begin_next(self, device: int, now: float) -> None:
        """The instance begins the next stage handed to it, if it is free:
        from the stage's start, or now if that has passed."""
        if self.running[device] is not None or not self.waiting[device]:
            return
        start = self.waiting[device].popleft()
        batch = start.batch
        begin = max(start.start_at, now)
        latency = self.layout.pipelines[batch.pipeline].stages[start.stage].latency[batch.size - 1]
        ratios = self.stage_ratios.get(self.layout.devices[device].device_class)
        if ratios is not None:
            latency *= float(ratios[self.rng.integers(len(ratios))])
        elif self.jitter > 0.0:
            latency *= float(self.rng.lognormal(-0.5 * self.jitter**2, self.jitter))
        self.running[device] = start
        payload = (device, self.epoch[device], batch.id, start.stage, start.run, begin)
        self.push(begin + latency, _STAGE_END, payload)

    def stage_end(self, payload: tuple, now: float) -> None:
        device, epoch, batch_id, stage, run, started = payload
        if epoch != self.epoch[device]:
            return  # the instance failed meanwhile: the work is lost
        self.running[device] = None
        self.busy_s[device] += now - started
        self.intervals[device].append((started, now))
        report = self.core.stage_finished
        self.call(report, now, batch_id, stage, started, now, now, device=device, run=run)
        self.begin_next(device, now)

    def transfer_end(self, payload: tuple, now: float) -> None:
        batch_id, stage, run, started = payload
        self.call(self.core.transfer_finished, now, batch_id, stage, started, now, now, run=run)

    def fault(self, device: int, up: bool, now: float) -> None:
        """The instance fails (what it held is lost; as the daemon's pool
        does, the failure is reported first, then each lost run as failed)
        or comes back."""
        if up:
            self.call(self.core.device_up, now, device, now)
            return
        lost = [self.running[device], *self.waiting[device]]
        self.running[device] = None
        self.epoch[device] += 1
        self.waiting[device].clear()
        self.call(self.core.device_down, now, device, now)
        for start in lost:
            if start is not None:
                failed = self.core.stage_failed
                self.call(failed, now, start.batch.id, start.stage, now, run=start.run)


def run_pipeline_simulation(
    scheduler: StageCore,
    model_names: Sequence[str],
    arrival_times: np.ndarray,
    model_index: np.ndarray,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    faults: Sequence[InstanceFault] = (),
    stage_ratios: Mapping[str, Sequence[float]] | None = None,
) -> PipelineTrace:
    """Drive `scheduler` through the arrivals (model `model_names[i]` for
    index i; deadline = arrival + the model's SLO) until every request is
    answered and the devices are idle."""
    run = _Run(scheduler, jitter, seed, stage_ratios)
    layout = scheduler.layout
    n = len(arrival_times)
    arrivals = arrival_times.tolist()
    midx = model_index.tolist()
    slo = [layout.slo_s[name] for name in model_names]
    deadline = [arrivals[i] + slo[midx[i]] for i in range(n)]
    for fault in sorted(faults, key=lambda f: f.at):
        run.push(fault.at, _FAULT, (fault.device, fault.up))
    i = 0
    now = 0.0
    events = run.events
    while i < n or events:
        if events and (i >= n or events[0][0] <= arrivals[i]):
            now, kind, _, payload = heapq.heappop(events)
            if kind == _STAGE_END:
                run.stage_end(payload, now)
            elif kind == _XFER_END:
                run.transfer_end(payload, now)
            elif kind == _FAULT:
                run.fault(payload[0], payload[1], now)
            elif payload[0] == run.timer_at:  # _TIMER, still armed
                run.timer_at = math.inf
                run.call(scheduler.advance, now, now)
        else:
            now = arrivals[i]
            request = Request(i, model_names[midx[i]], now, deadline[i])
            i += 1
            run.call(scheduler.add_request, now, request, now)
    status = np.full(n, PENDING, dtype=np.int8)
    finish = np.full(n, math.nan)
    reason = np.full(n, -1, dtype=np.int16)
    size = np.zeros(n, dtype=np.int32)
    for request, outcome, at, code, items in run.outcomes:
        status[request.id] = outcome
        finish[request.id] = at
        reason[request.id] = code
        size[request.id] = items
    return PipelineTrace(
        arrival=arrival_times,
        deadline=np.asarray(deadline),
        model_index=model_index,
        status=status,
        finish=finish,
        drop_reason=reason,
        batch_size=size,
        device_busy=np.asarray(run.busy_s),
        busy_intervals=run.intervals,
        batches=run.completed,
        end_time=now,
        core_seconds=run.core_seconds,
    )
