"""Symphony's rules (symphony.txt §4.3, App. C) on hand-made cases, driven on
the core's own virtual clock. Models declare an expected rate so that λ — and
with it βλ — is known from the first request."""

from __future__ import annotations

import pytest

from app.scheduling import DropReason, make_scheduler
from app.scheduling.symphony import SymphonyScheduler
from tests.fakes import devices, dispatches, drops, model, request


def feed(scheduler, info, times, slo_s=None):
    decisions = []
    for t in times:
        decisions += scheduler.add_request(request(info, t, slo_s), t)
    return decisions


def blocker(duration_ms: float):
    """A model that occupies a device for exactly `duration_ms`."""
    return model("blocker", alpha_ms=0.0, beta_ms=duration_ms, slo_ms=10_000.0)


def test_waits_for_frontrun_at_while_below_beta_lambda_even_with_idle_device():
    # §4.3's rule as written (hold="frontrun"):
    # ℓ(b) = b + 10 ms, SLO 50 ms, λ ≈ 1000/s ⇒ βλ ≈ 10. Five requests 1 ms
    # apart stay below βλ, so the candidate waits for
    # frontrun_at = dl − ℓ(6) = 50 − 16 = 34 ms although the device is idle.
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=50.0, expected_rate=1000.0)
    sched = make_scheduler("symphony", [info], devices(1), hold="frontrun")
    assert dispatches(feed(sched, info, [i * 0.001 for i in range(5)])) == []
    candidate = sched.candidates["m"]
    assert candidate.bs == 5
    assert candidate.exec_at == pytest.approx(0.034)
    assert candidate.invalid_after == pytest.approx(0.035)
    assert sched.next_wakeup() == pytest.approx(0.034)
    assert dispatches(sched.advance(0.0339)) == []
    (sent,) = dispatches(sched.advance(0.034))
    assert sent.batch.size == 5
    assert sent.batch.start_at == pytest.approx(0.034)
    # ℓ(5) = 15 ms: it finishes at 49 ms, before the head's deadline at 50 ms.
    assert sent.batch.finish_at == pytest.approx(0.049)


@pytest.mark.parametrize("slo_s", [60.0, 5.0, 1.0])
def test_a_bursts_last_requests_wait_at_most_what_the_rate_can_add(slo_s):
    """Issue 42, item 7: with §4.3's hold, the tail of a burst waited on an
    idle device until its deadline (60 s, 5 s, 1 s). Bounded: ℓ(b) = b + 10
    ms, λ ≈ 1000/s ⇒ βλ ≈ 10; five requests 1 ms apart (the last at 4 ms)
    lack 5 items, which the rate brings in 5 ms: they start at 9 ms."""
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=slo_s * 1000, expected_rate=1000.0)
    bounded = make_scheduler("symphony", [info], devices(1))
    assert dispatches(feed(bounded, info, [i * 0.001 for i in range(5)])) == []
    assert bounded.next_wakeup() == pytest.approx(0.009, abs=1e-4)  # λ as measured
    assert dispatches(bounded.advance(0.0088)) == []
    (sent,) = dispatches(bounded.advance(bounded.next_wakeup()))
    assert (sent.batch.size, sent.batch.start_at) == (5, pytest.approx(0.009, abs=1e-4))
    paper = make_scheduler("symphony", [info], devices(1), hold="frontrun")
    feed(paper, info, [i * 0.001 for i in range(5)])
    assert paper.next_wakeup() == pytest.approx(slo_s - 0.016)  # dl − ℓ(6)


def test_a_bounded_hold_is_counted_from_the_last_arrival():
    # Arrivals keep coming: each one moves the bound, and at βλ ≈ 9.5 the
    # batch goes at once, as under §4.3's rule. λ ≈ 950/s: 9 requests lack
    # 0.5 item, 0.5 ms at that rate after the last (at 8 ms).
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=50.0, expected_rate=950.0)
    sched = make_scheduler("symphony", [info], devices(1))
    assert dispatches(feed(sched, info, [i * 0.001 for i in range(9)])) == []
    assert sched.next_wakeup() == pytest.approx(0.0085, abs=1e-4)
    (sent,) = dispatches(feed(sched, info, [0.0083]))
    assert (sent.batch.size, sent.batch.start_at) == (10, pytest.approx(0.0083))


def test_dispatches_at_once_when_batch_reaches_beta_lambda():
    # β = 2 ms, λ ≈ 900/s ⇒ βλ ≈ 1.8: one request waits, two are schedulable.
    info = model(alpha_ms=1.0, beta_ms=2.0, slo_ms=50.0, expected_rate=900.0)
    sched = SymphonyScheduler([info], devices(1), hold="frontrun")
    assert dispatches(sched.add_request(request(info, 0.0), 0.0)) == []
    assert sched.candidates["m"].exec_at == pytest.approx(0.050 - 0.004)
    (sent,) = dispatches(sched.add_request(request(info, 0.001), 0.001))
    assert sent.batch.size == 2
    assert sent.batch.start_at == pytest.approx(0.001)


