"""BDA (app/scheduling/bda.py, inss.txt §5.3 Algorithm 1) on hand-made
monotone cases: its result against a brute-force scan, its probe count, and
the cases the printed pseudo-code gets wrong."""

from __future__ import annotations

import itertools

import pytest

from app.scheduling.bda import decide_batch, decide_batches


def linear(alpha_ms: float, beta_ms: float, slo_ms: float, memory_per_item: float = 0.0):
    """ℓ(b) = α·b + β; a batch fits when 2·ℓ(b) ≤ SLO (waiting for the batch
    plus running it) and b × memory_per_item ≤ 1."""

    def latency(b: int) -> float:
        return (alpha_ms * b + beta_ms) / 1000.0

    def fits(_model, b: int) -> bool:
        return 2 * latency(b) <= slo_ms / 1000.0 and b * memory_per_item <= 1.0

    def throughput(_model, b: int) -> float:
        return b / latency(b)

    return fits, throughput


def test_the_largest_batch_meeting_the_slo_in_at_most_six_probes():
    # 2·(1.053 b + 5.072) ≤ 25 ms → b ≤ 7 (ResNet50's Table 4 profile).
    fits, throughput = linear(1.053, 5.072, 25.0)
    decision = decide_batch("r50", 300.0, fits, throughput)
    assert decision.batch == 7 and decision.ok
    assert decision.throughput == pytest.approx(7 / 12.443e-3)
    assert decision.probes <= 6


def test_against_a_brute_force_scan_on_every_cut_point():
    for last_fitting in range(0, 33):

        def fits(_m, b, last=last_fitting):
            return b <= last

        decision = decide_batch("m", 0.0, fits, lambda _m, b: float(b))
        assert decision.batch == (last_fitting or None)
        assert decision.probes <= 6  # ⌈log2 33⌉


def test_a_rate_the_largest_fitting_batch_cannot_serve_fails_the_model():
    fits, throughput = linear(1.053, 5.072, 25.0)  # b = 7: 562.6 r/s at most
    decision = decide_batch("r50", 600.0, fits, throughput)
    assert (decision.batch, decision.ok) == (7, False)


def test_a_model_is_not_given_up_where_a_larger_batch_keeps_up():
    # The printed algorithm breaks at mid = 16 when 16 fits but misses the
    # rate; b = 24 fits too and keeps up.
    def fits(_m, b):
        return b <= 24

    decision = decide_batch("m", 22.0, fits, lambda _m, b: float(b))
    assert (decision.batch, decision.ok) == (24, True)


def test_memory_and_slo_together_and_every_model_decided():
    tight, tput = linear(1.0, 5.0, 40.0, memory_per_item=1 / 6)  # memory: b ≤ 6
    loose, _ = linear(1.0, 5.0, 40.0)  # SLO: b ≤ 15
    rates = {"a": 100.0, "b": 5000.0}
    decisions, ok = decide_batches(rates, lambda m, b: (tight if m == "a" else loose)(m, b), tput)
    assert (decisions["a"].batch, decisions["a"].ok) == (6, True)
    assert (decisions["b"].batch, decisions["b"].ok) == (15, False)
    assert ok is False
    decisions, ok = decide_batches({"a": 100.0}, tight, tput)
    assert ok is True


def test_nothing_fits():
    decision = decide_batch("m", 1.0, lambda _m, _b: False, lambda _m, b: float(b))
    assert (decision.batch, decision.ok, decision.throughput) == (None, False, 0.0)
    assert decision.probes == 5  # 16, 8, 4, 2, 1


@pytest.mark.parametrize("low,high", [(0, 4), (5, 4)])
def test_bad_ranges_are_refused(low, high):
    with pytest.raises(ValueError, match="batch range"):
        decide_batch("m", 1.0, lambda *_: True, lambda *_: 1.0, min_batch=low, max_batch=high)


def test_probe_counts_over_all_outcomes_never_exceed_six():
    counts = set()
    for last, rate in itertools.product(range(33), (0.0, 10.0)):
        decision = decide_batch("m", rate, lambda _m, b, last=last: b <= last, lambda _m, b: b)
        counts.add(decision.probes)
    assert max(counts) == 6 and min(counts) == 5
