"""NexusScheduler driven directly with explicit `now` values (a virtual clock).

Model "A": ℓ(b) = 1 ms·b + 4 ms, SLO 20 ms, max batch 16 → planned batch
B = 6 (2·ℓ(6) ≤ 20 ms), one dedicated device serves 600 req/s.
"""

from __future__ import annotations

import heapq
import itertools

import pytest

from app.scheduling.model import ModelInfo
from app.scheduling.nexus import NexusScheduler
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import Dispatch, Drop, DropReason, Request
from tests.fakes import devices

SLO = 0.020


def A(name: str, rate: float | None = None) -> ModelInfo:
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, 16), SLO, 16, rate)


_ids = itertools.count(1000)


def req(model: str, t: float, deadline: float | None = None, rid: int | None = None) -> Request:
    return Request(
        next(_ids) if rid is None else rid, model, t, t + SLO if deadline is None else deadline
    )


def dispatches(decisions):
    return [d.batch for d in decisions if isinstance(d, Dispatch)]


def drops(decisions):
    return [(d.reason, [r.id for r in d.requests]) for d in decisions if isinstance(d, Drop)]


def simulate(sched, arrivals, until):
    """A tiny discrete-event driver: arrivals, batch completions at their
    predicted finish, timers at next_wakeup(). Returns (batches, drops)."""
    seq = itertools.count()
    events = [(r.arrival, 1, next(seq), r) for r in arrivals]
    heapq.heapify(events)
    batches, dropped = [], []

    def handle(decisions):
        for d in decisions:
            if isinstance(d, Dispatch):
                batches.append(d.batch)
                heapq.heappush(events, (d.batch.finish_at, 0, next(seq), d.batch))
            elif isinstance(d, Drop):
                dropped.extend((r, d.reason) for r in d.requests)

    while True:
        nxt = events[0][0] if events else float("inf")
        wake = sched.next_wakeup()
        if wake is not None and wake < nxt and wake <= until:
            handle(sched.advance(wake))
            continue
        if not events or nxt > until:
            return batches, dropped
        t, kind, _, item = heapq.heappop(events)
        if kind == 0:
            handle(sched.batch_finished(item.device, item.id, t))
        else:
            handle(sched.add_request(item, t))


# --------------------------------------------------------------- the plan


def test_registry_builds_nexus_with_the_planned_batch():
    sched = make_scheduler("nexus", [A("a", 1200.0)], devices(2), epoch_s=5.0)
    assert isinstance(sched, NexusScheduler)
    assert sched.name == "nexus"
    assert sched.epoch_s == 5.0
    assert sched.devices_of("a") == (0, 1)
    assert [(s.model, s.batch) for s in sched.sessions_on(0)] == [("a", 6)]
    assert [(s.model, s.batch) for s in sched.sessions_on(1)] == [("a", 6)]
    with pytest.raises(ValueError):
        make_scheduler("nexus", [A("a")], devices(1), epoch_s=0)


def test_first_plan_even_split_without_hints():
    sched = NexusScheduler([A("a"), A("b")], devices(4))
    assert sched.devices_of("a") == (0, 1)
    assert sched.devices_of("b") == (2, 3)


# ---------------------------------------------------- routing and dispatch


def test_round_robin_routing_and_work_conserving_dispatch():
    sched = NexusScheduler([A("a", 1200.0)], devices(2))
    # A free device runs the request at once, alone (work-conserving).
    out = sched.add_request(req("a", 0.000, rid=1), 0.000)
    assert [
        (b.device, [r.id for r in b.requests], b.start_at, b.finish_at) for b in dispatches(out)
    ] == [(0, [1], 0.0, pytest.approx(0.005))]
    out = sched.add_request(req("a", 0.001, rid=2), 0.001)
    assert [(b.device, b.size, b.start_at) for b in dispatches(out)] == [(1, 1, 0.001)]
    # Both busy: the next requests alternate between the devices' queues.
    for i, t in enumerate([0.002, 0.0021, 0.0022, 0.0023, 0.0024]):
        assert sched.add_request(req("a", t, rid=3 + i), t) == []
    assert sched.queued_on(0) == 3
    assert sched.queued_on(1) == 2
    # Device 0 frees at 5 ms: one batch of its three queued requests (3, 5, 7).
    out = sched.batch_finished(0, 1, 0.005)
    [batch] = dispatches(out)
    assert (batch.device, [r.id for r in batch.requests]) == (0, [3, 5, 7])
    assert batch.start_at == 0.005
    assert batch.finish_at == pytest.approx(0.005 + 0.007)
    assert sched.queued() == 2


