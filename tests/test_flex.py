"""FLEX (shepherd-nsdi23.txt §5.2, Algorithms 1–2) on hand-made cases."""

from __future__ import annotations

import pytest

from app.scheduling import DropReason, make_scheduler
from app.scheduling.flex import FlexScheduler
from app.scheduling.types import Complete
from tests.fakes import decided, devices, dispatches, drops, model, preempts, request


def fill(sched, info, count, t, slo_s=None):
    out = []
    for _ in range(count):
        out += sched.add_request(request(info, t, slo_s), t)
    return out


def occupy(sched, info, size, t, device=0):
    """Start a batch of exactly `size` requests of `info` on idle device 0.

    Arriving one by one they would preempt each other (a same-model batch
    counts the running requests, Algorithm 2 lines 6–7), so queue them
    directly and let the device pick its next batch.
    """
    for _ in range(size):
        sched.queues[info.name].add(request(info, t))
    sched._run_next(device, t)
    (batch,) = dispatches(sched._take())
    assert batch.batch.size == size
    return batch.batch, t


@pytest.mark.parametrize(("new", "preempted"), [(30, False), (31, True)])
def test_preempts_exactly_at_the_lambda_threshold(new, preempted):
    # Running batch of 10 ⇒ preempt when the new batch ≥ 3.03 × 10 = 30.3.
    slow = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=1000.0, max_batch=64)
    fast = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=64)
    sched = make_scheduler("flex", [slow, fast], devices(1))
    running, t = occupy(sched, slow, 10, 0.0)
    out = fill(sched, fast, new - 1, t)
    assert preempts(out) == []
    out = sched.add_request(request(fast, t), t)
    if preempted:
        (stop,) = preempts(out)
        assert stop.batch_id == running.id
        assert (stop.model, stop.requests) == ("slow", 10)  # what the daemon counts
        (sent,) = dispatches(out)
        assert (sent.batch.model, sent.batch.size) == ("fast", 31)
        # Until the stop is confirmed the core holds the preempted requests:
        # not queued, not answered.
        assert len(sched.queues["slow"]) == 0 and drops(out) == []
        assert [r.id for r in sched.held_on(0)] == [r.id for r in running.requests]
        # Confirmed 2 ms later: they can still make it, back in their queue.
        out = sched.batch_stopped(0, running.id, t + 0.002)
        assert len(sched.queues["slow"]) == 10 and drops(out) == []
        assert sched.held_on(0) == []
    else:
        assert preempts(out) == [] and dispatches(out) == []


def test_flex_np_never_preempts():
    slow = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=1000.0, max_batch=128)
    fast = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=128)
    sched = make_scheduler("flex-np", [slow, fast], devices(1))
    _, t = occupy(sched, slow, 2, 0.0)
    assert preempts(fill(sched, fast, 100, t)) == []


def test_preempted_requests_that_cannot_finish_alone_are_dropped():
    slow = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=45.0, max_batch=64)
    fast = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=64)
    sched = FlexScheduler([slow, fast], devices(1))
    running, _ = occupy(sched, slow, 2, 0.0)  # ℓ(2) = 22 ms, deadlines at 45 ms
    # At 30 ms a burst of 7 fast requests preempts (7 ≥ 3.03 × 2); alone a
    # slow request needs 21 ms but only 15 ms remain: both are dropped.
    out = fill(sched, fast, 7, 0.030)
    (stop,) = preempts(out)
    assert stop.batch_id == running.id
    assert drops(out) == []  # held until the stop is confirmed
    (dropped,) = drops(sched.batch_stopped(0, running.id, 0.031))
    assert dropped.reason is DropReason.PREEMPTED
    assert len(dropped.requests) == 2
    assert len(sched.queues["slow"]) == 0


def test_batchgen_takes_the_largest_feasible_window_across_models():
    a = model("a", alpha_ms=1.0, beta_ms=5.0, slo_ms=40.0, max_batch=64)
    b = model("b", alpha_ms=1.0, beta_ms=5.0, slo_ms=40.0, max_batch=64)
    block = model("block", alpha_ms=0.0, beta_ms=30.0, slo_ms=1000.0)
    sched = FlexScheduler([a, b, block], devices(1), preemption=False)
    (busy,) = dispatches(sched.add_request(request(block, 0.0), 0.0))
    # While the device is busy until 30 ms: 8 "a" requests at 0 ms (deadline
    # 40 ms) and 12 "b" requests at 5 ms (deadline 45 ms).
    fill(sched, a, 8, 0.0)
    fill(sched, b, 12, 0.005)
    out = sched.batch_finished(0, busy.batch.id, 0.030)
    # At 30 ms: "a" fits ℓ(k) ≤ 10 ms ⇒ k = 5 of 8; "b" fits ℓ(k) ≤ 15 ms ⇒
    # all 10... k = 10 of 12. The larger window wins.
    (sent,) = dispatches(out)
    assert (sent.batch.model, sent.batch.size) == ("b", 10)
    assert sent.batch.finish_at <= min(r.deadline for r in sent.batch.requests) + 1e-12


