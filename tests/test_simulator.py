"""The discrete-event simulator driving every policy on the same arrivals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.scheduling import policy_names
from app.simulation.engine import DROPPED, GOOD, LATE
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload, parse_workload

WORKLOADS = Path(__file__).resolve().parent.parent / "bench" / "workloads"
DEADLINE_AWARE = ["symphony", "symphony-wc", "flex", "flex-np", "clockwork", "nexus", "orloj"]


def bursty_mix(duration_s: float = 2.0, jitter: float = 0.0):
    return parse_workload(
        {
            "name": "test-mix",
            "duration_s": duration_s,
            "seed": 7,
            "devices": 3,
            "jitter": jitter,
            "arrival": {"process": "gamma", "shape": 0.2},
            "models": [
                {
                    "name": "wide",
                    "profile": {"alpha_ms": 0.5, "beta_ms": 8.0},
                    "slo_ms": 30,
                    "max_batch": 32,
                    "rate": 900,
                },
                {
                    "name": "narrow",
                    "profile": {"alpha_ms": 3.0, "beta_ms": 1.0},
                    "slo_ms": 40,
                    "max_batch": 16,
                    "rate": 300,
                },
            ],
        },
        WORKLOADS,
    )


def test_every_policy_answers_every_request_once_and_deadline_aware_ones_never_late():
    workload = bursty_mix()
    arrivals = generate_arrivals(workload)
    assert len(arrivals) > 1500
    for policy in policy_names():
        result = simulate(workload, policy, arrivals=arrivals)
        overall = result.summary["overall"]
        # The engine raises if any request is unanswered or answered twice.
        assert overall["requests"] == len(arrivals)
        total = overall["slo_attainment"] + overall["drop_fraction"] + overall["late_fraction"]
        assert total == pytest.approx(1.0)
        if policy in DEADLINE_AWARE:
            assert overall["late_fraction"] == 0.0, policy
        assert overall["slo_attainment"] > 0.5, policy


def test_same_seed_same_run():
    workload = bursty_mix(1.0)
    first = simulate(workload, "symphony").trace
    second = simulate(workload, "symphony").trace
    assert np.array_equal(first.status, second.status)
    assert np.array_equal(first.finish, second.finish, equal_nan=True)


def test_jitter_makes_predictions_wrong_but_nothing_is_lost():
    workload = bursty_mix(1.0, jitter=0.3)
    result = simulate(workload, "symphony")
    trace = result.trace
    assert np.count_nonzero(trace.status == LATE) > 0  # runs overran their profile
    assert np.count_nonzero(trace.status == GOOD) > 0.5 * trace.status.size


def test_flex_preempts_in_simulation_and_beats_non_preemptive_at_slo_90():
    workload = load_workload(WORKLOADS / "shepherd-fig11a-slo90.yaml")
    arrivals = generate_arrivals(workload)
    arrivals = arrivals.select(arrivals.times < 1.2)
    flex = simulate(workload, "flex", arrivals=arrivals)
    flex_np = simulate(workload, "flex-np", arrivals=arrivals)
    assert flex.trace.preemptions > 0
    assert flex_np.trace.preemptions == 0
    assert flex.goodput > 2.0 * flex_np.goodput


def test_fig11a_slo_90_first_burst_is_the_papers_ratio_and_later_ones_are_not():
    """The analysis behind BENCHMARKS "Shepherd Figure 11(a)": a
    device finishes at most 128 + 128 + 102 = 358 of a burst of 1024 within
    90 ms. flex gets close on every burst. flex-np's first burst waits for
    B's first batch (started at t = 0) and keeps 57 (6.3×, the paper's 6.2×);
    after it, B's largest feasible batch (3 requests, 87.3 ms) plus one A
    batch of 128 (31.9 ms) fill the 120 ms period, so flex-np keeps one full
    batch of 128 per burst and the ratio settles near 2.6×."""
    workload = load_workload(WORKLOADS / "shepherd-fig11a-slo90.yaml")
    arrivals = generate_arrivals(workload)
    arrivals = arrivals.select(arrivals.times < 0.605)  # bursts at 5, 125, …, 485 ms
    stream_a = workload.models.index(next(m for m in workload.models if m.name == "resnet18"))

    def good_per_burst(policy: str) -> list[int]:
        trace = simulate(workload, policy, arrivals=arrivals).trace
        good_a = (trace.status == GOOD) & (trace.model_index == stream_a)
        burst = np.floor((trace.arrival - 0.005) / 0.120 + 1e-9).astype(int)
        return [int(np.count_nonzero(good_a & (burst == k))) for k in range(5)]

    flex, flex_np = good_per_burst("flex"), good_per_burst("flex-np")
    assert all(330 <= served <= 358 for served in flex), flex
    assert flex_np[0] <= 60 and flex[0] / flex_np[0] >= 5.8, (flex, flex_np)
    assert all(128 <= served <= 150 for served in flex_np[1:]), flex_np
    assert 2.2 <= sum(flex[1:]) / sum(flex_np[1:]) <= 2.9


def test_symphony_batches_near_the_staggered_size_on_table4_resnet50():
    workload = load_workload(WORKLOADS / "symphony-table4-resnet50.yaml")
    arrivals = generate_arrivals(workload, rate_scale=0.9)  # 4500 r/s
    arrivals = arrivals.select(arrivals.times < 2.0)
    result = simulate(workload, "symphony", arrivals=arrivals)
    overall = result.summary["overall"]
    assert overall["slo_attainment"] >= 0.99
    # Table 4: the staggered batch size for 8 devices is 16.
    assert 14.0 <= overall["mean_batch_size"] <= 17.0
    autoscale = result.autoscale
    assert 0.0 <= autoscale["idle_fraction"] <= 0.25
    assert autoscale["bad_rate"] < 0.01


# ------------------------------------------------------ the live serving path


def _live_a(rate_scale: float):
    workload = load_workload(WORKLOADS / "live-a-resnet50-emulated.yaml")
    arrivals = generate_arrivals(workload, rate_scale)
    arrivals = arrivals.select(arrivals.times < 5.0)
    return workload, arrivals


def test_deadline_margin_plans_early_and_is_judged_at_the_slo():
    """The core's `deadline_margin` (the daemon's DEADLINE_MARGIN_MS): each
    request is planned to finish 3 ms before its 25-ms SLO (without jitter
    it finishes there), which costs drops near capacity; requests are still
    judged at the SLO."""
    workload, arrivals = _live_a(2.4)
    direct = simulate(workload, "symphony", arrivals=arrivals)
    margin = simulate(workload, "symphony", {"deadline_margin": 0.003}, arrivals=arrivals)
    trace = margin.trace
    served = trace.status != DROPPED
    assert np.max(trace.finish[served] - trace.arrival[served]) <= 0.022 + 1e-9
    assert np.array_equal(trace.deadline, trace.arrival + 0.025)
    assert np.all(trace.status[served] == GOOD)
    assert direct.summary["overall"]["drop_fraction"] < 0.003
    assert margin.summary["overall"]["drop_fraction"] > 0.008


def test_intake_delay_is_timed_from_the_arrival():
    """The core sees each request after an exponential intake delay (mean
    1 ms here) but its SLO runs from its arrival: the trace is in arrival
    order, judged from the arrival, with more drops near capacity."""
    workload, arrivals = _live_a(2.4)
    direct = simulate(workload, "symphony", arrivals=arrivals)
    delayed = simulate(workload, "symphony", arrivals=arrivals, intake_delay_ms=1.0)
    trace = delayed.trace
    assert np.array_equal(trace.arrival, arrivals.times)
    assert np.array_equal(trace.model_index, arrivals.model_index)
    served = trace.status != DROPPED
    on_time = trace.finish[served] <= trace.arrival[served] + 0.025
    assert np.array_equal(trace.status[served] == GOOD, on_time)
    assert (
        delayed.summary["overall"]["drop_fraction"] > 2 * direct.summary["overall"]["drop_fraction"]
    )
    with pytest.raises(ValueError, match="intake_delay_ms"):
        simulate(workload, "symphony", arrivals=arrivals, intake_delay_ms=-1.0)


def test_timer_lead_forms_batches_early():
    """The core's `timer_lead` (the daemon's TIMER_LEAD_MS): every timer is
    handled 2 ms before it is due, so a batch holds only the requests that
    came by then: smaller batches, more drops near capacity, and every
    request served still ends by its planned deadline."""
    workload, arrivals = _live_a(2.2)
    plain = simulate(workload, "symphony", {"deadline_margin": 0.003}, arrivals=arrivals)
    lead = simulate(
        workload, "symphony", {"deadline_margin": 0.003, "timer_lead": 0.002}, arrivals=arrivals
    )
    for result in (plain, lead):
        served = result.trace.status != DROPPED
        assert np.max(result.trace.finish[served] - result.trace.arrival[served]) <= 0.022 + 1e-9
    plain_all, lead_all = plain.summary["overall"], lead.summary["overall"]
    assert lead_all["mean_batch_size"] < plain_all["mean_batch_size"] - 0.3
    assert lead_all["drop_fraction"] > plain_all["drop_fraction"] + 0.001
    with pytest.raises(ValueError, match="timer_lead"):
        simulate(workload, "symphony", {"timer_lead": float("nan")}, arrivals=arrivals)
