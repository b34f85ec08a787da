"""The mechanisms seen live: FLEX preemptions counted per model and logged
at INFO (rate-limited), each device's state (a parked device is not a
crashed one), and the plan in force, in `/metrics` as the dashboard reads
them."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.runtime.pool_records import DeviceRecords
from app.scheduling import make_scheduler
from app.scheduling.types import Preempt
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.metrics import ALONE_QUANTILES, DEVICE_STATES, Metrics
from app.server.preemption_log import PreemptionLog
from tests.fakes import devices, model
from tests.fakes_live import FakeClock, FakeExecutors, FakeTimer


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """`name`'s samples in the rendered exposition, by their labels."""
    text = metrics.render()[0].decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metrics.prefix + name
    }


def test_each_flex_preemption_is_counted_for_the_preempted_model_in_metrics():
    """Shepherd §5.2's threshold λ ≈ 3.03, on one device."""
    slow = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=1000.0, max_batch=64)
    fast = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=100.0, max_batch=64)
    metrics = Metrics()
    seen: list[Preempt] = []

    def on_preempt(decision: Preempt) -> None:
        seen.append(decision)
        metrics.batch_preempted(decision.model, decision.requests)

    async def scenario() -> None:
        core = make_scheduler("flex", [slow, fast], devices(1))
        timer = FakeTimer()
        executors = FakeExecutors()
        group = CoreGroup(core, frozenset(core.models), tuple(core.devices))
        dispatcher = Dispatcher(
            [group], executors, clock=FakeClock(), timer_factory=lambda: timer,
            on_preempt=on_preempt,
        )  # fmt: skip
        # FLEX is work-conserving: the first slow request runs alone, and
        # each arrival that makes a batch ≥ λ × the running one preempts it.
        pending = [dispatcher.submit_request("slow", 0, slow.slo)]
        pending += [dispatcher.submit_request("fast", 1 + i, fast.slo) for i in range(40)]
        assert len(executors.cancels) == len(seen)
        for p in pending:  # answered or dropped later: none is lost here
            assert not p.future.done() or p.future.exception() is not None

    asyncio.run(scenario())
    # 1 slow running → a batch of 4 fast preempts it (4 ≥ 3.03 × 1); then
    # 13 preempt those 4 (13 ≥ 12.1); the next would need 40 queued.
    assert [(d.model, d.requests) for d in seen] == [("slow", 1), ("fast", 4), ("fast", 13)]
    assert samples(metrics, "preemptions_total") == {
        (("model", "fast"),): 2.0,
        (("model", "slow"),): 1.0,
    }
    assert samples(metrics, "preempted_requests_total") == {
        (("model", "fast"),): 17.0,
        (("model", "slow"),): 1.0,
    }


def test_preemptions_are_logged_once_per_model_every_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    log = PreemptionLog(every_s=10.0, clock=lambda: clock.now)
    with caplog.at_level(logging.INFO, logger="app.server"):
        logged = []
        for i in range(25):  # one preemption of 4 requests every 0.5 s, for 12.5 s
            clock.now = 0.5 * i
            logged.append(log.preempted("slow", "cpu:0", 4))
        logged.append(log.preempted("other", "cpu:1", 2))
    # The first at once, the next 10 s later with the 20 since; "other" its own.
    assert [i for i, was in enumerate(logged) if was] == [0, 20, 25]
    assert caplog.messages == [
        "preempted a batch of slow on cpu:0 (4 requests held back)",
        "preempted 20 batches of slow (80 requests held back) in the last 10 s; the latest on "
        "cpu:0",
        "preempted a batch of other on cpu:1 (2 requests held back)",
    ]


class _Record:
    def __init__(self, *, dead: bool = False, loading: bool = False) -> None:
        self.models: list[str] = []
        self.load_errors: dict[str, str] = {}
        self.load_info: dict[str, str] = {}
        self.dead, self.loading = dead, loading
        self.restarts = 0
        self.last_respawn_s = None


class _Pool(DeviceRecords):
    """A pool's records: 0 serves, 1 is parked, 2 crashed, 3 restarts, 4 reshares."""

    def __init__(self) -> None:
        self.records = {
            0: _Record(), 1: _Record(dead=True), 2: _Record(dead=True),
            3: _Record(loading=True), 4: _Record(),
        }  # fmt: skip

    def _records(self):
        return self.records

    def alive(self, device_id: int) -> bool:
        r = self.records[device_id]
        return not r.dead and not r.loading

    def parked(self, device_id: int) -> bool:
        return device_id == 1

    def resharing(self, device_id: int) -> bool:
        return device_id == 4


def test_a_parked_device_does_not_look_like_a_crashed_one():
    pool = _Pool()
    states = {f"cpu:{i}": pool.state(i) for i in pool.records}
    assert states == {
        "cpu:0": "serving",
        "cpu:1": "parked",
        "cpu:2": "down",
        "cpu:3": "loading",
        "cpu:4": "resharing",
    }
    metrics = Metrics()
    metrics.watch_devices(lambda: states)
    found = samples(metrics, "device_state")
    assert len(found) == len(states) * len(DEVICE_STATES)
    ones = {dict(labels)["device"]: dict(labels)["state"] for labels, v in found.items() if v == 1}
    assert ones == states
    states["cpu:1"] = "serving"  # read again at each scrape: unparked
    assert samples(metrics, "device_state")[(("device", "cpu:1"), ("state", "serving"))] == 1.0


def test_the_plan_in_force_is_one_series_replaced_on_a_switch():
    metrics = Metrics()
    assert samples(metrics, "plan_info") == {(("kind", "none"), ("version", "")): 1.0}
    metrics.record_plan("inss-plan", "2", 1_764_000_000.0)
    assert samples(metrics, "plan_info") == {(("kind", "inss-plan"), ("version", "2")): 1.0}
    assert samples(metrics, "plan_loaded_timestamp_seconds") == {(): 1_764_000_000.0}


def test_orlojs_per_application_alone_times_are_exported_as_quantiles():
    """Two applications of one dynamic model (orloj.txt §3): a's alone-times
    c0 + U[10, 20] ms, b's c0 + U[60, 100] ms, with c0 = 5 ms."""
    from tests.test_orloj import dynamic, orloj

    a = tuple(np.linspace(0.010, 0.020, 1001))
    b = tuple(np.linspace(0.060, 0.100, 1001))
    core = orloj([dynamic("d", c0=0.005, slo=1.0, a=a, b=b)])
    found = core.alone_time_quantiles(ALONE_QUANTILES)
    assert set(found) == {("d", "a"), ("d", "b")}
    assert found[("d", "a")] == pytest.approx((0.020, 0.024, 0.0249), abs=1e-6)
    assert found[("d", "b")] == pytest.approx((0.085, 0.101, 0.1046), abs=1e-6)
    metrics = Metrics()
    metrics.watch_alone_times(lambda: core.alone_time_quantiles(ALONE_QUANTILES))
    exported = samples(metrics, "alone_time_quantile_seconds")
    assert exported[(("app", "b"), ("model", "d"), ("quantile", "0.99"))] == pytest.approx(0.1046)
    assert len(exported) == 6
    # A new window of b's measurements moves b's quantiles only.
    for i in range(core.states["d"].dynamic.min_samples):
        core.record_alone_time("d", "b", 0.205, 0.001 * i)
    moved = core.alone_time_quantiles(ALONE_QUANTILES)
    assert moved[("d", "b")] == pytest.approx((0.205,) * 3)
    assert moved[("d", "a")] == found[("d", "a")]
