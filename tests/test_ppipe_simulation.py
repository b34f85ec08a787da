"""The pooled-pipeline simulator driving the `ppipe` data plane."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.planning.ppipe.plan import read_reference_plan
from app.planning.ppipe.profiles import BUNDLED_DIR, load_profile
from app.scheduling.ppipe import PPipeScheduler
from app.simulation.pipeline_engine import (
    DROPPED,
    GOOD,
    PENDING,
    InstanceFault,
    run_pipeline_simulation,
)
from app.simulation.ppipe_run import BurstShape, plan_arrivals, simulate_plan
from tests.test_ppipe_dataplane import make_layout


def two_stage(slo: float = 10.0) -> PPipeScheduler:
    # Stage 0 on one instance (node 0): 1 s; transfer 0.5 s; stage 1 on two
    # instances (nodes 1, 2): 2 s. Batch size 1.
    layout = make_layout(
        [((1.0,), (0.0,), [0]), ((2.0,), (0.5,), [1, 2])], slo=slo, batch=1, nodes=3
    )
    return PPipeScheduler(layout, admit_floor=0.0)


def test_batches_run_as_reserved_without_jitter() -> None:
    core = two_stage()
    times = np.array([0.0, 0.0, 0.0])
    trace = run_pipeline_simulation(core, ["m"], times, np.zeros(3, dtype=np.int32))
    assert trace.status.tolist() == [GOOD] * 3
    # Stage 0 serialises them (0–1, 1–2, 2–3); each transfer takes 0.5 s;
    # stage 1 alternates between its two instances: ends 3.5, 4.5, 5.5.
    assert trace.finish.tolist() == [3.5, 4.5, 5.5]
    assert trace.device_busy.tolist() == [3.0, 4.0, 2.0]
    assert trace.batches == 3


def test_stage_times_can_be_drawn_from_measured_runs() -> None:
    """With `stage_ratios`, each stage takes its profile × a ratio drawn
    from its class's measured runs: all 1.5 here, so stage 0 takes 1.5 s
    and stage 1 takes 3 s."""
    core = two_stage()
    times = np.array([0.0, 0.0, 0.0])
    trace = run_pipeline_simulation(
        core, ["m"], times, np.zeros(3, dtype=np.int32), stage_ratios={"G": [1.5, 1.5]}
    )
    assert trace.status.tolist() == [GOOD] * 3
    # Stage 0: 0–1.5, 1.5–3, 3–4.5; transfer 0.5 s; stage 1 takes 3 s.
    assert trace.finish.tolist() == pytest.approx([5.0, 6.5, 8.0])
    assert trace.device_busy.tolist() == pytest.approx([4.5, 6.0, 3.0])


def test_jitter_is_corrected_by_reports_and_every_request_answered_once() -> None:
    core = two_stage(slo=6.0)
    rng = np.random.default_rng(3)
    times = np.sort(rng.uniform(0.0, 40.0, 40))
    trace = run_pipeline_simulation(
        core, ["m"], times, np.zeros(40, dtype=np.int32), jitter=0.3, seed=1
    )
    assert PENDING not in trace.status.tolist()
    assert (trace.status == GOOD).sum() + (trace.status == DROPPED).sum() <= 40
    assert core.in_flight == {}
    assert all(len(t) == 0 for t in core.device_tables)


def test_a_device_fault_reroutes_and_answers_every_request_once() -> None:
    core = two_stage(slo=20.0)
    times = np.arange(0.0, 10.0, 0.5)
    trace = run_pipeline_simulation(
        core,
        ["m"],
        times,
        np.zeros(len(times), dtype=np.int32),
        faults=(InstanceFault(3.2, 1), InstanceFault(8.0, 1, up=True)),
    )
    assert PENDING not in trace.status.tolist()
    assert core.in_flight == {}
    # While instance 1 is down, instance 2 serves stage 1 alone.
    assert trace.device_busy[2] > trace.device_busy[1]


def test_bursty_arrivals_keep_the_mean_rate() -> None:
    times, index, names = plan_arrivals(
        {"a": 200.0, "b": 100.0}, 20.0, process="bursty", seed=2, burst=BurstShape(0.5, 0.1)
    )
    counts = np.bincount(index, minlength=2)
    assert names == ["a", "b"]
    assert counts[0] / 20.0 == pytest.approx(200.0, rel=0.1)
    assert counts[1] / 20.0 == pytest.approx(100.0, rel=0.1)
    assert np.all(np.diff(times) >= 0)


def test_a_reference_plan_at_half_load_is_served_within_slo() -> None:
    path = next((BUNDLED_DIR / "plans-maf19").glob("*L4-T4*_v4.json"))
    plan = read_reference_plan(Path(path))
    profiles = {m.name: load_profile(m.name) for m in plan.models}
    result = simulate_plan(plan, profiles, 0.5, duration_s=1.0, seed=4)
    for name, fraction in result.within_slo.items():
        assert fraction >= 0.99, name
        assert result.requests[name] == pytest.approx(0.5 * plan.models[0].throughput, rel=0.5)
    assert set(result.utilisation) == {"L4", "T4"}
    assert 0.0 < result.utilisation["T4"] < result.utilisation["L4"] < 1.0
    assert result.batches > 0 and 1.0 <= result.probes_per_batch < 10.0


def test_temporal_utilisation_counts_a_device_busy_when_any_share_runs() -> None:
    from app.scheduling.ppipe import DeviceInstance, Layout
    from app.simulation.ppipe_run import class_utilisation

    # Two half-shares of physical device 0 and one idle whole device 1.
    devices = (
        DeviceInstance(0, "G", 2, 0, 0),
        DeviceInstance(1, "G", 2, 0, 0),
        DeviceInstance(2, "G", 1, 1, 0),
    )
    layout = Layout(devices, 1, (), {}, {"G": 2})
    temporal, weighted = class_utilisation(layout, [[(0.0, 4.0)], [(2.0, 6.0)], []], 10.0)
    assert temporal == {"G": pytest.approx(6.0 / 20.0)}  # [0, 6) of 2 devices × 10 s
    assert weighted == {"G": pytest.approx(4.0 / 20.0)}  # (4 + 4) / 2 of 20
