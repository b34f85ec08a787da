"""bench/inss_cpu_model.py: the fits on synthetic data with known
coefficients, and `--quick` end to end through real executors."""

from __future__ import annotations

import json
import math

import pytest

from bench.inss_cpu_fit import (
    alone_predictions,
    co_predictions,
    cpu_device,
    fit_alone,
    fit_intensities,
    split_batches,
)
from bench.inss_cpu_measure import AlonePoint, CoPoint
from bench.inss_cpu_model import RESULT_FILE, main

ALPHA = {"a": 0.3, "b": 0.1, "c": 0.2}
INTENSITY = {"a": 1.0, "b": 0.5, "c": 0.25}


def alone_s(model: str, batch: int, share: float) -> float:
    """A power law in b and ρ: what log-space LWR reproduces exactly."""
    base = {"a": 2e-3, "b": 1e-3, "c": 5e-4}[model]
    return base * batch**0.8 / share


def synthetic() -> tuple[list[AlonePoint], list[CoPoint]]:
    alone = [
        AlonePoint(m, share, b, alone_s(m, b, share))
        for m in ALPHA
        for share in (0.5, 1.0)
        for b in (1, 2, 4, 8, 16)
    ]
    co = [
        CoPoint(m, v, b, 0.5, 0.5, alone_s(m, b, 0.5) * (1 + ALPHA[m] * INTENSITY[v]), 3)
        for m in ALPHA
        for v in ALPHA
        for b in (1, 4, 16)
    ]
    return alone, co


def test_split_batches_holds_out_every_other_interior_size():
    assert split_batches([16, 1, 2, 4, 8]) == ([1, 4, 16], [2, 8])
    assert split_batches([1, 2, 4, 8]) == ([1, 4, 8], [2])
    with pytest.raises(ValueError, match="≥ 3 batch sizes"):
        split_batches([1, 4])


def test_fit_intensities_recovers_known_coefficients():
    observations = [
        (m, v, alone_s(m, b, 0.5), alone_s(m, b, 0.5) * (1 + ALPHA[m] * INTENSITY[v]))
        for m in ALPHA
        for v in ALPHA
        for b in (1, 4)
    ]
    alpha, intensity = fit_intensities(observations)
    for m in ALPHA:
        assert alpha[m] == pytest.approx(ALPHA[m], rel=1e-6)
        assert intensity[m] == pytest.approx(INTENSITY[m], rel=1e-6)


def test_a_co_runner_that_seems_to_speed_a_model_up_is_fitted_as_no_interference():
    # Timings 10 % faster beside "b" than alone (noise on a busy box): the
    # fit keeps α_cache and intensity at 0 rather than predicting a speed-up
    # (which, large enough, would be a negative time).
    observations = [("a", "b", 0.010, 0.009), ("a", "b", 0.020, 0.018)]
    alpha, intensity = fit_intensities(observations)
    assert alpha["a"] * intensity["b"] == 0.0
    assert alpha["a"] >= 0.0 and intensity["b"] >= 0.0
    # ... also beside a co-runner that does slow it: "c"'s fit is unharmed.
    observations += [("a", "c", 0.010, 0.012), ("a", "c", 0.020, 0.024)]
    alpha, intensity = fit_intensities(observations)
    assert alpha["a"] * intensity["c"] == pytest.approx(0.2)
    assert intensity["b"] == 0.0


def test_predictions_on_exact_data_are_exact_and_leave_the_held_out_points_out():
    alone, co = synthetic()
    train = {m: [1, 4, 16] for m in ALPHA}
    held = alone_predictions(alone, train, log_space=True)
    assert sorted({(p.batch, p.share) for p in held}) == [(2, 0.5), (2, 1.0), (8, 0.5), (8, 1.0)]
    assert max(abs(p.error) for p in held) < 1e-9
    lwr = {m: fit_alone(alone, m, train[m], log_space=True) for m in ALPHA}
    sizes = {m: (16.0, 4.0) for m in ALPHA}
    predicted = co_predictions(co, alone, lwr, sizes, cpu_device(1e10))
    assert len(predicted) == len(co)
    assert max(abs(p.error) for p in predicted) < 1e-6
    # A raw-axis LWR cannot follow the power law exactly between 1, 4 and 16.
    raw = alone_predictions(alone, train, log_space=False)
    assert max(abs(p.error) for p in raw) > 0.01


def test_a_pair_that_cannot_be_fitted_without_itself_is_an_error():
    alone, co = synthetic()
    only_a = [p for p in co if p.model == "a"]  # no other model's α: b's l needs a pair
    lwr = {"a": fit_alone(alone, "a", [1, 4, 16], log_space=True)}
    with pytest.raises(ValueError, match="leaves no pair"):
        co_predictions(only_a, alone, lwr, {"a": (1.0, 1.0)}, cpu_device(1e10))


@pytest.mark.slow
def test_quick_run_writes_finite_errors(tmp_path, capsys):
    assert main(["--quick", "--out-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / RESULT_FILE).read_text())
    models = {"cnn", "mlp"}
    assert set(doc["fit"]) == models
    # Alone: batch 2 held out at both shares; co: 3 pairs × batches 1, 4 × both sides.
    assert len(doc["alone_points"]) == 2 * 2 * 3
    assert len(doc["co_points"]) == 3 * 2 * 2
    assert {(p["batch"], p["share"]) for p in doc["predictions"]["alone"]} == {(2, 0.5), (2, 1.0)}
    assert len(doc["predictions"]["co"]) == len(doc["co_points"])
    for kind in ("alone", "alone_raw", "co"):
        for p in doc["predictions"][kind]:
            assert p["measured_s"] > 0 and math.isfinite(p["error"])
            # The fitted model (log-space LWR) never predicts a negative
            # time; the paper's raw-axis LWR, scored beside it, may when it
            # extrapolates from a few noisy points (a busy box, --quick).
            if kind != "alone_raw":
                assert p["predicted_s"] > 0, (kind, p)
            assert p["error"] == pytest.approx(p["predicted_s"] / p["measured_s"] - 1)
    for kind in ("alone", "alone_raw", "co", "overall"):
        assert set(doc["summary"][kind]) == models | {"all"}
        for s in doc["summary"][kind].values():
            assert s["n"] > 0
            assert math.isfinite(s["median_abs_error"]) and math.isfinite(s["max_abs_error"])
    assert max(f["intensity"] for f in doc["fit"].values()) == pytest.approx(1.0)
    assert all(math.isfinite(f["alpha_cache"]) for f in doc["fit"].values())
    assert doc["arena_bandwidth_bytes_per_s"] > 0
    assert "median |error| overall" in capsys.readouterr().out
