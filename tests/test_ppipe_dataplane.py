"""The PPipe data plane on virtual time: reservation tables, probe/reserve on
the example of ppipe.txt Figure 5, Step 2's batch-size descent, dropping the
oldest request, waiting until the last moment, feedback correction and
re-routing on a device failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.planning.ppipe.layout import build_layout, reference_devices_per_node
from app.planning.ppipe.plan import read_reference_plan
from app.planning.ppipe.profiles import BUNDLED_DIR, load_profile
from app.scheduling.ppipe import (
    DeviceInstance,
    Layout,
    PipelineComplete,
    PipelineDispatch,
    PoolPipeline,
    PoolStage,
    PPipeScheduler,
    ReservationTable,
    StageStart,
    TransferStart,
    earliest_common_slot,
)
from app.scheduling.types import Drop, DropReason, Request

MS = 1e-3


class PlanOnly(PPipeScheduler):
    """The core's planning decisions only: these tests check Algorithm 1,
    the reservations and re-routing; handing the stages over is
    tests/test_ppipe_sequencing.py's."""

    def _take(self) -> list:
        return [d for d in super()._take() if not isinstance(d, StageStart | TransferStart)]


def make_layout(
    stages: list[tuple[tuple[float, ...], tuple[float, ...], list[int]]],
    *,
    slo: float,
    batch: int,
    nodes: int,
    handoff: float = 0.0,
) -> Layout:
    """One model "m", one pipeline; each stage is (latency per batch size,
    transfer in per batch size, the nodes of its instances)."""
    devices: list[DeviceInstance] = []
    pool_stages = []
    for k, (latency, transfer, on_nodes) in enumerate(stages):
        ids = []
        for node in on_nodes:
            devices.append(DeviceInstance(len(devices), "G", 1, len(devices), node))
            ids.append(devices[-1].id)
        pool_stages.append(
            PoolStage(k, k + 1, "G", 1, tuple(ids), latency, transfer, frozenset(on_nodes))
        )
    pipeline = PoolPipeline(0, "m", batch, tuple(pool_stages), 100.0, handoff)
    return Layout(tuple(devices), nodes, (pipeline,), {"m": slo}, {"G": len(devices)})


def request(i: int, at: float, slo: float) -> Request:
    return Request(i, "m", at, at + slo)


# ---------------------------------------------------------------- tables


def test_earliest_slot_uses_gaps_between_reservations() -> None:
    table = ReservationTable()
    table.reserve(1.0, 2.0, "a")
    table.reserve(4.0, 6.0, "b")
    assert table.earliest_slot(0.0, 1.0) == 0.0  # fits before "a"
    assert table.earliest_slot(0.0, 1.5) == 2.0  # the gap [2, 4)
    assert table.earliest_slot(0.0, 2.5) == 6.0  # only after "b"
    assert table.earliest_slot(1.5, 0.5) == 2.0
    assert table.earliest_slot(7.0, 3.0) == 7.0
    with pytest.raises(ValueError, match="overlaps"):
        table.reserve(5.0, 7.0, "c")


def test_common_slot_needs_both_links_free_together() -> None:
    up, down = ReservationTable("up"), ReservationTable("down")
    up.reserve(0.0, 3.0, "x")
    down.reserve(3.0, 5.0, "y")
    down.reserve(6.0, 8.0, "z")
    assert earliest_common_slot((up, down), 0.0, 1.0) == 5.0
    assert earliest_common_slot((up, down), 0.0, 2.0) == 8.0


def test_correct_moves_the_reservations_a_late_report_overlaps() -> None:
    table = ReservationTable()
    table.reserve(0.0, 1.0, "a")
    table.reserve(1.0, 2.0, "b")
    table.reserve(2.5, 3.0, "c")
    table.reserve(5.0, 6.0, "d")
    moved = table.correct("a", 0.2, 1.8)  # started late, ran long
    assert moved == [("b", 1.8, 2.8), ("c", 2.8, 3.3)]
    assert table.intervals() == [
        (0.2, 1.8, "a"), (1.8, 2.8, "b"), (2.8, 3.3, "c"), (5.0, 6.0, "d"),
    ]  # fmt: skip
    table.prune(2.8)
    assert [o for _, _, o in table.intervals()] == ["c", "d"]


