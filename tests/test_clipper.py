"""Clipper baseline: AIMD batch cap per model, deadline-unaware batching,
driven with a virtual clock."""

from __future__ import annotations

import numpy as np
import pytest

from app.results import DROP_REASONS, Outcome
from app.scheduling.clipper import ClipperScheduler
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler, policy_options
from app.scheduling.types import Batch, DropReason, Request
from app.simulation.engine import run_simulation
from tests.fakes import before, devices, dispatches, drops, ids

MS = 1e-3


def model(name: str = "m", slo_ms: float = 50.0, max_batch: int = 8) -> ModelInfo:
    # ℓ(b) = (b + 4) ms: ℓ(1) = 5 ms, ℓ(8) = 12 ms.
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, max_batch), slo_ms * MS, max_batch)


class Ids:
    def __init__(self) -> None:
        self.next = 0

    def req(self, m: str, arrival: float, deadline: float, items: int = 1) -> Request:
        self.next += 1
        return Request(self.next, m, arrival, deadline, items)


def only_batch(decisions) -> Batch:
    (d,) = dispatches(decisions)
    return d.batch


# ------------------------------------------------------------------ registry


def test_registry_builds_clipper_with_its_options() -> None:
    s = make_scheduler("clipper", [model()], devices(2), aimd_backoff=0.5, initial_batch=3)
    assert isinstance(s, ClipperScheduler)
    assert s.name == "clipper"
    assert s.cap == {"m": 3.0}
    assert s.aimd_backoff == 0.5
    assert {"initial_batch", "aimd_increase", "aimd_backoff"} <= set(policy_options("clipper"))
    with pytest.raises(ValueError, match="bad option"):
        make_scheduler("clipper", [model()], devices(1), preferred_batch_sizes=[4])


@pytest.mark.parametrize(
    ("option", "value"),
    [("aimd_backoff", 1.0), ("aimd_backoff", 0.0), ("aimd_increase", 0.0), ("initial_batch", 0.5)],
)
def test_bad_aimd_options_are_refused_by_name(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=option):
        ClipperScheduler([model()], devices(1), **{option: value})


def test_initial_cap_is_capped_at_max_batch() -> None:
    s = ClipperScheduler([model(max_batch=4)], devices(1), initial_batch=10)
    assert s.cap == {"m": 4.0}


# ---------------------------------------------------------------------- AIMD


def test_cap_grows_by_one_within_the_slo_and_shrinks_by_a_tenth_past_it() -> None:
    s = ClipperScheduler([model(slo_ms=50)], devices(1))
    q = Ids()
    batch = only_batch(s.add_request(q.req("m", 0.0, 10.0), 0.0))
    for _ in range(40):
        assert s.add_request(q.req("m", 0.0, 10.0), 0.0) == []
    sizes, caps = [batch.size], []
    # The measured latency is finish − start: three fast batches, two slow
    # ones (60 ms > the 50 ms SLO), two fast again.
    for latency_ms in (5, 6, 7, 60, 60, 9, 10):
        batch = only_batch(s.batch_finished(0, batch.id, batch.start_at + latency_ms * MS))
        caps.append(s.cap["m"])
        sizes.append(batch.size)
    assert caps == pytest.approx([2.0, 3.0, 4.0, 3.6, 3.24, 4.24, 5.24])
    assert sizes == [1, 2, 3, 4, 3, 3, 4, 5]
    # Batches take the queue's front in order.
    assert s.queued() == 41 - sum(sizes)


def test_a_batch_exactly_at_the_slo_is_within_it() -> None:
    s = ClipperScheduler([model(slo_ms=50)], devices(1))
    q = Ids()
    batch = only_batch(s.add_request(q.req("m", 0.0, 10.0), 0.0))
    s.batch_finished(0, batch.id, batch.start_at + 0.050)
    assert s.cap["m"] == 2.0


