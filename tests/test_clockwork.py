"""Clockwork baseline: greedy work-conserving EDF, driven with a virtual clock."""

from __future__ import annotations

import heapq
import random

import pytest

from app.scheduling.clockwork import ClockworkScheduler
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import Decision, DeviceInfo, Dispatch, Drop, DropReason, Request
from tests.fakes import before, decided, devices, dispatches, drops, ids

MS = 1e-3


def model(name: str = "m", slo_ms: float = 50.0, max_batch: int = 32) -> ModelInfo:
    # ℓ(b) = (b + 4) ms: ℓ(1) = 5 ms, ℓ(6) = 10 ms, ℓ(16) = 20 ms.
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, max_batch), slo_ms * MS, max_batch)


def slow_model(name: str = "big") -> ModelInfo:
    # ℓ(b) = (b + 29) ms: a single request keeps a device busy for 30 ms.
    return ModelInfo(name, LatencyProfile.linear(1.0, 29.0, 64), 1.0, 64)


class Ids:
    def __init__(self) -> None:
        self.next = 0

    def req(self, m: str, arrival: float, deadline: float) -> Request:
        self.next += 1
        return Request(self.next, m, arrival, deadline)


def test_registry_builds_clockwork() -> None:
    s = make_scheduler("clockwork", [model()], devices(2))
    assert isinstance(s, ClockworkScheduler)
    assert s.name == "clockwork"
    with pytest.raises(ValueError, match="bad option"):
        make_scheduler("clockwork", [model()], devices(1), preferred_batch_sizes=[4])


def test_work_conserving_dispatches_a_lone_request_at_once() -> None:
    s = make_scheduler("clockwork", [model()], devices(1))
    out = s.add_request(Request(1, "m", 0.0, 0.050), now=0.0)
    (d,) = dispatches(out)
    assert ids(d.batch.requests) == [1]
    assert d.batch.device == 0
    assert d.batch.start_at == 0.0
    assert d.batch.finish_at == pytest.approx(5 * MS)
    # Nothing queued, so no timer.
    assert s.next_wakeup() is None


def test_edf_picks_the_model_with_the_earlier_head_deadline() -> None:
    s = ClockworkScheduler([model("a", slo_ms=50), model("b", slo_ms=20)], devices(1))
    q = Ids()
    first = dispatches(s.add_request(q.req("a", 0.0, 0.050), 0.0))[0].batch
    # Device busy until 5 ms. a arrives first but b's deadline is earlier.
    ra = q.req("a", 0.001, 0.051)
    rb = q.req("b", 0.002, 0.022)
    assert s.add_request(ra, 0.001) == []
    assert s.add_request(rb, 0.002) == []
    (d,) = dispatches(s.batch_finished(0, first.id, first.finish_at))
    assert d.batch.model == "b"
    assert ids(d.batch.requests) == [rb.id]
    assert d.batch.start_at == pytest.approx(5 * MS)
    (d2,) = dispatches(s.batch_finished(0, d.batch.id, d.batch.finish_at))
    assert d2.batch.model == "a"
    assert ids(d2.batch.requests) == [ra.id]


def test_batch_is_the_largest_prefix_that_meets_the_head_deadline() -> None:
    s = ClockworkScheduler([model(slo_ms=100)], devices(1))
    q = Ids()
    blocker = dispatches(s.add_request(q.req("m", 0.0, 1.0), 0.0))[0].batch  # busy until 5 ms
    head = q.req("m", 0.001, 0.015)  # at 5 ms: 10 ms left → ℓ(k) = k + 4 ≤ 10 → k = 6
    s.add_request(head, 0.001)
    rest = [q.req("m", 0.002, 0.100) for _ in range(7)]
    for r in rest:
        assert s.add_request(r, 0.002) == []
    assert s.queued() == 8
    (d,) = dispatches(s.batch_finished(0, blocker.id, 0.005))
    assert d.batch.size == 6
    assert ids(d.batch.requests) == [head.id, *ids(rest[:5])]
    assert d.batch.finish_at == pytest.approx(0.015)  # exactly the head's deadline
    assert d.batch.finish_at <= head.deadline
    # The remaining two go next, without waiting for more (work-conserving).
    (d2,) = dispatches(s.batch_finished(0, d.batch.id, 0.015))
    assert ids(d2.batch.requests) == ids(rest[5:])


