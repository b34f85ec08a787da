"""Policy `gpulet` (app/scheduling/gpulet.py): Gpulet's batching as InSS
describes it — the largest batch with ℓ(b) ≤ SLO / 2, sent when full or
when its oldest request has waited SLO / 2 — on the virtual clock."""

from __future__ import annotations

import pytest

from app.scheduling.gpulet import GpuletScheduler, half_slo_batch
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import Request
from tests.fakes import before, devices, dispatches, ids

MS = 1e-3


def model(name: str = "m", slo_ms: float = 50.0, max_batch: int = 32) -> ModelInfo:
    # ℓ(b) = (b + 4) ms: ℓ(21) = 25 ms = SLO / 2 at a 50-ms SLO.
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, max_batch), slo_ms * MS, max_batch)


def request(i: int, arrival: float, slo: float = 0.050) -> Request:
    return Request(i, "m", arrival, arrival + slo)


def test_batch_is_the_largest_within_half_the_slo_and_the_delay_half_the_slo():
    s = make_scheduler("gpulet", [model(), model("n", slo_ms=20.0, max_batch=4)], devices(1))
    assert isinstance(s, GpuletScheduler)
    assert s.config["m"].max_batch == 21  # ℓ(21) = 25 ms ≤ 25 ms < ℓ(22)
    assert s.config["m"].max_queue_delay == pytest.approx(0.025)
    assert s.config["n"].max_batch == 4  # ℓ(6) = 10 ms, capped by max batch 4
    assert s.config["n"].max_queue_delay == pytest.approx(0.010)
    assert s.config["m"].queue_timeout == pytest.approx(0.050)  # triton's default: the SLO
    # Not even a batch of 1 within SLO / 2: batches of 1.
    assert half_slo_batch(model(slo_ms=6.0)) == 1


def test_sends_at_half_the_slo_or_when_full():
    s = GpuletScheduler([model()], devices(1))
    for i, t in enumerate((0.010, 0.012, 0.015), start=1):
        assert s.add_request(request(i, t), t) == []
    assert s.next_wakeup() == pytest.approx(0.035)  # oldest at 10 ms + 25 ms
    assert s.advance(before(0.035)) == []
    (d,) = dispatches(s.advance(0.035))
    assert ids(d.batch.requests) == [1, 2, 3] and d.batch.start_at == 0.035
    s = GpuletScheduler([model()], devices(1))
    found = []
    for i in range(1, 22):
        found += dispatches(s.add_request(request(i, 0.001 * i), 0.001 * i))
    (d,) = found  # the 21st fills the batch
    assert d.batch.size == 21 and d.batch.start_at == pytest.approx(0.021)


def test_explicit_options_apply_as_given():
    s = GpuletScheduler(
        [model(), model("n")],
        devices(1),
        max_batch={"m": 8},
        model_options={"n": {"max_queue_delay_ms": 3.0}},
    )
    assert (s.config["m"].max_batch, s.config["n"].max_batch) == (8, 21)
    assert s.config["m"].max_queue_delay == pytest.approx(0.025)
    assert s.config["n"].max_queue_delay == pytest.approx(0.003)
    s = GpuletScheduler([model()], devices(1), max_queue_delay_ms=1.0)
    assert s.config["m"].max_queue_delay == pytest.approx(0.001)
