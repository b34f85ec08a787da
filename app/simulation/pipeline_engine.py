"""Discrete-event simulation of pooled pipelines (ppipe.txt §7: the 100-GPU
simulated clusters) driving the `ppipe` data plane.

The engine is the core's driver, as the daemon will be: it hands arrivals to
`PPipeScheduler.add_request`, fires its timers (`next_wakeup`/`advance`),
carries out its decisions and reports every stage's and transfer's actual
start and end (`stage_finished`, `transfer_finished`), which the core uses
for feedback correction.

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
  authors' simulator.

A resource runs its work in the order of the reserved starts, never before
a reserved start, and never before the work's input is there — a
pipeline's hand-over (`PoolPipeline.handoff_s`) after the previous stage's
end or the transfer's. Without
jitter everything then runs exactly as reserved; with it, late work delays
what follows on the same resource. A batch re-dispatched after a device
fault replaces its stages from the re-dispatched one on; what the failed
device was running is lost.

At equal times: ends of work first, then starts, faults, the core's timers,
and arrivals last.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.results import DROP_REASONS
from app.scheduling.ppipe.batches import (
    PipelineBatch,
    PipelineComplete,
    PipelineDecision,
    PipelineDispatch,
)
from app.scheduling.ppipe.layout import Layout
from app.scheduling.ppipe.policy import PPipeScheduler
from app.scheduling.types import Drop, Request
from app.simulation.engine import DROPPED, GOOD, LATE, PENDING

# Event kinds, in the order they are handled at equal times.
_STAGE_END, _XFER_END, _WAKE_DEVICE, _WAKE_XFER, _FAULT, _TIMER, _ARRIVAL = range(7)


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
    probes: int
    core_seconds: float  # wall time spent inside the core's calls


class _Run:
    """The engine's state; one per simulation."""

    def __init__(self, scheduler: PPipeScheduler, jitter: float, seed: int) -> None:
        self.core = scheduler
        self.layout: Layout = scheduler.layout
        self.jitter = jitter
        self.rng = np.random.default_rng(seed)
        n_dev = len(self.layout.devices)
        self.events: list[tuple[float, int, int, tuple]] = []
        self.seq = 0
        self.dev_queue: list[list[tuple[float, int, int, int]]] = [[] for _ in range(n_dev)]
        self.dev_busy = [False] * n_dev
        self.dev_epoch = [0] * n_dev
        self.dev_wake = [math.inf] * n_dev
        self.up_queue: list[list[tuple[float, int, int, int]]] = [
            [] for _ in range(self.layout.nodes)
        ]
        self.down_queue: list[list[tuple[float, int, int, int]]] = [
            [] for _ in range(self.layout.nodes)
        ]
        self.up_busy = [False] * self.layout.nodes
        self.down_busy = [False] * self.layout.nodes
        self.busy_s = [0.0] * n_dev
        self.intervals: list[list[tuple[float, float]]] = [[] for _ in range(n_dev)]
        self.generation: dict[tuple[int, int], int] = {}
        self.input_ready: dict[tuple[int, int], float] = {}  # compute may start
        self.data_ready: dict[tuple[int, int], float] = {}  # transfer may start
        self.core_seconds = 0.0
        self.timer_at = math.inf
        self.completed = 0
        self.outcomes: list[tuple[Request, int, float, int, int]] = []

    # ------------------------------------------------------------- plumbing

    def push(self, at: float, kind: int, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, kind, self.seq, payload))

    def call(self, method, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        decisions: list[PipelineDecision] = method(*args, **kwargs)
        wake = self.core.next_wakeup()
        self.core_seconds += time.perf_counter() - t0
        now = self.core.clock
        for decision in decisions:
            if isinstance(decision, PipelineDispatch):
                self.dispatch(decision, now)
            elif isinstance(decision, PipelineComplete):
                size = decision.batch.size
                self.completed += 1
                for r in decision.requests:
                    self.outcomes.append((r, GOOD if now <= r.deadline else LATE, now, -1, size))
            elif isinstance(decision, Drop):
                code = DROP_REASONS.index(decision.reason)
                for r in decision.requests:
                    self.outcomes.append((r, DROPPED, now, code, 0))
        if wake is not None and wake < self.timer_at:
            self.timer_at = wake
            self.push(wake, _TIMER, ())

    # ------------------------------------------------------------- decisions

    def dispatch(self, decision: PipelineDispatch, now: float) -> None:
        batch = decision.batch
        first = decision.from_stage
        for run in batch.stages[first:]:
            key = (batch.id, run.stage)
            gen = self.generation.get(key, 0) + 1
            self.generation[key] = gen
            self.input_ready.pop(key, None)
            self.data_ready.pop(key, None)
            heapq.heappush(self.dev_queue[run.device], (run.start, batch.id, run.stage, gen))
            if run.source_node is not None:
                assert run.transfer_start is not None
                job = (run.transfer_start, batch.id, run.stage, gen)
                heapq.heappush(self.up_queue[run.source_node], job)
                heapq.heappush(self.down_queue[run.node], job)
        head = batch.stages[first]
        if head.source_node is None:
            self.input_ready[(batch.id, first)] = now
        else:
            self.data_ready[(batch.id, first)] = now
            self.try_transfer(head.source_node, head.node, now)
        for run in batch.stages[first:]:
            self.try_device(run.device, now)

    # ------------------------------------------------------------- devices

    def live(self, job: tuple[float, int, int, int]) -> bool:
        _, batch_id, stage, gen = job
        return batch_id in self.core.in_flight and self.generation.get((batch_id, stage)) == gen

    def try_device(self, device: int, now: float) -> None:
        if self.dev_busy[device] or not self.core.alive[device]:
            return
        queue = self.dev_queue[device]
        while queue and not self.live(queue[0]):
            heapq.heappop(queue)
        if not queue:
            return
        planned, batch_id, stage, gen = queue[0]
        ready_at = self.input_ready.get((batch_id, stage))
        if ready_at is None:
            return
        start_at = max(planned, ready_at)  # ready_at: after the hand-over
        if start_at > now:
            if start_at < self.dev_wake[device]:
                self.dev_wake[device] = start_at
                self.push(start_at, _WAKE_DEVICE, (device,))
            return
        heapq.heappop(queue)
        batch = self.core.in_flight[batch_id]
        pipeline = self.layout.pipelines[batch.pipeline]
        latency = pipeline.stages[stage].latency[batch.size - 1]
        if self.jitter > 0.0:
            latency *= float(self.rng.lognormal(-0.5 * self.jitter**2, self.jitter))
        self.dev_busy[device] = True
        self.push(
            now + latency, _STAGE_END, (device, self.dev_epoch[device], batch_id, stage, gen, now)
        )

    def stage_end(self, payload: tuple, now: float) -> None:
        device, epoch, batch_id, stage, gen, started = payload
        if epoch != self.dev_epoch[device]:
            return  # the device failed meanwhile: the work is lost
        self.dev_busy[device] = False
        self.busy_s[device] += now - started
        self.intervals[device].append((started, now))
        batch = self.core.in_flight.get(batch_id)
        if batch is not None and self.generation.get((batch_id, stage)) == gen:
            self.call(self.core.stage_finished, batch_id, stage, started, now, now, device=device)
            if batch_id in self.core.in_flight:
                nxt = batch.stages[stage + 1]
                key = (batch_id, stage + 1)
                if nxt.source_node is None:
                    self.input_ready[key] = now + self.layout.pipelines[batch.pipeline].handoff_s
                    self.try_device(nxt.device, now)
                else:
                    self.data_ready[key] = now
                    self.try_transfer(nxt.source_node, nxt.node, now)
            else:
                self.forget(batch)
        self.try_device(device, now)

    def forget(self, batch: PipelineBatch) -> None:
        for k in range(len(batch.stages)):
            self.input_ready.pop((batch.id, k), None)
            self.data_ready.pop((batch.id, k), None)
            self.generation.pop((batch.id, k), None)

    # ------------------------------------------------------------- links

    def try_transfer(self, up_node: int, down_node: int, now: float) -> None:
        """Start the transfer at the head of both links' queues, if it is the
        same one, both links are idle, its data is there and its time came."""
        if self.up_busy[up_node] or self.down_busy[down_node]:
            return
        ups, downs = self.up_queue[up_node], self.down_queue[down_node]
        while ups and not self.live(ups[0]):
            heapq.heappop(ups)
        while downs and not self.live(downs[0]):
            heapq.heappop(downs)
        if not ups or not downs or ups[0] != downs[0]:
            return
        planned, batch_id, stage, gen = ups[0]
        if (batch_id, stage) not in self.data_ready:
            return
        if planned > now:
            self.push(planned, _WAKE_XFER, (up_node, down_node))
            return
        heapq.heappop(ups)
        heapq.heappop(downs)
        batch = self.core.in_flight[batch_id]
        pipeline = self.layout.pipelines[batch.pipeline]
        length = pipeline.stages[stage].transfer_in[batch.size - 1]
        self.up_busy[up_node] = self.down_busy[down_node] = True
        self.push(now + length, _XFER_END, (up_node, down_node, batch_id, stage, gen, now))

    def transfer_end(self, payload: tuple, now: float) -> None:
        up_node, down_node, batch_id, stage, gen, started = payload
        self.up_busy[up_node] = self.down_busy[down_node] = False
        batch = self.core.in_flight.get(batch_id)
        if batch is not None and self.generation.get((batch_id, stage)) == gen:
            self.call(self.core.transfer_finished, batch_id, stage, started, now, now)
            run = batch.stages[stage]
            handoff = self.layout.pipelines[batch.pipeline].handoff_s
            self.input_ready[(batch_id, stage)] = now + handoff
            self.try_device(run.device, now)
        self.wake_links(up_node, down_node, now)

    def wake_links(self, up_node: int, down_node: int, now: float) -> None:
        """A link freed: its queue's head may go now."""
        for queue, is_up in ((self.up_queue[up_node], True), (self.down_queue[down_node], False)):
            while queue and not self.live(queue[0]):
                heapq.heappop(queue)
            if queue:
                run = self.core.in_flight[queue[0][1]].stages[queue[0][2]]
                assert run.source_node is not None
                if is_up:
                    self.try_transfer(up_node, run.node, now)
                else:
                    self.try_transfer(run.source_node, down_node, now)


def run_pipeline_simulation(
    scheduler: PPipeScheduler,
    model_names: Sequence[str],
    arrival_times: np.ndarray,
    model_index: np.ndarray,
    *,
    jitter: float = 0.0,
    seed: int = 0,
    faults: Sequence[InstanceFault] = (),
) -> PipelineTrace:
    """Drive `scheduler` through the arrivals (model `model_names[i]` for
    index i; deadline = arrival + the model's SLO) until every request is
    answered and the devices are idle."""
    run = _Run(scheduler, jitter, seed)
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
            elif kind == _WAKE_DEVICE:
                (device,) = payload
                run.dev_wake[device] = math.inf
                run.try_device(device, now)
            elif kind == _WAKE_XFER:
                run.try_transfer(payload[0], payload[1], now)
            elif kind == _FAULT:
                device, up = payload
                if up:
                    run.call(scheduler.device_up, device, now)
                    run.try_device(device, now)
                else:
                    run.dev_epoch[device] += 1
                    run.dev_busy[device] = False
                    run.call(scheduler.device_down, device, now)
            else:  # _TIMER
                if now >= run.timer_at:
                    run.timer_at = math.inf
                    run.call(scheduler.advance, now)
        else:
            now = arrivals[i]
            request = Request(i, model_names[midx[i]], now, deadline[i])
            i += 1
            run.call(scheduler.add_request, request, now)
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
        probes=scheduler.probes,
        core_seconds=run.core_seconds,
    )