def test_batch_is_capped_at_max_batch() -> None:
    s = ClockworkScheduler([model(slo_ms=500, max_batch=4)], devices(1))
    q = Ids()
    blocker = dispatches(s.add_request(q.req("m", 0.0, 1.0), 0.0))[0].batch
    for _ in range(10):
        s.add_request(q.req("m", 0.001, 0.5), 0.001)
    (d,) = dispatches(s.batch_finished(0, blocker.id, 0.005))
    assert d.batch.size == 4


def test_hopeless_request_is_dropped_by_timer_never_dispatched_late() -> None:
    s = ClockworkScheduler([model(slo_ms=20), slow_model()], devices(1))
    q = Ids()
    busy = dispatches(s.add_request(q.req("big", 0.0, 1.0), 0.0))[0].batch
    assert busy.finish_at == pytest.approx(0.030)  # device busy until 30 ms
    r = q.req("m", 0.001, 0.021)
    assert s.add_request(r, 0.001) == []
    # ℓ(1) = 5 ms: it can still finish alone if started by 16 ms, not after.
    wake = s.next_wakeup()
    assert wake is not None
    assert wake > 0.016
    assert wake == pytest.approx(0.016, abs=1e-12)
    assert s.advance(0.016) == []  # would finish exactly at its deadline: still fine
    assert s.advance(before(wake)) == []
    (drop,) = drops(s.advance(wake))
    assert drop.reason is DropReason.DEADLINE
    assert ids(drop.requests) == [r.id]
    assert s.queued() == 0
    assert s.next_wakeup() is None
    # The device frees later; nothing left to run.
    assert decided(s.batch_finished(0, busy.id, 0.030)) == []


def test_arrival_that_is_already_hopeless_is_dropped_at_once() -> None:
    s = ClockworkScheduler([model(slo_ms=50)], devices(1))
    out = s.add_request(Request(1, "m", 0.0, 0.004), 0.0)  # ℓ(1) = 5 ms > 4 ms
    assert dispatches(out) == []
    (drop,) = drops(out)
    assert drop.reason is DropReason.DEADLINE
    assert s.next_wakeup() is None


def test_finishing_exactly_at_the_deadline_is_served() -> None:
    s = ClockworkScheduler([model(slo_ms=50)], devices(1))
    (d,) = dispatches(s.add_request(Request(1, "m", 0.0, 0.005), 0.0))
    assert d.batch.finish_at == pytest.approx(0.005)


def test_drop_timer_follows_the_earliest_head_and_only_drops_the_hopeless() -> None:
    s = ClockworkScheduler([model(slo_ms=20), slow_model()], devices(1))
    q = Ids()
    s.add_request(q.req("big", 0.0, 1.0), 0.0)  # device busy until 30 ms
    r1 = q.req("m", 0.001, 0.021)  # hopeless after 16 ms
    r2 = q.req("m", 0.010, 0.030)  # hopeless after 25 ms
    s.add_request(r1, 0.001)
    s.add_request(r2, 0.010)
    wake = s.next_wakeup()
    assert wake == pytest.approx(0.016, abs=1e-12)
    assert s.advance(before(wake)) == []
    (drop,) = drops(s.advance(wake))
    assert ids(drop.requests) == [r1.id]
    wake2 = s.next_wakeup()
    assert wake2 == pytest.approx(0.025, abs=1e-12)
    assert s.advance(before(wake2)) == []
    (drop2,) = drops(s.advance(wake2))
    assert ids(drop2.requests) == [r2.id]


def test_earliest_free_idle_device_gets_the_batch() -> None:
    s = ClockworkScheduler([model(slo_ms=100)], devices(3))
    q = Ids()
    b0 = dispatches(s.add_request(q.req("m", 0.0, 0.1), 0.0))[0].batch
    b1 = dispatches(s.add_request(q.req("m", 0.001, 0.1), 0.001))[0].batch
    assert (b0.device, b1.device) == (0, 1)
    # Device 1 reports its end first (4 ms), device 0 at 5 ms; device 2 never ran.
    s.batch_finished(1, b1.id, 0.004)
    s.batch_finished(0, b0.id, 0.005)
    # Device 2 has been idle longest (free since -inf), then 1 (4 ms), then 0.
    order = [
        dispatches(s.add_request(q.req("m", 0.006, 0.1), 0.006))[0].batch.device for _ in range(3)
    ]
    assert order == [2, 1, 0]
    # All three busy: the next request waits.
    assert dispatches(s.add_request(q.req("m", 0.007, 0.1), 0.007)) == []