def test_uncoordinated_frontends_route_independently():
    def first_devices(frontends):
        sched = NexusScheduler([A("a", 1200.0)], devices(2), frontends=frontends)
        out = []
        for rid in range(4):
            before = [sched.queued_on(d) for d in (0, 1)]
            decisions = sched.add_request(req("a", 0.0, rid=rid), 0.0)
            ran = dispatches(decisions)
            if ran:
                out.append(ran[0].device)
            else:
                out.append(0 if sched.queued_on(0) > before[0] else 1)
        return out

    assert first_devices(1) == [0, 1, 0, 1]
    # Two frontends (request id mod 2), each rotating on its own: requests
    # 2 and 3 land on device 1 and 0, 0 and 3 share device 0.
    assert first_devices(2) == [0, 1, 1, 0]


def test_batch_is_capped_at_the_planned_size():
    sched = NexusScheduler([A("a", 600.0)], devices(1))
    assert dispatches(sched.add_request(req("a", 0.0, rid=0), 0.0))[0].size == 1
    for i in range(1, 9):
        assert sched.add_request(req("a", i / 1000, rid=i), i / 1000) == []
    [batch] = dispatches(sched.batch_finished(0, 1, 0.009))
    assert [r.id for r in batch.requests] == [1, 2, 3, 4, 5, 6]  # B = 6
    assert batch.finish_at == pytest.approx(0.009 + 0.010)
    assert sched.queued() == 2
    [batch] = dispatches(sched.batch_finished(0, batch.id, 0.019))
    assert [r.id for r in batch.requests] == [7, 8]


def test_weighted_routing_follows_planned_rates():
    # a: 750 req/s → a dedicated device (600) plus 150 on the shared device.
    sched = NexusScheduler([A("a", 750.0), A("b", 150.0)], devices(2), fill_devices=False)
    assert sched.devices_of("a") == (0, 1)
    # Keep both devices busy so that requests stay where they were routed.
    [first] = dispatches(sched.add_request(req("a", 0.0), 0.0))
    assert first.device == 0  # a's first pick
    sched.add_request(req("b", 0.0), 0.0)  # → device 1 (runs)
    placed = []
    for _ in range(10):
        before = sched.queued_on(0, "a")
        sched.add_request(req("a", 0.001), 0.001)
        placed.append(0 if sched.queued_on(0, "a") > before else 1)
    # Smooth weighted round-robin, weights 600:150 = 4:1, picks 0 0 1 0 0 | 0 0 1 0 0.
    assert placed == [0, 1, 0, 0, 0, 0, 1, 0, 0, 0]


def test_shared_device_round_robins_between_sessions():
    sched = NexusScheduler([A("a", 750.0), A("b", 150.0)], devices(2), fill_devices=False)
    assert [(s.model, s.batch) for s in sched.sessions_on(1)] == [("a", 2), ("b", 2)]
    [b1] = dispatches(sched.add_request(req("b", 0.0, rid=1), 0.0))
    assert (b1.device, b1.model, b1.finish_at) == (1, "b", pytest.approx(0.005))
    for rid in (10, 11, 12):
        assert sched.add_request(req("b", 0.001, rid=rid), 0.001) == []
    [a0] = dispatches(sched.add_request(req("a", 0.001, rid=20), 0.001))
    assert a0.device == 0
    assert sched.add_request(req("a", 0.001, rid=21), 0.001) == []  # queued on 0
    assert sched.add_request(req("a", 0.001, rid=22), 0.001) == []  # queued on 1
    assert (sched.queued_on(1, "a"), sched.queued_on(1, "b")) == (1, 3)
    # Device 1 ran b; its round-robin turn goes to a first, then back to b.
    [x] = dispatches(sched.batch_finished(1, b1.id, 0.005))
    assert (x.model, [r.id for r in x.requests]) == ("a", [22])
    assert x.finish_at == pytest.approx(0.010)
    [y] = dispatches(sched.batch_finished(1, x.id, 0.010))
    # b's planned batch on the shared device is 2, although 3 are queued.
    assert (y.model, [r.id for r in y.requests]) == ("b", [10, 11])
    assert y.finish_at == pytest.approx(0.016)
    [z] = dispatches(sched.batch_finished(1, y.id, 0.016))
    assert (z.model, [r.id for r in z.requests]) == ("b", [12])
    assert z.finish_at == pytest.approx(0.021)  # exactly its deadline: kept