def test_requests_that_cannot_finish_alone_are_dropped_by_timer():
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=30.0)
    block = model("block", alpha_ms=0.0, beta_ms=100.0, slo_ms=1000.0)
    sched = make_scheduler("flex-np", [info, block], devices(1))
    sched.add_request(request(block, 0.0), 0.0)
    hopeless = request(info, 0.001)  # must start by 31 − 11 = 20 ms; device busy to 100 ms
    assert sched.add_request(hopeless, 0.001) == []
    assert sched.next_wakeup() == pytest.approx(0.020, abs=1e-6)
    (dropped,) = drops(sched.advance(sched.next_wakeup()))
    assert dropped.requests == [hopeless]
    assert dropped.reason is DropReason.DEADLINE


def test_bad_threshold_is_rejected():
    with pytest.raises(ValueError, match="threshold"):
        make_scheduler("flex", [model()], devices(1), threshold=0.5)


# ------------------------------------------------ preemption completes in the core


def test_the_preempted_devices_new_batch_may_take_the_held_requests():
    """Algorithm 2 lines 6–7: the running batch's requests count towards
    B_g; they are held, but the new batch runs on the same device after the
    stop, so it may take them at once."""
    info = model("m", alpha_ms=1.0, beta_ms=100.0, slo_ms=1000.0)
    sched = FlexScheduler([info], devices(1))
    (first,) = dispatches(sched.add_request(request(info, 0.0), 0.0))
    out = fill(sched, info, 3, 0.001)
    (stop,) = preempts(out)
    (again,) = dispatches(out)
    assert stop.batch_id == first.batch.id
    assert again.batch.size == 4 and first.batch.requests[0] in again.batch.requests
    assert sched.held_on(0) == []  # all taken: the stop answers nobody
    out = sched.batch_stopped(0, first.batch.id, 0.002)
    assert decided(out) == [] and len(sched.queues["m"]) == 0


def test_held_requests_run_on_another_device_only_after_the_stop():
    """Device 0 falls idle while device 1 stops a preempted batch, but until
    device 1 confirms the stop its batch may still write the held requests'
    outputs: they wait, and then go to device 0."""
    slow = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=1000.0, max_batch=64)
    fast = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=64)
    block = model("block", alpha_ms=0.0, beta_ms=500.0, slo_ms=2000.0)
    sched = FlexScheduler([slow, fast, block], devices(2))
    blocker, _ = occupy(sched, block, 3, 0.0)  # 7 < 3.03 × 3: never preempted
    running, _ = occupy(sched, slow, 2, 0.0, device=1)
    assert (blocker.device, running.device) == (0, 1)
    out = fill(sched, fast, 7, 0.001)  # 7 ≥ 3.03 × 2: preempts device 1
    assert [p.batch_id for p in preempts(out)] == [running.id]
    held = [r.id for r in running.requests]
    assert [r.id for r in sched.held_on(1)] == held
    # Device 0 frees up before the stop is confirmed: nothing for it.
    out = sched.batch_finished(0, blocker.id, 0.002)
    assert dispatches(out) == [] and sched.idle_devices() == [0]
    out = sched.batch_stopped(1, running.id, 0.003)
    # Back as new arrivals: device 0 takes them.
    (moved,) = dispatches(out)
    assert (moved.batch.device, [r.id for r in moved.batch.requests]) == (0, held)


def test_a_preempted_batch_that_ends_first_answers_what_it_holds():
    info = model("m", alpha_ms=1.0, beta_ms=20.0, slo_ms=1000.0, max_batch=64)
    other = model("o", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=64)
    sched = FlexScheduler([info, other], devices(1))
    running, _ = occupy(sched, info, 2, 0.0)
    out = fill(sched, other, 7, 0.001)
    assert preempts(out)
    # The stop came too late: the batch ended at 22 ms with its outputs.
    out = sched.batch_finished(0, running.id, 0.022)
    (done,) = [d for d in out if isinstance(d, Complete)]
    assert done.batch is running and done.requests == running.requests
    assert sched.held_on(0) == [] and len(sched.queues["m"]) == 0


def test_a_device_that_fails_while_a_batch_stops_drops_or_requeues_what_it_holds():
    slow = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=45.0, max_batch=64)
    fast = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=64)
    sched = FlexScheduler([slow, fast], devices(2))
    running, _ = occupy(sched, slow, 2, 0.0)  # device 0; deadlines 45 ms
    sched._preempt(running, 0.030)
    out = sched.device_down(0, 0.030)
    # Alone a slow request needs 21 ms, 15 remain: both dropped for the failure.
    (dropped,) = drops(out)
    assert dropped.reason is DropReason.DEVICE_FAILED and len(dropped.requests) == 2
    assert sched.stopping == {} and sched.held_on(0) == []
