"""The `ppipe` core hands its planned stages over (app/scheduling/ppipe/
sequencer.py) and sheds late work; the pipeline simulator and the daemon's
pipeline driver carry out the same decisions: one scripted scenario through
both, with jitter, a stage executor killed and back, every core call and
decision equal."""

from __future__ import annotations

import asyncio
import heapq
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.repository.config import ModelConfig, TensorSpec
from app.runtime.arena import Arena
from app.runtime.events import BatchFinished, DeviceDown, DeviceUp, ExecutorEvent
from app.scheduling.ppipe import (
    PipelineComplete,
    PipelineDispatch,
    PPipeScheduler,
    StageStart,
    TransferStart,
)
from app.scheduling.ppipe.layout import Layout
from app.scheduling.types import Drop, DropReason, Request
from app.server.pipeline_driver import PipelineDriver
from app.server.pipeline_types import PipelineModel
from app.simulation.pipeline_engine import (
    DROPPED,
    GOOD,
    LATE,
    InstanceFault,
    run_pipeline_simulation,
)
from tests.fakes_live import FakeClock, FakeTimer
from tests.test_ppipe_dataplane import make_layout

MS = 0.001


def summarize(decisions: list[Any]) -> list[tuple]:
    out: list[tuple] = []
    for d in decisions:
        if isinstance(d, PipelineDispatch):
            stages = [(s.device, round(s.start, 12), round(s.finish, 12)) for s in d.batch.stages]
            out.append(
                ("dispatch", d.batch.id, d.from_stage, [r.id for r in d.batch.requests], stages)
            )
        elif isinstance(d, StageStart):
            out.append(("start", d.batch.id, d.stage, d.device, round(d.start_at, 12), d.run))
        elif isinstance(d, TransferStart):
            out.append(("transfer", d.batch.id, d.stage, d.run))
        elif isinstance(d, PipelineComplete):
            out.append(("complete", d.batch.id, [r.id for r in d.requests]))
        elif isinstance(d, Drop):
            out.append(("drop", d.reason.value, [r.id for r in d.requests]))
    return out


class Recording:
    """A `ppipe` core that logs every driver call (its arguments, rounded)
    and its decisions; everything else is the wrapped core's."""

    CALLS = ("add_request", "stage_finished", "stage_failed", "transfer_finished", "advance")
    CALLS += ("device_down", "device_up")

    def __init__(self, core: PPipeScheduler) -> None:
        self.core = core
        self.log: list[tuple] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.core, name)
        if name not in self.CALLS:
            return attr

        def call(*args: Any, **kwargs: Any) -> list:
            decisions = attr(*args, **kwargs)
            what = [a.id if isinstance(a, Request) else round(a, 12) for a in args]
            self.log.append((name, what, sorted(kwargs.items()), summarize(decisions)))
            return decisions

        return call


def layout() -> Layout:
    """Stage 0 on instance 0 (1 ms per item), stage 1 on instances 1 and 2
    (2.5 ms per item), one node (shared memory: no transfers), batch 2,
    SLO 12 ms, a 0.2 ms hand-over between the stages."""
    return make_layout(
        [((1 * MS, 2 * MS), (0.0, 0.0), [0]), ((2.5 * MS, 5 * MS), (0.0, 0.0), [0, 0])],
        slo=12 * MS,
        batch=2,
        nodes=1,
        handoff=0.2 * MS,
    )


def scenario() -> tuple[np.ndarray, list[tuple[float, int, bool]]]:
    """Poisson arrivals at ~1.3× what stage 1's two instances serve, for
    0.15 s; instance 1 killed at 40 ms and back at 90 ms."""
    rng = np.random.default_rng(11)
    times = np.cumsum(rng.exponential(1 / 1000.0, 150))
    return times, [(0.040, 1, False), (0.090, 1, True)]


JITTER, SEED = 0.25, 5


