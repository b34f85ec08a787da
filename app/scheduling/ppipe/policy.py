"""Policy `ppipe`: resource reservation-based adaptive batching over pooled
pipelines (ppipe.txt §5.4, App. A.3 Algorithm 1).

Per model one queue of requests in deadline order. Whenever a model's queue
changes (an arrival) or its timer fires, the core runs Algorithm 1 on it:

1. *Step 1*: probe every pipeline of the model at its planned batch size
   (`probe.py`) and take the one with the least waiting time — the time the
   batch would spend waiting for busy devices and links along its path.
2. *Step 2*: probe the chosen pipeline at smaller and smaller batch sizes,
   from the planned one down, until the batch ends by the oldest request's
   deadline.
3. Then: if not even a batch of one makes it, drop the oldest request and
   start over; if fewer requests are queued than the size found, wait — a
   timer at the last moment (below); otherwise reserve the path's intervals
   in the tables (`reservations.py`) and dispatch the oldest requests as one
   batch along it (`PipelineDispatch`).

The core also hands the planned work over (`sequencer.py`): each device
instance and link runs its reservations in order, a stage once its input is
there (`StageStart`, `TransferStart`). The executors report each stage's
actual start and end (`stage_finished`, and `transfer_finished` for
transfers); the core writes them into the tables and moves the reservations
they now overlap (feedback correction, §5.4).

**Why its own class.** `app.scheduling.base.Scheduler` is built around
batches that run whole on one device: `Batch.device`, per-device run order,
an ℓ(b) profile per model, preemption and held requests. A PPipe batch has a
device *per stage*, transfers between them, and a report per stage. This
class answers the same driver API (app/scheduling/driven.py: `DrivenCore`,
time as an argument, decisions out, `advance` and `next_wakeup` for timers,
`device_down`/`device_up`, exactly-once answers), with its stages' reports
(`StageCore`) in place of whole batches' and its own batch and decision
types (`batches.py`). Its drivers are the pipeline simulator
(app/simulation/pipeline_engine.py) and the daemon's pipeline driver
(app/server/pipeline_driver.py).

Deviations from the pseudo-code, each for a reason:

* *Admission at the head* (`admit_floor`, default 0.95). A request that
  reaches the head of its queue for the first time is kept only if a batch
  of at least `round(admit_floor × planned size)` can still end by its
  deadline; otherwise it is dropped at once. Later passes over the same head
  use the full descent. This is what the authors' simulator does
  (ReservationSlaLoadBalancer, "empirically determined"), and it produced
  the paper's figures: without it, a queue that has fallen behind drains in
  small batches, which serve fewer requests per second than the plan and
  fall further behind. `admit_floor=0` gives Algorithm 1 as printed.
* *Pipeline choice*: a pipeline whose planned size is 1 and that cannot meet
  the oldest deadline even so is ranked after the others (its waiting time
  plus the SLO), as in the authors' simulator: Step 2 cannot shrink it.
* *The last moment* of "wait for more requests" is when one more request
  would no longer fit: deadline − (compute + transfers of a batch of
  queued + 1) — the authors' simulator's rule. When the timer fires, a batch
  of that size no longer fits, so Step 2 finds one the queue can fill. If
  that moment has passed already (resources are busier than the bare
  latencies), the queue goes at once at the largest size that still fits.
* *Fewer probes on arrivals*. While a model waits, an arrival that leaves
  its queue below the size Step 2 found, with no change in the tables its
  pipelines use since, changes nothing: the core does not re-probe (the
  artifact re-probes on every arrival). Probes are counted (`probes`).
* *Requests of several items* (the paper's are one each): a batch carries
  whole requests, so Step 2 never goes below the head's items, and starts
  above the planned size when the head alone exceeds it, up to the
  largest batch the profile covers; a head beyond that is dropped
  (`DropReason.NOT_SERVED`).
* *Late work is shed, not served* (not in the paper, whose simulator runs
  every stage exactly as reserved). Live, a stage may run longer than its
  profile, or an instance may still be busy with an earlier stage, so a
  batch can fall behind its plan after it was admitted. When a stage is due
  to be handed over, the core projects the batch's end — the later of its
  planned end and (the stage's earliest start: its reserved start, now,
  and the expected ends of what the instance still holds) + the remaining
  stages' and transfers' times — and drops (`DropReason.DEADLINE`) each
  request whose deadline that end misses; a batch left empty gives its
  reservations back. A stage's time in the projection is its profile ×
  its *pace*: the exponentially weighted mean (weight `PACE_WEIGHT`) of its
  reported runs over their profile — when the last stage is due, plus
  `PACE_SPREAD` of their standard deviation — since executors on a loaded
  machine run slower than profiled, and unevenly, and the last stage is
  the one that makes an answer late (after it nothing can be shed). As
  every other policy answers a request that cannot make it at once, a
  pipeline does not serve it late. Without
  jitter the projection never exceeds the plan, so simulated runs are
  unchanged.
* *Overdue instances* (daemon only, `overdue`): an executor that is
  stopped or wedged holds its stages until the pool's heartbeat timeout
  kills it. An instance whose oldest stage has not reported `factor` × its
  planned time + `margin` after it could start (its start, or when the one
  before it reported) is taken out of the routes as if it had failed —
  its batches re-routed to its pool's other instances — and put back by
  its next good report (a late report of a re-routed stage is ignored: the
  new route writes the same outputs) or by the pool's `device_up`.
* *Re-routing on a device failure*: a batch that still needs the failed
  device, or whose intermediate output it held, is probed again from its
  first unfinished stage (from the start if the output it needs is lost),
  on the same pipeline or, from the start, any pipeline of its model; it is
  dispatched again if it still ends by its oldest deadline, else dropped
  (`DropReason.DEVICE_FAILED`). Reports from the old route are ignored, so
  every request is answered exactly once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import ClassVar

from app.scheduling.ppipe.batches import (
    PipelineBatch,
    PipelineComplete,
    PipelineDecision,
    PipelineDispatch,
    StageRun,
    StageStart,
    TransferStart,
)
from app.scheduling.ppipe.layout import Layout, PoolPipeline
from app.scheduling.ppipe.probe import Probe, probe
from app.scheduling.ppipe.reservations import ReservationTable
from app.scheduling.ppipe.sequencer import Handed, StageSequencer
from app.scheduling.types import Drop, DropReason, Request

_INF = math.inf
_EPS = 1e-9  # float slack when comparing projected ends with deadlines
# The weight of a stage's latest run in its pace (how its runs compare with
# the profile): ~10 runs make most of it.
PACE_WEIGHT = 0.1
# Standard deviations of its runs' spread added to the last stage's pace: it
# runs longer than projected rarely, not half of the time. (On all stages,
# or with 2, the simulator with jitter sheds 2–7 % more than it must.)
PACE_SPREAD = 1.0


@dataclass(slots=True)
class _ModelState:
    name: str
    slo: float
    pipelines: list[PoolPipeline]
    queue: deque[Request] = field(default_factory=deque)
    queued_items: int = 0
    wake: float | None = None  # the wait timer
    version: int = 0  # bumped when a table its pipelines use changes
    waiting_for: int = 0  # the size Step 2 found when it chose to wait
    waiting_version: int = -1


class PPipeScheduler:
    """The `ppipe` data plane over a plan's layout (see the module docstring)."""

    name: ClassVar[str] = "ppipe"

    def __init__(
        self,
        layout: Layout,
        *,
        admit_floor: float = 0.95,
        deadline_margin: float = 0.0,
        lead: float = 0.0,
        hold: int = 1,
        overdue: tuple[float, float] | None = None,
    ) -> None:
        """`lead` and `hold`: how stages are handed over (sequencer.py): `lead`
        seconds before their reserved start, at most `hold` per instance not
        reported yet (the simulator: 0 and 1; the daemon's executors:
        `live_lead(layout)` and `LIVE_HOLD`). `overdue` (factor, margin s):
        an instance whose oldest stage has not reported factor × its planned
        time + margin after it could start is routed around (see "Overdue
        instances" in the module docstring; the daemon: `LIVE_OVERDUE`)."""
        if not 0.0 <= admit_floor <= 1.0:
            raise ValueError(f"admit_floor must be in [0, 1], got {admit_floor}")
        if not (deadline_margin >= 0.0 and math.isfinite(deadline_margin)):
            raise ValueError(f"deadline_margin must be a finite number ≥ 0, got {deadline_margin}")
        if not layout.pipelines:
            raise ValueError("the layout has no pipelines")
        self.layout = layout
        self.admit_floor = admit_floor
        self.deadline_margin = deadline_margin
        n_dev = len(layout.devices)
        self.device_tables = [ReservationTable(f"device {d}") for d in range(n_dev)]
        self.uplinks = [ReservationTable(f"node {n} uplink") for n in range(layout.nodes)]
        self.downlinks = [ReservationTable(f"node {n} downlink") for n in range(layout.nodes)]
        self.node_of = [d.node for d in layout.devices]
        self.alive = [True] * n_dev
        self.models: dict[str, _ModelState] = {
            name: _ModelState(name, slo, layout.pipelines_of(name))
            for name, slo in layout.slo_s.items()
        }
        self._pipelines = {p.id: p for p in layout.pipelines}
        # Which models a change to a device's or a node's tables concerns.
        self._device_models: list[set[str]] = [set() for _ in range(n_dev)]
        self._node_models: list[set[str]] = [set() for _ in range(layout.nodes)]
        for p in layout.pipelines:
            for stage in p.stages:
                for d in stage.devices:
                    self._device_models[d].add(p.model)
                    self._node_models[self.node_of[d]].add(p.model)
        self.in_flight: dict[int, PipelineBatch] = {}
        self._sequencer = StageSequencer(n_dev, layout.nodes, lead=lead, hold=hold)
        # (pipeline, stage) → (mean, variance) of its runs over its profile
        self._pace: dict[tuple[int, int], tuple[float, float]] = {}
        self._overdue = overdue
        self._handed_plan: dict[int, tuple[float, float]] = {}  # run → (start, planned s)
        self._overdue_at: dict[int, float] = {}  # device → when its oldest run is overdue
        self._suspect: set[int] = set()  # routed around for an overdue run
        self.overdue_count = 0  # times an instance was routed around for an overdue run
        self._admitted: set[int] = set()
        self._out: list[PipelineDecision] = []
        self._next_batch_id = 1
        self.clock = -_INF
        self.probes = 0
        self.batches_dispatched = 0

    # ----------------------------------------------------------------- driver API

    def add_request(self, request: Request, now: float) -> list[PipelineDecision]:
        now = self._tick(now)
        request.due = request.deadline - self.deadline_margin
        state = self.models.get(request.model)
        if state is None or not state.pipelines:
            self._out.append(Drop([request], DropReason.NOT_SERVED))
            return self._take()
        queue = state.queue
        if queue and request.due < queue[-1].due:
            # Out of deadline order (a model with several SLOs): insert it.
            items = sorted([*queue, request], key=lambda r: r.due)
            queue.clear()
            queue.extend(items)
            state.waiting_version = -1
        else:
            queue.append(request)
        state.queued_items += request.items
        if (
            state.wake is not None
            and state.waiting_version == state.version
            and state.queued_items < state.waiting_for
            and now < state.wake
        ):
            return self._take()  # still waiting; nothing it relies on changed
        self._schedule(state, now)
        return self._take()

    def stage_finished(
        self,
        batch_id: int,
        stage: int,
        started: float,
        finished: float,
        now: float,
        *,
        device: int | None = None,
        run: int | None = None,
    ) -> list[PipelineDecision]:
        """Stage `stage` of batch `batch_id` ran over [started, finished)
        (as run `run` of a `StageStart`, on `device`, when given: a report
        of a route the core replaced is ignored). The last stage's report
        completes the batch; another hands the next stage over when due."""
        now = self._tick(now)
        if device is not None and device in self._suspect:
            self._revive(device, now)  # it answers after all
        holder, live = self._report(batch_id, stage, run)
        batch = self.in_flight.get(batch_id)
        if not live or batch is None or not 0 <= stage < len(batch.stages):
            if holder is not None and holder.device >= 0:
                self._pump_device(holder.device, now)
            return self._take()
        step = batch.stages[stage]
        if step.done or (device is not None and device != step.device):
            return self._take()
        step.done = True
        self._measure_pace(batch, stage, finished - started)
        table = self.device_tables[step.device]
        self._apply_moves(table.correct((batch_id, stage), started, finished), link=False)
        table.prune(now)
        step.start, step.finish = started, finished
        self._touch(self._device_models[step.device])
        if stage == len(batch.stages) - 1:
            del self.in_flight[batch_id]
            self._sequencer.forget(batch)
            self._out.append(PipelineComplete(batch, batch.requests))
        else:
            handoff = self._pipelines[batch.pipeline].handoff_s
            self._sequencer.stage_done(batch, stage, finished, handoff)
            nxt = batch.stages[stage + 1]
            if nxt.source_node is None:
                self._pump_device(nxt.device, now)
            else:
                self._pump_link(nxt.source_node, nxt.node, now)
        self._pump_device(step.device, now)
        return self._take()

    def stage_failed(
        self, batch_id: int, stage: int, now: float, *, run: int | None = None
    ) -> list[PipelineDecision]:
        """Stage `stage` of batch `batch_id` failed on its executor: its
        requests are dropped (`DropReason.DEVICE_FAILED`) and its
        reservations given back."""
        now = self._tick(now)
        holder, live = self._report(batch_id, stage, run)
        batch = self.in_flight.get(batch_id)
        if live and batch is not None:
            self._abandon(batch, list(batch.requests), DropReason.DEVICE_FAILED)
        if holder is not None and holder.device >= 0:
            self._pump_device(holder.device, now)
        return self._take()

    def transfer_finished(
        self,
        batch_id: int,
        stage: int,
        started: float,
        finished: float,
        now: float,
        *,
        run: int | None = None,
    ) -> list[PipelineDecision]:
        """The transfer into stage `stage` of batch `batch_id` ran over
        [started, finished): corrects both links' tables, and hands the
        stage over when due."""
        now = self._tick(now)
        holder, live = self._report(batch_id, stage, run)
        batch = self.in_flight.get(batch_id)
        step = batch.stages[stage] if batch is not None and 0 <= stage < len(batch.stages) else None
        if not live or step is None or step.source_node is None or step.done:
            if holder is not None and holder.link is not None:
                self._pump_links(*holder.link, now)
            return self._take()
        assert batch is not None
        up, down = step.source_node, step.node
        for table in (self.uplinks[up], self.downlinks[down]):
            self._apply_moves(table.correct((batch_id, stage), started, finished), link=True)
            table.prune(now)
        step.transfer_start, step.transfer_finish = started, finished
        self._touch(self._node_models[up] | self._node_models[down])
        handoff = self._pipelines[batch.pipeline].handoff_s
        self._sequencer.transfer_done(batch_id, stage, finished, handoff)
        self._pump_device(step.device, now)
        self._pump_links(up, down, now)
        return self._take()

    def advance(self, now: float) -> list[PipelineDecision]:
        now = self._tick(now)
        for device, at in list(self._overdue_at.items()):
            if at <= now and self.alive[device]:
                self._suspect.add(device)
                self.overdue_count += 1
                self._device_down(device, now)
        for device in self._sequencer.due_devices(now):
            self._pump_device(device, now)
        for up, down in self._sequencer.due_links(now):
            self._pump_link(up, down, now)
        for state in self.models.values():
            if state.wake is not None and state.wake <= now:
                state.wake = None
                self._schedule(state, now)
        return self._take()

    def next_wakeup(self) -> float | None:
        wakes = [s.wake for s in self.models.values() if s.wake is not None]
        due = self._sequencer.next_due()
        if due is not None:
            wakes.append(due)
        wakes.extend(at for device, at in self._overdue_at.items() if self.alive[device])
        return min(wakes) if wakes else None

    def device_down(self, device: int, now: float) -> list[PipelineDecision]:
        """Instance `device` failed: its batches are re-routed or dropped,
        each exactly once; what it held is lost."""
        now = self._tick(now)
        if not 0 <= device < len(self.alive):
            raise ValueError(f"unknown device {device}")
        # Its executor died: the pool brings it back (`device_up`), not a report.
        self._suspect.discard(device)
        self._device_down(device, now)
        return self._take()

    def _device_down(self, device: int, now: float) -> None:
        if not self.alive[device]:
            return
        self.alive[device] = False
        for handed in self._sequencer.held_by(device):
            self._handed_plan.pop(handed.run, None)
        self._overdue_at.pop(device, None)
        self._sequencer.device_down(device)
        for batch in list(self.in_flight.values()):
            first = next(k for k, run in enumerate(batch.stages) if not run.done)
            needs = any(run.device == device for run in batch.stages[first:])
            holds = first > 0 and batch.stages[first - 1].device == device
            if needs or holds:
                self._reroute(batch, first, now)
        self.device_tables[device] = ReservationTable(f"device {device}")
        self._touch_all()
        for state in self.models.values():
            self._schedule(state, now)

    def device_up(self, device: int, now: float) -> list[PipelineDecision]:
        now = self._tick(now)
        if not 0 <= device < len(self.alive):
            raise ValueError(f"unknown device {device}")
        self._revive(device, now)
        return self._take()

    def _revive(self, device: int, now: float) -> None:
        self._suspect.discard(device)
        if self.alive[device]:
            return
        self.alive[device] = True
        self.device_tables[device] = ReservationTable(f"device {device}")
        self._touch_all()
        for state in self.models.values():
            self._schedule(state, now)
        self._pump_device(device, now)

    def queued(self) -> int:
        """Requests waiting in the models' queues (not yet dispatched)."""
        return sum(len(state.queue) for state in self.models.values())

    @property
    def probes_per_batch(self) -> float:
        return self.probes / self.batches_dispatched if self.batches_dispatched else 0.0

    # ----------------------------------------------------------------- Algorithm 1

    def _schedule(self, state: _ModelState, now: float) -> None:
        state.wake = None
        queue = state.queue
        while queue:
            head = queue[0]
            deadline = head.due
            chosen_pipeline, first = self._step1(state, deadline, now)
            if chosen_pipeline is None or first is None:
                self._drop_head(state, DropReason.NOT_SERVED)
                continue
            if head.items > len(chosen_pipeline.stages[0].latency):
                # More items than any batch the profile covers.
                self._drop_head(state, DropReason.NOT_SERVED)
                continue
            # A batch carries the head whole: never fewer items than it has.
            planned = max(chosen_pipeline.batch, head.items)
            if self.admit_floor > 0.0 and head.id not in self._admitted:
                floor = max(head.items, round(chosen_pipeline.batch * self.admit_floor))
                if self._descend(chosen_pipeline, planned, floor, deadline, now, first) is None:
                    self._drop_head(state, DropReason.DEADLINE)
                    continue
                self._admitted.add(head.id)
            found = self._descend(chosen_pipeline, planned, head.items, deadline, now, first)
            if found is None:
                self._drop_head(state, DropReason.DEADLINE)
                continue
            if state.queued_items >= found.batch:
                self._dispatch(state, found, now)
                continue
            # Too few requests: wait until one more would no longer fit.
            wake = deadline - chosen_pipeline.work(state.queued_items + 1)
            if wake > now:
                state.wake = wake
                state.waiting_for = found.batch
                state.waiting_version = state.version
                return
            last = self._descend(chosen_pipeline, state.queued_items, head.items, deadline, now)
            if last is None:
                self._drop_head(state, DropReason.DEADLINE)
                continue
            self._dispatch(state, last, now)

    def _step1(
        self, state: _ModelState, deadline: float, now: float
    ) -> tuple[PoolPipeline | None, Probe | None]:
        best: Probe | None = None
        best_key = _INF
        for pipeline in state.pipelines:
            found = self._probe(pipeline, pipeline.batch, now)
            if found is None:
                continue
            key = found.wait
            if pipeline.batch == 1 and found.finish > deadline:
                key += state.slo
            if key < best_key:
                best, best_key = found, key
        return (best.pipeline, best) if best is not None else (None, None)

    def _descend(
        self,
        pipeline: PoolPipeline,
        top: int,
        floor: int,
        deadline: float,
        now: float,
        known: Probe | None = None,
    ) -> Probe | None:
        """The probe of the largest size in [floor, top] that ends by
        `deadline` (`known` is the probe at `top`, if made already)."""
        for size in range(top, floor - 1, -1):
            found = known if known is not None and size == known.batch else None
            if found is None:
                found = self._probe(pipeline, size, now)
            if found is not None and found.finish <= deadline:
                return found
        return None

    def _probe(
        self,
        pipeline: PoolPipeline,
        size: int,
        now: float,
        first_stage: int = 0,
        source_node: int | None = None,
    ) -> Probe | None:
        self.probes += 1
        return probe(
            pipeline,
            size,
            now,
            self.device_tables,
            self.uplinks,
            self.downlinks,
            self.node_of,
            self.alive,
            first_stage=first_stage,
            source_node=source_node,
        )

    # ----------------------------------------------------------------- batches

    def _dispatch(self, state: _ModelState, found: Probe, now: float) -> None:
        requests: list[Request] = []
        items = 0
        queue = state.queue
        while queue and items + queue[0].items <= found.batch:
            request = queue.popleft()
            items += request.items
            requests.append(request)
            self._admitted.discard(request.id)
        state.queued_items -= items
        if items != found.batch:
            # Requests of several items did not fill the size exactly.
            smaller = self._probe(found.pipeline, items, now)
            if smaller is not None and smaller.finish <= found.finish:
                found = smaller
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        batch = PipelineBatch(batch_id, state.name, found.pipeline.id, requests, [], now)
        self._reserve(batch_id, found.steps, now)
        batch.stages = found.steps
        self.in_flight[batch_id] = batch
        self.batches_dispatched += 1
        self._out.append(PipelineDispatch(batch, 0))
        self._start(batch, 0, now)

    def _reserve(self, batch_id: int, steps: list[StageRun], now: float) -> None:
        for run in steps:
            owner = (batch_id, run.stage)
            table = self.device_tables[run.device]
            table.prune(now)
            table.reserve(run.start, run.finish, owner)
            touched = self._device_models[run.device]
            if run.source_node is not None:
                assert run.transfer_start is not None and run.transfer_finish is not None
                for link in (self.uplinks[run.source_node], self.downlinks[run.node]):
                    link.prune(now)
                    link.reserve(run.transfer_start, run.transfer_finish, owner)
                touched = touched | self._node_models[run.source_node] | self._node_models[run.node]
            self._touch(touched)

    def _release(self, batch_id: int, steps: list[StageRun]) -> None:
        for run in steps:
            owner = (batch_id, run.stage)
            self.device_tables[run.device].release(owner)
            if run.source_node is not None:
                self.uplinks[run.source_node].release(owner)
                self.downlinks[run.node].release(owner)

    def _reroute(self, batch: PipelineBatch, first: int, now: float) -> None:
        # The input of stage j is stage j − 1's output, on that stage's device.
        j = first
        while j > 0 and not self.alive[batch.stages[j - 1].device]:
            j -= 1
        self._release(batch.id, batch.stages[j:])
        deadline = min(r.due for r in batch.requests)
        pipeline = self._pipelines[batch.pipeline]
        best: Probe | None = None
        if j > 0:
            source = batch.stages[j - 1].node
            best = self._probe(pipeline, batch.size, now, first_stage=j, source_node=source)
        else:
            state = self.models[batch.model]
            for candidate in state.pipelines:
                if batch.size > candidate.batch:
                    continue
                found = self._probe(candidate, batch.size, now)
                if found is not None and (best is None or found.finish < best.finish):
                    best = found
        if best is None or best.finish > deadline:
            del self.in_flight[batch.id]
            self._sequencer.forget(batch)
            self._out.append(Drop(batch.requests, DropReason.DEVICE_FAILED))
            return
        if j == 0:
            batch.pipeline = best.pipeline.id
            batch.stages = []
        else:
            del batch.stages[j:]
        self._reserve(batch.id, best.steps, now)
        batch.stages.extend(best.steps)
        self._out.append(PipelineDispatch(batch, j))
        self._start(batch, j, now)

    def _apply_moves(self, moved: list[tuple[Hashable, float, float]], *, link: bool) -> None:
        """Write reservations a correction moved into their batches' plans."""
        for owner, start, end in moved:
            batch_id, stage = owner  # type: ignore[misc]
            batch = self.in_flight.get(batch_id)
            if batch is None or stage >= len(batch.stages):
                continue
            run = batch.stages[stage]
            if link:
                run.transfer_start, run.transfer_finish = start, end
            else:
                run.start, run.finish = start, end

    # ----------------------------------------------------------------- handing over

    def _start(self, batch: PipelineBatch, first: int, now: float) -> None:
        """Queue the batch's stages from `first` on and hand over what is due."""
        self._sequencer.plan(batch, first, now)
        head = batch.stages[first]
        if head.source_node is not None:
            self._pump_link(head.source_node, head.node, now)
        for device in dict.fromkeys(run.device for run in batch.stages[first:]):
            self._pump_device(device, now)

    def _pump_device(self, device: int, now: float) -> None:
        """Hand the instance the stages that are due, while it may hold more."""
        if not self.alive[device]:
            return
        sequencer = self._sequencer
        while (work := sequencer.next_device_work(device, now)) is not None:
            batch_id, stage, start_at = work
            batch = self.in_flight[batch_id]
            if not self._on_time(batch, stage, device, start_at, now):
                sequencer.skip_device_work(device)
                continue
            handed = sequencer.hand_device_work(device)
            run = batch.stages[stage]
            self._handed_plan[handed.run] = (start_at, run.finish - run.start)
            if device not in self._overdue_at:
                self._watch(device, now)
            self._out.append(StageStart(batch, stage, device, start_at, handed.run))

    def _pump_link(self, up: int, down: int, now: float) -> None:
        found = self._sequencer.next_transfer(up, down, now)
        if found is None:
            return
        batch_id, stage = found
        handed = self._sequencer.hand_transfer(batch_id, stage)
        self._out.append(TransferStart(self.in_flight[batch_id], stage, handed.run))

    def _pump_links(self, up: int, down: int, now: float) -> None:
        """Links `up` and `down` are free: the transfers at their heads may go."""
        for pair in self._sequencer.link_pairs(up, down):
            self._pump_link(*pair, now)

    def _on_time(
        self, batch: PipelineBatch, stage: int, device: int, start_at: float, now: float
    ) -> bool:
        """Shed what can no longer make it (see "Late work is shed" in the
        module docstring). False: the whole batch was given up."""
        earliest = max(start_at, now)
        for held in self._sequencer.held_by(device):
            other = self.in_flight.get(held.batch_id)
            if other is not None and held.stage < len(other.stages):
                run = other.stages[held.stage]
                took = self._stage_time(other, held.stage)
                earliest = max(earliest, run.finish, run.start + took)
        remaining = 0.0
        pipeline = self._pipelines[batch.pipeline]
        last = len(batch.stages) - 1
        for k in range(stage, len(batch.stages)):
            remaining += self._stage_time(batch, k, spread=stage == last)
            if k > stage:
                remaining += pipeline.handoff_s
                if batch.stages[k].source_node is not None:
                    remaining += pipeline.stages[k].transfer_in[batch.size - 1]
        end = max(batch.stages[-1].finish, earliest + remaining) - _EPS
        late = [r for r in batch.requests if r.due < end]
        if not late:
            return True
        if len(late) == len(batch.requests):
            self._abandon(batch, late, DropReason.DEADLINE)
            return False
        batch.requests = [r for r in batch.requests if r.due >= end]
        self._out.append(Drop(late, DropReason.DEADLINE))
        return True

    def _stage_time(self, batch: PipelineBatch, stage: int, spread: bool = False) -> float:
        """How long the stage will take: its profile × how its stages ran
        lately (`_pace`: their mean, and with `spread`, `PACE_SPREAD` of
        their standard deviation)."""
        profiled = self._pipelines[batch.pipeline].stages[stage].latency[batch.size - 1]
        mean, variance = self._pace.get((batch.pipeline, stage), (1.0, 0.0))
        return profiled * (mean + (PACE_SPREAD * math.sqrt(variance) if spread else 0.0))

    def _measure_pace(self, batch: PipelineBatch, stage: int, took: float) -> None:
        """A stage ran for `took`: fold its time over its profile into the
        stage's pace (exponentially weighted mean and variance)."""
        profiled = self._pipelines[batch.pipeline].stages[stage].latency[batch.size - 1]
        if profiled <= 0.0:
            return
        ratio = took / profiled
        if abs(ratio - 1.0) < _EPS:
            ratio = 1.0  # float dust of a run exactly as profiled
        key = (batch.pipeline, stage)
        mean, variance = self._pace.get(key, (1.0, 0.0))
        delta = ratio - mean
        mean += PACE_WEIGHT * delta
        variance = (1.0 - PACE_WEIGHT) * (variance + PACE_WEIGHT * delta * delta)
        self._pace[key] = (mean, variance)

    def _abandon(self, batch: PipelineBatch, requests: list[Request], reason: DropReason) -> None:
        """Give the batch up: its unfinished stages' reservations back, its
        requests dropped."""
        self._release(batch.id, [run for run in batch.stages if not run.done])
        del self.in_flight[batch.id]
        self._sequencer.forget(batch)
        self._touch_all()
        self._out.append(Drop(requests, reason))

    def _report(self, batch_id: int, stage: int, run: int | None) -> tuple[Handed | None, bool]:
        """A report of `run` (None: of whatever (batch, stage) has handed
        over, for callers that drive stages by hand): what held it, and
        whether it is the piece's live run."""
        if run is None:
            run = self._sequencer.current_run(batch_id, stage)
            if run is None:
                return None, True
        holder, live = self._sequencer.reported(run)
        self._handed_plan.pop(run, None)
        if holder is not None and holder.device >= 0:
            self._overdue_at.pop(holder.device, None)
            self._watch(holder.device, self.clock)
        return holder, live

    def _watch(self, device: int, now: float) -> None:
        """When the instance's oldest run counts as overdue (none: not watched)."""
        if self._overdue is None:
            return
        held = self._sequencer.held_by(device)
        plan = self._handed_plan.get(held[0].run) if held else None
        if plan is None:
            self._overdue_at.pop(device, None)
            return
        factor, margin = self._overdue
        start_at, planned = plan
        self._overdue_at[device] = max(start_at, now) + factor * planned + margin

    # ----------------------------------------------------------------- plumbing

    def _drop_head(self, state: _ModelState, reason: DropReason) -> None:
        request = state.queue.popleft()
        state.queued_items -= request.items
        self._admitted.discard(request.id)
        self._out.append(Drop([request], reason))

    def _touch(self, models: set[str]) -> None:
        for name in models:
            self.models[name].version += 1

    def _touch_all(self) -> None:
        for state in self.models.values():
            state.version += 1

    def _tick(self, now: float) -> float:
        if now < self.clock:
            return self.clock
        self.clock = now
        return now

    def _take(self) -> list[PipelineDecision]:
        out, self._out = self._out, []
        return out
