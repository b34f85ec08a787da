"""The live driver of the `ppipe` data plane: a model served as a pipeline of
partitions over pools of executors (ppipe.txt §5.4; the core is
app/scheduling/ppipe/policy.py, the simulator that drives the same core is
app/simulation/pipeline_engine.py).

The core is sans-IO and plans everything: which pipeline, which instance of
each pool, when each stage starts. This driver carries it out, in the shape
of app/server/dispatcher.py's driver of the single-device core:

* inputs: a request (`submit`: its inputs are written into the model's
  pipeline arena, app/runtime/stage_arena.py), the executor pool's typed
  events (`post`), and one timer for the core's next wakeup and for the
  moments stages are due to be handed to their executors;
* outputs: each stage of a `PipelineDispatch` as a `Run` of its partition on
  the instance the core chose; `stage_finished` with the executor's own
  start and end on the same monotonic clock; `PipelineComplete` answers the
  requests with the outputs read from the arena; `Drop` answers them with
  an error; a `DeviceDown` goes to the core, which re-routes or drops the
  batches that needed the instance.

Rules it keeps, the simulator's (pipeline_engine.py), so that live runs and
simulated ones can be compared:

* an instance runs its stages in the order of their reserved starts, one at
  a time, never before a stage's input is there (stage k + 1 waits for
  stage k's `Ran`: it reads what stage k wrote into the request's slots);
* a stage is handed to its executor `lead_s` before its reserved start, and
  the executor holds it until that start (`Run.start_at`). The lead is
  shorter than any stage, so no batch reserved later can fit before a stage
  already handed over: the order of the reservations is kept;
* an executor holds at most `HANDED_AHEAD` (2) runs: the one it runs and
  the next, waiting in its inbox. Handing the next one over only after the
  current one's report would leave the instance idle for a round trip
  through this process per stage (1–4 ms on a busy two-core box, as long
  as a stage of the chain model on the fast class): the pipeline's busiest
  pool would lose a third of its throughput to it;
* transfers between stages are shared memory on one machine: the next stage
  reads the slots the previous one wrote, nothing is copied, so a transfer
  takes no time. The plan's cluster should say so (a bandwidth high enough
  that `transfer_seconds` is ~0); where the core planned a transfer, it is
  reported as done the moment the previous stage ended.

An instance whose oldest stage is overdue (`OVERDUE_FACTOR` × its planned
time + `OVERDUE_MARGIN_S` after it could start; a stopped or wedged
executor) is reported to the core as down at once, so that its batches are
re-routed to the class's healthy instances instead of waiting for the pool's
heartbeat timeout to kill it; a good report from it brings it back (the
stages re-routed meanwhile write the same values: see below).

Exactly once: every request gets one answer — its outputs, or an error.
A request's slots are released only once no executor can touch them any
more: after its answer and after every stage handed out for its batch has
been reported (a stage still running for a route the core replaced writes
the same values into the same slots; the slots must not be given to
another request before it ends).

A stage that fails (`Ran.error`) fails its batch: its requests are answered
with the error at once and the rest of the batch's stages are reported to
the core as done at that moment, so its reservations are given back.
A stage the core thinks lost with its device (an output "held" by the dead
instance) is in fact still in the arena; the core re-runs it anyway (its
rule, kept: on a cluster of machines it would be lost).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from app.errors import ExecutorFailed, Overloaded, ShuttingDown, dropped
from app.runtime.events import BatchFinished, BatchStopped, DeviceDown, DeviceUp, ExecutorEvent
from app.scheduling.ppipe.batches import (
    PipelineBatch,
    PipelineComplete,
    PipelineDecision,
    PipelineDispatch,
)
from app.scheduling.ppipe.policy import PPipeScheduler
from app.scheduling.types import Drop, DropReason, Request
from app.server.event_driver import EventDriver
from app.server.pipeline_types import (
    DriverCounts,
    PipelineAnswer,
    PipelineModel,
    StageExecutors,
)
from app.server.timerfd import Timer, make_timer
from app.server.wakeup import WakeupTimer

log = logging.getLogger(__name__)

# Runs an executor holds at once: the one it runs and the next (see above).
HANDED_AHEAD = 2
# A stage an instance holds is overdue this many times its planned time (plus
# the margin) after it could start: the instance is routed around at once
# (a SIGSTOPped or wedged executor), rather than after the heartbeat timeout.
OVERDUE_FACTOR = 4.0
OVERDUE_MARGIN_S = 0.1


@dataclass
class _Pending:
    request: Request
    slots: list[int]
    future: asyncio.Future
    batch: int | None = None  # the batch it was dispatched in


@dataclass
class _Device:
    # (reserved start, batch, stage, route) of the stages planned on it
    queue: list[tuple[float, int, int, int]] = field(default_factory=list)
    handed: list[int] = field(default_factory=list)  # runs handed over, not reported yet
    wake: float = math.inf  # when its queue's head is due to be handed over
    overdue_at: float = math.inf  # when its oldest handed run counts as overdue
    suspect: bool = False  # taken out of the core's routes for an overdue run


@dataclass(frozen=True)
class _RunOf:
    batch: int
    stage: int
    gen: int
    device: int
    start: float = 0.0  # its reserved start
    planned_s: float = 0.0  # its planned duration


def default_lead(scheduler: PPipeScheduler) -> float:
    """Half the shortest stage of the layout at batch 1 (see the module
    docstring), at most 1 ms."""
    shortest = min(s.latency[0] for p in scheduler.layout.pipelines for s in p.stages)
    return min(0.001, 0.5 * shortest)


class PipelineDriver(EventDriver):
    """Drives one `PPipeScheduler` on the running event loop (see the module
    docstring). `models` are the pipelines the core's layout serves;
    `executors` runs partitions on the layout's instances."""

    def __init__(
        self,
        scheduler: PPipeScheduler,
        models: Mapping[str, PipelineModel],
        executors: StageExecutors,
        *,
        clock: Callable[[], float] = time.monotonic,
        timer_factory: Callable[[], Timer] | None = None,
        lead_s: float | None = None,
    ) -> None:
        layout = scheduler.layout
        for name in layout.slo_s:
            if name not in models:
                raise ValueError(f"the layout serves {name!r}, which has no pipeline model")
        for pipeline in layout.pipelines:
            ranges = models[pipeline.model].partitions
            for stage in pipeline.stages:
                if (stage.start, stage.end) not in ranges:
                    raise ValueError(
                        f"model {pipeline.model!r}: pipeline {pipeline.id} runs blocks "
                        f"[{stage.start}, {stage.end}), which no partition holds "
                        f"(have {sorted(ranges)})"
                    )
        super().__init__()
        self.core = scheduler
        self.models = dict(models)
        self._executors = executors
        self._clock = clock
        self._wakeup = WakeupTimer(
            timer_factory or (lambda: make_timer(asyncio.get_running_loop())), self._on_wakeup
        )
        self.lead_s = default_lead(scheduler) if lead_s is None else lead_s
        if not 0.0 <= self.lead_s < math.inf:
            raise ValueError(f"lead_s must be a finite number ≥ 0, got {self.lead_s}")
        self._devices = [_Device() for _ in layout.devices]
        self._gen: dict[tuple[int, int], int] = {}  # (batch, stage) → its current route
        self._ready: set[tuple[int, int]] = set()  # stages whose input is in the arena
        self._runs: dict[int, _RunOf] = {}  # run id → what it runs
        self._open_runs: dict[int, int] = {}  # batch → its runs not reported yet
        # batch → (model, slots) of its answered requests, freed after its last run
        self._held: dict[int, tuple[str, list[int]]] = {}
        self._stages = max(len(p.stages) for p in layout.pipelines)
        self._failed: set[int] = set()  # batches a stage error failed
        self._seen: set[int] = set()  # batches dispatched at least once
        self._run_ids = itertools.count(1)
        self._request_ids = itertools.count()
        self.pending: dict[int, _Pending] = {}
        self.counts = DriverCounts()
        # Called once per batch that ran to its end, before its answers.
        self.on_batch: Callable[[PipelineBatch], None] | None = None

    # ---------------------------------------------------------------- inputs

    def submit(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        slo_s: float | None = None,
        received_at: float | None = None,
    ) -> asyncio.Future:
        """Serve one request: `inputs` (arrays with the batch dimension
        first: its items) are written into the model's arena. The future
        resolves to a `PipelineAnswer`, or fails with Dropped / Overloaded
        / ExecutorFailed. The deadline is `received_at` (default now) +
        `slo_s` (default the layout's SLO of the model)."""
        if self.closing:
            raise ShuttingDown("server is shutting down")
        if model not in self.models:
            raise KeyError(f"model {model!r} is not served as a pipeline here")
        arena = self.models[model].arena
        first = next(iter(inputs.values()), None)
        items = 0 if first is None else int(np.shape(first)[0])
        if items < 1:
            raise ValueError(f"model {model!r}: a request needs at least one item")
        future = asyncio.get_running_loop().create_future()
        self.counts.submitted += 1
        slots = arena.acquire_rows(items)
        if slots is None:
            self.counts.failed += 1
            future.set_exception(Overloaded(f"model {model!r}: its arena is full"))
            return future
        try:
            arena.write_rows(slots, inputs)
        except BaseException:
            arena.release_rows(slots)
            raise
        now = self._clock()
        arrival = now if received_at is None else min(received_at, now)
        slo = self.core.layout.slo_s[model] if slo_s is None else slo_s
        request = Request(next(self._request_ids), model, arrival, arrival + slo, items)
        self.pending[request.id] = _Pending(request, slots, future)
        self._run(lambda: self._apply(self.core.add_request(request, now)))
        return future

    # ---------------------------------------------------------------- driving

    def _handle(self, event: ExecutorEvent) -> None:
        now = self._clock()
        if isinstance(event, BatchFinished):
            self._stage_report(event.batch_id, event.started_at, event.finished_at, event.error)
        elif isinstance(event, BatchStopped):  # never cancelled by this driver
            self._stage_report(event.batch_id, event.at, event.at, "stopped")
        elif isinstance(event, DeviceDown) and 0 <= event.device < len(self._devices):
            self._devices[event.device].suspect = False  # the pool brings it back now
            self._apply(self.core.device_down(event.device, now))
        elif isinstance(event, DeviceUp) and 0 <= event.device < len(self._devices):
            self._apply(self.core.device_up(event.device, now))
            self._try_device(event.device, now)

    def _apply(self, decisions: list[PipelineDecision]) -> None:
        for decision in decisions:
            if isinstance(decision, PipelineDispatch):
                self._dispatch(decision.batch, decision.from_stage)
            elif isinstance(decision, PipelineComplete):
                self._complete(decision.batch, decision.requests)
            elif isinstance(decision, Drop):
                self._drop(decision.requests, decision.reason)

    # ---------------------------------------------------------------- stages

    def _dispatch(self, batch: PipelineBatch, first: int) -> None:
        if batch.id in self._seen:
            self.counts.rerouted += 1
        else:
            self._seen.add(batch.id)
            self.counts.dispatched += 1
            for request in batch.requests:
                pending = self.pending.get(request.id)
                if pending is not None:
                    pending.batch = batch.id
        for run in batch.stages[first:]:
            key = (batch.id, run.stage)
            gen = self._gen.get(key, 0) + 1
            self._gen[key] = gen
            self._ready.discard(key)
            heapq.heappush(self._devices[run.device].queue, (run.start, batch.id, run.stage, gen))
        # Its input is in the arena: the request's own (stage 0) or what the
        # stage before wrote (shared memory is not lost with an instance).
        self._ready.add((batch.id, first))
        now = self._clock()
        for device in {run.device for run in batch.stages[first:]}:
            self._try_device(device, now)

    def _live(self, job: tuple[float, int, int, int]) -> bool:
        _, batch_id, stage, gen = job
        return (
            batch_id in self.core.in_flight
            and batch_id not in self._failed
            and self._gen.get((batch_id, stage)) == gen
        )

    def _try_device(self, device: int, now: float) -> None:
        """Hand the device's next stages over, as many as are due and ready
        and the executor may hold."""
        state = self._devices[device]
        queue = state.queue
        while len(state.handed) < HANDED_AHEAD and self.core.alive[device]:
            while queue and not self._live(queue[0]):
                heapq.heappop(queue)
            if not queue:
                return
            start, batch_id, stage, gen = queue[0]
            if (batch_id, stage) not in self._ready:
                return
            if start - self.lead_s > now:
                state.wake = start - self.lead_s
                return
            heapq.heappop(queue)
            state.wake = math.inf
            self._hand_over(device, batch_id, stage, gen, start, now)

    def _hand_over(
        self, device: int, batch_id: int, stage: int, gen: int, start: float, now: float
    ) -> None:
        batch = self.core.in_flight[batch_id]
        pipeline = self.core.layout.pipelines[batch.pipeline]
        blocks = pipeline.stages[stage]
        partition = self.models[batch.model].partitions[(blocks.start, blocks.end)]
        slots = [s for r in batch.requests for s in self._slots_of(r)]
        run_id = next(self._run_ids)
        planned = batch.stages[stage]
        self._runs[run_id] = _RunOf(
            batch_id, stage, gen, device, start, max(0.0, planned.finish - planned.start)
        )
        self._open_runs[batch_id] = self._open_runs.get(batch_id, 0) + 1
        self._devices[device].handed.append(run_id)
        if len(self._devices[device].handed) == 1:
            self._watch_oldest(device, now)
        self.counts.stage_runs += 1
        try:
            self._executors.submit(device, run_id, partition, slots, start)
        except Exception as exc:  # its executor is gone: a DeviceDown, if any, comes first
            log.warning("device %d refused stage %d of batch %d: %s", device, stage, batch_id, exc)
            self._events.append(BatchFinished(device, run_id, now, now, str(exc)))

    def _slots_of(self, request: Request) -> list[int]:
        pending = self.pending.get(request.id)
        return pending.slots if pending is not None else []

    def _stage_report(
        self, run_id: int, started: float, finished: float, error: str | None
    ) -> None:
        of = self._runs.pop(run_id, None)
        if of is None:
            log.warning("report of unknown stage run %d", run_id)
            return
        state = self._devices[of.device]
        now = self._clock()
        if run_id in state.handed:
            state.handed.remove(run_id)
            self._watch_oldest(of.device, now)
        if state.suspect and error is None:
            # It answers after all: routes may use it again.
            state.suspect = False
            log.warning("pipeline device %d reported again: back in its routes", of.device)
            self._apply(self.core.device_up(of.device, now))
        self._close_run(of.batch)
        batch = self.core.in_flight.get(of.batch)
        current = batch is not None and self._gen.get((of.batch, of.stage)) == of.gen
        if current and batch is not None:
            if error is not None:
                self._fail_batch(batch, of.stage, started, finished, error, now)
            else:
                self._apply(
                    self.core.stage_finished(
                        of.batch, of.stage, started, finished, now, device=of.device
                    )
                )
                if of.batch in self.core.in_flight:
                    self._next_stage(batch, of.stage + 1, finished, now)
        self._try_device(of.device, now)

    def _next_stage(self, batch: PipelineBatch, stage: int, ready_at: float, now: float) -> None:
        run = batch.stages[stage]
        if run.source_node is not None:
            # Shared memory: the "transfer" ended with the stage that wrote it.
            self._apply(self.core.transfer_finished(batch.id, stage, ready_at, ready_at, now))
        self._ready.add((batch.id, stage))
        self._try_device(run.device, now)

    def _fail_batch(
        self,
        batch: PipelineBatch,
        stage: int,
        started: float,
        finished: float,
        error: str,
        now: float,
    ) -> None:
        """A stage failed: answer the batch's requests with the error, and
        report its remaining stages done now so that the core completes it
        and frees what it reserved."""
        self.counts.stage_errors += 1
        self._failed.add(batch.id)
        self._fail(batch.requests, ExecutorFailed(f"stage {stage} of its batch failed: {error}"))
        decisions = self.core.stage_finished(
            batch.id, stage, started, finished, now, device=batch.stages[stage].device
        )
        for later in range(stage + 1, len(batch.stages)):
            if batch.id not in self.core.in_flight:
                break
            decisions += self.core.stage_finished(
                batch.id, later, now, now, now, device=batch.stages[later].device
            )
        self._apply(decisions)

    def _close_run(self, batch_id: int) -> None:
        left = self._open_runs.get(batch_id, 0) - 1
        if left > 0:
            self._open_runs[batch_id] = left
            return
        self._open_runs.pop(batch_id, None)
        self._forget_if_over(batch_id)

    def _forget_if_over(self, batch_id: int) -> None:
        """Once a batch is out of the core and no executor runs anything of
        it: free its answered requests' slots and its bookkeeping."""
        if batch_id in self.core.in_flight or batch_id in self._open_runs:
            return
        held = self._held.pop(batch_id, None)
        if held is not None:
            model, slots = held
            self.models[model].arena.release_rows(slots)
        self._failed.discard(batch_id)
        self._seen.discard(batch_id)
        for stage in range(self._stages):
            self._gen.pop((batch_id, stage), None)
            self._ready.discard((batch_id, stage))

    # ---------------------------------------------------------------- answers

    def _complete(self, batch: PipelineBatch, requests: list[Request]) -> None:
        now = self._clock()
        arena = self.models[batch.model].arena
        devices = tuple(run.device for run in batch.stages)
        if batch.id not in self._failed:
            for run in batch.stages:
                key = f"{batch.pipeline}.{run.stage}"
                seconds = self.counts.stage_seconds
                took = run.finish - run.start
                seconds[key] = seconds.get(key, 0.0) + took
                self.counts.stage_batches[key] = self.counts.stage_batches.get(key, 0) + 1
                planned = self.core.layout.pipelines[batch.pipeline].stages[run.stage]
                ratio = took / planned.latency[batch.size - 1]
                ratios, squares = self.counts.stage_ratio_sum, self.counts.stage_ratio_squares
                ratios[key] = ratios.get(key, 0.0) + ratio
                squares[key] = squares.get(key, 0.0) + ratio * ratio
            for before, after in itertools.pairwise(batch.stages):
                self.counts.handoff_seconds += after.start - before.finish
                self.counts.handoffs += 1
            if self.on_batch is not None:
                self.on_batch(batch)
        for request in requests:
            pending = self.pending.pop(request.id, None)
            if pending is None:
                continue  # answered already (its batch failed)
            outputs = arena.read_rows(pending.slots)
            answer = PipelineAnswer(
                outputs, batch.id, batch.size, batch.pipeline, devices, batch.stages[0].start, now
            )
            self.counts.answered += 1
            if not pending.future.done():
                pending.future.set_result(answer)
            self._free(pending)
        self._forget_if_over(batch.id)

    def _drop(self, requests: list[Request], reason: DropReason) -> None:
        for _ in requests:
            self.counts.dropped[reason.value] = self.counts.dropped.get(reason.value, 0) + 1
        self._fail(requests, dropped(reason.value))

    def _fail(self, requests: list[Request], error: Exception) -> None:
        batches: set[int] = set()
        for request in requests:
            pending = self.pending.pop(request.id, None)
            if pending is None:
                continue
            self.counts.answered += 1
            self.counts.failed += 1
            if not pending.future.done():
                pending.future.set_exception(error)
            self._free(pending)
            if pending.batch is not None:
                batches.add(pending.batch)
        for batch_id in batches:
            self._forget_if_over(batch_id)

    def _free(self, pending: _Pending) -> None:
        """Release a request's slots now, or hold them until its batch is
        over and no executor can touch them (see the module docstring)."""
        batch = pending.batch
        if batch is None:
            self.models[pending.request.model].arena.release_rows(pending.slots)
            return
        held = self._held.setdefault(batch, (pending.request.model, []))
        held[1].extend(pending.slots)

    # ------------------------------------------------------------------ timer

    def _watch_oldest(self, device: int, now: float) -> None:
        """The device's oldest handed run (if any) is overdue
        OVERDUE_FACTOR × its planned time + OVERDUE_MARGIN_S after it could
        start (its reserved start, or now: it waited for the one before)."""
        state = self._devices[device]
        run = self._runs.get(state.handed[0]) if state.handed else None
        if run is None:
            state.overdue_at = math.inf
            return
        began = max(run.start, now)
        state.overdue_at = began + OVERDUE_FACTOR * run.planned_s + OVERDUE_MARGIN_S

    def _check_overdue(self, now: float) -> None:
        """Take an instance whose oldest run is overdue out of the routes
        (`device_down` to the core: its batches are re-routed to healthy
        instances of its class) without waiting for the heartbeat timeout;
        it is back at its next good report, or with the pool's DeviceUp."""
        for device, state in enumerate(self._devices):
            if state.overdue_at > now or state.suspect or not self.core.alive[device]:
                continue
            state.suspect = True
            self.counts.overdue += 1
            log.warning(
                "pipeline device %d: the stage it runs is overdue (%.3f s past its due time); "
                "routing around it",
                device,
                now - state.overdue_at,
            )
            self._apply(self.core.device_down(device, now))

    def _rearm(self) -> None:
        wakes = [d.wake for d in self._devices if d.wake < math.inf]
        wakes += [d.overdue_at for d in self._devices if d.overdue_at < math.inf and not d.suspect]
        core = self.core.next_wakeup()
        if core is not None:
            wakes.append(core)
        wake_at = min(wakes) if wakes else None
        if not self.closing:
            self._wakeup.arm(wake_at)

    def _on_wakeup(self) -> None:
        now = self._wakeup.fired(self._clock())

        def wake() -> None:
            wake_core = self.core.next_wakeup()
            if wake_core is not None and wake_core <= now:
                self._apply(self.core.advance(now))
            self._check_overdue(now)
            for device, state in enumerate(self._devices):
                if state.wake <= now:
                    state.wake = math.inf
                    self._try_device(device, now)

        self._run(wake)