class StageExecutors:
    """Emulated executors of the daemon's pool on a virtual clock: each runs
    the stages handed to it in order, from max(start_at, free), for the
    layout's latency × the simulator's jitter (the same draws, in the same
    order); a killed one loses what it holds and, as the pool does, reports
    it failed after the DeviceDown."""

    def __init__(self, plan: Layout, partitions: dict[str, int]) -> None:
        self.layout = plan
        self.partitions = partitions  # partition name → stage
        self.rng = np.random.default_rng(SEED)
        n = len(plan.devices)
        self.waiting: list[list[tuple[int, int, int, float]]] = [[] for _ in range(n)]
        self.running: list[tuple[int, int, int, float] | None] = [None] * n
        self.epoch = [0] * n
        self.events: list[tuple[float, int, int, tuple]] = []  # (time, kind, seq, payload)
        self.seq = 0
        self.now = 0.0

    def submit(self, device: int, run: int, model: str, slots: list[int], start_at: float) -> None:
        self.waiting[device].append((run, self.partitions[model], len(slots), start_at))
        self._begin(device, self.now)

    def _begin(self, device: int, now: float) -> None:
        if self.running[device] is not None or not self.waiting[device]:
            return
        run, stage, items, start_at = self.waiting[device].pop(0)
        begin = max(start_at, now)
        latency = self.layout.pipelines[0].stages[stage].latency[items - 1]
        latency *= float(self.rng.lognormal(-0.5 * JITTER**2, JITTER))
        self.running[device] = (run, stage, items, begin)
        self.seq += 1
        heapq.heappush(self.events, (begin + latency, 0, self.seq, (device, self.epoch[device])))

    def pop(self) -> ExecutorEvent | None:
        at, _, _, (device, epoch) = heapq.heappop(self.events)
        if epoch != self.epoch[device]:
            return None
        running = self.running[device]
        assert running is not None
        self.running[device] = None
        self._begin(device, at)
        return BatchFinished(device, running[0], running[3], at)

    def kill(self, device: int, at: float) -> list[ExecutorEvent]:
        lost = [self.running[device], *self.waiting[device]]
        self.running[device], self.waiting[device] = None, []
        self.epoch[device] += 1
        failed = [BatchFinished(device, r[0], at, at, "killed") for r in lost if r is not None]
        return [DeviceDown(device, "killed"), *failed]


def arena(capacity: int = 512) -> Arena:
    config = ModelConfig(
        "m", "onnx", Path("."), (TensorSpec("x", "FP32", (-1, 2)),),
        (TensorSpec("y", "FP32", (-1, 2)),), 2, 12.0,
    )  # fmt: skip
    return Arena.create(config, capacity=capacity)


def test_the_simulator_and_the_live_pipeline_driver_make_the_same_decisions() -> None:
    times, faults = scenario()
    simulated = Recording(PPipeScheduler(layout()))
    trace = run_pipeline_simulation(
        simulated,  # type: ignore[arg-type]
        ["m"],
        times,
        np.zeros(len(times), dtype=np.int32),
        jitter=JITTER,
        seed=SEED,
        faults=[InstanceFault(at, device, up) for at, device, up in faults],
    )

    live = Recording(PPipeScheduler(layout()))
    clock, timer, slots = FakeClock(), FakeTimer(), arena()
    executors = StageExecutors(live.core.layout, {"first": 0, "second": 1})
    model = PipelineModel("m", slots, {(0, 1): "first", (1, 2): "second"})
    futures: list[asyncio.Future] = []

    async def drive() -> None:
        driver = PipelineDriver(
            live,  # type: ignore[arg-type]
            {"m": model},
            executors,  # type: ignore[arg-type]
            clock=clock,
            timer_factory=lambda: timer,
        )
        inf = float("inf")
        i = j = 0
        while True:
            # The simulator's order at equal times: stage ends, faults, the
            # core's timer, arrivals.
            t_event = executors.events[0][0] if executors.events else inf
            t_fault = faults[j][0] if j < len(faults) else inf
            t_timer = timer.when if timer.when is not None else inf
            t_arrival = float(times[i]) if i < len(times) else inf
            now = min(t_event, t_fault, t_timer, t_arrival)
            if now == inf:
                break
            clock.now = executors.now = now
            if t_event == now:
                event = executors.pop()
                if event is not None:
                    driver.post(event)
            elif t_fault == now:
                _, device, up = faults[j]
                j += 1
                for event in [DeviceUp(device, 0.05)] if up else executors.kill(device, now):
                    driver.post(event)
            elif t_timer == now:
                timer.fire()
            else:
                i += 1
                futures.append(driver.submit("m", {"x": np.full((1, 2), i, np.float32)}))
        assert driver.pending == {}

    try:
        asyncio.run(drive())
        free = slots.free_slots
    finally:
        slots.close_and_unlink()

    assert live.log == simulated.log
    calls = {entry[0] for entry in live.log}
    assert {"add_request", "stage_finished", "stage_failed", "advance", "device_down"} <= calls
    assert "device_up" in calls
    decided = [d[0] for entry in live.log for d in entry[3]]
    assert decided.count("start") > 90 and decided.count("complete") > 40
    # Late work was shed at a hand-over, and instance 1's failure re-routed.
    dropped = [d for entry in live.log for d in entry[3] if d[0] == "drop"]
    assert any(reason == "deadline" for _, reason, _ in dropped)
    assert [d for entry in live.log if entry[0] == "device_down" for d in entry[3]]
    # Every request answered exactly once, live as simulated. Late answers
    # remain only where a last stage itself ran long (σ = 0.25 jitter).
    assert all(f.done() for f in futures) and len(futures) == len(times)
    status = trace.status.tolist()
    served_live = sum(1 for f in futures if f.exception() is None)
    assert served_live == status.count(GOOD) + status.count(LATE)
    assert status.count(DROPPED) == len(times) - served_live
    assert status.count(LATE) <= 0.05 * len(times)
    assert free == 512