def test_work_conserving_variant_dispatches_as_soon_as_formed():
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=50.0, expected_rate=1000.0)
    sched = make_scheduler("symphony-wc", [info], devices(2))
    out = dispatches(feed(sched, info, [0.0, 0.001, 0.002]))
    # Two idle devices take one request each at once; the third waits.
    assert [(d.batch.size, d.batch.device, d.batch.start_at) for d in out] == [
        (1, 0, 0.0),
        (1, 1, 0.001),
    ]


def test_earliest_free_device_goes_to_the_candidate_with_earliest_exec_at():
    # ℓ(b) = 10·b + 10 ms. "a": SLO 100 ms, arrives at 1 ms → frontrun 71 ms,
    # invalid_after 81 ms. "b": SLO 95 ms, arrives at 2 ms → frontrun 67 ms,
    # invalid_after 77 ms. The device is busy until 75 ms, so both wait; at 75
    # ms the device goes to "b" (earlier exec_at), and "a", which can no longer
    # start by 81 ms, is dropped just after 81 ms.
    a = model("a", alpha_ms=10.0, beta_ms=10.0, slo_ms=100.0, expected_rate=1000.0)
    b = model("b", alpha_ms=10.0, beta_ms=10.0, slo_ms=95.0, expected_rate=1000.0)
    block = blocker(75.0)
    sched = SymphonyScheduler([a, b, block], devices(1), grant_by="exec_at", hold="frontrun")
    (busy,) = dispatches(sched.add_request(request(block, 0.0), 0.0))
    assert busy.batch.finish_at == pytest.approx(0.075)
    sched.add_request(request(a, 0.001), 0.001)
    sched.add_request(request(b, 0.002), 0.002)
    assert sched.candidates["a"].exec_at == pytest.approx(0.071)
    assert sched.candidates["b"].exec_at == pytest.approx(0.067)
    assert dispatches(sched.advance(0.072)) == []
    assert set(sched.waiting) == {"a", "b"}
    (granted,) = dispatches(sched.batch_finished(0, busy.batch.id, 0.075))
    assert granted.batch.model == "b"
    assert granted.batch.start_at == pytest.approx(0.075)
    assert sched.next_wakeup() == pytest.approx(0.081, abs=1e-6)
    (dropped,) = drops(sched.advance(sched.next_wakeup()))
    assert [r.model for r in dropped.requests] == ["a"]
    assert dropped.reason is DropReason.DEADLINE


@pytest.mark.parametrize(("grant_by", "served"), [("slack", {"x", "y"}), ("exec_at", {"x"})])
def test_freed_device_goes_to_the_candidate_with_least_slack(grant_by, served):
    # Both candidates are schedulable at once (λ ≈ 1/s ⇒ βλ < 1) and wait for a
    # device busy until 50 ms. "x" (ℓ(1) = 60 ms, SLO 200) arrived first but
    # can start as late as 141 ms; "y" (ℓ(1) = 11 ms, SLO 70) only until 61 ms.
    # Least slack first runs y at 50-61 ms and x at 61-121 ms: both make it.
    # App. C's earliest exec_at runs x first, and y is dropped.
    x = model("x", alpha_ms=50.0, beta_ms=10.0, slo_ms=200.0, expected_rate=1.0)
    y = model("y", alpha_ms=1.0, beta_ms=10.0, slo_ms=70.0, expected_rate=1.0)
    block = blocker(50.0)
    sched = SymphonyScheduler([x, y, block], devices(1), grant_by=grant_by)
    (busy,) = dispatches(sched.add_request(request(block, 0.0), 0.0))
    assert dispatches(sched.add_request(request(x, 0.001), 0.001)) == []
    assert dispatches(sched.add_request(request(y, 0.002), 0.002)) == []
    assert set(sched.waiting) == {"x", "y"}
    decisions = sched.batch_finished(0, busy.batch.id, 0.050)
    ran = {d.batch.model: d.batch for d in dispatches(decisions)}
    while (wake := sched.next_wakeup()) is not None:
        for batch in (d.batch for d in dispatches(sched.advance(wake))):
            ran[batch.model] = batch
        for batch in list(sched.in_flight.values()):
            for d in dispatches(sched.batch_finished(batch.device, batch.id, batch.finish_at)):
                ran[d.batch.model] = d.batch
    assert set(ran) == served
    assert all(b.finish_at <= min(r.deadline for r in b.requests) + 1e-12 for b in ran.values())


