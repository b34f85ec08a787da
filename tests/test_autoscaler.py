"""Autoscaling that acts (issue 24 item 5): Symphony's advice (symphony.txt
§4.4) within bounds and a cool-down, releasing idle devices only — against a
fake core with set signals — and a simulated load step up and down."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from app.scheduling.autoscaler import Autoscaler, ScaleDown, ScaleUp, ScalingBounds
from app.scheduling.registry import make_scheduler
from app.scheduling.types import AutoscaleSignals
from app.simulation.engine import run_simulation
from bench.autoscale import main as autoscale_main
from tests.fakes import devices, model


@dataclass
class FakeCore:
    """What the autoscaler reads: a window's signals and the idle devices."""

    bad_rate: float = 0.0
    busy: dict[int, float] = field(default_factory=dict)
    idle: list[int] = field(default_factory=list)
    stopping: dict = field(default_factory=dict)
    resets: int = 0

    def signals(self, now: float) -> AutoscaleSignals:
        return AutoscaleSignals(
            window_s=5.0, bad_rate=self.bad_rate, per_device_busy=dict(self.busy)
        )

    def reset_signals(self, now: float) -> None:
        self.resets += 1

    def idle_devices(self) -> list[int]:
        return list(self.idle)


def scaler(serving: set[int], **bounds) -> Autoscaler:
    return Autoscaler(tuple(range(8)), serving, ScalingBounds(**{"max_devices": 8, **bounds}))


def test_a_bad_rate_adds_devices_up_to_the_bound_then_cools_down():
    s = scaler({0, 1}, max_devices=5, cooldown_s=10.0)
    core = FakeCore(bad_rate=0.5, busy={0: 1.0, 1: 1.0})
    # N·r/(1−r) = 2·0.5/0.5 = 2 devices: the parked 2 and 3 start.
    assert s.tick(core, 5.0) == ScaleUp((2, 3))  # type: ignore[arg-type]
    assert core.resets == 1 and s.starting == {2, 3} and s.serving == {0, 1}
    assert s.tick(core, 10.0) is None  # cooling down (until 15 s)
    s.started(2)
    s.started(3)
    core.busy = {d: 1.0 for d in range(4)}
    # 4·0.5/0.5 = 4 advised; the bound leaves 1.
    assert s.tick(core, 15.0) == ScaleUp((4,))  # type: ignore[arg-type]
    assert s.tick(core, 30.0) is None  # at the bound: nothing left to start
    assert [h.advised for h in s.history] == [2, 2, 4, 4]  # N = those serving


def test_idle_devices_are_released_down_to_the_bound_and_busy_ones_kept():
    s = scaler({0, 1, 2, 3, 4}, min_devices=2, cooldown_s=0.0)
    # Mean busy 0.2: idle 0.8, ⌊5·0.8⌋ = 4 advised; 1 is busy, the bound keeps 2.
    core = FakeCore(busy={d: 0.2 for d in range(5)}, idle=[0, 2, 3, 4])
    assert s.tick(core, 5.0) == ScaleDown((4, 3, 2))  # type: ignore[arg-type]
    assert s.serving == {0, 1}
    core.busy, core.idle = {0: 0.1, 1: 0.1}, [0, 1]
    assert s.tick(core, 10.0) is None  # at min_devices


def test_a_device_stopping_a_batch_is_not_released():
    s = scaler({0, 1, 2}, cooldown_s=0.0)

    @dataclass
    class Stop:
        batch: object

    @dataclass
    class OnDevice:
        device: int

    core = FakeCore(busy={0: 0.0, 1: 0.0, 2: 0.0}, idle=[0, 1, 2])
    core.stopping = {7: Stop(OnDevice(2))}
    assert s.tick(core, 5.0) == ScaleDown((1, 0))  # type: ignore[arg-type]


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="need 1 ≤ min_devices ≤ max_devices, got 3, 2"):
        ScalingBounds(3, 2)
    with pytest.raises(ValueError, match="window_s must be a finite number of seconds > 0"):
        ScalingBounds(window_s=0)
    with pytest.raises(ValueError, match="outside \\[2, 8\\]"):
        scaler({0}, min_devices=2)


@pytest.mark.slow  # over a second
def test_a_simulated_load_step_adds_devices_then_releases_them():
    """400 r/s for 60 s, 2,000 r/s for 60 s, 400 again: ℓ(b) = b + 10 ms,
    SLO 100 ms, 2 of 8 devices at first; window 5 s, cool-down 10 s,
    devices serve 2 s after they are started."""
    info = model("m", alpha_ms=1.0, beta_ms=10.0, slo_ms=100.0, max_batch=32)
    rng = np.random.default_rng(0)
    times, t = [], 0.0
    for length, rate in ((60, 400), (60, 2000), (60, 400)):
        end = t + length
        while (t := t + rng.exponential(1 / rate)) < end:
            times.append(t)
        t = end
    arrivals = np.array(times)
    s = Autoscaler(tuple(range(8)), {0, 1}, ScalingBounds(1, 8, window_s=5, cooldown_s=10))
    core = make_scheduler("symphony", [info], devices(8))
    trace = run_simulation(
        core, [info], devices(8), arrivals, np.zeros(len(arrivals), dtype=int),
        autoscaler=s, startup_s=2.0,
    )  # fmt: skip
    assert trace.scaling is not None
    ups = [(at, n) for at, n in trace.scaling if 60 < at < 120]
    # The first window after the step sees it; its devices serve 2 s later.
    assert ups and ups[0][0] == pytest.approx(67.0) and max(n for _, n in ups) >= 4
    good = trace.status == 1

    def within(start: float, end: float) -> float:
        sel = (trace.arrival >= start) & (trace.arrival < end)
        return float(good[sel].mean())

    assert within(0, 60) == 1.0
    assert within(60, 70) < 0.9  # the step, before devices come
    assert within(75, 120) >= 0.99  # back above 99 %
    assert within(125, 180) >= 0.99
    # Released when idle: back to 2 after the step down.
    assert trace.scaling[-1][1] == 2 and trace.scaling[-1][0] > 120


@pytest.mark.slow  # over a second
def test_the_bench_quick_run_reports_each_system(tmp_path) -> None:
    assert autoscale_main(["--quick", "--out-dir", str(tmp_path)]) == 0
    body = json.loads((tmp_path / "autoscale.json").read_text())
    rows = body["systems"]
    assert set(rows) == {"autoscaled", "fixed-max", "fixed-start"}
    # All devices all the time serve the step; the start's two do not.
    assert rows["fixed-max"]["within_slo_per_phase"][1] >= 0.99
    assert rows["fixed-start"]["within_slo_per_phase"][1] < 0.9
    auto = rows["autoscaled"]
    assert auto["first_added_serving_s"] is not None and auto["first_added_serving_s"] <= 7.0
    assert auto["device_seconds"] < rows["fixed-max"]["device_seconds"] / 2
    assert auto["devices_at_end"] == 2
