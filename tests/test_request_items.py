"""Requests with several items, for every policy, on the simulator's virtual clock.

The model: ℓ(b) = 10 + b ms (b in items), max_batch 8. A request carries
`items` rows; the core counts them toward the batch size, never splits a
request, and drops one that cannot finish in time even alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.results import DROP_REASONS, Outcome
from app.scheduling import DropReason, make_scheduler, policy_names
from app.scheduling.queue import DeadlineQueue
from app.scheduling.types import Request
from app.simulation.engine import Trace, run_simulation
from tests.fakes import devices, dispatches, drops, model

POLICIES = policy_names()
# Policies that run a request whatever its deadline (the batchers of Triton,
# Gpulet, InSS and Clipper): nothing is refused for lateness before it runs.
DEADLINE_UNAWARE = ("triton", "gpulet", "inss", "clipper")
GOOD, DROPPED, LATE = int(Outcome.GOOD), int(Outcome.DROPPED), int(Outcome.LATE)


def simulate(
    policy: str, times: list[float], items: list[int], *, slo_ms: float, n_devices: int = 1
) -> Trace:
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=slo_ms, max_batch=8)
    devs = devices(n_devices)
    scheduler = make_scheduler(policy, [info], devs)
    return run_simulation(
        scheduler,
        [info],
        devs,
        np.array(times),
        np.zeros(len(times), dtype=int),
        items=np.array(items),
    )


def test_every_policy_is_covered() -> None:
    assert sorted(POLICIES) == sorted(
        [
            "symphony",
            "symphony-wc",
            "flex",
            "flex-np",
            "clockwork",
            "nexus",
            "triton",
            "gpulet",
            "inss",
            "clipper",
            "orloj",
        ]
    )


# policy → (largest batch in items, requests good, dropped, late, batches,
# items in good requests) for the mixed load below: overloaded (2,500 items/s
# offered, at most 2 × 8/18 ms ≈ 889 items/s served), so every policy drops.
MIXED = {
    "symphony": (8, 134, 106, 0, 37, 288),
    "symphony-wc": (8, 122, 118, 0, 38, 288),
    "flex": (8, 121, 119, 0, 38, 289),
    "flex-np": (8, 123, 117, 0, 38, 287),
    "clockwork": (8, 113, 127, 0, 48, 183),
    "nexus": (8, 156, 84, 0, 36, 264),
    "triton": (7, 33, 148, 59, 46, 79),
    "gpulet": (7, 34, 147, 59, 45, 80),
    "inss": (7, 45, 131, 64, 42, 101),  # drops what cannot end in time even alone
    "clipper": (6, 30, 153, 57, 46, 70),
    "orloj": (8, 113, 127, 0, 48, 183),
}


@pytest.mark.parametrize("policy", POLICIES)
def test_mixed_load_batches_never_exceed_max_items(policy: str) -> None:
    # 240 requests, one every 1 ms, sizes 1, 3, 1, 5, ... : 600 items in 240 ms
    # on 2 devices, SLO 100 ms. Every batch stays within 8 items.
    sizes = [1, 3, 1, 5] * 60
    times = [i * 0.001 for i in range(len(sizes))]
    trace = simulate(policy, times, sizes, slo_ms=100.0, n_devices=2)
    assert trace.items is not None and int(trace.items.sum()) == 600
    answered = trace.status != int(Outcome.PENDING)
    assert answered.all()  # each answered once (the engine raises on twice)
    served = trace.status != DROPPED
    assert int(served.sum()) > 0
    # A served request ran whole: its batch holds at least its own items.
    assert (trace.batch_size[served] >= trace.items[served]).all()
    assert int(trace.batch_size.max()) <= 8
    # Batches count items: some batch is larger than the requests in it
    # could be at one item each (a batch holding a 5-item request has ≥ 5).
    assert int(trace.batch_size[served & (trace.items == 5)].min()) >= 5
    good = trace.status == GOOD
    assert (
        int(trace.batch_size.max()),
        int(good.sum()),
        int((trace.status == DROPPED).sum()),
        int((trace.status == LATE).sum()),
        trace.batches,
        int(trace.items[good].sum()),
    ) == MIXED[policy]


@pytest.mark.parametrize("policy", POLICIES)
def test_big_request_is_kept_whole(policy: str) -> None:
    # One request of 6 items alone, SLO 100 ms: one batch of 6 items,
    # ℓ(6) = 16 ms, answered in time.
    trace = simulate(policy, [0.0], [6], slo_ms=100.0)
    assert trace.status.tolist() == [GOOD]
    assert trace.batch_size.tolist() == [6]
    assert trace.batches == 1
    assert trace.finish[0] - trace.start[0] == pytest.approx(0.016)


@pytest.mark.parametrize("policy", POLICIES)
def test_big_request_and_small_ones_share_a_batch_in_items(policy: str) -> None:
    # 6 items then two 1-item requests at the same instant: 8 items fit one
    # batch of the max; a third 1-item request would take it to 9.
    trace = simulate(policy, [0.0, 0.0, 0.0, 0.0], [6, 1, 1, 1], slo_ms=200.0)
    assert (trace.status == GOOD).all()
    assert int(trace.batch_size.max()) <= 8
    assert trace.batch_size[0] >= 6


@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in DEADLINE_UNAWARE])
def test_request_too_large_for_its_time_is_dropped_not_split(policy: str) -> None:
    # SLO 16 ms: ℓ(8) = 18 ms cannot make it, ℓ(1) = 11 ms can. The 8-item
    # request is dropped (DEADLINE) whole; the 1-item one is served alone.
    trace = simulate(policy, [0.0, 0.0], [8, 1], slo_ms=16.0)
    assert trace.status.tolist() == [DROPPED, GOOD]
    assert DROP_REASONS[int(trace.drop_reason[0])] is DropReason.DEADLINE
    assert trace.finish[0] <= 0.016  # answered before its deadline passed
    assert trace.batch_size.tolist() == [0, 1]
    assert trace.batches == 1


def test_triton_runs_a_request_too_large_for_its_time_whole_and_late() -> None:
    # Triton's batcher is deadline-unaware by design: it runs the 8-item
    # request, whole, and it finishes late (18 ms > 16 ms).
    trace = simulate("triton", [0.0], [8], slo_ms=16.0)
    assert trace.status.tolist() == [LATE]
    assert trace.batch_size.tolist() == [8]
    assert trace.finish[0] == pytest.approx(0.018)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p not in DEADLINE_UNAWARE])
def test_request_that_became_too_large_while_waiting_is_dropped(policy: str) -> None:
    # SLO 30 ms. 8 items at 0 run 0–18 ms. 4 items at 1 ms (due at 31 ms,
    # ℓ(4) = 14 ms) must start by 17 ms, the device is busy until 18 ms:
    # dropped (DEADLINE) just after 17 ms, whole, never split to fit.
    trace = simulate(policy, [0.0, 0.001], [8, 4], slo_ms=30.0)
    assert trace.status.tolist() == [GOOD, DROPPED]
    assert DROP_REASONS[int(trace.drop_reason[1])] is DropReason.DEADLINE
    assert trace.finish.tolist() == pytest.approx([0.018, 0.017])
    assert trace.batch_size.tolist() == [8, 0]


def test_triton_serves_the_waiting_request_late() -> None:
    trace = simulate("triton", [0.0, 0.001], [8, 4], slo_ms=30.0)
    assert trace.status.tolist() == [GOOD, LATE]
    assert trace.finish.tolist() == pytest.approx([0.018, 0.032])  # 18 + ℓ(4) = 32 ms
    assert trace.batch_size.tolist() == [8, 4]


def test_clipper_runs_a_request_too_large_for_its_time_late_and_drops_one_past_its_deadline():
    # Clipper knows no latencies: the 8-item request goes alone (above the
    # initial cap of 1) and ends at 18 ms, late; the 1-item one waits behind
    # it and is dropped when its deadline passes, at 16 ms.
    trace = simulate("clipper", [0.0, 0.0], [8, 1], slo_ms=16.0)
    assert trace.status.tolist() == [LATE, DROPPED]
    assert DROP_REASONS[int(trace.drop_reason[1])] is DropReason.DEADLINE
    assert trace.finish.tolist() == pytest.approx([0.018, 0.016])
    assert trace.batch_size.tolist() == [8, 0]


def test_clipper_serves_the_waiting_request_late() -> None:
    # Its deadline (31 ms) has not passed when the device frees at 18 ms.
    trace = simulate("clipper", [0.0, 0.001], [8, 4], slo_ms=30.0)
    assert trace.status.tolist() == [GOOD, LATE]
    assert trace.finish.tolist() == pytest.approx([0.018, 0.032])
    assert trace.batch_size.tolist() == [8, 4]


@pytest.mark.parametrize("policy", POLICIES)
def test_request_above_the_model_max_is_refused_at_admission(policy: str) -> None:
    info = model(max_batch=8)
    scheduler = make_scheduler(policy, [info], devices(1))
    decisions = scheduler.add_request(Request(1, info.name, 0.0, 1.0, items=9), 0.0)
    assert not dispatches(decisions)
    (drop,) = drops(decisions)
    assert drop.reason is DropReason.OVERLOADED
    assert [r.items for r in drop.requests] == [9]


def test_request_items_must_be_positive() -> None:
    with pytest.raises(ValueError, match="items must be ≥ 1, got 0"):
        Request(1, "m", 0.0, 1.0, items=0)


def test_deadline_queue_counts_items_and_selects_whole_requests() -> None:
    queue = DeadlineQueue(
        [Request(i, "m", 0.0, 1.0 + i, items=n) for i, n in enumerate([2, 5, 1, 3])]
    )
    assert len(queue) == 4
    assert queue.items == 11
    assert not queue.uniform
    # Budget 6: 2 fits, 5 does not (skipped, not split), 1 and 3 fit.
    assert queue.select(6) == [0, 2, 3]
    assert queue.prefix(6) == 1  # in order, stopping at the 5
    assert queue.batch(1) == [0]  # the head goes, alone, even above the budget
    assert [r.items for r in queue.pop_positions([0, 2])] == [2, 1]
    assert queue.items == 8
    assert queue.items_of([0, 1]) == 8


def test_batch_size_counts_items() -> None:
    info = model(max_batch=8)
    scheduler = make_scheduler("clockwork", [info], devices(1))
    (dispatch,) = dispatches(scheduler.add_request(Request(1, info.name, 0.0, 1.0, items=4), 0.0))
    assert dispatch.batch.size == 4
    assert len(dispatch.batch.requests) == 1
    # ℓ(4) = 10 + 4 ms
    assert dispatch.batch.finish_at - dispatch.batch.start_at == pytest.approx(0.014)


# ------------------------------------------------------------ workloads with item sizes


def _workload(items=None, model_items=None, max_batch: int = 8):
    from app.workloads.spec import parse_workload

    model = {"name": "m", "profile": {"alpha_ms": 1.0, "beta_ms": 10.0}, "rate": 300}
    if model_items is not None:
        model["items"] = model_items
    doc = {"duration_s": 10, "seed": 5, "devices": 2, "max_batch": max_batch, "slo_ms": 100}
    if items is not None:
        doc["items"] = items
    doc["models"] = [model]
    return parse_workload(doc, Path("."), source="wl.yaml")


def test_workload_items_one_size_and_a_distribution():
    from app.workloads.arrivals import generate_arrivals

    fixed = _workload(items=4)
    assert fixed.models[0].items.sizes == (4,)
    # The core plans with items/s: 300 requests/s × 4 items.
    assert fixed.model_infos()[0].expected_rate == 1200.0
    mixed = _workload(model_items={1: 0.7, 4: 0.3})
    assert mixed.models[0].items.mean == pytest.approx(1.9)
    arrivals = generate_arrivals(mixed)
    plain = generate_arrivals(_workload())
    # Sizes come from a stream of their own: the arrival times do not move.
    np.testing.assert_array_equal(arrivals.times, plain.times)
    assert plain.items is not None and set(plain.items.tolist()) == {1}
    assert arrivals.items is not None and len(arrivals.items) == len(arrivals) == 3023
    assert int((arrivals.items == 4).sum()) == 888  # ≈ 30 % of 3023
    assert set(arrivals.items.tolist()) == {1, 4}


@pytest.mark.parametrize(
    ("top", "model", "message"),
    [
        (0, None, "wl.yaml: items: an item count must be ≥ 1, got 0"),
        (None, 9, "wl.yaml: models[0] (m).items: requests of 9 items exceed max_batch 8"),
        (None, {1: 0.5, 2: 0.4}, "models[0] (m).items: probabilities must sum to 1, got 0.9"),
        (None, {0: 1.0}, "item counts must be integers ≥ 1, got 0"),
        (None, {1: -0.5, 2: 1.5}, "items[1]: must be a probability ≥ 0, got -0.5"),
        (None, "four", "must be an item count (e.g. 4) or a mapping {count: probability}"),
        (None, {1: "x"}, "items[1]: must be a probability, got 'x'"),
        ({1: 0.5, 16: 0.5}, None, "wl.yaml: items: requests of 16 items exceed max_batch 8"),
    ],
)
def test_workload_items_errors_name_the_field(top, model, message):
    with pytest.raises(ValueError) as err:
        _workload(items=top, model_items=model)
    assert message in str(err.value)


def test_simulator_carries_request_sizes_and_counts_goodput_in_requests():
    from app.simulation.run import simulate as simulate_workload

    workload = _workload(model_items={1: 0.5, 3: 0.5})
    result = simulate_workload(workload, "symphony")
    trace = result.trace
    assert trace.items is not None
    assert int(trace.items.sum()) == 6005 and len(trace.items) == 3023
    served = trace.status != DROPPED
    assert int(trace.batch_size.max()) <= 8
    assert (trace.batch_size[served] >= trace.items[served]).all()
    overall = result.summary["overall"]
    # 300 requests/s × 2 items on 2 devices: all served in time
    assert int((trace.status == GOOD).sum()) == 3023
    assert overall["requests"] == 3023  # requests, not items
    assert overall["goodput_rps"] == pytest.approx(302.3)  # requests/s, not items/s
    # in items; 7.112 under §4.3's hold as written (symphony's hold="frontrun"):
    # the bounded hold sends a batch once the rate cannot fill it further
    assert overall["mean_batch_size"] == pytest.approx(6.037, abs=1e-3)


def test_the_live_load_generator_refuses_sizes_it_cannot_send():
    from bench.loadgen.run import LoadGenError, run_schedule

    with pytest.raises(LoadGenError, match=r"models \['m'\] have request sizes"):
        run_schedule(_workload(items=2), 1.0, None, 10**6, None)
