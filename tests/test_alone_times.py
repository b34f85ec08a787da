"""Alone-time histograms and the batch latency derived from them
(app/scheduling/alone_times.py), against Monte-Carlo estimates on known
distributions. Seeds are fixed: every figure below is deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from app.scheduling.alone_times import (
    AloneTimes,
    StaticLatency,
    expected_max,
    max_density_eq8,
)
from app.scheduling.profile import LatencyProfile

C0 = 0.005  # s
MC_DRAWS = 200_000


def normal(rng: np.random.Generator, mean: float, std: float, size) -> np.ndarray:
    return rng.normal(mean, std, size).clip(0.0)


def bimodal(rng: np.random.Generator, size) -> np.ndarray:
    """0.6 × N(80 ms, 4 ms) + 0.4 × N(40 ms, 4 ms), clipped at 0."""
    long = rng.random(size) < 0.6
    return np.where(long, normal(rng, 0.080, 0.004, size), normal(rng, 0.040, 0.004, size))


def make(prior, max_batch: int = 8, **kw) -> AloneTimes:
    options = {"window_s": 10.0, "min_samples": 5, **kw}
    return AloneTimes(C0, max_batch, prior=[(a, tuple(C0 + x)) for a, x in prior], **options)


def test_one_application_expected_batch_latency_matches_monte_carlo() -> None:
    rng = np.random.default_rng(1)
    times = make([("", normal(rng, 0.050, 0.005, 20_000))])
    for k in range(1, 9):
        draws = normal(rng, 0.050, 0.005, (MC_DRAWS, k)).max(axis=1)
        monte_carlo = C0 + k * draws.mean()
        assert times.expected(k) == pytest.approx(monte_carlo, rel=0.02), k
    # k = 1 is the mean alone-time: 5 + 50 ms.
    assert times.expected(1) == pytest.approx(0.055, rel=0.005)
    # E[L_8] = c0 + 8·E[max of 8 N(50, 5)] = 5 + 8·(50 + 1.4236·5) ms.
    assert times.expected(8) == pytest.approx(C0 + 8 * (0.050 + 1.4236 * 0.005), rel=0.005)


def test_two_applications_mix_by_share_of_samples() -> None:
    # 30 % of the samples from "short", 70 % from "long": a batch's k draws
    # come from that mixture (§4.3).
    rng = np.random.default_rng(2)
    times = make([("short", normal(rng, 0.020, 0.002, 6_000)), ("long", bimodal(rng, 14_000))])
    assert times.apps() == ["long", "short"]
    for k in range(1, 9):
        short = rng.random((MC_DRAWS, k)) < 0.3
        draws = np.where(
            short, normal(rng, 0.020, 0.002, (MC_DRAWS, k)), bimodal(rng, (MC_DRAWS, k))
        )
        monte_carlo = C0 + k * draws.max(axis=1).mean()
        assert times.expected(k) == pytest.approx(monte_carlo, rel=0.02), k
    # The histogram of L_k: edges c0 + k·x, masses summing to 1, its mean
    # (uniform within bins) close to E[L_k].
    edges, masses = times.histogram(4)
    assert masses.sum() == pytest.approx(1.0)
    assert edges[0] >= C0 and len(edges) == 65
    mids = (edges[:-1] + edges[1:]) / 2
    assert float(mids @ masses) == pytest.approx(times.expected(4), rel=0.01)


def test_a_given_two_application_batch_uses_eq8() -> None:
    # Two "short" and two "long" requests in one batch: the CDF of the
    # maximum is F_s²·F_l² (product form); eq. 8's sum over subsets gives
    # the same density, and both the Monte-Carlo mean.
    rng = np.random.default_rng(3)
    times = make([("short", normal(rng, 0.020, 0.002, 20_000)), ("long", bimodal(rng, 20_000))])
    apps = ["short", "long", "short", "long"]
    product = times.expected_batch(apps, items=4)
    draws = np.maximum(
        normal(rng, 0.020, 0.002, (MC_DRAWS, 2)).max(axis=1),
        bimodal(rng, (MC_DRAWS, 2)).max(axis=1),
    )
    assert product == pytest.approx(C0 + 4 * draws.mean(), rel=0.02)

    edges = times.grid()[0]
    x = np.linspace(edges[0], edges[-1], 20_001)
    f = {a: times.pdf_cdf(a, x) for a in ("short", "long")}
    pdfs = np.array([f[a][0] for a in apps])
    cdfs = np.array([f[a][1] for a in apps])
    literal = max_density_eq8(cdfs, pdfs)
    # d/dx Π F_i = Σ_i f_i Π_{j≠i} F_j
    derivative = sum(pdfs[i] * np.prod(np.delete(cdfs, i, axis=0), axis=0) for i in range(4))
    assert np.allclose(literal, derivative, rtol=1e-9, atol=1e-6 * derivative.max())
    # E[max] by integrating x·f_(k) (eq. 5 with eq. 8) = the product form's.
    mean_eq8 = float(np.sum(x[:-1] * literal[:-1] * np.diff(x)))
    assert C0 + 4 * mean_eq8 == pytest.approx(product, rel=0.002)
    # A batch of long requests only runs longer than the mixture's estimate.
    assert (
        times.expected_batch(["long"] * 4, 4)
        > times.expected(4)
        > times.expected_batch(["short"] * 4, 4)
    )


def test_eq8_for_two_variables_is_the_product_rule() -> None:
    F = np.array([[0.2, 0.5], [0.4, 0.9]])
    f = np.array([[1.0, 2.0], [3.0, 0.5]])
    assert max_density_eq8(F, f) == pytest.approx(f[0] * F[1] + f[1] * F[0])
    with pytest.raises(ValueError, match="too many"):
        max_density_eq8(np.ones((13, 1)), np.ones((13, 1)))


def test_expected_max_integrates_piecewise_linear_cdfs_exactly() -> None:
    # Uniform on [0, 1]: E[max of k] = k/(k+1), whatever the bins.
    edges = np.linspace(0.0, 1.0, 4)
    cdf = np.linspace(0.0, 1.0, 4)
    for k in (1, 2, 5, 13):
        assert expected_max(edges, [(cdf, k)]) == pytest.approx(k / (k + 1), rel=1e-12)
    # A uniform on [0, 1] and one on [0.5, 1] (on the same grid): the
    # max's CDF is x·(2x − 1) on [0.5, 1]: E = 1 − ∫ F = 1 − 5/24.
    edges = np.array([0.0, 0.5, 1.0])
    assert expected_max(edges, [(np.array([0, 0.5, 1]), 1), (np.array([0, 0, 1]), 1)]) == (
        pytest.approx(1 - 5 / 24, rel=1e-12)
    )


def test_equal_samples_are_a_point() -> None:
    times = make([("", np.full(10, 0.010))])
    for k in (1, 3, 8):
        assert times.expected(k) == pytest.approx(C0 + k * 0.010, rel=1e-12)
        edges, masses = times.histogram(k)
        assert edges.tolist() == pytest.approx([C0 + k * 0.010] * 2)
        assert masses.tolist() == [1.0]


def test_samples_below_c0_count_as_zero() -> None:
    times = AloneTimes(C0, 2, window_s=1.0, min_samples=1, prior=[("", (0.001, C0 + 0.002))])
    assert times.samples_in_use("") == pytest.approx((0.0, 0.002))


def test_window_reset_keeps_the_previous_histogram_until_the_new_one_has_min_samples() -> None:
    times = make([("", np.full(4, 0.010))], min_samples=3, window_s=10.0)
    version = times.version
    assert times.expected(1) == pytest.approx(C0 + 0.010)
    # Window [0, 10): two samples are too few; the prior stays in use.
    times.record("", C0 + 0.020, now=0.0)
    times.record("", C0 + 0.020, now=1.0)
    assert times.version == version
    assert times.expected(1) == pytest.approx(C0 + 0.010)
    # The third makes the window's histogram the one in use.
    times.record("", C0 + 0.020, now=2.0)
    assert times.version > version
    assert times.expected(1) == pytest.approx(C0 + 0.020)
    # Window [10, 20): a new window starts empty, the last one stays in use.
    version = times.version
    times.record("", C0 + 0.030, now=10.0)
    assert times.version == version
    assert times.samples_in_use("") == pytest.approx((0.020,) * 3)
    # It closes with one sample: dropped; [20, 30) fills up and takes over.
    for now in (20.0, 21.0, 22.0):
        times.record("", C0 + 0.040, now=now)
    assert times.samples_in_use("") == pytest.approx((0.040,) * 3)
    assert times.expected(1) == pytest.approx(C0 + 0.040)
    # Several empty windows later the last full window is still in use.
    times.record("", C0 + 0.050, now=95.0)
    assert times.samples_in_use("") == pytest.approx((0.040,) * 3)


def test_a_new_application_joins_the_mixture_once_it_has_min_samples() -> None:
    times = make([("a", np.full(10, 0.010))], min_samples=2)
    times.record("b", C0 + 0.030, now=0.0)
    assert times.apps() == ["a"]
    times.record("b", C0 + 0.030, now=0.0)
    assert times.apps() == ["a", "b"]
    # Shares by samples: 10 of "a" (10 ms), 2 of "b" (30 ms), in the first
    # and last of 64 bins over [10, 30] ms.
    edges, masses = times.histogram(1)
    assert (edges[0], edges[-1]) == pytest.approx((C0 + 0.010, C0 + 0.030))
    assert masses[0] == pytest.approx(10 / 12) and masses[-1] == pytest.approx(2 / 12)


def test_tables_are_recomputed_only_when_the_samples_in_use_change() -> None:
    times = make([("", np.linspace(0.01, 0.02, 50))], min_samples=2, window_s=100.0)
    first = times.tables()
    assert times.tables() is first
    times.record("", C0 + 0.5, now=0.0)  # one sample: not in use yet
    assert times.tables() is first
    times.record("", C0 + 0.5, now=1.0)
    second = times.tables()
    assert second is not first
    assert second.expected[1] == pytest.approx(C0 + 0.5)


def test_capped_window_keeps_the_latest_samples() -> None:
    times = make([], min_samples=2, max_samples=3)
    for i in range(5):
        times.record("", C0 + 0.001 * i, now=0.0)
    assert times.samples_in_use("") == pytest.approx((0.002, 0.003, 0.004))


def test_static_latency_is_the_profile() -> None:
    profile = LatencyProfile.from_table({1: 11.0, 4: 20.0, 8: 40.0}, 8)
    static = StaticLatency(profile, 8)
    for k in range(1, 9):
        assert static.expected(k) == profile.latency(k)
        edges, masses = static.histogram(k)
        assert edges.tolist() == [profile.latency(k)] * 2 and masses.tolist() == [1.0]
    assert static.expected_batch(["a", "b"], 3) == profile.latency(3)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"window_s": 0.0}, "window_s must be > 0"),
        ({"min_samples": 0}, "min_samples must be ≥ 1"),
        ({"bins": 0}, "bins must be ≥ 1"),
        ({"min_samples": 8, "max_samples": 4}, "max_samples must be ≥ min_samples = 8"),
    ],
)
def test_bad_options_are_refused(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        make([("", np.ones(3))], **kw)


def test_bad_samples_are_refused_and_no_samples_is_an_error() -> None:
    times = make([])
    with pytest.raises(ValueError, match="finite number ≥ 0 s, got nan"):
        times.record("", float("nan"), now=0.0)
    with pytest.raises(ValueError, match="no alone-time samples"):
        times.expected(1)
