"""Squishy bin packing (Nexus) on hand-made cases with exact expected plans.

Model "A" everywhere: ℓ(b) = 1 ms·b + 4 ms, SLO 20 ms, max batch 16, so
B = 6 (2·ℓ(6) = 20 ms ≤ 20, 2·ℓ(7) = 22 ms), one dedicated device serves
T = 6/10 ms = 600 req/s.
"""

from __future__ import annotations

import itertools

import pytest

from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.squishy import nexus_batch, plan


def A(name: str, slo: float = 0.020) -> ModelInfo:
    return ModelInfo(name, LatencyProfile.linear(1.0, 4.0, 16), slo, 16)


def sessions(p, index):
    return [(s.model, s.batch) for s in p.devices[index].sessions]


# ----------------------------------------------------------------- batch size


def test_batch_size_resnet50_from_eq1():
    r50 = ModelInfo("resnet50", LatencyProfile.linear(1.053, 5.072, 64), 0.025, 64)
    # 2·ℓ(7) = 24.886 ms ≤ 25 ms, 2·ℓ(8) = 26.992 ms: Table 4's NoCoordination BS.
    assert nexus_batch(r50) == 7
    inc = ModelInfo("incresv2", LatencyProfile.linear(5.090, 18.368, 32), 0.070, 32)
    assert nexus_batch(inc) == 3


def test_batch_size_capped_and_at_least_one():
    assert nexus_batch(A("a")) == 6
    capped = ModelInfo("c", LatencyProfile.linear(1.0, 4.0, 16), 0.100, 4)
    assert nexus_batch(capped) == 4
    slow = ModelInfo("s", LatencyProfile.linear(1.0, 15.0, 8), 0.020, 8)  # 2·ℓ(1) = 32 ms
    assert nexus_batch(slow) == 1
    assert nexus_batch(A("a"), speed=2.0) == 16  # ℓ halved: 2·(16+4)/2 = 20 ms


# ------------------------------------------------------- dedicated + residual


def test_dedicated_devices_and_residual():
    p = plan([A("a")], {"a": 1500}, 4)
    # load 1500/600 = 2.5: two dedicated devices, residual 300 req/s.
    assert p.dedicated == {"a": 2}
    assert p.placement == {"a": (0, 1, 2)}
    assert p.batch == {"a": 6}
    assert p.scale == 1.0
    for i in (0, 1):
        d = p.devices[i]
        assert d.dedicated
        assert sessions(p, i) == [("a", 6)]
        assert d.duty_cycle == pytest.approx(0.010)
        assert d.sessions[0].share == 1.0
        assert d.sessions[0].rate == pytest.approx(600.0)
    # Residual alone: d = min(b/r, SLO − ℓ(b)); b = 4 gives d = min(13.3, 12) = 12 ms,
    # batch ⌈300·0.012⌉ = 4, share ℓ(4)/d = 8/12 (the smallest of the candidates).
    shared = p.devices[2]
    assert not shared.dedicated
    assert sessions(p, 2) == [("a", 4)]
    assert shared.duty_cycle == pytest.approx(0.012)
    assert shared.sessions[0].share == pytest.approx(2 / 3)
    assert shared.sessions[0].rate == pytest.approx(300.0)
    assert p.devices[3].sessions == ()
    assert p.used_devices == 3


def test_exact_multiple_has_no_residual():
    p = plan([A("a")], {"a": 1800}, 3)
    assert p.dedicated == {"a": 3}
    assert p.placement == {"a": (0, 1, 2)}
    assert all(d.dedicated for d in p.devices)


def test_resnet50_three_thousand_per_second_on_eight():
    r50 = ModelInfo("r50", LatencyProfile.linear(1.053, 5.072, 64), 0.025, 64)
    p = plan([r50], {"r50": 3000}, 8)
    # T = 7/12.443 ms = 562.56 req/s → ⌊5.33⌋ = 5 dedicated + one shared.
    assert p.dedicated == {"r50": 5}
    assert p.placement == {"r50": (0, 1, 2, 3, 4, 5)}
    assert p.devices[0].sessions[0].rate == pytest.approx(7 / 0.012443)
    residual = p.devices[5].sessions[0]
    assert residual.rate == pytest.approx(3000 - 5 * 7 / 0.012443)
    assert residual.batch == 3
    assert p.used_devices == 6