def test_drop_timer_answers_a_hopeless_request_before_its_deadline():
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=30.0, expected_rate=1000.0)
    block = blocker(50.0)
    sched = make_scheduler("symphony", [info, block], devices(1))
    (busy,) = dispatches(sched.add_request(request(block, 0.0), 0.0))
    # SLO 15 ms from 1 ms: it must start by 16 − ℓ(1) = 5 ms; the device is
    # busy until 50 ms. The model timer fires at frontrun 16 − 12 = 4 ms, the
    # candidate waits, and the drop timer answers it just after 5 ms — 11 ms
    # before its deadline.
    tight = request(info, 0.001, slo_s=0.015)
    assert sched.add_request(tight, 0.001) == []
    assert sched.next_wakeup() == pytest.approx(0.004)
    assert sched.advance(0.004) == []
    assert sched.next_wakeup() == pytest.approx(0.005, abs=1e-6)
    out = sched.advance(sched.next_wakeup())
    (dropped,) = drops(out)
    assert dropped.requests == [tight]
    assert dropped.reason is DropReason.DEADLINE
    assert dispatches(out) == []
    assert busy.batch.id in sched.in_flight


@pytest.mark.parametrize(
    ("pruning", "rate", "dropped_count", "batch_size", "left_queued"),
    [
        # Window: heads go until a batch of the remaining size fits: 10 (needs
        # 12 ms, head dl 20.5 ms) ✗, 9 (11 ms, 21.0) ✗, 8 (10 ms, 21.5) ✗, 7 (9 ms, 22.0) ✓.
        ("window", 20.0, 3, 7, 0),
        # Prefix (literal): nobody is dropped; the batch shrinks to what the
        # head allows: ℓ(b) ≤ 20.5 − 12 = 8.5 ms ⇒ b = 6; four stay queued.
        ("prefix", 900.0, 0, 6, 4),
        # Adaptive at λ ≈ 30/s: one device keeps up with batches of 1, so the
        # batch shrinks to 6 as with prefix and nobody is dropped.
        ("adaptive", 20.0, 0, 6, 4),
        # Adaptive at λ ≈ 900/s: only batches of b ≥ 18 (b/(b+2) ms ≥ 0.9/ms)
        # keep up, so a batch of 6 would not do: it drops like the window.
        ("adaptive", 900.0, 3, 7, 0),
    ],
)
def test_pruning_window_keeps_batch_size_prefix_shrinks_it(
    pruning, rate, dropped_count, batch_size, left_queued
):
    # ℓ(b) = b + 2 ms, SLO 20 ms. Ten requests queue (0.5 … 5 ms) behind a
    # device busy until 12 ms.
    info = model(alpha_ms=1.0, beta_ms=2.0, slo_ms=20.0, expected_rate=rate)
    block = blocker(12.0)
    sched = make_scheduler("symphony-wc", [info, block], devices(1), pruning=pruning)
    (busy,) = dispatches(sched.add_request(request(block, 0.0), 0.0))
    assert dispatches(feed(sched, info, [0.0005 * (i + 1) for i in range(10)])) == []
    out = sched.batch_finished(0, busy.batch.id, 0.012)
    assert sum(len(d.requests) for d in drops(out)) == dropped_count
    (sent,) = dispatches(out)
    assert sent.batch.size == batch_size
    assert sent.batch.finish_at <= min(r.deadline for r in sent.batch.requests) + 1e-12
    assert len(sched.queues["m"]) == left_queued


def test_never_dispatches_a_batch_that_would_finish_late():
    info = model(alpha_ms=2.0, beta_ms=5.0, slo_ms=25.0)
    sched = make_scheduler("symphony", [info], devices(2))
    sent = late = 0
    for i in range(3000):
        t = i * 0.0004  # 2500 r/s: above what two devices can serve
        for d in dispatches(sched.add_request(request(info, t), t)):
            sent += d.batch.size
            late += sum(1 for r in d.batch.requests if d.batch.finish_at > r.deadline + 1e-12)
    assert sent > 800  # ≈ 760 r/s served over 1.2 s
    assert late == 0


def test_unknown_policy_and_bad_option_are_clear_errors():
    info = model()
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_scheduler("nope", [info], devices(1))
    with pytest.raises(ValueError, match="pruning must be"):
        make_scheduler("symphony", [info], devices(1), pruning="sideways")
    with pytest.raises(ValueError, match="grant_by must be"):
        make_scheduler("symphony", [info], devices(1), grant_by="size")
    with pytest.raises(ValueError, match="bad option for policy 'symphony'"):
        make_scheduler("symphony", [info], devices(1), colour="blue")