def test_cap_stays_within_one_and_max_batch() -> None:
    s = ClipperScheduler([model(max_batch=3)], devices(1))
    q = Ids()
    batch = only_batch(s.add_request(q.req("m", 0.0, 10.0), 0.0))
    for _ in range(30):
        s.add_request(q.req("m", 0.0, 10.0), 0.0)
    # Slow at cap 1: the floor holds it at 1.
    batch = only_batch(s.batch_finished(0, batch.id, batch.start_at + 1.0))
    assert s.cap["m"] == 1.0 and batch.size == 1
    sizes = []
    for _ in range(5):
        batch = only_batch(s.batch_finished(0, batch.id, batch.start_at + 5 * MS))
        sizes.append(batch.size)
    assert sizes == [2, 3, 3, 3, 3]
    assert s.cap["m"] == 3.0


def test_the_cap_is_per_model() -> None:
    s = ClipperScheduler([model("a"), model("b")], devices(2))
    q = Ids()
    a = only_batch(s.add_request(q.req("a", 0.0, 10.0), 0.0))
    b = only_batch(s.add_request(q.req("b", 0.0, 10.0), 0.0))
    s.batch_finished(a.device, a.id, 5 * MS)
    s.batch_finished(b.device, b.id, 1.0)
    assert s.cap == {"a": 2.0, "b": 1.0}


def test_a_stopped_batch_leaves_the_cap_alone_and_its_requests_go_back() -> None:
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    batch = only_batch(s.add_request(q.req("m", 0.0, 10.0), 0.0))
    again = only_batch(s.batch_stopped(0, batch.id, 0.002))
    assert s.cap["m"] == 1.0
    assert ids(again.requests) == ids(batch.requests)
    assert again.start_at == 0.002


# ------------------------------------------------------------------- batches


def test_work_conserving_dispatches_a_lone_request_at_once() -> None:
    s = ClipperScheduler([model()], devices(1))
    batch = only_batch(s.add_request(Request(1, "m", 0.0, 0.050), 0.0))
    assert ids(batch.requests) == [1]
    assert (batch.device, batch.start_at) == (0, 0.0)
    assert batch.finish_at == pytest.approx(5 * MS)
    assert s.next_wakeup() is None


def test_batches_take_requests_in_arrival_order() -> None:
    s = ClipperScheduler([model(slo_ms=100)], devices(1), initial_batch=3)
    q = Ids()
    first = only_batch(s.add_request(q.req("m", 0.0, 0.1), 0.0))
    waiting = []
    for k in range(1, 8):
        r = q.req("m", k * MS, k * MS + 0.1)
        waiting.append(r)
        assert s.add_request(r, k * MS) == []
    taken = []
    batch = first
    while s.queued():
        batch = only_batch(s.batch_finished(0, batch.id, batch.finish_at))
        taken.append(ids(batch.requests))
    # Cap 3 → 4 → 5 after each fast batch; FIFO throughout.
    assert taken == [ids(waiting[:4]), ids(waiting[4:])]


def test_the_queue_is_in_deadline_order_as_clippers_own() -> None:
    # Every request of a model has the same SLO in practice; one given an
    # earlier deadline goes first, as in Clipper's deadline-ordered queue.
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    first = only_batch(s.add_request(q.req("m", 0.0, 1.0), 0.0))
    late = q.req("m", 0.001, 1.0)
    urgent = q.req("m", 0.002, 0.5)
    s.add_request(late, 0.001)
    s.add_request(urgent, 0.002)
    nxt = only_batch(s.batch_finished(0, first.id, 0.005))  # cap 2 now
    assert ids(nxt.requests) == [urgent.id, late.id]


def test_the_model_whose_head_is_due_first_gets_the_idle_device() -> None:
    s = ClipperScheduler([model("a", slo_ms=50), model("b", slo_ms=20)], devices(1))
    q = Ids()
    first = only_batch(s.add_request(q.req("a", 0.0, 0.050), 0.0))
    ra = q.req("a", 0.001, 0.051)
    rb = q.req("b", 0.002, 0.022)
    s.add_request(ra, 0.001)
    s.add_request(rb, 0.002)
    nxt = only_batch(s.batch_finished(0, first.id, 0.005))
    assert (nxt.model, ids(nxt.requests)) == ("b", [rb.id])