def test_control_and_data_delay_shift_start_and_shrink_the_batch() -> None:
    s = ClockworkScheduler([model(slo_ms=100)], devices(1), d_ctrl=0.001, d_data=0.0005)
    q = Ids()
    blocker = dispatches(s.add_request(q.req("m", 0.0, 1.0), 0.0))[0].batch
    # Started at delay(1) = 1.5 ms, ran 5 ms.
    assert blocker.start_at == pytest.approx(0.0015)
    assert blocker.finish_at == pytest.approx(0.0065)
    for _ in range(8):
        s.add_request(q.req("m", 0.001, 0.020), 0.001)
    # At 10 ms: 10 + 1 + 0.5k + (k + 4) ≤ 20 → 1.5k ≤ 5 → k = 3.
    (d,) = dispatches(s.batch_finished(0, blocker.id, 0.010))
    assert d.batch.size == 3
    assert d.batch.start_at == pytest.approx(0.0125)
    assert d.batch.finish_at == pytest.approx(0.0195)


def test_heterogeneous_devices_head_waits_for_the_fast_one() -> None:
    # Device 0 runs at half speed: ℓ(1) = 10 ms there.
    s = ClockworkScheduler(
        [model("m", slo_ms=8)], [DeviceInfo(0, speed=0.5), DeviceInfo(1, speed=1.0)]
    )
    q = Ids()
    first = dispatches(s.add_request(q.req("m", 0.0, 0.008), 0.0))[0].batch
    assert first.device == 1  # cannot make it on the slow one
    second = q.req("m", 0.001, 0.009)  # fast device frees at 5 ms: 5 + 5 > 9 → hopeless at 4 ms
    assert dispatches(s.add_request(second, 0.001)) == []
    wake = s.next_wakeup()
    assert wake == pytest.approx(0.004, abs=1e-12)
    assert s.advance(before(wake)) == []
    (drop,) = drops(s.advance(wake))
    assert ids(drop.requests) == [second.id]


# ------------------------------------------------------------ randomized check


def simulate(s, arrivals: list[Request]) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    """A tiny discrete-event driver: arrivals, batch ends at finish_at, timers."""
    events: list[tuple[float, int, str, object]] = []
    seq = 0
    for r in arrivals:
        events.append((r.arrival, seq, "arrive", r))
        seq += 1
    heapq.heapify(events)
    batches, dropped = [], []

    def handle(decisions: list[Decision]) -> None:
        nonlocal seq, now
        for d in decisions:
            if isinstance(d, Dispatch):
                batches.append(d.batch)
                heapq.heappush(events, (d.batch.finish_at, seq, "finish", d.batch))
                seq += 1
            elif isinstance(d, Drop):
                dropped.extend((r, d.reason, now) for r in d.requests)

    now = 0.0
    while events or s.next_wakeup() is not None:
        wake = s.next_wakeup()
        if wake is not None and (not events or wake <= events[0][0]):
            assert wake >= now
            now = wake
            handle(s.advance(now))
            continue
        now, _, kind, item = heapq.heappop(events)
        if kind == "arrive":
            handle(s.add_request(item, now))
        else:
            handle(s.batch_finished(item.device, item.id, now))
        # Work-conserving: never an idle device while requests are queued.
        if s.queued():
            assert len(s.in_flight) == len(s.devices)
    return batches, dropped


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_load_never_dispatches_late_and_accounts_every_request(seed: int) -> None:
    rng = random.Random(seed)
    models = [model("a", slo_ms=15), model("b", slo_ms=30), model("c", slo_ms=60)]
    s = ClockworkScheduler(models, devices(2))
    t, arrivals = 0.0, []
    for i in range(600):
        t += rng.expovariate(1500.0)  # overloaded on purpose
        m = rng.choice(models)
        arrivals.append(Request(i, m.name, t, t + m.slo))
    batches, dropped = simulate(s, arrivals)
    for b in batches:
        assert b.finish_at <= min(r.deadline for r in b.requests)
        assert 1 <= b.size <= 32
    served = [r.id for b in batches for r in b.requests]
    lost = [r.id for r, _, _ in dropped]
    assert sorted(served + lost) == list(range(600))
    alone = 5 * MS  # ℓ(1)
    for r, reason, when in dropped:
        assert reason is DropReason.DEADLINE
        # Dropped only once hopeless, and promptly: no later than the first
        # float after deadline − ℓ(1) (every SLO here exceeds ℓ(1)).
        assert when + alone > r.deadline
        assert when <= r.deadline - alone + 1e-12
    assert dropped, "the load is meant to overload two devices"
    assert s.queued() == 0 and not s.in_flight
    assert any(b.size > 1 for b in batches)
