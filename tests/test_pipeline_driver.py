"""The live driver of the `ppipe` data plane (app/server/pipeline_driver.py)
on a fake clock with fake executors: stages handed over in order, each only
once the one before has reported; completion, drops, stage errors and
device failures, every request answered exactly once and its slots freed
only when no executor can touch them. Also the executors' emulated
slowdown, and (slow) real executors serving the chain model cut in two."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from app.errors import Dropped, ExecutorFailed
from app.planning.ppipe.layout import build_layout
from app.planning.ppipe.plan import Cluster, ModelTarget, Pipeline, Plan, Stage
from app.planning.ppipe.profiles import BlockProfile
from app.repository.config import ModelConfig, TensorSpec
from app.runtime.arena import Arena
from app.runtime.events import BatchFinished, DeviceDown
from app.runtime.executor import Executor
from app.runtime.messages import Ran
from app.scheduling.ppipe import PPipeScheduler
from app.server.pipeline_driver import PipelineDriver
from app.server.pipeline_types import PipelineModel
from tests.fakes_live import FakeClock, FakeTimer

MS = 0.001
# 4 blocks; a block takes b ms at batch b on `fast`, 3·b ms on `slow`.
PROFILE = BlockProfile(
    "m",
    {
        ("fast", 1): np.array([[MS * b for b in (1, 2)]] * 4),
        ("slow", 1): np.array([[3 * MS * b for b in (1, 2)]] * 4),
    },
    np.array([16.0, 16.0, 16.0]),
)
FIRST, SECOND = "m.blocks0-2", "m.blocks2-4"


def plan(slo_s: float = 0.1) -> Plan:
    """fast [0, 2) on instance 0 → slow [2, 4) on instances 1 and 2, batch 2;
    the bandwidth of shared memory (transfers take ~0)."""
    stages = (Stage(0, 2, "fast", 1, 1, 4 * MS), Stage(2, 4, "slow", 1, 2, 12 * MS))
    return Plan(
        Cluster({"fast": 1, "slow": 2}, bandwidth_gbps=1e6, devices_per_node=4),
        (ModelTarget("m", 1.0, slo_s, 250.0),),
        (Pipeline("m", 2, stages, 250.0),),
    )


def arena() -> Arena:
    spec = TensorSpec("x", "FP32", (-1, 4))
    config = ModelConfig(
        "m", "onnx", Path("."), (spec,), (TensorSpec("y", "FP32", (-1, 4)),), 2, 100.0
    )
    return Arena.create(config, capacity=8)


class Executors:
    """Records the stage runs handed over; `refuse`: devices that raise."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, int, str, list[int], float]] = []
        self.refuse: set[int] = set()

    def submit(self, device_id, batch_id, model, slots, start_at) -> None:
        if device_id in self.refuse:
            raise ExecutorFailed(f"executor {device_id} is not running")
        self.runs.append((device_id, batch_id, model, list(slots), start_at))


def driver(slo_s: float = 0.1):
    clock, timer, executors, slots = FakeClock(), FakeTimer(), Executors(), arena()
    core = PPipeScheduler(build_layout(plan(slo_s), {"m": PROFILE}))
    model = PipelineModel("m", slots, {(0, 2): FIRST, (2, 4): SECOND})
    live = PipelineDriver(core, {"m": model}, executors, clock=clock, timer_factory=lambda: timer)
    return live, core, executors, clock, timer, slots


def x(value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), value, np.float32)}


def finish(live, slots, run, started, finished, *, error=None, clock=None) -> None:
    """The executor of `run` reports it; a last stage writes y = 2x first."""
    device, run_id, model, rows, _ = run
    if model == SECOND and error is None:
        slots.scatter("y", rows, 2 * slots.gather("x", rows))
    if clock is not None:
        clock.now = finished
    live.post(BatchFinished(device, run_id, started, finished, error))