def test_a_batch_stops_at_the_first_request_that_does_not_fit() -> None:
    s = ClipperScheduler([model()], devices(1), initial_batch=4)
    q = Ids()
    first = only_batch(s.add_request(q.req("m", 0.0, 1.0, items=1), 0.0))
    r1 = q.req("m", 0.001, 1.0, items=2)
    r2 = q.req("m", 0.002, 1.0, items=4)
    r3 = q.req("m", 0.003, 1.0, items=1)
    for r in (r1, r2, r3):
        s.add_request(r, r.arrival)
    # Cap 5 now: 2 + 4 > 5, so r2 waits, and r3 (which would fit) is not
    # taken past it.
    nxt = only_batch(s.batch_finished(0, first.id, 0.005))
    assert ids(nxt.requests) == [r1.id]
    assert nxt.size == 2


def test_a_request_above_the_cap_goes_alone() -> None:
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    big = q.req("m", 0.0, 1.0, items=6)
    small = q.req("m", 0.0, 1.0)
    batch = only_batch(s.add_request(big, 0.0))
    assert s.add_request(small, 0.0) == []
    assert batch.size == 6 and batch.finish_at == pytest.approx(10 * MS)


# --------------------------------------------------------------------- drops


def test_a_request_is_dropped_exactly_when_its_deadline_passes() -> None:
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    busy = only_batch(s.add_request(q.req("m", 0.0, 1.0), 0.0))
    r = q.req("m", 0.001, 0.003)
    assert s.add_request(r, 0.001) == []
    assert s.next_wakeup() == 0.003
    assert s.advance(before(0.003)) == []
    (drop,) = drops(s.advance(0.003))
    assert drop.reason is DropReason.DEADLINE and ids(drop.requests) == [r.id]
    assert s.queued() == 0 and s.next_wakeup() is None
    # The device frees later: nothing left to run.
    assert dispatches(s.batch_finished(0, busy.id, 0.005)) == []


def test_a_request_that_will_finish_late_still_runs() -> None:
    # Deadline-unaware: 2 ms left, ℓ(1) = 5 ms; it runs and ends at 7 ms.
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    busy = only_batch(s.add_request(q.req("m", 0.0, 1.0), 0.0))
    r = q.req("m", 0.001, 0.007)
    s.add_request(r, 0.001)
    nxt = only_batch(s.batch_finished(0, busy.id, 0.005))
    assert ids(nxt.requests) == [r.id]
    assert nxt.finish_at == pytest.approx(0.010) and nxt.finish_at > r.deadline


def test_the_deadline_margin_moves_the_drop_earlier() -> None:
    s = ClipperScheduler([model()], devices(1), deadline_margin=0.002)
    q = Ids()
    only_batch(s.add_request(q.req("m", 0.0, 1.0), 0.0))
    r = q.req("m", 0.001, 0.010)
    s.add_request(r, 0.001)
    assert s.next_wakeup() == pytest.approx(0.008)
    (drop,) = drops(s.advance(s.next_wakeup()))
    assert ids(drop.requests) == [r.id]


def test_expired_requests_are_dropped_when_the_device_frees() -> None:
    # Clipper's remove_tasks_with_elapsed_deadlines: with the timer not yet
    # handled, forming a batch drops the expired head first.
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    busy = only_batch(s.add_request(q.req("m", 0.0, 1.0), 0.0))
    old = q.req("m", 0.001, 0.004)
    fresh = q.req("m", 0.002, 1.0)
    s.add_request(old, 0.001)
    s.add_request(fresh, 0.002)
    out = s.batch_finished(0, busy.id, 0.005)
    (drop,) = drops(out)
    assert ids(drop.requests) == [old.id] and drop.reason is DropReason.DEADLINE
    assert ids(only_batch(out).requests) == [fresh.id]


# ------------------------------------------------------ devices and models


