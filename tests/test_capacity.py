"""Symphony's analytical capacity formulas (symphony.txt §4.2, §5.2.2, Table 4)."""

from __future__ import annotations

import math

import pytest

from app.planning.capacity import (
    compare,
    devices_for_model,
    devices_for_rate,
    no_coordination_batch_size,
    staggered,
    staggered_batch_size,
    throughput,
)
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile

MS = 1e-3

# (name, α s, β s, SLO s, N, no-coordination BS, r/s, staggered BS, r/s) — Table 4.
TABLE_4 = [
    ("ResNet50", 1.053 * MS, 5.072 * MS, 25 * MS, 8, 7, 4501, 16, 5839),
    ("InceptionResNetV2", 5.090 * MS, 18.368 * MS, 70 * MS, 8, 3, 713, 8, 1083),
]


@pytest.mark.parametrize(
    ("name", "alpha", "beta", "slo", "n", "nc_bs", "nc_rps", "st_bs", "st_rps"), TABLE_4
)
def test_table_4_reproduced_exactly(
    name: str,
    alpha: float,
    beta: float,
    slo: float,
    n: int,
    nc_bs: int,
    nc_rps: int,
    st_bs: int,
    st_rps: int,
) -> None:
    row = compare(alpha, beta, slo, n)
    assert row.no_coordination.batch_size == nc_bs
    assert row.staggered.batch_size == st_bs
    # Table 4 rounds to the nearest integer.
    assert row.no_coordination.throughput_rps == nc_rps
    assert row.staggered.throughput_rps == st_rps
    assert round(row.no_coordination.throughput) == nc_rps
    # §5.2.2: "twice the batch size and 30% ~ 50% higher throughput".
    assert 1.29 < row.throughput_gain < 1.52


def test_table_4_rounding_is_nearest_not_floor_or_ceil() -> None:
    nc = compare(1.053 * MS, 5.072 * MS, 25 * MS, 8).no_coordination
    assert nc.throughput == pytest.approx(4500.522, abs=1e-3)
    assert math.floor(nc.throughput) == 4500  # floor would not match the paper's 4501
    st = compare(1.053 * MS, 5.072 * MS, 25 * MS, 8).staggered
    assert st.throughput == pytest.approx(5839.416, abs=1e-3)
    assert math.ceil(st.throughput) == 5840  # ceil would not match the paper's 5839


def test_formulas_by_hand() -> None:
    # ℓ(b) = 2b + 10 ms, SLO 50 ms: no coordination ⌊(25 − 10)/2⌋ = 7;
    # N = 4: ⌊(50/1.25 − 10)/2⌋ = 15; N = 1 is the same as no coordination.
    a, b, slo = 2 * MS, 10 * MS, 50 * MS
    assert no_coordination_batch_size(a, b, slo) == 7
    assert staggered_batch_size(a, b, slo, 4) == 15
    assert staggered_batch_size(a, b, slo, 1) == 7
    assert throughput(a, b, 15, 4) == pytest.approx(4 * 15 / 0.040)
    assert throughput(a, b, 0, 4) == 0.0
    # Exactly on an integer boundary the floor must not lose one to rounding:
    # (0.3/2 − 0.1)/0.01 = 5 exactly, computed in floats as 4.999….
    assert (0.3 / 2 - 0.1) / 0.01 < 5
    assert no_coordination_batch_size(0.01, 0.1, 0.3) == 5


def test_staggered_worst_queueing_delay_is_latency_over_n() -> None:
    p = staggered(2 * MS, 10 * MS, 50 * MS, 4)
    assert p.batch_latency == pytest.approx(40 * MS)
    assert p.worst_queueing_delay == pytest.approx(10 * MS)
    # eq. 2 holds: (1 + 1/N)·ℓ(b) ≤ SLO.
    assert p.batch_latency + p.worst_queueing_delay <= 50 * MS + 1e-12