def test_stages_run_in_order_and_the_answers_come_from_the_arena():
    async def scenario() -> None:
        live, core, executors, clock, timer, slots = driver()
        first = live.submit("m", x(1.0))
        assert executors.runs == [] and timer.when is not None  # waits for a second request
        clock.now = 0.001
        second = live.submit("m", x(2.0))
        ((device, _, model, rows, start_at),) = executors.runs
        assert (device, model, len(rows), start_at) == (0, FIRST, 2, 0.001)
        # Stage 1 waits for stage 0's report: it reads what stage 0 wrote.
        finish(live, slots, executors.runs[0], 0.001, 0.005, clock=clock)
        assert len(executors.runs) == 2
        device, _, model, rows2, start_at = executors.runs[1]
        assert (device in (1, 2), model, rows2) == (True, SECOND, rows)
        assert start_at == pytest.approx(0.005)  # the transfer: 32 bytes of shared memory
        assert core.in_flight[1].stages[0].done
        finish(live, slots, executors.runs[1], 0.005, 0.017, clock=clock)
        answers = [first.result(), second.result()]
        assert [a.outputs["y"][0, 0] for a in answers] == [2.0, 4.0]
        assert {(a.batch_id, a.batch_size, a.devices[0], a.finished_at) for a in answers} == {
            (1, 2, 0, 0.017)
        }
        assert core.in_flight == {} and live.pending == {}
        assert slots.free_slots == 8  # both requests' slots are free again
        counts = live.counts
        assert (counts.submitted, counts.answered, counts.failed, counts.stage_runs) == (2, 2, 0, 2)
        assert counts.stage_batches == {"0.0": 1, "0.1": 1}
        assert counts.stage_seconds == pytest.approx({"0.0": 0.004, "0.1": 0.012})
        # Both took their planned time (2 blocks at batch 2: 4 and 12 ms).
        assert counts.stage_ratio_sum == pytest.approx({"0.0": 1.0, "0.1": 1.0})
        assert counts.stage_ratio_squares == pytest.approx({"0.0": 1.0, "0.1": 1.0})
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_a_stage_is_handed_over_only_a_lead_before_its_reserved_start():
    async def scenario() -> None:
        live, _, executors, clock, timer, slots = driver()
        assert live.lead_s == pytest.approx(0.001)  # half the shortest stage, at most 1 ms
        live.submit("m", x(1.0))
        live.submit("m", x(2.0))
        # Stage 0 ends 2 ms early: stage 1 is reserved at 4 ms, handed over at 3 ms.
        finish(live, slots, executors.runs[0], 0.0, 0.002, clock=clock)
        assert len(executors.runs) == 1 and timer.when == pytest.approx(0.003)
        clock.now = 0.003
        timer.fire()
        assert len(executors.runs) == 2 and executors.runs[1][4] == pytest.approx(0.004)
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_the_next_stage_is_handed_over_while_the_instance_still_runs_one():
    async def scenario() -> None:
        live, _, executors, clock, timer, slots = driver()
        for value in (1.0, 2.0, 3.0, 4.0):  # two batches of two, back to back on instance 0
            live.submit("m", x(value))
        assert [(r[0], r[4]) for r in executors.runs] == [(0, 0.0)]
        # At 3 ms (4 ms − the 1 ms lead) the second batch goes to instance 0
        # while the first still runs there: no round trip between them.
        assert timer.when == pytest.approx(0.003)
        clock.now = 0.003
        timer.fire()
        assert [(r[0], r[4]) for r in executors.runs] == [(0, 0.0), (0, pytest.approx(0.004))]
        # A third is not handed over before one of the two is reported.
        for value in (5.0, 6.0):
            live.submit("m", x(value))
        assert len([r for r in executors.runs if r[0] == 0]) == 2
        finish(live, slots, executors.runs[0], 0.0, 0.004, clock=clock)
        assert timer.when == pytest.approx(0.007)  # the third batch's lead
        clock.now = 0.007
        timer.fire()
        assert [r[4] for r in executors.runs if r[0] == 0] == pytest.approx([0.0, 0.004, 0.008])
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_a_request_that_cannot_make_its_slo_is_dropped_and_its_slot_freed():
    async def scenario() -> None:
        live, _, executors, _, _, slots = driver()
        future = live.submit("m", x(1.0), slo_s=0.005)  # below one pass through the stages
        with pytest.raises(Dropped, match="deadline"):
            future.result()
        assert executors.runs == [] and slots.free_slots == 8 and live.pending == {}
        assert live.counts.dropped == {"deadline": 1}
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_a_failed_stage_fails_its_batch_once_and_returns_its_reservations():
    async def scenario() -> None:
        live, core, executors, clock, _, slots = driver()
        futures = [live.submit("m", x(v)) for v in (1.0, 2.0)]
        finish(live, slots, executors.runs[0], 0.0, 0.004, error="boom", clock=clock)
        for future in futures:
            with pytest.raises(ExecutorFailed, match="stage 0 of its batch failed: boom"):
                future.result()
        assert len(executors.runs) == 1  # stage 1 never ran
        assert core.in_flight == {} and slots.free_slots == 8
        assert all(len(t) == 0 for t in core.device_tables[1:])
        assert (live.counts.answered, live.counts.failed, live.counts.stage_errors) == (2, 2, 1)
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_a_device_failure_reroutes_the_stage_and_ignores_the_old_report():
    async def scenario() -> None:
        live, _, executors, clock, _, slots = driver()
        futures = [live.submit("m", x(v)) for v in (1.0, 2.0)]
        finish(live, slots, executors.runs[0], 0.0, 0.004, clock=clock)
        dead, old_run, _, rows, _ = executors.runs[1]
        other = 3 - dead  # the other slow instance
        clock.now = 0.006
        # The pool's order: DeviceDown first, then the lost run's report.
        live.post(DeviceDown(dead, "killed"))
        live.post(BatchFinished(dead, old_run, 0.006, 0.006, "executor died"))
        assert live.counts.rerouted == 1
        device, _, model, rerows, start_at = executors.runs[2]
        assert (device, model, rerows) == (other, SECOND, rows)
        assert start_at == pytest.approx(0.006)
        assert not futures[0].done()
        finish(live, slots, executors.runs[2], 0.006, 0.018, clock=clock)
        assert [f.result().outputs["y"][0, 0] for f in futures] == [2.0, 4.0]
        assert [f.result().devices for f in futures] == [(0, other)] * 2
        assert live.pending == {} and slots.free_slots == 8
        assert (live.counts.answered, live.counts.failed) == (2, 0)
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_an_instance_whose_stage_is_overdue_is_routed_around_before_the_heartbeat():
    """Issue 42, item 10: a SIGSTOPped stage kept its traffic until the pool's
    heartbeat timeout (0.8 s) killed it, though the class had a healthy
    instance."""

    async def scenario() -> None:
        live, core, executors, clock, timer, slots = driver(slo_s=1.0)
        futures = [live.submit("m", x(v)) for v in (1.0, 2.0)]
        finish(live, slots, executors.runs[0], 0.0, 0.004, clock=clock)
        stuck, _, _, rows, start = executors.runs[1]
        other = 3 - stuck
        # 4 × its planned 12 ms + 0.1 s after its start; nothing before.
        assert timer.when == pytest.approx(start + 4 * 0.012 + 0.1)
        clock.now = timer.when - 0.001
        assert live.counts.overdue == 0 and core.alive[stuck]
        clock.now = timer.when
        timer.fire()
        assert live.counts.overdue == 1 and live.counts.rerouted == 1
        assert not core.alive[stuck]
        device, _, model, rerows, _ = executors.runs[2]
        assert (device, model, rerows) == (other, SECOND, rows)
        finish(live, slots, executors.runs[2], clock.now, clock.now + 0.012, clock=clock)
        assert [f.result().outputs["y"][0, 0] for f in futures] == [2.0, 4.0]
        assert [f.result().devices for f in futures] == [(0, other)] * 2
        # The stopped one goes on (SIGCONT): its late report is ignored, and
        # it is back in the routes.
        finish(live, slots, executors.runs[1], start, clock.now + 0.001, clock=clock)
        assert core.alive[stuck]
        assert (live.counts.answered, live.counts.failed) == (2, 0)
        assert live.pending == {} and slots.free_slots == 8
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_a_batch_no_pool_can_take_is_dropped_once_its_slots_kept_until_its_run_ends():
    async def scenario() -> None:
        live, _, executors, clock, _, slots = driver()
        futures = [live.submit("m", x(v)) for v in (1.0, 2.0)]
        finish(live, slots, executors.runs[0], 0.0, 0.004, clock=clock)
        running, run_id, *_ = executors.runs[1]
        clock.now = 0.005
        live.post(DeviceDown(3 - running, "killed"))  # the idle slow instance
        live.post(DeviceDown(running, "killed"))  # and the busy one: no slow pool left
        for future in futures:
            with pytest.raises(Dropped, match="its device failed"):
                future.result()
        assert live.counts.dropped == {"device_failed": 2} and live.pending == {}
        # Its run may still write into the slots: they stay taken until it is reported.
        assert slots.free_slots == 6
        live.post(BatchFinished(running, run_id, 0.005, 0.005, "executor died"))
        assert slots.free_slots == 8 and len(executors.runs) == 2
        # Reports of a batch the core no longer knows answer nobody twice.
        live.post(BatchFinished(running, run_id, 0.005, 0.005, None))
        assert live.counts.answered == 2
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_a_refused_stage_waits_for_the_device_failure_that_follows():
    """An executor that is gone refuses the run; the pool's DeviceDown for it
    is handled first, and the batch is re-routed, not failed."""

    async def scenario() -> None:
        live, core, executors, clock, _, slots = driver()
        futures = [live.submit("m", x(v)) for v in (1.0, 2.0)]
        planned = core.in_flight[1].stages[1].device
        executors.refuse.add(planned)
        original = executors.submit

        def submit(device_id, *args) -> None:
            if device_id in executors.refuse:
                live.post(DeviceDown(device_id, "gone"))  # the pool notices on send
            original(device_id, *args)

        executors.submit = submit  # type: ignore[method-assign]
        finish(live, slots, executors.runs[0], 0.0, 0.004, clock=clock)
        ((device, _, model, _, _),) = executors.runs[1:]
        assert (device, model) == (3 - planned, SECOND)
        finish(live, slots, executors.runs[1], 0.004, 0.016, clock=clock)
        assert [f.result().outputs["y"][0, 0] for f in futures] == [2.0, 4.0]
        assert slots.free_slots == 8 and live.counts.rerouted == 1
        slots.close_and_unlink()

    asyncio.run(scenario())


