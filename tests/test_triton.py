"""Triton dynamic-batcher baseline, driven with a virtual clock."""

from __future__ import annotations

import heapq
import random

import pytest

from app.scheduling.clockwork import ClockworkScheduler
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.triton import TritonScheduler
from app.scheduling.types import Decision, Dispatch, Drop, DropReason, Request
from tests.fakes import before, decided, devices, dispatches, drops, ids

MS = 1e-3


def model(name: str = "m", slo_ms: float = 50.0, max_batch: int = 32) -> ModelInfo:
    # ℓ(b) = (b + 4) ms: ℓ(1) = 5 ms, ℓ(16) = 20 ms, ℓ(46) = 50 ms.
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, max_batch), slo_ms * MS, max_batch)


class Ids:
    def __init__(self) -> None:
        self.next = 0

    def req(self, m: str, arrival: float, slo: float = 0.050) -> Request:
        self.next += 1
        return Request(self.next, m, arrival, arrival + slo)


def test_registry_builds_triton_with_options() -> None:
    s = make_scheduler("triton", [model()], devices(1), max_queue_delay_ms=2, max_batch=8)
    assert isinstance(s, TritonScheduler)
    assert s.name == "triton"
    cfg = s.config["m"]
    assert (cfg.max_batch, cfg.max_queue_delay) == (8, 0.002)
    with pytest.raises(ValueError, match="bad option"):
        make_scheduler("triton", [model()], devices(1), max_queue_delay=2)


def test_defaults_are_what_a_careful_user_would_set() -> None:
    s = TritonScheduler([model("a", slo_ms=20), model("b", slo_ms=100, max_batch=64)], devices(1))
    a, b = s.config["a"], s.config["b"]
    # max batch: largest b with ℓ(b) ≤ SLO: 20 ms → 16; 100 ms → 96, capped at 64.
    assert a.max_batch == 16
    assert b.max_batch == 64
    # Triton's default delay is 0; queue timeout defaults to the SLO.
    assert a.max_queue_delay == 0.0
    assert a.queue_timeout == pytest.approx(0.020)
    assert b.queue_timeout == pytest.approx(0.100)
    assert a.preferred == ()
    assert a.max_queue_size is None


def test_options_validate_and_cap() -> None:
    s = TritonScheduler(
        [model("a", max_batch=8), model("b")],
        devices(1),
        max_batch={"a": 100},
        preferred_batch_sizes=[4, 16, 2],
        queue_timeout_ms=None,
    )
    assert s.config["a"].max_batch == 8  # capped at the model's max_batch
    assert s.config["a"].preferred == (4, 2)  # 16 > 8 ignored for "a"
    assert s.config["b"].max_batch == 32  # slo_batch of a 50 ms SLO: 46, capped at 32
    assert s.config["b"].preferred == (16, 4, 2)
    assert s.config["a"].queue_timeout is None
    with pytest.raises(ValueError):
        TritonScheduler([model()], devices(1), max_batch={"nope": 4})
    with pytest.raises(ValueError):
        TritonScheduler([model()], devices(1), max_queue_delay_ms=-1)
    with pytest.raises(ValueError):
        TritonScheduler([model()], devices(1), queue_timeout_ms="forever")
    with pytest.raises(ValueError):
        TritonScheduler([model()], devices(1), preferred_batch_sizes=[0])


def test_default_delay_zero_sends_whatever_is_queued_at_once() -> None:
    s = TritonScheduler([model()], devices(1))
    q = Ids()
    (d,) = dispatches(s.add_request(q.req("m", 0.0), 0.0))
    assert d.batch.size == 1
    assert (d.batch.start_at, d.batch.device) == (0.0, 0)
    # Device busy: three more queue, then all go together when it frees.
    for t in (0.001, 0.002, 0.003):
        assert s.add_request(q.req("m", t), t) == []
    (d2,) = dispatches(s.batch_finished(0, d.batch.id, 0.005))
    assert ids(d2.batch.requests) == [2, 3, 4]
    assert d2.batch.finish_at == pytest.approx(0.005 + 0.007)