# ------------------------------------------------------------------- packing


def test_first_fit_decreasing_packing():
    # Alone: c, d (200 req/s) take d = 13 ms, batch 3, share 7/13;
    # a, b (0 req/s) take d = 15 ms, batch 1, share 5/15.
    p = plan([A("a"), A("b"), A("c"), A("d")], {"a": 0, "b": 0, "c": 200, "d": 200}, 3)
    # Decreasing order c, d, a, b: c+d needs 7+7 = 14 > 13 ms, so d opens device 1;
    # a joins c (7+5 = 12 ≤ 13 ms, SLO 13+7 = 20 ms), b joins d.
    # (First-fit in name order would need three devices: a+b, c, d.)
    assert p.placement == {"a": (0,), "b": (1,), "c": (0,), "d": (1,)}
    assert sessions(p, 0) == [("c", 3), ("a", 1)]
    assert sessions(p, 1) == [("d", 3), ("b", 1)]
    for i in (0, 1):
        dev = p.devices[i]
        assert dev.duty_cycle == pytest.approx(0.013)
        assert [s.share for s in dev.sessions] == pytest.approx([7 / 13, 5 / 13])
        assert dev.occupancy == pytest.approx(12 / 13)
    assert p.used_devices == 2
    assert p.dedicated == {"a": 0, "b": 0, "c": 0, "d": 0}


def test_merge_shrinks_batches_to_the_smaller_cycle():
    # a alone: 150 req/s → d = 13.33 ms, batch 2; b: 150 req/s, the same.
    p = plan([A("a"), A("b")], {"a": 750, "b": 150}, 2)
    assert p.dedicated == {"a": 1, "b": 0}
    assert sessions(p, 1) == [("a", 2), ("b", 2)]
    assert p.devices[1].duty_cycle == pytest.approx(0.040 / 3)
    assert [s.share for s in p.devices[1].sessions] == pytest.approx([0.45, 0.45])
    assert [s.rate for s in p.devices[1].sessions] == pytest.approx([150.0, 150.0])


def test_zero_rate_models_share_a_device():
    # Zero-rate sessions: batch 1, d = 20 − 5 = 15 ms; three fit (3·5 = 15 ms).
    p = plan([A(x) for x in "abcd"], dict.fromkeys("abcd", 0.0), 2)
    assert p.placement == {"a": (0,), "b": (0,), "c": (0,), "d": (1,)}
    assert p.devices[0].duty_cycle == pytest.approx(0.015)
    assert p.devices[0].occupancy == pytest.approx(1.0)
    assert not p.overcommitted


def test_every_model_gets_a_device_even_when_overcommitted():
    p = plan([A(x) for x in "abcd"], dict.fromkeys("abcd", 0.0), 1)
    assert p.placement == {"a": (0,), "b": (0,), "c": (0,), "d": (0,)}
    assert p.overcommitted
    assert p.devices[0].occupancy == pytest.approx(4 / 3)


def test_slow_model_cannot_share():
    slow = ModelInfo("s", LatencyProfile.linear(1.0, 15.0, 8), 0.020, 8)
    p = plan([A("a"), slow], {"a": 0.0, "s": 10.0}, 3)
    assert p.batch["s"] == 1
    assert p.placement == {"a": (1,), "s": (0,)}
    assert p.devices[0].sessions[0].share == 1.0


# ------------------------------------------------------------ load scaling


