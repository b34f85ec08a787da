"""Policy `inss` (app/scheduling/inss.py): FIFO per model, a batch of b_i
sent once b_i requests are queued, otherwise at the queued requests' last
moment behind one planned batch (deadline − ℓ(queued) − delay − ℓ(b_i), or
the models' duty cycle on a time-shared device), a
request queued past its SLO dropped — on the virtual clock."""

from __future__ import annotations

import pytest

from app.scheduling.inss import InssScheduler
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DropReason, Request
from tests.fakes import before, devices, dispatches, drops, ids

MS = 1e-3


def model(name: str = "m", slo_ms: float = 50.0, max_batch: int = 32) -> ModelInfo:
    # ℓ(b) = (b + 4) ms: ℓ(21) = 25 ms = SLO / 2 at a 50-ms SLO.
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, max_batch), slo_ms * MS, max_batch)


def request(i: int, arrival: float, slo: float = 0.050, name: str = "m") -> Request:
    return Request(i, name, arrival, arrival + slo)


def test_batch_is_the_plans_or_else_the_largest_within_half_the_slo():
    s = make_scheduler("inss", [model(), model("n", max_batch=4)], devices(1))
    assert isinstance(s, InssScheduler)
    assert (s.config["m"].max_batch, s.config["n"].max_batch) == (21, 4)
    assert s.config["m"].queue_timeout == pytest.approx(0.050)  # the SLO
    s = make_scheduler("inss", [model(), model("n")], devices(1), batch={"m": 6})
    assert (s.config["m"].max_batch, s.config["n"].max_batch) == (6, 21)
    s = make_scheduler("inss", [model(max_batch=8)], devices(1), batch=12)
    assert s.config["m"].max_batch == 8  # capped by the model's max batch
    for option in ("max_batch", "max_queue_delay_ms"):
        with pytest.raises(ValueError, match=f"policy inss takes no '{option}'"):
            make_scheduler("inss", [model()], devices(1), **{option: 4})


def test_a_full_batch_is_sent_at_once():
    s = InssScheduler([model()], devices(1), batch=4)
    for i, t in enumerate((0.001, 0.002, 0.003), start=1):
        assert s.add_request(request(i, t), t) == []
    (d,) = dispatches(s.add_request(request(4, 0.004), 0.004))
    assert ids(d.batch.requests) == [1, 2, 3, 4]
    assert d.batch.start_at == pytest.approx(0.004)
    assert d.batch.finish_at == pytest.approx(0.012)  # ℓ(4) = 8 ms


def test_a_partial_batch_goes_at_its_last_moment_behind_one_planned_batch():
    # Batch 8 (ℓ(8) = 12 ms held in reserve); three requests at 10, 12,
    # 15 ms, the oldest due at 60 ms. The last moment moves earlier as the
    # queue grows: 60 − ℓ(1) − 12 = 43 ms, then 42, then 60 − ℓ(3) − 12 =
    # 41 ms, when all three go (and end at 48 ms).
    s = InssScheduler([model()], devices(1), batch=8)
    for i, (t, last) in enumerate(((0.010, 0.043), (0.012, 0.042), (0.015, 0.041)), start=1):
        assert s.add_request(request(i, t), t) == []
        assert s.next_wakeup() == pytest.approx(last)
    wake = s.next_wakeup()
    assert wake is not None
    assert s.advance(before(wake)) == []
    (d,) = dispatches(s.advance(wake))
    assert ids(d.batch.requests) == [1, 2, 3]
    assert (d.batch.start_at, d.batch.finish_at) == pytest.approx((0.041, 0.048))