# ----------------------------------------------------------- drops


def test_sliding_window_drops_a_head_that_cannot_finish():
    sched = NexusScheduler([A("a", 600.0)], devices(1))
    sched.add_request(req("a", 0.0, rid=0), 0.0)  # runs until 5 ms
    # Head r1 could finish alone at 5+5 = 10 ms, but not in a batch of 3
    # (5+7 = 12 ms > 11.5 ms); in a batch of 2 (5+6 = 11 ms) r2 is fine.
    sched.add_request(req("a", 0.001, deadline=0.0115, rid=1), 0.001)
    sched.add_request(req("a", 0.002, deadline=0.030, rid=2), 0.002)
    sched.add_request(req("a", 0.003, deadline=0.031, rid=3), 0.003)
    out = sched.batch_finished(0, 1, 0.005)
    assert drops(out) == [(DropReason.DEADLINE, [1])]
    [batch] = dispatches(out)
    assert [r.id for r in batch.requests] == [2, 3]
    assert batch.finish_at == pytest.approx(0.011)


def test_drop_timer_fires_while_the_device_is_busy():
    sched = NexusScheduler([A("a", 600.0)], devices(1), d_ctrl=0.001)
    out = sched.add_request(req("a", 0.0, rid=0), 0.0)
    [batch] = dispatches(out)
    assert batch.start_at == 0.001  # d_ctrl before the batch starts
    assert batch.finish_at == pytest.approx(0.006)
    # r1's latest start: 10.5 ms − d_ctrl − ℓ(1) = 4.5 ms, before the device frees.
    sched.add_request(req("a", 0.001, deadline=0.0105, rid=1), 0.001)
    sched.add_request(req("a", 0.002, deadline=0.030, rid=2), 0.002)
    wake = sched.next_wakeup()
    assert wake == pytest.approx(0.0105 - 0.001 - 0.005)  # latest start, while busy
    assert sched.advance(wake - 1e-6) == []
    out = sched.advance(wake)
    assert drops(out) == [(DropReason.DEADLINE, [1])]
    assert dispatches(out) == []
    assert sched.queued() == 1
    # Next timer: r2's latest start (the epoch timer is at 10 s).
    assert sched.next_wakeup() == pytest.approx(0.030 - 0.006)
    [batch] = dispatches(sched.batch_finished(0, batch.id, 0.006))
    assert [r.id for r in batch.requests] == [2]


def test_expired_request_is_dropped_on_arrival_when_busy():
    sched = NexusScheduler([A("a", 600.0)], devices(1))
    sched.add_request(req("a", 0.0, rid=0), 0.0)
    out = sched.add_request(req("a", 0.004, deadline=0.008, rid=1), 0.004)
    assert drops(out) == [(DropReason.DEADLINE, [1])]


def test_unknown_model_is_not_served():
    sched = NexusScheduler([A("a", 600.0)], devices(1))
    out = sched.add_request(req("zzz", 0.0, rid=5), 0.0)
    assert drops(out) == [(DropReason.NOT_SERVED, [5])]


# ------------------------------------------------------------- epochs