# ---------------------------------------------------------------- Figure 5


def figure5() -> PlanOnly:
    """Figure 5: partition 1 on one GPU (node 0), partition 2 on two GPUs
    (nodes 1 and 2). Stage 1 takes 10 ms (t1), the transfer 2 ms (t2),
    stage 2 5 ms (t3). Node 1's downlink is taken over [10, 13) ms; the GPU
    on node 2 is busy until 22 ms."""
    layout = make_layout(
        [((10 * MS,), (0.0,), [0]), ((5 * MS,), (2 * MS,), [1, 2])],
        slo=100 * MS,
        batch=1,
        nodes=3,
    )
    core = PlanOnly(layout, admit_floor=0.0)
    core.downlinks[1].reserve(10 * MS, 13 * MS, "other")
    core.device_tables[2].reserve(5 * MS, 22 * MS, "other")
    return core


def test_probe_picks_the_gpu_that_finishes_first_figure5() -> None:
    core = figure5()
    found = core._probe(core.layout.pipelines[0], 1, 0.0)
    assert found is not None
    first, second = found.steps
    assert (first.device, first.start, first.finish) == (0, 0.0, pytest.approx(10 * MS))
    # Node 1: the transfer waits for its downlink (13 ms), the GPU is free:
    # ends at 20 ms. Node 2 would transfer at 10 ms but its GPU is busy until
    # 22 ms: 27 ms. probe() takes node 1.
    assert second.device == 1
    assert second.transfer_start == pytest.approx(13 * MS)
    assert second.transfer_finish == pytest.approx(15 * MS)
    assert (second.start, second.finish) == (pytest.approx(15 * MS), pytest.approx(20 * MS))
    assert found.finish == pytest.approx(20 * MS)
    assert found.wait == pytest.approx(3 * MS)  # 20 − (10 + 2 + 5)


def test_reserve_marks_every_interval_of_the_path_figure5() -> None:
    core = figure5()
    (decision,) = core.add_request(request(1, 0.0, 100 * MS), 0.0)
    assert isinstance(decision, PipelineDispatch)
    batch = decision.batch
    owner0, owner1 = (batch.id, 0), (batch.id, 1)
    assert core.device_tables[0].interval_of(owner0) == (0.0, pytest.approx(10 * MS))
    assert core.uplinks[0].interval_of(owner1) == (pytest.approx(13 * MS), pytest.approx(15 * MS))
    assert core.downlinks[1].interval_of(owner1) == (
        pytest.approx(13 * MS), pytest.approx(15 * MS),
    )  # fmt: skip
    assert core.device_tables[1].interval_of(owner1) == (
        pytest.approx(15 * MS), pytest.approx(20 * MS),
    )  # fmt: skip
    # A second batch now finds GPU 0 busy until 10 ms.
    found = core._probe(core.layout.pipelines[0], 1, 0.0)
    assert found is not None and found.steps[0].start == pytest.approx(10 * MS)


# ---------------------------------------------------------------- Step 2, drop, wait

LAT = (1.0, 2.0, 3.5, 4.0)  # seconds at batch 1..4: round numbers for the test


def single_stage(admit_floor: float) -> PPipeScheduler:
    layout = make_layout([(LAT, (0.0,) * 4, [0])], slo=8.0, batch=4, nodes=1)
    core = PlanOnly(layout, admit_floor=admit_floor)
    core.device_tables[0].reserve(0.0, 5.0, "busy")  # the device is free from 5 s
    return core