def test_the_driver_refuses_a_layout_its_partitions_do_not_cover():
    core = PPipeScheduler(build_layout(plan(), {"m": PROFILE}))
    model = PipelineModel("m", None, {(0, 2): FIRST})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"runs blocks \[2, 4\), which no partition holds"):
        PipelineDriver(core, {"m": model}, Executors())
    with pytest.raises(ValueError, match="has no pipeline model"):
        PipelineDriver(core, {}, Executors())


# ----------------------------------------------------------- emulated slowdown


def test_an_executor_with_a_slowdown_holds_each_batch_that_many_times_its_compute(monkeypatch):
    config = ModelConfig(
        "m",
        "onnx",
        Path("."),
        (TensorSpec("x", "FP32", (-1, 4)),),
        (TensorSpec("y", "FP32", (-1, 4)),),
        4,
        100.0,
    )
    slots = Arena.create(config, capacity=2)
    try:
        sent: list = []

        class Conn:
            def send(self, msg) -> None:
                sent.append(msg)

        class Doubling:
            def run(self, inputs):
                import time

                begun = time.process_time()
                while time.process_time() - begun < 0.005:  # 5 ms of compute
                    pass
                return {"y": 2 * inputs["x"]}

        executor = Executor(Conn(), {"name": "slow:0", "kind": "cpu", "slowdown": 3.0})
        executor.backends["m"], executor.arenas["m"] = Doubling(), slots
        holds: list[float] = []
        monkeypatch.setattr(executor, "_wait_until", holds.append)
        rows = [slots.acquire()]
        slots.write_inputs(rows[0], {"x": np.ones(4, np.float32)})
        import time

        cpu_before = time.process_time()
        executor.run(5, "m", rows, 0.0)
        cpu_used = time.process_time() - cpu_before
        (reply,) = sent
        assert isinstance(reply, Ran) and reply.error is None
        assert slots.read_outputs(rows[0])["y"][0, 0] == 2.0
        start_at, until = holds  # the wait for its start, then the hold
        assert start_at == 0.0
        start = reply.started_at
        # start + 3 × its compute: at least the run's 5 ms of CPU time, at
        # most the process's CPU time over the whole run (the executor reads
        # the process's CPU clock; other threads of this test process count)
        assert start + 3 * 0.005 <= until <= start + 3 * cpu_used + 1e-6
        with pytest.raises(ValueError, match="slowdown must be ≥ 1"):
            from app.runtime.devices import ExecutorDevice

            ExecutorDevice(0, "cpu", "cpu:0", slowdown=0.5)
    finally:
        slots.close_and_unlink()