def test_replan_at_epoch_from_measured_rates():
    sched = NexusScheduler(
        [A("a", 600.0), A("b", 600.0)], devices(2), epoch_s=1.0, fill_devices=False
    )
    assert sched.devices_of("a") == (0,)
    assert sched.devices_of("b") == (1,)
    # One epoch of uniform traffic: a at 750 req/s, b at 150 req/s, from t = 0.
    arrivals = [req("a", i / 750) for i in range(750)] + [req("b", j / 150) for j in range(150)]
    _, dropped = simulate(sched, arrivals, until=0.9999)
    assert sched.epochs == 0
    assert sched.next_wakeup() is not None
    # a overloads its single device during the first epoch (750 > 600 req/s).
    assert sum(1 for r, _ in dropped if r.model == "a") > 0
    assert all(r.model == "a" for r, _ in dropped)
    # The epoch timer (first arrival + 1 s) re-plans from the measured rates.
    sched.advance(1.0)
    assert sched.epochs == 1
    assert sched.plan.rates == {"a": pytest.approx(750.0), "b": pytest.approx(150.0)}
    assert sched.devices_of("a") == (0, 1)
    assert sched.devices_of("b") == (1,)
    assert [(s.model, s.batch) for s in sched.sessions_on(0)] == [("a", 6)]
    assert [(s.model, s.batch) for s in sched.sessions_on(1)] == [("a", 2), ("b", 2)]
    assert sched.timers.when(("nexus", "epoch")) == pytest.approx(2.0)


def test_replan_moves_queued_requests_of_a_moved_model():
    sched = NexusScheduler(
        [A("a", 600.0), A("b", 600.0)], devices(2), epoch_s=1.0, fill_devices=False
    )
    # b at 1200 req/s for the first epoch; a only at t = 0 (starts the epoch timer).
    arrivals = [req("a", 0.0)] + [req("b", j / 1200) for j in range(1200)]
    simulate(sched, arrivals, until=0.9999)
    # Occupy device 0 with one request of a and queue a second one there.
    [run] = dispatches(sched.add_request(req("a", 0.9995, rid=1), 0.9995))
    assert run.device == 0
    assert sched.add_request(req("a", 0.9996, rid=2), 0.9996) == []
    assert sched.queued_on(0, "a") == 1
    assert sched.advance(1.0) == []
    # Measured: a 3 req/s, b 1200 req/s = 2 device-loads on 2 devices plus a's
    # slot: scaled down; b keeps device 0 to itself, a shares device 1 with b.
    assert sched.epochs == 1
    assert sched.plan.scale < 1.0
    assert sched.devices_of("b") == (0, 1)
    assert sched.devices_of("a") == (1,)
    assert [(s.model, s.batch) for s in sched.sessions_on(0)] == [("b", 6)]
    assert [(s.model, s.batch) for s in sched.sessions_on(1)] == [("b", 3), ("a", 1)]
    # Request 2 left device 0 (which no longer hosts a) for a's new device.
    assert sched.queued_on(0, "a") == 0
    assert sched.queued_on(1, "a") == 1


def test_idle_epoch_keeps_the_plan():
    # No hints: the rate meters have no prior, so an epoch without arrivals
    # measures 0 req/s everywhere, and the plan stays.
    sched = NexusScheduler([A("a"), A("b")], devices(2), epoch_s=1.0)
    sched.add_request(req("a", 0.0), 0.0)
    plan = sched.plan
    sched.advance(5.0)
    assert sched.epochs == 0
    assert sched.plan is plan
    assert sched.timers.when(("nexus", "epoch")) == pytest.approx(6.0)


def test_steady_state_after_replan_meets_every_deadline():
    sched = NexusScheduler(
        [A("a", 600.0), A("b", 600.0)], devices(2), epoch_s=1.0, fill_devices=False
    )
    arrivals = [req("a", i / 750) for i in range(1500)] + [req("b", j / 150) for j in range(300)]
    batches, dropped = simulate(sched, arrivals, until=3.0)
    late = [r for b in batches for r in b.requests if b.finish_at > r.deadline + 1e-12]
    assert late == []  # drops, never late answers
    second = [r for r, _ in dropped if r.arrival >= 1.1]
    assert second == []
    served = sum(b.size for b in batches if b.start_at >= 1.1)
    assert served == pytest.approx(0.9 * 900, abs=10)
