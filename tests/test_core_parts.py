"""The core's building blocks: profiles, queues, timers, rate meter, autoscaling."""

from __future__ import annotations

import itertools

import pytest

from app.scheduling.autoscale import AutoscaleMonitor, advised_device_change
from app.scheduling.profile import LatencyProfile
from app.scheduling.queue import DeadlineQueue
from app.scheduling.rate import RateMeter
from app.scheduling.timers import Timers
from app.scheduling.types import Request


def test_linear_profile_and_max_batch_within():
    profile = LatencyProfile.linear(1.053, 5.072, 64)
    assert profile.latency(16) == pytest.approx(0.021920)
    assert profile.max_batch_within(0.025) == 18  # ℓ(18) = 24.03 ms, ℓ(19) = 25.08 ms
    assert profile.max_batch_within(0.006) == 0  # ℓ(1) = 6.125 ms
    assert profile.max_batch_within(1.0) == 64
    assert profile.batching_gain == pytest.approx(5.072 / 1.053)


def test_table_profile_interpolates_monotonically_and_extrapolates():
    profile = LatencyProfile.from_table({1: 10.0, 4: 16.0, 8: 20.0}, 12)
    ms = [round(profile.latency(b) * 1000, 6) for b in range(1, 13)]
    assert ms == [10.0, 12.0, 14.0, 16.0, 17.0, 18.0, 19.0, 20.0, 21.0, 22.0, 23.0, 24.0]
    assert all(x <= y for x, y in itertools.pairwise(ms))
    with pytest.raises(ValueError, match="must not decrease"):
        LatencyProfile.from_table({1: 10.0, 2: 9.0}, 4)
    with pytest.raises(ValueError, match="empty"):
        LatencyProfile.from_table({}, 4)
    # Built directly, too: the policies bisect the table, and on one that
    # falls they disagree with themselves (a drop timer re-armed one float
    # later, forever).
    falls = r"must not decrease with batch size: ℓ\(2\)=3 ms > ℓ\(3\)"
    with pytest.raises(ValueError, match=falls):
        LatencyProfile((0.0, 0.002, 0.003, 0.0025))
    assert LatencyProfile((0.0, 0.002, 0.002, 0.003)).max_batch_within(0.0025) == 2


def test_deadline_queue_orders_by_deadline_and_pops_ranges():
    queue = DeadlineQueue()
    for i, deadline in enumerate([0.5, 0.1, 0.3, 0.2, 0.4]):
        queue.add(Request(i, "m", 0.0, deadline))
    assert [r.deadline for r in queue] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert queue.head_deadline() == 0.1
    assert [r.id for r in queue.pop_range(1, 3)] == [3, 2]
    assert [r.id for r in queue.pop_expired(0.45)] == [1, 4]
    assert [r.id for r in queue] == [0]


def test_timers_replace_cancel_and_fire_in_order():
    timers = Timers()
    timers.set("a", 3.0)
    timers.set("b", 1.0)
    timers.set("a", 2.0)  # replaces a@3
    timers.set("c", 5.0)
    timers.cancel("c")
    assert timers.next_time() == 1.0
    assert [timers.pop_due(2.5), timers.pop_due(2.5), timers.pop_due(2.5)] == [
        ("b", 1.0),
        ("a", 2.0),
        None,
    ]
    # With a lead, a timer is due that much early: `at − lead ≤ now`.
    timers.set("d", 4.0)
    assert not timers.due(3.0, lead=0.5) and timers.pop_due(3.0, lead=0.5) is None
    assert timers.due(3.5, lead=0.5) and timers.pop_due(3.5, lead=0.5) == ("d", 4.0)
    assert timers.next_time() is None


def test_rate_meter_window_and_prior():
    meter = RateMeter(window_s=1.0)
    for i in range(100):
        meter.record(i * 0.01)  # 100/s
    assert meter.rate(0.99) == pytest.approx(100 / 0.99)
    for i in range(100, 300):
        meter.record(i * 0.01)
    assert meter.rate(2.99) == pytest.approx(100.0, abs=1.0)  # arrivals in [1.99, 2.99]
    assert meter.rate(10.0) == 0.0
    primed = RateMeter(window_s=1.0, prior_rate=500.0)
    assert primed.rate(0.0) == 500.0
    assert primed.record(0.0) == pytest.approx(501.0)  # 1 seen + 500 expected
    assert primed.rate(0.5) == pytest.approx(1 + 250.0)


def test_autoscale_advice_follows_symphony_4_4():
    # Bad rate r = 0.2 on 10 devices ⇒ add ⌈10 · 0.2 / 0.8⌉ = 3.
    assert advised_device_change(10, 0.2, 0.0) == 3
    # Idle fraction f = 0.35, no bad requests ⇒ release ⌊10 · 0.35⌋ = 3.
    assert advised_device_change(10, 0.0, 0.35) == -3
    assert advised_device_change(10, 0.005, 0.01) == 0
    monitor = AutoscaleMonitor([0, 1])
    monitor.batch_ended(0, 0.0, 0.5, good=8, late=1)
    monitor.requests_dropped(1)
    signals = monitor.signals(1.0, running=[(1, 0.75)])
    assert signals.bad_rate == pytest.approx(0.2)
    assert signals.idle_fraction == pytest.approx(1 - 0.75 / 2)
    assert signals.advised_device_change == 1  # ⌈2 · 0.2/0.8⌉
    assert signals.per_device_busy == {0: 0.5, 1: 0.25}