def test_step2_lowers_the_batch_size_until_the_oldest_deadline_holds() -> None:
    core = single_stage(admit_floor=0.0)
    # Deadline 8: batch 4 would end at 9, batch 3 at 8.5, batch 2 at 7.
    assert core.add_request(request(1, 0.0, 8.0), 0.0) == []
    assert core.probes == 3  # step 1 at 4; step 2 reuses it, then 3 and 2
    # One request queued, batch 2 found: wait. The last moment a batch of 2
    # could still start is 8 − ℓ(2) = 6.
    assert core.next_wakeup() == pytest.approx(6.0)
    (decision,) = core.add_request(request(2, 0.1, 8.0), 0.1)
    assert isinstance(decision, PipelineDispatch)
    run = decision.batch.stages[0]
    assert decision.batch.size == 2
    assert (run.start, run.finish) == (5.0, 7.0)
    assert core.next_wakeup() == 5.0  # no more waiting; its stage is due at its start


def test_arrivals_below_the_size_found_do_not_probe_again() -> None:
    layout = make_layout([(LAT, (0.0,) * 4, [0])], slo=8.0, batch=4, nodes=1)
    core = PlanOnly(layout, admit_floor=0.0)
    assert core.add_request(request(1, 0.0, 8.0), 0.0) == []  # batch 4 fits: wait for 4
    probes = core.probes
    assert core.add_request(request(2, 0.5, 8.0), 0.5) == []
    assert core.add_request(request(3, 0.6, 8.0), 0.6) == []
    assert core.probes == probes
    (decision,) = core.add_request(request(4, 0.7, 8.0), 0.7)
    assert isinstance(decision, PipelineDispatch) and decision.batch.size == 4


def test_waits_until_the_last_moment_then_sends_what_is_queued() -> None:
    core = single_stage(admit_floor=0.0)
    assert core.add_request(request(1, 0.0, 8.0), 0.0) == []
    assert core.next_wakeup() == pytest.approx(6.0)
    assert core.advance(5.9) == []  # not due yet
    (decision,) = core.advance(6.0)
    # At 6 s a batch of 2 would end at 8 (still on time) but only one
    # request is queued and 8 − ℓ(2) is now: it goes alone, 6 → 7.
    assert isinstance(decision, PipelineDispatch)
    assert decision.batch.size == 1
    assert (decision.batch.stages[0].start, decision.batch.stages[0].finish) == (6.0, 7.0)


def test_drops_the_oldest_when_not_even_a_batch_of_one_fits() -> None:
    core = single_stage(admit_floor=0.0)
    core.device_tables[0].reserve(5.0, 10.0, "busy too")  # free from 10 s
    decisions = core.add_request(request(1, 0.0, 8.0), 0.0)
    assert len(decisions) == 1 and isinstance(decisions[0], Drop)
    assert decisions[0].reason is DropReason.DEADLINE
    assert [r.id for r in decisions[0].requests] == [1]
    assert not core.models["m"].queue


def test_admission_at_the_head_drops_what_only_a_small_batch_could_serve() -> None:
    # The authors' rule (admit_floor 0.95): a new head must fit in a batch of
    # round(0.95 × 4) = 4; here only 2 does, so it is dropped at once.
    core = single_stage(admit_floor=0.95)
    (decision,) = core.add_request(request(1, 0.0, 8.0), 0.0)
    assert isinstance(decision, Drop) and decision.reason is DropReason.DEADLINE
    # With an idle device batch 4 fits (ends at 4 ≤ 8): admitted, then waits.
    core.device_tables[0].release("busy")
    assert core.add_request(request(2, 1.0, 8.0), 1.0) == []
    assert core.next_wakeup() == pytest.approx(7.0)  # deadline 9 − ℓ(2)