def test_models_in_turn_on_a_device_reserve_the_duty_cycle():
    # m at batch 8 (ℓ = 12 ms) and n at batch 4 (ℓ = 8 ms) time-share one
    # device: one planned batch of each may run first, a 20-ms cycle, so a
    # lone request due at 60 ms goes at 60 − ℓ(1) − 20 = 35 ms, whichever
    # model it is for. Over two devices the cycle is 10 ms, below m's own
    # ℓ(8): m's reserve is 12 ms again (43 ms), n's 10 ms (45 ms).
    for n_devices, last_m, last_n in ((1, 0.035, 0.035), (2, 0.043, 0.045)):
        s = InssScheduler([model(), model("n")], devices(n_devices), batch={"m": 8, "n": 4})
        assert s.add_request(request(1, 0.010), 0.010) == []
        assert s.next_wakeup() == pytest.approx(last_m)
        s = InssScheduler([model(), model("n")], devices(n_devices), batch={"m": 8, "n": 4})
        assert s.add_request(request(1, 0.010, name="n"), 0.010) == []
        assert s.next_wakeup() == pytest.approx(last_n)


def test_without_the_reserve_a_partial_batch_ends_at_its_deadline():
    s = InssScheduler([model()], devices(1), batch=8, reserve_batch=False)
    for i, t in enumerate((0.010, 0.012, 0.015), start=1):
        assert s.add_request(request(i, t), t) == []
    wake = s.next_wakeup()
    assert wake == pytest.approx(0.053)  # 60 − ℓ(3)
    (d,) = dispatches(s.advance(wake))
    assert d.batch.finish_at == pytest.approx(0.060)


def test_the_last_moment_counts_the_dispatch_delay_and_the_earliest_deadline():
    # d_ctrl 1 ms + d_data 0.5 ms per item. Request 2 arrives later with a
    # tighter deadline (30 ms): 30 − ℓ(2) − delay(2) − ℓ(8) = 30 − 6 − 2 −
    # 12 = 10 ms.
    s = InssScheduler([model()], devices(1), batch=8, d_ctrl=0.001, d_data=0.0005)
    assert s.add_request(Request(1, "m", 0.0, 0.050), 0.0) == []
    assert s.add_request(Request(2, "m", 0.005, 0.030), 0.005) == []
    assert s.next_wakeup() == pytest.approx(0.010)
    (d,) = dispatches(s.advance(s.next_wakeup()))
    assert ids(d.batch.requests) == [1, 2]
    assert d.batch.finish_at == pytest.approx(0.018)


def test_a_request_queued_past_its_slo_is_dropped():
    # Batch 1: request 1 runs at once and the device stays busy (no end is
    # reported). Request 2 (at 1 ms) is ready at its last moment, 41 ms, but
    # no device is free; just after 51 ms (its SLO) it is dropped.
    s = InssScheduler([model()], devices(1), batch=1)
    (d,) = dispatches(s.add_request(request(1, 0.0), 0.0))
    assert ids(d.batch.requests) == [1]
    assert s.add_request(request(2, 0.001), 0.001) == []
    assert s.advance(0.046) == []
    assert s.advance(0.051) == []  # not yet: dropped once now > arrival + SLO
    wake = s.next_wakeup()
    assert wake is not None and 0.051 < wake < 0.051 + 1e-9
    (drop,) = drops(s.advance(wake))
    assert ids(drop.requests) == [2] and drop.reason is DropReason.QUEUE_TIMEOUT
    assert s.queued() == 0


