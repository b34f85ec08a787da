"""Models added to and removed from a running scheduling core (a model
loaded or unloaded while serving), for every policy, on virtual time.

What is checked: every request is answered exactly once; a model added is
served like the others; a model removed has its queued requests dropped
with reason `unloaded` at once, a batch of it already running is answered
with its outputs, a later request for it is `not_served`; the other model
is not disturbed; no per-model state of it is left in the core.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter

import pytest

from app.scheduling.base import Scheduler
from app.scheduling.registry import make_scheduler, policy_names
from app.scheduling.types import Complete, Decision, Dispatch, Drop, Preempt
from tests.fakes import devices, model, request

POLICIES = policy_names()


class Driver:
    """The smallest driver: batches end at their predicted finish, a
    preemption stops its batch at once; outcomes by request id."""

    def __init__(self, core: Scheduler) -> None:
        self.core = core
        self.now = 0.0
        self._ends: list[tuple[float, int, int]] = []  # (finish, device, batch id)
        self._stopped: set[int] = set()
        self.outcomes: dict[int, list[str]] = {}
        self.batches: dict[int, str] = {}  # batch id → model

    def take(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Dispatch):
                self.batches[d.batch.id] = d.batch.model
                heapq.heappush(self._ends, (d.batch.finish_at, d.batch.device, d.batch.id))
            elif isinstance(d, Complete):
                for r in d.requests:
                    self.outcomes.setdefault(r.id, []).append("ok")
            elif isinstance(d, Drop):
                for r in d.requests:
                    self.outcomes.setdefault(r.id, []).append(d.reason.value)
            elif isinstance(d, Preempt):
                self._stopped.add(d.batch_id)
                self.take(self.core.batch_stopped(d.device, d.batch_id, self.now))

    def run_until(self, t: float) -> None:
        while True:
            wake = self.core.next_wakeup()
            wake = math.inf if wake is None else wake
            end = self._ends[0][0] if self._ends else math.inf
            at = min(wake, end)
            if at > t:
                break
            self.now = max(self.now, at)
            if end <= wake:
                _, device, batch_id = heapq.heappop(self._ends)
                if batch_id not in self._stopped:
                    self.take(self.core.batch_finished(device, batch_id, self.now))
            else:
                self.take(self.core.advance(self.now))
        self.now = max(self.now, t)

    def send(self, info, t: float) -> int:
        self.run_until(t)
        r = request(info, t)
        self.take(self.core.add_request(r, t))
        return r.id


A = model("a", alpha_ms=1.0, beta_ms=5.0, slo_ms=200.0, max_batch=8, expected_rate=100.0)
B = model("b", alpha_ms=2.0, beta_ms=5.0, slo_ms=200.0, max_batch=8, expected_rate=100.0)


def core_of(policy: str) -> Scheduler:
    return make_scheduler(policy, [A], devices(2))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_model_added_is_served(policy):
    driver = Driver(core_of(policy))
    sent_a = [driver.send(A, 0.001 * i) for i in range(5)]
    driver.take(driver.core.add_model(B, 0.010))
    assert "b" in driver.core.models
    sent_b = [driver.send(B, 0.011 + 0.001 * i) for i in range(7)]
    sent_a += [driver.send(A, 0.012 + 0.001 * i) for i in range(4)]
    driver.run_until(5.0)
    assert {i: driver.outcomes[i] for i in sent_a + sent_b} == {i: ["ok"] for i in sent_a + sent_b}
    assert "b" in driver.batches.values()
    assert driver.core.queued() == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_model_removed_drops_its_queue_and_finishes_its_running_batch(policy):
    core = make_scheduler(policy, [A, B], devices(1))
    driver = Driver(core)
    sent_b = [driver.send(B, 0.0001 * i) for i in range(20)]
    sent_a = [driver.send(A, 0.003 + 0.0001 * i) for i in range(3)]
    driver.run_until(0.004)
    running_b = [bid for bid, m in driver.batches.items() if m == "b"]
    assert running_b, "a batch of b should be running before the removal"
    driver.take(core.remove_model("b", 0.004))
    assert "b" not in core.models and "b" not in core.rates
    late = driver.send(B, 0.005)
    sent_a += [driver.send(A, 0.006 + 0.0001 * i) for i in range(3)]
    driver.run_until(5.0)

    outcomes = {i: driver.outcomes.get(i, []) for i in [*sent_b, *sent_a, late]}
    assert all(len(v) == 1 for v in outcomes.values()), outcomes  # exactly once
    of_b = Counter(outcomes[i][0] for i in sent_b)
    assert set(of_b) <= {"ok", "unloaded"} and of_b["unloaded"] > 0 and of_b["ok"] > 0, of_b
    assert outcomes[late] == ["not_served"]
    assert all(outcomes[i] == ["ok"] for i in sent_a)
    assert core.queued() == 0
    # no timer of the removed model is left
    assert all("b" not in repr(key) for key in _timer_keys(core)), _timer_keys(core)


@pytest.mark.parametrize("policy", POLICIES)
def test_removed_then_added_back(policy):
    core = core_of(policy)
    driver = Driver(core)
    driver.take(core.add_model(B, 0.0))
    driver.take(core.remove_model("b", 0.001))
    with pytest.raises(ValueError, match="unknown model 'b'"):
        core.remove_model("b", 0.001)
    driver.take(core.add_model(B, 0.002))
    with pytest.raises(ValueError, match="served already"):
        core.add_model(B, 0.002)
    sent = [driver.send(B, 0.003 + 0.001 * i) for i in range(4)]
    driver.run_until(5.0)
    assert [driver.outcomes[i] for i in sent] == [["ok"]] * 4


def _timer_keys(core: Scheduler) -> list:
    return list(core.timers._due)  # the keys of the timers set now