# ------------------------------------------------------------ handing over


def two_stage(*, lead: float = 0.0, hold: int = 1, slo: float = 10.0) -> PPipeScheduler:
    """Stage 0 (1 s) on instance 0, stage 1 (2 s) on instances 1 and 2, one
    node, batch 1."""
    plan = make_layout([((1.0,), (0.0,), [0]), ((2.0,), (0.0,), [0, 0])], slo=slo, batch=1, nodes=1)
    return PPipeScheduler(plan, admit_floor=0.0, lead=lead, hold=hold)


def starts(decisions: list[Any]) -> list[tuple[int, int, int, float]]:
    return [
        (d.batch.id, d.stage, d.device, d.start_at) for d in decisions if isinstance(d, StageStart)
    ]


def test_an_instance_holds_the_next_stage_while_it_runs_one_with_hold_2() -> None:
    core = two_stage(lead=0.5, hold=2)
    first = core.add_request(Request(1, "m", 0.0, 10.0), 0.0)
    assert starts(first) == [(1, 0, 0, 0.0)]
    # The second batch is reserved on instance 0 at 1 s: handed over at
    # 0.5 s (the lead), while the first still runs there.
    assert starts(core.add_request(Request(2, "m", 0.1, 10.1), 0.1)) == []
    assert core.next_wakeup() == pytest.approx(0.5)
    assert starts(core.advance(0.5)) == [(2, 0, 0, 1.0)]
    # A third is reserved at 2 s, but instance 0 holds two: it waits for a report.
    assert starts(core.add_request(Request(3, "m", 0.2, 10.2), 1.6)) == []
    run = next(d.run for d in first if isinstance(d, StageStart))
    out = core.stage_finished(1, 0, 0.0, 1.0, 1.6, run=run)
    assert starts(out) == [(1, 1, 1, 1.0), (3, 0, 0, 2.0)]  # from 1 s: as soon as free


def test_a_batch_that_fell_behind_is_dropped_when_its_next_stage_is_due() -> None:
    core = two_stage(slo=4.0)
    (start,) = [
        d for d in core.add_request(Request(1, "m", 0.0, 4.0), 0.0) if isinstance(d, StageStart)
    ]
    # Planned: stage 0 over [0, 1), stage 1 over [1, 3) — ends by 4. Stage 0
    # ran 2.5 s instead: stage 1 would end at 4.5 > 4.
    out = core.stage_finished(1, 0, 0.0, 2.5, 2.5, run=start.run)
    assert [(type(d), getattr(d, "reason", None)) for d in out] == [(Drop, DropReason.DEADLINE)]
    assert core.in_flight == {}
    assert all(len(t) == 0 for t in core.device_tables[1:])  # its stage 1 given back
    assert core.next_wakeup() is None


