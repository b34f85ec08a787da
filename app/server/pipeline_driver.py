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

The core decides everything the simulator's emulated devices are told
(app/scheduling/ppipe/sequencer.py): which stage goes to which instance and
when, in the order of the reservations, each only once its input is there.
This driver keeps no scheduling state of its own; it hands each
`StageStart` to its executor at once, with the stage's start
(`Run.start_at`: the executor holds it until then). For the daemon the core
is built with `live_lead(layout)` and `LIVE_HOLD`:

* a stage is handed over `lead` before its reserved start, shorter than
  any stage, so no batch reserved later can fit before a stage already
  handed over: the order of the reservations is kept;
* an executor holds at most `LIVE_HOLD` (2) runs: the one it runs and the
  next, waiting in its inbox. Handing the next one over only after the
  current one's report would leave the instance idle for a round trip
  through this process per stage (1–4 ms on a busy two-core box, as long
  as a stage of the chain model on the fast class): the pipeline's busiest
  pool would lose a third of its throughput to it;
* transfers between stages are shared memory on one machine: the next stage
  reads the slots the previous one wrote, nothing is copied, so a transfer
  takes no time. The plan's cluster should say so (a bandwidth high enough
  that `transfer_seconds` is ~0); a `TransferStart` the core still makes is
  reported as done the moment it is handed over;
* a request that can no longer meet its deadline is dropped by the core
  when its next stage is due (503 `deadline`), as every other policy
  drops it, rather than served late.

Exactly once: every request gets one answer — its outputs, or an error.
A request's slots are released only once no executor can touch them any
more: after its answer and after every stage handed out for its batch has
been reported (a stage still running for a route the core replaced writes
the same values into the same slots; the slots must not be given to
another request before it ends).

A stage that fails (`Ran.error`) fails its batch: the core gives its
reservations back and drops its requests, which are answered with the
executor's error.
A stage the core thinks lost with its device (an output "held" by the dead
instance) is in fact still in the arena; the core re-runs it anyway (its
rule, kept: on a cluster of machines it would be lost).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from app.errors import ExecutorFailed, Overloaded, ShuttingDown, dropped
from app.runtime.events import BatchFinished, BatchStopped, DeviceDown, DeviceUp, ExecutorEvent
from app.scheduling.driven import StageCore
from app.scheduling.ppipe.batches import (
    PipelineBatch,
    PipelineComplete,
    PipelineDecision,
    PipelineDispatch,
    StageStart,
    TransferStart,
)
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


@dataclass
class _Pending:
    request: Request
    slots: list[int]
    future: asyncio.Future
    batch: int | None = None  # the batch it was dispatched in


@dataclass(frozen=True)
class _RunOf:
    """A stage run handed to an executor and not reported yet."""

    batch: int
    stage: int
    device: int