def test_without_a_plan_bda_sizes_batches_from_the_measured_rate():
    # ℓ(b) = (b + 4) ms, SLO 50 ms, no dispatch delay. Worst task latency at
    # rate λ: max(ℓ(b), (b − 1)/λ) + ℓ(b). At 500 req/s: b = 13 gives
    # max(17, 24) + 17 = 41 ms, b = 14 gives 26 + 18 = 44 ms, b = 16: 30 +
    # 20 = 50 ms, b = 17: 32 + 21 = 53 ms → BDA's b = 16 (≤ 6 probes).
    s = InssScheduler([model()], devices(1), rate_window_s=1.0, bda_every_s=1.0)
    assert s.config["m"].max_batch == 21  # no rate yet: Gpulet's rule
    t, i = 0.0, 0
    while t < 1.0:  # 500 req/s for a second; batches run as they fill
        i += 1
        s.add_request(request(i, t), t)
        t += 0.002
    assert s.bda_runs == 1  # the first arrival (no rate yet: the batch stays)
    assert s.config["m"].max_batch == 21
    s.add_request(request(i + 1, 1.0), 1.0)  # a second on: BDA at the measured rate
    assert s.bda_runs == 2
    rate = s.rates["m"].rate(1.0)
    assert rate == pytest.approx(500, rel=0.01)
    assert s.config["m"].max_batch == 16
    # A planned batch is fixed: BDA never runs.
    planned = InssScheduler([model()], devices(1), batch=6)
    for j in range(600):
        planned.add_request(request(10_000 + j, j * 0.002), j * 0.002)
    assert (planned.bda_runs, planned.config["m"].max_batch) == (0, 6)
    with pytest.raises(ValueError, match="bda_every_s must be a finite number > 0, got 0"):
        InssScheduler([model()], devices(1), bda_every_s=0)


def test_a_backlog_goes_in_one_larger_batch_that_still_meets_the_oldest_deadline():
    # Batch 2: requests 1–2 run at once (ℓ(2) = 6 ms, busy to 6 ms); eight
    # more queue meanwhile (1 … 8 ms). When the device frees at 9 ms the
    # oldest queued is due at 51 ms: ℓ(8) = 12 ms ends at 21 ms, so all
    # eight go together; the paper's FIFO (catch_up=False) sends 2.
    for catch_up, sizes in ((True, [8]), (False, [2, 2, 2, 2])):
        s = InssScheduler([model()], devices(1), batch=2, catch_up=catch_up)
        s.add_request(request(1, 0.0), 0.0)
        (first,) = dispatches(s.add_request(request(2, 0.0), 0.0))
        for i in range(3, 11):
            assert s.add_request(request(i, 0.001 * (i - 2)), 0.001 * (i - 2)) == []
        sent, batch, now = [], first.batch, 0.009
        while s.queued():
            (d,) = dispatches(s.batch_finished(0, batch.id, now))
            sent.append(len(d.batch.requests))
            batch, now = d.batch, d.batch.finish_at
        assert sent == sizes, catch_up
    # Capped by how much still meets the oldest deadline: due at 19 ms, at
    # 9 ms only ℓ(b) ≤ 10 ms fits (b ≤ 6).
    s = InssScheduler([model()], devices(1), batch=2)
    s.add_request(request(1, 0.0), 0.0)
    (first,) = dispatches(s.add_request(request(2, 0.0), 0.0))
    for i in range(3, 11):
        assert s.add_request(request(i, 0.001, slo=0.018), 0.001) == []
    (d,) = dispatches(s.batch_finished(0, first.batch.id, 0.009))
    assert ids(d.batch.requests) == [3, 4, 5, 6, 7, 8]


def test_a_request_that_cannot_end_in_time_even_alone_is_dropped_at_a_free_device():
    # Batch 1: request 1 (0 ms) holds the device to 5 ms; request 2 (1 ms,
    # due 8 ms) would end at 10 ms even alone: dropped when the device frees,
    # request 3 (due 51 ms) runs. With drop_hopeless=False it runs late.
    for drop_hopeless in (True, False):
        s = InssScheduler([model()], devices(1), batch=1, drop_hopeless=drop_hopeless)
        (first,) = dispatches(s.add_request(request(1, 0.0), 0.0))
        assert s.add_request(request(2, 0.001, slo=0.007), 0.001) == []
        assert s.add_request(request(3, 0.001), 0.001) == []
        decisions = s.batch_finished(0, first.batch.id, 0.005)
        (d,) = dispatches(decisions)
        if drop_hopeless:
            (drop,) = drops(decisions)
            assert ids(drop.requests) == [2] and drop.reason is DropReason.DEADLINE
            assert ids(d.batch.requests) == [3]
        else:
            assert drops(decisions) == [] and ids(d.batch.requests) == [2]
            assert d.batch.finish_at == pytest.approx(0.010)  # past its 8-ms deadline
