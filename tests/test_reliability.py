"""Reliability (issue 6): device faults in the scheduling core, executor
crashes and hangs in the live daemon, overload, and shutdown under load.

The core tests drive every policy with a virtual clock (no sleeping); the
daemon tests run `python -m app serve` on emulated devices.
"""

from __future__ import annotations

import heapq
from collections import Counter

import pytest

from app.scheduling import Request
from app.scheduling.registry import make_scheduler, policy_names
from app.scheduling.types import Batch, Decision, Dispatch, Drop, DropReason, Preempt
from tests.helpers import devices, model

# ------------------------------------------------------------ core: device faults


class VirtualDriver:
    """A minimal simulator: carries out decisions on a virtual clock, finishes
    batches at their predicted time, and records every request's answer."""

    def __init__(self, core) -> None:
        self.core = core
        self.now = 0.0
        self.finishes: list[tuple[float, int, int]] = []  # (at, batch id, device)
        self.batches: dict[int, Batch] = {}
        self.answers: Counter[int] = Counter()
        self.finished: dict[int, float] = {}  # request id → finish time
        self.dropped: dict[int, DropReason] = {}
        self.dispatched: list[Batch] = []

    def apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Dispatch):
                b = d.batch
                self.batches[b.id] = b
                self.dispatched.append(b)
                heapq.heappush(self.finishes, (b.finish_at, b.id, b.device))
            elif isinstance(d, Drop):
                for r in d.requests:
                    self.answers[r.id] += 1
                    self.dropped[r.id] = d.reason
            elif isinstance(d, Preempt):
                self.batches.pop(d.batch_id, None)

    def run_until(self, t: float) -> None:
        while True:
            wake = self.core.next_wakeup()
            finish = self.finishes[0][0] if self.finishes else None
            nxt = min(x for x in (wake, finish, t) if x is not None)
            if nxt > t or (nxt == t and wake != t and finish != t):
                self.now = t
                return
            self.now = max(self.now, nxt)
            if finish is not None and finish <= nxt:
                _, batch_id, device = heapq.heappop(self.finishes)
                batch = self.batches.pop(batch_id, None)
                if batch is not None:
                    for r in batch.requests:
                        self.answers[r.id] += 1
                        self.finished[r.id] = self.now
                    self.apply(self.core.batch_finished(device, batch_id, self.now))
            else:
                self.apply(self.core.advance(self.now))
            if (
                nxt == t
                and self.core.next_wakeup() != t
                and (not self.finishes or self.finishes[0][0] > t)
            ):
                self.now = t
                return

    def add(self, request: Request) -> None:
        self.apply(self.core.add_request(request, self.now))

    def device_down(self, device: int) -> None:
        # The executor died: the batches running there never report success.
        for batch_id, batch in list(self.batches.items()):
            if batch.device == device:
                del self.batches[batch_id]
        self.apply(self.core.device_down(device, self.now))

    def device_up(self, device: int) -> None:
        self.apply(self.core.device_up(device, self.now))


_ids = iter(range(10**9))


def _req(name: str, arrival: float, slo: float) -> Request:
    return Request(next(_ids), name, arrival, arrival + slo)


def _core(policy: str, n_devices: int = 2, **model_kw):
    info = model(**{"alpha_ms": 1.0, "beta_ms": 5.0, "slo_ms": 100.0, **model_kw})
    return info, make_scheduler(policy, [info], devices(n_devices))


@pytest.mark.parametrize("policy", policy_names())
def test_device_down_requeues_its_batch_elsewhere_and_device_up_takes_it_back(policy):
    info, core = _core(policy)
    sim = VirtualDriver(core)
    first = [_req(info.name, 0.0, 0.1) for _ in range(4)]
    for r in first:
        sim.add(r)
    while not sim.dispatched:
        sim.run_until(sim.now + 0.001)
    failed = sim.dispatched[0]
    sim.run_until(max(sim.now, failed.start_at) + 0.001)  # mid-batch
    t_down = sim.now
    sim.device_down(failed.device)
    assert core.down == {failed.device}
    n_before = len(sim.dispatched)
    # Load while it is down: nothing goes to the dead device.
    during = []
    for k in range(20):
        sim.run_until(t_down + 0.005 * k)
        r = _req(info.name, sim.now, 0.1)
        during.append(r)
        sim.add(r)
    sim.run_until(t_down + 0.2)
    after_down = sim.dispatched[n_before:]
    assert after_down, "the failed batch's requests must run somewhere"
    assert all(b.device != failed.device for b in after_down)
    # The failed batch's requests could all still finish alone (100 ms SLO):
    # they ran on the other device, before their deadline, once.
    for r in failed.requests:
        assert sim.answers[r.id] == 1
        assert r.id in sim.finished and sim.finished[r.id] <= r.deadline
    # Back in service: it gets work again.
    sim.device_up(failed.device)
    assert not core.down
    n_up = len(sim.dispatched)
    later = []
    for k in range(40):
        sim.run_until(t_down + 0.2 + 0.004 * k)
        r = _req(info.name, sim.now, 0.1)
        later.append(r)
        sim.add(r)
    sim.run_until(t_down + 1.0)
    assert any(b.device == failed.device for b in sim.dispatched[n_up:])
    # Every request got exactly one answer.
    for r in first + during + later:
        assert sim.answers[r.id] == 1, (r, sim.answers[r.id])


@pytest.mark.parametrize("policy", policy_names())
def test_requests_of_a_failed_batch_that_cannot_finish_alone_are_dropped_at_once(policy):
    # ℓ(b) = b + 10 ms; 12 requests at t=0 with deadlines 30..41 ms. The
    # first batch of ≥ 2 fails 0.5 ms before its end. A request goes back to
    # the queue iff t_down + ℓ(1) ≤ its deadline, else it is answered
    # DEVICE_FAILED at once (for most policies here: all of that batch).
    info, core = _core(policy, alpha_ms=1.0, beta_ms=10.0, slo_ms=40.0)
    sim = VirtualDriver(core)
    reqs = [Request(next(_ids), info.name, 0.0, 0.030 + 0.001 * i) for i in range(12)]
    for r in reqs:
        sim.add(r)
    while not any(b.size >= 2 for b in sim.dispatched):
        sim.run_until(sim.now + 0.0005)
    failed = next(b for b in sim.dispatched if b.size >= 2)
    t_down = failed.finish_at - 0.0005
    sim.run_until(t_down)
    sim.device_down(failed.device)
    expect_drop = {r.id for r in failed.requests if t_down + 0.011 > r.deadline}
    got_drop = {i for i, why in sim.dropped.items() if why is DropReason.DEVICE_FAILED}
    assert got_drop == expect_drop
    sim.run_until(0.2)
    for r in reqs:
        assert sim.answers[r.id] == 1
        if r.id in sim.finished and policy != "triton":  # Triton ignores deadlines
            assert sim.finished[r.id] <= r.deadline + 1e-9


@pytest.mark.parametrize("policy", policy_names())
def test_with_every_device_down_requests_are_still_answered(policy):
    info, core = _core(policy, n_devices=1)
    sim = VirtualDriver(core)
    sim.device_down(0)
    reqs = [_req(info.name, 0.001 * i, 0.1) for i in range(10)]
    for r in reqs:
        sim.run_until(r.arrival)
        sim.add(r)
    sim.run_until(0.5)
    assert not sim.dispatched
    assert all(sim.answers[r.id] == 1 for r in reqs)
    # Back up: served again.
    sim.device_up(0)
    r = _req(info.name, sim.now, 0.1)
    sim.add(r)
    sim.run_until(sim.now + 0.2)
    assert r.id in sim.finished