def test_device_down_requeues_its_batch_and_device_up_serves_the_queue() -> None:
    s = ClipperScheduler([model(slo_ms=100)], devices(1), initial_batch=4)
    q = Ids()
    batch = only_batch(s.add_request(q.req("m", 0.0, 0.1), 0.0))
    waiting = [q.req("m", 0.001, 0.101) for _ in range(2)]
    for r in waiting:
        s.add_request(r, 0.001)
    assert dispatches(s.device_down(0, 0.002)) == []
    assert s.queued() == 3 and s.cap["m"] == 4.0  # a lost batch measures nothing
    assert s.next_wakeup() == 0.1  # the head's drop timer keeps running
    later = q.req("m", 0.003, 0.103)
    assert s.add_request(later, 0.003) == []
    up = only_batch(s.device_up(0, 0.010))
    assert ids(up.requests) == [*ids(batch.requests), *ids(waiting), later.id]
    assert up.start_at == 0.010


def test_device_down_with_nothing_up_drops_at_the_deadline() -> None:
    s = ClipperScheduler([model()], devices(1))
    q = Ids()
    s.device_down(0, 0.0)
    r = q.req("m", 0.0, 0.050)
    assert s.add_request(r, 0.0) == []
    (drop,) = drops(s.advance(0.050))
    assert ids(drop.requests) == [r.id] and drop.reason is DropReason.DEADLINE


def test_added_model_starts_at_the_initial_cap_and_removed_one_is_forgotten() -> None:
    s = ClipperScheduler([model("a")], devices(1), initial_batch=2)
    q = Ids()
    busy = only_batch(s.add_request(q.req("a", 0.0, 1.0), 0.0))
    s.add_model(model("b"), 0.001)
    assert s.cap == {"a": 2.0, "b": 2.0}
    queued = [q.req("b", 0.002, 0.5) for _ in range(3)]
    for r in queued:
        s.add_request(r, 0.002)
    assert s.next_wakeup() == 0.5
    (drop,) = drops(s.remove_model("b", 0.003))
    assert drop.reason is DropReason.UNLOADED and ids(drop.requests) == ids(queued)
    assert s.cap == {"a": 2.0} and "b" not in s.queues
    assert s.next_wakeup() is None
    # Removing "a" with its batch in flight: the batch is still answered,
    # and its end teaches nothing to a model no longer served.
    s.remove_model("a", 0.004)
    assert [d.batch.id for d in s.batch_finished(0, busy.id, 0.005)] == [busy.id]
    assert s.cap == {}


# ---------------------------------------------------------------- simulation


def test_simulated_overload_answers_every_request_once_and_the_cap_settles() -> None:
    # ℓ(b) = 10·b ms with SLO 55 ms: a batch of 5 is within it, 6 is not.
    # Under overload on one device the cap climbs to 6, backs off to 5.4,
    # climbs to 6.4, backs off to 5.76, ... so no batch of "m" ever exceeds
    # 6 items although max_batch is 16 ("n" shares the device).
    info = ModelInfo("m", LatencyProfile.linear(10.0, 0.0, 16), 0.055, 16)
    other = ModelInfo("n", LatencyProfile.linear(1.0, 4.0, 16), 0.055, 16)
    rng = np.random.default_rng(7)
    n = 2000
    arrivals = np.sort(rng.uniform(0.0, 4.0, n))
    which = (rng.random(n) < 0.8).astype(int) ^ 1  # 80 % for model "m"
    devs = devices(1)
    core = ClipperScheduler([info, other], devs)
    trace = run_simulation(core, [info, other], devs, arrivals, which)
    status = trace.status
    # The engine raises on a request answered twice; none is left pending.
    assert not (status == int(Outcome.PENDING)).any()
    good = int((status == int(Outcome.GOOD)).sum())
    late = int((status == int(Outcome.LATE)).sum())
    dropped = status == int(Outcome.DROPPED)
    assert good + late + int(dropped.sum()) == n
    assert late > 0 and dropped.any()  # deadline-unaware: some finish late
    reasons = {DROP_REASONS[int(i)] for i in trace.drop_reason[dropped]}
    assert reasons == {DropReason.DEADLINE}
    on_m = which == 0
    sizes = set(trace.batch_size[on_m & ~dropped].tolist())
    assert max(sizes) == 6 and {5, 6} <= sizes