def test_max_batch_caps_the_size() -> None:
    assert staggered_batch_size(1.053 * MS, 5.072 * MS, 25 * MS, 8, max_batch=8) == 8
    assert compare(1.053 * MS, 5.072 * MS, 25 * MS, 8, max_batch=4).staggered.batch_size == 4


def test_infeasible_slo_gives_batch_zero() -> None:
    # ℓ(1) = 30 ms > SLO/2 = 25 ms.
    assert no_coordination_batch_size(10 * MS, 20 * MS, 50 * MS) == 0
    assert compare(10 * MS, 20 * MS, 50 * MS, 2).no_coordination.throughput == 0.0


def test_devices_for_rate_is_smallest_n() -> None:
    a, b, slo = 1.053 * MS, 5.072 * MS, 25 * MS
    p = devices_for_rate(a, b, slo, 5000)
    # N = 7: b = ⌊(25/(8/7) − 5.072)/1.053⌋ = 15, 7·15/20.867 ms = 5031.9 r/s.
    assert (p.devices, p.batch_size) == (7, 15)
    assert p.throughput == pytest.approx(5031.87, abs=0.01)
    # N = 6 does not reach 5000 r/s.
    below = staggered(a, b, slo, 6)
    assert below.throughput < 5000
    # Table 4's staggered 8-GPU throughput needs exactly 8 devices.
    assert devices_for_rate(a, b, slo, 5839).devices == 8
    assert devices_for_rate(a, b, slo, 5840).devices == 9
    assert devices_for_rate(a, b, slo, 0).devices == 1


def test_devices_for_rate_needs_more_devices_than_uncoordinated_would_give() -> None:
    # ℓ(1) = 30 ms, SLO 50 ms: N = 1 gives b = 0 (2·ℓ(1) > SLO); N = 2 gives
    # ⌊(33.3 − 20)/10⌋ = 1, 2 requests per 30 ms = 66.7 r/s.
    p = devices_for_rate(10 * MS, 20 * MS, 50 * MS, 60)
    assert (p.devices, p.batch_size) == (2, 1)


def test_devices_for_rate_rejects_hopeless_and_bad_input() -> None:
    with pytest.raises(ValueError, match="batch of one"):
        devices_for_rate(10 * MS, 45 * MS, 50 * MS, 1)
    with pytest.raises(ValueError, match="more than 3 devices"):
        devices_for_rate(1.053 * MS, 5.072 * MS, 25 * MS, 5000, max_devices=3)
    with pytest.raises(ValueError):
        devices_for_rate(1 * MS, 1 * MS, 25 * MS, -1)
    with pytest.raises(ValueError):
        staggered_batch_size(1 * MS, 1 * MS, 25 * MS, 0)
    with pytest.raises(ValueError, match="unbounded"):
        no_coordination_batch_size(0.0, 1 * MS, 25 * MS)
    assert no_coordination_batch_size(0.0, 1 * MS, 25 * MS, max_batch=32) == 32


def test_devices_for_model_matches_linear_formula() -> None:
    model = ModelInfo("resnet50", LatencyProfile.linear(1.053, 5.072, 64), slo=0.025, max_batch=64)
    p = devices_for_model(model, 5000)
    assert (p.devices, p.batch_size) == (7, 15)
    assert p.throughput == pytest.approx(5031.87, abs=0.01)
    # A measured (table) profile with a knee: ℓ(b) = 5 ms up to b = 8, then 2 ms per request.
    table = LatencyProfile.from_table({1: 5.0, 8: 5.0, 16: 21.0}, max_batch=16)
    knee = ModelInfo("knee", table, slo=0.030, max_batch=16)
    # N = 1: budget 15 ms → b = 13 (ℓ = 15 ms) → 866.7 r/s.
    q = devices_for_model(knee, 800)
    assert (q.devices, q.batch_size) == (1, 13)
    assert q.throughput == pytest.approx(13 / 0.015)