class PipelineDriver(EventDriver):
    """Drives one `ppipe` core (a `StageCore`) on the running event loop (see the module
    docstring). `models` are the pipelines the core's layout serves;
    `executors` runs partitions on the layout's instances."""

    def __init__(
        self,
        scheduler: StageCore,
        models: Mapping[str, PipelineModel],
        executors: StageExecutors,
        *,
        clock: Callable[[], float] = time.monotonic,
        timer_factory: Callable[[], Timer] | None = None,
    ) -> None:
        layout = scheduler.layout
        for name in layout.slo_s:
            if name not in models:
                raise ValueError(f"the layout serves {name!r}, which has no pipeline model")
        # (pipeline, stage) → the partition its executors run
        self._partitions: dict[tuple[int, int], str] = {}
        for pipeline in layout.pipelines:
            ranges = models[pipeline.model].partitions
            for k, stage in enumerate(pipeline.stages):
                if (stage.start, stage.end) not in ranges:
                    raise ValueError(
                        f"model {pipeline.model!r}: pipeline {pipeline.id} runs blocks "
                        f"[{stage.start}, {stage.end}), which no partition holds "
                        f"(have {sorted(ranges)})"
                    )
                self._partitions[(pipeline.id, k)] = ranges[(stage.start, stage.end)]
        super().__init__()
        self.core = scheduler
        self.layout = layout
        self.slo_s = dict(layout.slo_s)
        self.models = dict(models)
        self._executors = executors
        self._clock = clock
        self._wakeup = WakeupTimer(
            timer_factory or (lambda: make_timer(asyncio.get_running_loop())), self._on_wakeup
        )
        self._runs: dict[int, _RunOf] = {}  # run id → what it runs
        self._open_runs: dict[int, int] = {}  # batch → its runs not reported yet
        # batch → (model, slots) of its answered requests, freed after its last run
        self._held: dict[int, tuple[str, list[int]]] = {}
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
        app: str = "",
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
        slo = self.slo_s[model] if slo_s is None else slo_s
        request = Request(next(self._request_ids), model, arrival, arrival + slo, items, app)
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
        elif isinstance(event, DeviceDown) and 0 <= event.device < len(self.layout.devices):
            self._apply(self.core.device_down(event.device, now))
        elif isinstance(event, DeviceUp) and 0 <= event.device < len(self.layout.devices):
            self._apply(self.core.device_up(event.device, now))

    def _apply(self, decisions: list[PipelineDecision]) -> None:
        for decision in decisions:
            if isinstance(decision, StageStart):
                self._hand_over(decision)
            elif isinstance(decision, TransferStart):
                # Shared memory: the stage it feeds reads the slots in place.
                now = self._clock()
                batch_id, stage = decision.batch.id, decision.stage
                self._apply(
                    self.core.transfer_finished(batch_id, stage, now, now, now, run=decision.run)
                )
            elif isinstance(decision, PipelineDispatch):
                self._dispatched(decision.batch)
            elif isinstance(decision, PipelineComplete):
                self._complete(decision.batch, decision.requests)
            elif isinstance(decision, Drop):
                self._drop(decision.requests, decision.reason)

    # ---------------------------------------------------------------- stages

    def _dispatched(self, batch: PipelineBatch) -> None:
        requests = [self.pending.get(r.id) for r in batch.requests]
        if any(p is not None and p.batch == batch.id for p in requests):
            self.counts.rerouted += 1
            return
        self.counts.dispatched += 1
        for pending in requests:
            if pending is not None:
                pending.batch = batch.id

    def _hand_over(self, start: StageStart) -> None:
        batch = start.batch
        partition = self._partitions[(batch.pipeline, start.stage)]
        slots = [s for r in batch.requests for s in self._slots_of(r)]
        self._runs[start.run] = _RunOf(batch.id, start.stage, start.device)
        self._open_runs[batch.id] = self._open_runs.get(batch.id, 0) + 1
        self.counts.stage_runs += 1
        try:
            self._executors.submit(start.device, start.run, partition, slots, start.start_at)
        except Exception as exc:  # its executor is gone: a DeviceDown, if any, comes first
            log.warning(
                "device %d refused stage %d of batch %d: %s",
                start.device,
                start.stage,
                batch.id,
                exc,
            )
            now = self._clock()
            self._events.append(BatchFinished(start.device, start.run, now, now, str(exc)))

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
        now = self._clock()
        if error is None:
            decisions = self.core.stage_finished(
                of.batch, of.stage, started, finished, now, device=of.device, run=run_id
            )
        else:
            self.counts.stage_errors += 1
            decisions = self.core.stage_failed(of.batch, of.stage, now, run=run_id)
            failure = ExecutorFailed(f"stage {of.stage} of its batch failed: {error}")
            for decision in decisions:
                if isinstance(decision, Drop) and decision.reason is DropReason.DEVICE_FAILED:
                    self._fail(decision.requests, failure)
        self._apply(decisions)
        self._close_run(of.batch)

    def _close_run(self, batch_id: int) -> None:
        left = self._open_runs.get(batch_id, 0) - 1
        if left > 0:
            self._open_runs[batch_id] = left
            return
        self._open_runs.pop(batch_id, None)
        self._free_held(batch_id)

    def _free_held(self, batch_id: int) -> None:
        """Once no executor runs anything of a batch: free the slots of its
        answered requests."""
        if batch_id in self._open_runs:
            return
        held = self._held.pop(batch_id, None)
        if held is not None:
            model, slots = held
            self.models[model].arena.release_rows(slots)

    # ---------------------------------------------------------------- answers

    def _complete(self, batch: PipelineBatch, requests: list[Request]) -> None:
        now = self._clock()
        arena = self.models[batch.model].arena
        devices = tuple(run.device for run in batch.stages)
        for run in batch.stages:
            key = f"{batch.pipeline}.{run.stage}"
            seconds = self.counts.stage_seconds
            took = run.finish - run.start
            seconds[key] = seconds.get(key, 0.0) + took
            self.counts.stage_batches[key] = self.counts.stage_batches.get(key, 0) + 1
            planned = self.layout.pipelines[batch.pipeline].stages[run.stage]
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
                continue
            outputs = arena.read_rows(pending.slots)
            answer = PipelineAnswer(
                outputs, batch.id, batch.size, batch.pipeline, devices, batch.stages[0].start, now
            )
            self.counts.answered += 1
            if not pending.future.done():
                pending.future.set_result(answer)
            self._free(pending)

    def _drop(self, requests: list[Request], reason: DropReason) -> None:
        for request in requests:
            if request.id in self.pending:
                self.counts.dropped[reason.value] = self.counts.dropped.get(reason.value, 0) + 1
        self._fail(requests, dropped(reason.value))

    def _fail(self, requests: list[Request], error: Exception) -> None:
        for request in requests:
            pending = self.pending.pop(request.id, None)
            if pending is None:
                continue
            self.counts.answered += 1
            self.counts.failed += 1
            if not pending.future.done():
                pending.future.set_exception(error)
            self._free(pending)

    def _free(self, pending: _Pending) -> None:
        """Release a request's slots now, or hold them until no executor
        can touch them (see the module docstring)."""
        batch = pending.batch
        if batch is None or batch not in self._open_runs:
            self.models[pending.request.model].arena.release_rows(pending.slots)
            return
        held = self._held.setdefault(batch, (pending.request.model, []))
        held[1].extend(pending.slots)

    # ------------------------------------------------------------------ timer

    def _rearm(self) -> None:
        overdue = self.core.overdue_count
        if overdue > self.counts.overdue:
            self.counts.overdue = overdue
            log.warning(
                "a pipeline instance's stage is overdue: routing around it until it reports "
                "(%d times so far)",
                overdue,
            )
        if not self.closing:
            self._wakeup.arm(self.core.next_wakeup())

    def _on_wakeup(self) -> None:
        now = self._wakeup.fired(self._clock())
        self._run(lambda: self._apply(self.core.advance(now)))