# ------------------------------------------------------------ real executors


@pytest.mark.slow
def test_real_executors_of_two_classes_answer_as_the_uncut_model(tmp_path):
    from app.repository.block_profile import DeviceClass, profile_blocks
    from app.repository.chain_model import build_chain
    from app.repository.partition import (
        group_segments,
        load_model,
        partition_by_runtime,
        run,
        segments,
        session,
        synthetic_inputs,
    )
    from app.server.pipeline_setup import LivePipelines, wait_answered
    from tests.fakes import our_segments

    whole = load_model(build_chain(blocks=4, width=8, size=8))
    pieces = segments(whole, "chain")
    chain = group_segments(pieces, partition_by_runtime([1.0] * pieces.blocks, 6))
    classes = {"fast": DeviceClass("fast", 1), "slow": DeviceClass("slow", 1, 2.0)}
    profile = profile_blocks(chain, list(classes.values()), max_batch=2, warmup=0, repeats=1)
    stages = (Stage(0, 3, "fast", 1, 1, 0.0), Stage(3, chain.blocks, "slow", 1, 2, 0.0))
    cut_plan = Plan(
        Cluster({"fast": 1, "slow": 2}, bandwidth_gbps=1e6, devices_per_node=4),
        (ModelTarget("chain", 1.0, 2.0, 1.0),),
        (Pipeline("chain", 2, stages, 1.0),),
    )
    core = PPipeScheduler(build_layout(cut_plan, {"chain": profile}))
    inputs = synthetic_inputs(whole, 6, seed=3)["input"]
    want = run(session(whole), {"input": inputs})["output"]

    async def scenario() -> list:
        live = LivePipelines(core, {"chain": chain}, classes, tmp_path, capacity=8)
        await live.start()
        try:
            futures = [live.driver.submit("chain", {"input": inputs[i : i + 1]}) for i in range(6)]
            assert await wait_answered(live.driver, 60.0)
            return [f.result() for f in futures]
        finally:
            await live.stop()

    answers = asyncio.run(scenario())
    got = np.concatenate([a.outputs["output"] for a in answers])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert {a.devices[0] for a in answers} == {0} and {a.devices[1] for a in answers} <= {1, 2}
    assert our_segments() == []