def test_a_request_of_more_items_than_the_planned_batch_runs_whole() -> None:
    # Planned batch 1; a request of 3 items needs a batch of 3 (3.5 s on the
    # idle device): it goes at once, never split and never in a batch of 1.
    layout = make_layout([(LAT, (0.0,) * 4, [0])], slo=8.0, batch=1, nodes=1)
    core = PlanOnly(layout)
    (decision,) = core.add_request(Request(1, "m", 0.0, 8.0, items=3), 0.0)
    assert isinstance(decision, PipelineDispatch) and decision.batch.size == 3
    assert decision.batch.stages[0].finish == pytest.approx(3.5)
    # Five items: more than any batch the profile covers (4).
    (drop,) = core.add_request(Request(2, "m", 0.1, 8.1, items=5), 0.1)
    assert isinstance(drop, Drop) and drop.reason is DropReason.NOT_SERVED
    assert not core.models["m"].queue


def test_a_hand_over_delays_each_later_stage_and_counts_as_work() -> None:
    # Two stages of 1 s at batch 1 on one node, 0.25 s to hand over: the
    # second starts 0.25 s after the first ends; the path has no waiting.
    layout = make_layout(
        [(LAT, (0.0,) * 4, [0]), (LAT, (0.0,) * 4, [0])], slo=8.0, batch=1, nodes=1, handoff=0.25
    )
    assert layout.pipelines[0].work(1) == pytest.approx(2.25)
    core = PlanOnly(layout)
    (decision,) = core.add_request(request(1, 0.0, 8.0), 0.0)
    assert isinstance(decision, PipelineDispatch)
    first, second = decision.batch.stages
    assert (first.start, first.finish, second.start, second.finish) == pytest.approx(
        (0.0, 1.0, 1.25, 2.25)
    )
    found = PlanOnly(layout)._probe(layout.pipelines[0], 1, 0.0)
    assert found is not None and found.wait == pytest.approx(0.0)


# ---------------------------------------------------------------- feedback correction


def test_a_late_stage_report_moves_the_next_reservation() -> None:
    layout = make_layout([((1.0,), (0.0,), [0])], slo=10.0, batch=1, nodes=1)
    core = PlanOnly(layout, admit_floor=0.0)
    (first,) = core.add_request(request(1, 0.0, 10.0), 0.0)
    (second,) = core.add_request(request(2, 0.0, 10.0), 0.0)
    assert isinstance(first, PipelineDispatch) and isinstance(second, PipelineDispatch)
    assert (second.batch.stages[0].start, second.batch.stages[0].finish) == (1.0, 2.0)
    # The first batch ran 0.5 s longer than its profile.
    (done,) = core.stage_finished(first.batch.id, 0, 0.0, 1.5, 1.5)
    assert isinstance(done, PipelineComplete) and [r.id for r in done.requests] == [1]
    owner = (second.batch.id, 0)
    assert core.device_tables[0].interval_of(owner) == (1.5, 2.5)
    assert (second.batch.stages[0].start, second.batch.stages[0].finish) == (1.5, 2.5)
    # A third batch is planned after the moved one.
    (third,) = core.add_request(request(3, 1.5, 10.0), 1.5)
    assert isinstance(third, PipelineDispatch)
    assert third.batch.stages[0].start == 2.5
    # The same report again changes nothing and answers nothing.
    assert core.stage_finished(first.batch.id, 0, 0.0, 1.5, 1.6) == []


# ---------------------------------------------------------------- device failure


def two_pools() -> PPipeScheduler:
    layout = make_layout(
        [((1.0,), (0.0,), [0]), ((1.0,), (0.5,), [1, 2])], slo=10.0, batch=1, nodes=3
    )
    return PlanOnly(layout, admit_floor=0.0)