def test_overload_scales_every_model_down_proportionally():
    # a 1200 + b 600 = 3 device-loads on 2 devices. At s = 0.5: a = 600 (one
    # dedicated), b = 300 (shared, batch 4, d = 12 ms). Above 0.5, a's residual
    # (batch 1, 5 ms) no longer fits with b's (8 ms) in 12 ms: three devices.
    p = plan([A("a"), A("b")], {"a": 1200, "b": 600}, 2)
    assert p.scale == pytest.approx(0.5, rel=1e-6)
    assert p.rates["a"] == pytest.approx(600.0, rel=1e-6)
    assert p.rates["b"] == pytest.approx(300.0, rel=1e-6)
    assert p.rates["a"] / p.rates["b"] == pytest.approx(2.0)
    assert p.placement == {"a": (0,), "b": (1,)}
    assert sessions(p, 0) == [("a", 6)]
    assert sessions(p, 1) == [("b", 4)]
    assert not p.overcommitted


def test_overload_single_model():
    p = plan([A("a")], {"a": 2000}, 2)
    assert p.scale == pytest.approx(0.6, rel=1e-6)
    assert p.dedicated == {"a": 2}
    assert p.used_devices == 2


def test_fill_scales_up_to_use_spare_devices():
    p = plan([A("a")], {"a": 1500}, 4, fill=True)
    assert p.scale == pytest.approx(1.6, rel=1e-6)
    assert p.dedicated == {"a": 4}
    assert p.placement == {"a": (0, 1, 2, 3)}
    assert plan([A("a")], {"a": 1500}, 4).used_devices == 3  # without fill


# ------------------------------------------------------------ unknown rates


def test_unknown_rates_split_evenly():
    p = plan([A("a"), A("b")], {}, 4)
    assert p.rates == {"a": pytest.approx(1200.0), "b": pytest.approx(1200.0)}
    assert p.placement == {"a": (0, 1), "b": (2, 3)}
    assert p.scale == 1.0


def test_unknown_rate_gets_what_known_rates_leave():
    p = plan([A("a"), A("b")], {"a": 600, "b": None}, 3)
    assert p.rates == {"a": 600.0, "b": pytest.approx(1200.0)}
    assert p.placement == {"a": (0,), "b": (1, 2)}


# ------------------------------------------------------------ invariants


def test_deterministic_and_order_independent():
    models = [A("c"), A("a"), A("b"), A("d")]
    rates = {"a": 130.0, "b": 470.0, "c": 900.0, "d": 20.0}
    p1 = plan(models, rates, 4)
    p2 = plan(list(reversed(models)), rates, 4)
    assert p1 == p2
    assert p1 == plan(models, rates, 4)


@pytest.mark.parametrize("rates", list(itertools.product([0, 90, 260, 410, 700], repeat=3)))
def test_shared_devices_keep_every_slo(rates):
    names = "abc"
    models = [A("a"), A("b", slo=0.030), A("c", slo=0.050)]
    p = plan(models, dict(zip(names, rates, strict=True)), 6)
    slo = {m.name: m.slo for m in models}
    lat = {m.name: m.profile.latency for m in models}
    for name in names:
        assert p.placement[name], name
    if p.overcommitted:
        return
    for dev in p.devices:
        if not dev.sessions:
            continue
        busy = sum(lat[s.model](s.batch) for s in dev.sessions)
        assert busy <= dev.duty_cycle + 1e-9
        for s in dev.sessions:
            # Worst case: wait one duty cycle, then run: Σ ℓ(bⱼ) + ℓ(bᵢ) ≤ SLO.
            assert dev.duty_cycle + lat[s.model](s.batch) <= slo[s.model] + 1e-9
            assert busy + lat[s.model](s.batch) <= slo[s.model] + 1e-9
            # The batch holds a cycle's arrivals of the planned rate.
            assert s.batch >= s.rate * dev.duty_cycle - 1e-6


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        plan([A("a")], {"a": 1.0}, 0)
    with pytest.raises(ValueError):
        plan([A("a")], {"a": -1.0}, 1)
    with pytest.raises(ValueError):
        plan([A("a"), A("a")], {}, 1)