def test_waits_max_queue_delay_then_sends_what_is_there() -> None:
    s = TritonScheduler([model()], devices(1), max_queue_delay_ms=5, max_batch=8)
    q = Ids()
    for t in (0.010, 0.011, 0.013):
        assert s.add_request(q.req("m", t), t) == []
    # Oldest arrived at 10 ms: it may be held until 15 ms.
    assert s.next_wakeup() == pytest.approx(0.015)
    assert s.advance(before(s.next_wakeup())) == []
    (d,) = dispatches(s.advance(0.015))
    assert ids(d.batch.requests) == [1, 2, 3]
    assert d.batch.start_at == 0.015


def test_dispatches_immediately_at_max_batch() -> None:
    s = TritonScheduler([model()], devices(1), max_queue_delay_ms=100, max_batch=4)
    q = Ids()
    for t in (0.0, 0.001, 0.002):
        assert s.add_request(q.req("m", t), t) == []
    (d,) = dispatches(s.add_request(q.req("m", 0.003), 0.003))
    assert d.batch.size == 4
    assert d.batch.start_at == 0.003
    # Nothing left waiting: no delay or timeout timer.
    assert s.next_wakeup() is None


def test_full_queue_sends_max_batch_and_keeps_the_rest_fifo() -> None:
    s = TritonScheduler([model()], devices(1), max_batch=4, queue_timeout_ms=None)
    q = Ids()
    first = dispatches(s.add_request(q.req("m", 0.0), 0.0))[0].batch
    for i in range(6):
        s.add_request(q.req("m", 0.001 + i * 1e-4), 0.001 + i * 1e-4)
    (d,) = dispatches(s.batch_finished(0, first.id, 0.005))
    assert ids(d.batch.requests) == [2, 3, 4, 5]
    (d2,) = dispatches(s.batch_finished(0, d.batch.id, d.batch.finish_at))
    assert ids(d2.batch.requests) == [6, 7]


def test_preferred_batch_size_sent_without_waiting_for_the_delay() -> None:
    s = TritonScheduler(
        [model()], devices(1), max_queue_delay_ms=50, max_batch=16, preferred_batch_sizes=[2, 4]
    )
    q = Ids()
    assert s.add_request(q.req("m", 0.0), 0.0) == []
    (d,) = dispatches(s.add_request(q.req("m", 0.001), 0.001))
    assert d.batch.size == 2  # preferred size reached: sent at once
    # With the device busy, 5 pile up; on free the largest formable preferred
    # size (4) goes, not all 5.
    for i in range(5):
        s.add_request(q.req("m", 0.002 + i * 1e-4), 0.002 + i * 1e-4)
    (d2,) = dispatches(s.batch_finished(0, d.batch.id, 0.007))
    assert d2.batch.size == 4
    # One left: it waits for its delay (arrived at 2.4 ms → 52.4 ms).
    assert s.queued() == 1
    assert decided(s.batch_finished(0, d2.batch.id, 0.015)) == []
    assert s.next_wakeup() == pytest.approx(0.0524)
    (d3,) = dispatches(s.advance(s.next_wakeup()))
    assert ids(d3.batch.requests) == [7]


def test_rejects_after_queue_timeout_at_the_right_time() -> None:
    big = ModelInfo("big", LatencyProfile.linear(1.0, 99.0, 8), 1.0, 8)  # ℓ(1) = 100 ms
    s = TritonScheduler([model(), big], devices(1), queue_timeout_ms=10)
    q = Ids()
    blocker = dispatches(s.add_request(q.req("big", 0.0, 1.0), 0.0))[0].batch
    r1 = q.req("m", 0.001)
    r2 = q.req("m", 0.004)
    assert s.add_request(r1, 0.001) == []
    assert s.add_request(r2, 0.004) == []
    # r1 may wait 10 ms: rejected just after 11 ms, not at 11 ms.
    wake = s.next_wakeup()
    assert wake == pytest.approx(0.011, abs=1e-12) and wake > 0.011
    assert s.advance(0.011) == []
    (drop,) = drops(s.advance(wake))
    assert drop.reason is DropReason.QUEUE_TIMEOUT
    assert ids(drop.requests) == [r1.id]
    assert s.queued() == 1
    wake2 = s.next_wakeup()
    assert wake2 == pytest.approx(0.014, abs=1e-12) and wake2 > 0.014
    (drop2,) = drops(s.advance(wake2))
    assert ids(drop2.requests) == [r2.id]
    assert s.queued() == 0 and s.next_wakeup() is None
    assert decided(s.batch_finished(0, blocker.id, 0.100)) == []