def test_device_down_reroutes_its_batches_exactly_once() -> None:
    core = two_pools()
    (decision,) = core.add_request(request(1, 0.0, 10.0), 0.0)
    assert isinstance(decision, PipelineDispatch)
    batch = decision.batch
    assert batch.stages[1].device == 1  # the first instance that meets the bound
    assert core.stage_finished(batch.id, 0, 0.0, 1.0, 1.0) == []
    (rerouted,) = core.device_down(1, 1.2)
    assert isinstance(rerouted, PipelineDispatch)
    assert rerouted.batch is batch and rerouted.from_stage == 1
    stage = batch.stages[1]
    # From node 0 to node 2 at 1.2 (0.5 s), then 1 s on instance 2.
    assert stage.device == 2
    assert (stage.transfer_start, stage.start, stage.finish) == (1.2, 1.7, 2.7)
    assert core.device_tables[1].intervals() == []
    # A late report from the failed route is ignored; the new one completes.
    assert core.stage_finished(batch.id, 1, 1.5, 2.0, 2.0, device=1) == []
    (done,) = core.stage_finished(batch.id, 1, 1.7, 2.7, 2.7, device=2)
    assert isinstance(done, PipelineComplete) and [r.id for r in done.requests] == [1]
    assert core.stage_finished(batch.id, 1, 1.7, 2.7, 2.8, device=2) == []
    assert core.device_down(1, 3.0) == []  # already down


def test_device_down_drops_a_batch_that_can_no_longer_make_it_once() -> None:
    core = two_pools()
    (decision,) = core.add_request(request(1, 0.0, 2.6), 0.0)
    assert isinstance(decision, PipelineDispatch)
    batch = decision.batch
    core.stage_finished(batch.id, 0, 0.0, 1.0, 1.0)
    (dropped,) = core.device_down(1, 1.2)  # re-routed it would end at 2.7 > 2.6
    assert isinstance(dropped, Drop) and dropped.reason is DropReason.DEVICE_FAILED
    assert [r.id for r in dropped.requests] == [1]
    assert core.stage_finished(batch.id, 1, 1.5, 2.5, 2.5) == []
    assert core.in_flight == {}


def test_a_failed_first_pool_sends_new_batches_nowhere_else_and_drops_them() -> None:
    core = two_pools()
    assert core.device_down(0, 0.0) == []
    (decision,) = core.add_request(request(1, 0.1, 10.0), 0.1)
    assert isinstance(decision, Drop) and decision.reason is DropReason.NOT_SERVED
    assert core.device_up(0, 0.2) == []
    (decision,) = core.add_request(request(2, 0.3, 10.0), 0.3)
    assert isinstance(decision, PipelineDispatch)


# ---------------------------------------------------------------- layout from a plan


def test_layout_of_a_reference_plan_lays_shares_and_nodes() -> None:
    path = next((BUNDLED_DIR / "plans-maf19").glob("*L4-T4*_v4.json"))
    plan = read_reference_plan(Path(path))
    profiles = {m.name: load_profile(m.name) for m in plan.models}
    per_node = reference_devices_per_node(plan)
    assert per_node == {"L4": 4, "T4": 2}
    layout = build_layout(plan, profiles, devices_per_node=per_node)
    assert len(layout.devices) == sum(s.devices for p in plan.pipelines for s in p.stages)
    physical: dict[str, set[int]] = {"L4": set(), "T4": set()}
    for d in layout.devices:
        physical[d.device_class].add(d.physical)
        # Nodes: L4 on nodes 0..6 (4 a node), T4 after them (2 a node).
        if d.device_class == "L4":
            assert d.node == d.physical // 4
        else:
            assert d.node == 7 + d.physical // 2
    used = plan.devices_used()
    for cls in physical:
        assert len(physical[cls]) == pytest.approx(used[cls], abs=len(plan.pipelines))
    for pool, planned in zip(layout.pipelines, plan.pipelines, strict=True):
        for stage, source in zip(pool.stages, planned.stages, strict=True):
            assert stage.latency[planned.batch - 1] == pytest.approx(source.latency_s, abs=1e-6)
        assert pool.stages[1].transfer_in[planned.batch - 1] == pytest.approx(
            planned.stages[0].transfer_s, rel=1e-6
        )