def test_only_the_requests_that_cannot_make_it_are_dropped_from_a_batch() -> None:
    plan = make_layout(
        [((1.0, 1.5), (0.0, 0.0), [0]), ((2.0, 3.0), (0.0, 0.0), [0])], slo=10.0, batch=2, nodes=1
    )
    core = PPipeScheduler(plan, admit_floor=0.0)
    core.add_request(Request(1, "m", 0.0, 5.0), 0.0)
    out = core.add_request(Request(2, "m", 0.0, 9.0), 0.0)
    (start,) = [d for d in out if isinstance(d, StageStart)]
    assert start.batch.size == 2  # [0, 1.5) then [1.5, 4.5)
    # Stage 0 ends at 3: stage 1 of two would end at 6 — past request 1's 5,
    # within request 2's 9. Request 1 is dropped; request 2 goes on alone.
    out = core.stage_finished(start.batch.id, 0, 0.0, 3.0, 3.0, run=start.run)
    assert [(d.reason, [r.id for r in d.requests]) for d in out if isinstance(d, Drop)] == [
        (DropReason.DEADLINE, [1])
    ]
    (nxt,) = [d for d in out if isinstance(d, StageStart)]
    assert nxt.batch.size == 1 and [r.id for r in nxt.batch.requests] == [2]
    done = core.stage_finished(start.batch.id, 1, 3.0, 5.0, 5.0, run=nxt.run)
    assert [[r.id for r in d.requests] for d in done if isinstance(d, PipelineComplete)] == [[2]]


def test_a_report_of_a_replaced_route_is_ignored_and_a_failed_stage_drops_its_batch() -> None:
    core = two_stage(slo=20.0)
    (start,) = starts(core.add_request(Request(1, "m", 0.0, 20.0), 0.0))
    run0 = next(
        d.run
        for d in core.stage_finished(1, 0, 0.0, 1.0, 1.0)  # a caller that drives stages by hand
        if isinstance(d, StageStart)
    )
    # Instance 1 (its stage 1) fails: re-routed to instance 2.
    rerouted = core.device_down(1, 1.5)
    assert [d.batch.stages[1].device for d in rerouted if isinstance(d, PipelineDispatch)] == [2]
    new = next(d for d in rerouted if isinstance(d, StageStart))
    assert new.device == 2 and new.run != run0
    # The lost run's failure report is stale: nothing happens.
    assert core.stage_failed(1, 1, 1.6, run=run0) == []
    # The new route's stage fails on its executor: the batch is dropped.
    out = core.stage_failed(1, 1, 2.0, run=new.run)
    assert [(d.reason, [r.id for r in d.requests]) for d in out] == [
        (DropReason.DEVICE_FAILED, [1])
    ]
    assert core.in_flight == {} and all(len(t) == 0 for t in core.device_tables)
    assert start == (1, 0, 0, 0.0)


def test_the_projection_times_stages_by_how_they_ran_lately() -> None:
    core = two_stage(slo=10.0)
    # Batch 1 runs both stages at twice their profile (1 s → 2 s, 2 s → 4 s).
    (start,) = starts(core.add_request(Request(1, "m", 0.0, 10.0), 0.0))
    out = core.stage_finished(1, 0, 0.0, 2.0, 2.0)
    (second,) = [d for d in out if isinstance(d, StageStart)]
    assert core.stage_finished(1, 1, 2.0, 6.0, 6.0, run=second.run) != []
    # Batch 2 is admitted on the profile (ends by 3 s of 3.5 s), but stage 0
    # ran 1.5 s: stage 1 at its pace (1 + 0.1 × (2 − 1) = 1.1 → 2.2 s, plus
    # one spread) cannot end by 3.5 s: dropped when due.
    assert starts(core.add_request(Request(2, "m", 6.0, 9.5), 6.0)) == [(2, 0, 0, 6.0)]
    out = core.stage_finished(2, 0, 6.0, 7.5, 7.5)
    assert [(type(d), getattr(d, "reason", None)) for d in out] == [(Drop, DropReason.DEADLINE)]
    # On the profile alone it would have made it: 7.5 + 2 ≤ 9.5.
    fresh = two_stage(slo=10.0)
    starts(fresh.add_request(Request(2, "m", 6.0, 9.5), 6.0))
    assert starts(fresh.stage_finished(1, 0, 6.0, 7.5, 7.5)) == [(1, 1, 1, 7.5)]
    assert start == (1, 0, 0, 0.0)