def test_default_queue_timeout_is_the_slo() -> None:
    big = ModelInfo("big", LatencyProfile.linear(1.0, 99.0, 8), 1.0, 8)
    s = TritonScheduler([model(slo_ms=20), big], devices(1))
    q = Ids()
    s.add_request(q.req("big", 0.0, 1.0), 0.0)
    s.add_request(q.req("m", 0.002, 0.020), 0.002)
    assert s.next_wakeup() == pytest.approx(0.022, abs=1e-12)


def test_deadline_unaware_finishes_late_without_dropping() -> None:
    # SLO 8 ms, ℓ(1) = 5 ms. r2 queues behind r1 and starts at 5 ms: it ends at
    # 10 ms, 1 ms after its deadline. Triton runs it anyway; Clockwork drops it.
    triton = TritonScheduler([model(slo_ms=8)], devices(1))
    clockwork = ClockworkScheduler([model(slo_ms=8)], devices(1))
    for s in (triton, clockwork):
        b1 = dispatches(s.add_request(Request(1, "m", 0.0, 0.008), 0.0))[0].batch
        assert s.add_request(Request(2, "m", 0.001, 0.009), 0.001) == []
        if s is clockwork:
            # Clockwork drops r2 as soon as it is hopeless: 4 ms + ℓ(1) > 9 ms.
            wake = s.next_wakeup()
            assert wake == pytest.approx(0.004, abs=1e-12)
            out = list(s.advance(wake))
            out += s.batch_finished(0, b1.id, 0.005)
        else:
            assert s.advance(0.004) == []
            out = list(s.batch_finished(0, b1.id, 0.005))
        if s is triton:
            assert drops(out) == []
            (d,) = dispatches(out)
            assert ids(d.batch.requests) == [2]
            assert d.batch.finish_at == pytest.approx(0.010)
            assert d.batch.finish_at > 0.009  # late
        else:
            assert dispatches(out) == []
            assert [r.id for d in drops(out) for r in d.requests] == [2]


def test_oldest_request_first_across_models() -> None:
    s = TritonScheduler([model("a"), model("b")], devices(1), queue_timeout_ms=None)
    q = Ids()
    first = dispatches(s.add_request(q.req("a", 0.0), 0.0))[0].batch
    rb = q.req("b", 0.001, slo=0.001)  # older, and a tight deadline: irrelevant to Triton
    ra = q.req("a", 0.002, slo=0.0001)
    s.add_request(rb, 0.001)
    s.add_request(ra, 0.002)
    (d,) = dispatches(s.batch_finished(0, first.id, 0.005))
    assert d.batch.model == "b"
    (d2,) = dispatches(s.batch_finished(0, d.batch.id, 0.010))
    assert d2.batch.model == "a"


def test_fifo_by_arrival_not_by_deadline() -> None:
    s = TritonScheduler([model()], devices(1), max_batch=1, queue_timeout_ms=None)
    first = dispatches(s.add_request(Request(1, "m", 0.0, 0.05), 0.0))[0].batch
    s.add_request(Request(2, "m", 0.001, 0.09), 0.001)  # older, later deadline
    s.add_request(Request(3, "m", 0.002, 0.02), 0.002)  # newer, earlier deadline
    (d,) = dispatches(s.batch_finished(0, first.id, 0.005))
    assert ids(d.batch.requests) == [2]


def test_each_freed_device_takes_the_oldest_requests() -> None:
    s = TritonScheduler([model()], devices(2), max_batch=2, queue_timeout_ms=None)
    q = Ids()
    b1 = dispatches(s.add_request(q.req("m", 0.0), 0.0))[0].batch
    b2 = dispatches(s.add_request(q.req("m", 0.001), 0.001))[0].batch
    assert (b1.device, b2.device) == (0, 1)
    for _ in range(4):
        s.add_request(q.req("m", 0.002), 0.002)
    # Device 1 reports first: it takes the two oldest.
    (d,) = dispatches(s.batch_finished(1, b2.id, 0.004))
    assert d.batch.device == 1 and ids(d.batch.requests) == [3, 4]
    (d2,) = dispatches(s.batch_finished(0, b1.id, 0.005))
    assert d2.batch.device == 0 and ids(d2.batch.requests) == [5, 6]


