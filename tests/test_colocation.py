"""The core on shared devices: which models run beside which, the slowdown a
co-runner costs (measured against a fake pool whose models slow each other
down by a known factor), the scaled profile, and the daemon planning with it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.runtime.devices import ExecutorDevice
from app.scheduling.profile import LatencyProfile
from app.server import colocation
from app.server.colocation import (
    Slowdown,
    co_locations,
    measure_slowdowns,
    probe_batch,
    scaled,
)
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings

CPU_SHARES = [
    ExecutorDevice(0, "cpu", "cpu:0/0", share=0.5),
    ExecutorDevice(1, "cpu", "cpu:0/1", share=0.5),
    ExecutorDevice(2, "emulated", "emulated:0"),
]


def test_each_model_on_a_share_runs_beside_the_first_model_of_each_other_share():
    devices = {d.id: d for d in CPU_SHARES}
    hosts = {"mlp": (0,), "cnn": (1,), "encoder": (1,), "resnet": (2,)}
    # encoder and cnn share cpu:0/1: their co-runner is mlp; mlp's is cnn (first by name).
    assert co_locations(hosts, devices) == {
        "cnn": (1, {0: "mlp"}),
        "encoder": (1, {0: "mlp"}),
        "mlp": (0, {1: "cnn"}),
    }
    # A share whose sibling hosts nothing, and a device not split: nothing to measure.
    assert co_locations({"mlp": (0,), "resnet": (2,)}, devices) == {}


def test_the_probe_batch_is_the_largest_within_half_the_slo():
    profile = LatencyProfile.linear(alpha_ms=2.0, beta_ms=4.0, max_batch=32)
    assert probe_batch(profile, slo_s=0.040) == 8  # ℓ(8) = 20 ms ≤ 20 ms < ℓ(9)
    assert probe_batch(profile, slo_s=0.004) == 1  # nothing fits: at least 1


def test_a_scaled_profile_is_every_latency_times_the_factor():
    profile = LatencyProfile.linear(alpha_ms=2.0, beta_ms=4.0, max_batch=8)
    slower = scaled(profile, 1.25)
    assert [slower.latency(b) for b in (1, 4, 8)] == pytest.approx([0.0075, 0.015, 0.025])
    assert (slower.alpha, slower.beta) == pytest.approx((0.0025, 0.005))
    with pytest.raises(ValueError, match=r"factor is ≥ 1, got 0\.9"):
        scaled(profile, 0.9)


def test_a_co_runner_never_counts_as_a_speed_up():
    assert Slowdown("a", "cpu:0/0", ("b",), 4, 0.010, 0.012).factor == pytest.approx(1.2)
    assert Slowdown("a", "cpu:0/0", ("b",), 4, 0.010, 0.009).factor == 1.0


class SlowingPool:
    """`profile` takes ℓ(b) of its model, × `factor` while another device's
    `profile` is in flight — two shares that slow each other down."""

    def __init__(self, devices: list[ExecutorDevice], latency_s: dict[str, float], factor: float):
        self.devices = {d.id: d for d in devices}
        self.latency_s = latency_s
        self.factor = factor
        self.busy: set[int] = set()
        self.calls: list[tuple[int, str, int, int]] = []

    async def profile(
        self, device_id: int, model: str, batches: list[int], *, warmup: int, repeats: int
    ) -> dict[int, float]:
        (batch,) = batches
        self.calls.append((device_id, model, batch, repeats))
        beside = bool(self.busy - {device_id})
        self.busy.add(device_id)
        try:
            await asyncio.sleep(0.001)
        finally:
            self.busy.discard(device_id)
        seconds = self.latency_s[model] * batch * (self.factor if beside else 1.0)
        return {batch: seconds * 1e3}


def test_the_slowdown_is_measured_beside_the_co_runners_running_flat_out():
    pool = SlowingPool(CPU_SHARES[:2], {"mlp": 0.002, "cnn": 0.001}, factor=1.3)
    profiles = {
        "mlp": LatencyProfile.linear(2.0, 0.0, 16),
        "cnn": LatencyProfile.linear(1.0, 0.0, 16),
    }
    slos = {"mlp": 0.016, "cnn": 0.016}  # probe batches 4 (ℓ 8 ms) and 8 (ℓ 8 ms)
    found = asyncio.run(
        measure_slowdowns(pool, {"mlp": (0,), "cnn": (1,)}, profiles, slos)  # type: ignore[arg-type]
    )
    assert [(s.model, s.device, s.co_runners, s.batch) for s in found] == [
        ("cnn", "cpu:0/1", ("mlp",), 8),
        ("mlp", "cpu:0/0", ("cnn",), 4),
    ]
    for s in found:
        assert s.alone_s == pytest.approx(0.008)
        assert s.co_located_s == pytest.approx(0.0104)
        assert s.factor == pytest.approx(1.3)
    # Each call holds its model about CALL_S: 50 ms / 8 ms → 6 runs.
    assert {repeats for *_, repeats in pool.calls} == {6}


EMULATED_ON = (
    "backend: emulated\n"
    "max_batch_size: 8\n"
    "slo_ms: 200\n"
    "profile: {{alpha_ms: {alpha}, beta_ms: 5.0}}\n"
    "devices: [{device}]\n"
    "inputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]\n"
    "outputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]\n"
)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
@pytest.mark.parametrize("measure", [True, False])
def test_the_daemon_plans_shared_devices_with_the_measured_slowdown(
    monkeypatch, tmp_path, caplog, measure
):
    """Two emulated shares, one model each: both are measured beside the
    other, and the core's profile is the config's / share × the factor;
    with COLOCATION_PROFILE=0, the config's / share."""
    repository = tmp_path / "models"
    for name, alpha, device in (("first", 1.0, "emulated:0/0"), ("second", 2.0, "emulated:0/1")):
        (repository / name).mkdir(parents=True)
        (repository / name / "config.yaml").write_text(
            EMULATED_ON.format(alpha=alpha, device=device)
        )
    # Emulated shares do not slow each other down: make the measured ratio 1.2.
    real = colocation.measure_slowdown

    async def slower(*args, **kwargs):
        found = await real(*args, **kwargs)
        return Slowdown(found.model, found.device, found.co_runners, found.batch, 0.010, 0.012)

    monkeypatch.setattr(colocation, "measure_slowdown", slower)
    settings = Settings(
        repository=repository,
        cpu_slices=0,
        emulated_devices=1,
        device_shares={"emulated": (0.5, 0.5)},
        colocation_profile=measure,
        respawn=False,
    )

    async def scenario() -> dict[str, list[float]]:
        service = LiveService(settings, Metrics())
        try:
            with caplog.at_level(logging.INFO, logger="app.server"):
                await service.start()
            return {
                name: [state.profile.latency(b) for b in (1, 8)]  # type: ignore[union-attr]
                for name, state in service.models.items()
            }
        finally:
            await service.stop()

    planned = asyncio.run(scenario())
    # The config's ℓ(b) / share 0.5, × 1.2 beside the other share.
    factor = 1.2 if measure else 1.0
    assert planned["first"] == pytest.approx([2 * 0.006 * factor, 2 * 0.013 * factor])
    assert planned["second"] == pytest.approx([2 * 0.007 * factor, 2 * 0.021 * factor])
    lines = [r.getMessage() for r in caplog.records if "beside" in r.getMessage()]
    assert sorted(line.split(" (")[0] for line in lines) == (
        [
            "model first on emulated:0/0: ×1.200 beside second",
            "model second on emulated:0/1: ×1.200 beside first",
        ]
        if measure
        else []
    )