def test_longest_idle_device_gets_the_next_batch() -> None:
    s = TritonScheduler([model()], devices(2), queue_timeout_ms=None)
    q = Ids()
    b1 = dispatches(s.add_request(q.req("m", 0.0), 0.0))[0].batch
    b2 = dispatches(s.add_request(q.req("m", 0.001), 0.001))[0].batch
    assert decided(s.batch_finished(1, b2.id, 0.004)) == []  # device 1 idle since 4 ms
    assert decided(s.batch_finished(0, b1.id, 0.005)) == []  # device 0 idle since 5 ms
    (d,) = dispatches(s.add_request(q.req("m", 0.010), 0.010))
    assert d.batch.device == 1


def test_max_queue_size_rejects_overflow() -> None:
    s = TritonScheduler([model()], devices(1), max_queue_size=2, queue_timeout_ms=None)
    q = Ids()
    s.add_request(q.req("m", 0.0), 0.0)  # runs
    s.add_request(q.req("m", 0.001), 0.001)
    s.add_request(q.req("m", 0.001), 0.001)
    (drop,) = drops(s.add_request(q.req("m", 0.001), 0.001))
    assert drop.reason is DropReason.OVERLOADED
    assert ids(drop.requests) == [4]
    assert s.queued() == 2


def test_transfer_delay_shifts_start() -> None:
    s = TritonScheduler([model()], devices(1), d_ctrl=0.001, d_data=0.0005)
    (d,) = dispatches(s.add_request(Request(1, "m", 0.0, 0.05), 0.0))
    assert d.batch.start_at == pytest.approx(0.0015)
    assert d.batch.finish_at == pytest.approx(0.0065)


# ------------------------------------------------------------ randomized check


@pytest.mark.parametrize("seed", [1, 2])
def test_random_load_accounts_every_request_and_respects_the_rules(seed: int) -> None:
    rng = random.Random(seed)
    models = [model("a", slo_ms=20), model("b", slo_ms=40)]
    s = TritonScheduler(models, devices(2), max_queue_delay_ms=2, preferred_batch_sizes=[8])
    events: list[tuple[float, int, str, object]] = []
    t = 0.0
    n = 800
    for i in range(n):
        t += rng.expovariate(2000.0)
        m = rng.choice(models)
        events.append((t, i, "arrive", Request(i, m.name, t, t + m.slo)))
    heapq.heapify(events)
    seq = n
    batches, dropped = [], []
    now = 0.0

    def handle(decisions: list[Decision]) -> None:
        nonlocal seq
        for d in decisions:
            if isinstance(d, Dispatch):
                batches.append((now, d.batch))
                heapq.heappush(events, (d.batch.finish_at, seq, "finish", d.batch))
                seq += 1
            elif isinstance(d, Drop):
                dropped.extend((now, r, d.reason) for r in d.requests)

    while events or s.next_wakeup() is not None:
        wake = s.next_wakeup()
        if wake is not None and (not events or wake <= events[0][0]):
            now = wake
            handle(s.advance(now))
            continue
        now, _, kind, item = heapq.heappop(events)
        if kind == "arrive":
            handle(s.add_request(item, now))
        else:
            handle(s.batch_finished(item.device, item.id, now))

    served = [r.id for _, b in batches for r in b.requests]
    assert sorted(served + [r.id for _, r, _ in dropped]) == list(range(n))
    late = 0
    for when, b in batches:
        cfg = s.config[b.model]
        assert 1 <= b.size <= cfg.max_batch
        oldest = min(r.arrival for r in b.requests)
        # Never timed out when dispatched; a short batch only after the delay.
        assert when <= oldest + cfg.queue_timeout
        if b.size not in (cfg.max_batch, 8):
            assert when >= oldest + cfg.max_queue_delay - 1e-12
        late += sum(r.deadline < b.finish_at for r in b.requests)
    for when, r, reason in dropped:
        assert reason is DropReason.QUEUE_TIMEOUT
        assert when > r.arrival + s.config[r.model].queue_timeout
        assert when == pytest.approx(r.arrival + s.config[r.model].queue_timeout, abs=1e-9)
    assert late > 0, "the load is meant to make the deadline-unaware batcher run late"
