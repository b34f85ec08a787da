"""The roofline running time from measured data (app/planning/inss/measured.py),
its config entry, the planner on it, and bench.inss_curves's fit figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.planning.config_input import InputError
from app.planning.inss.config import load_problem, problem_from_dict
from app.planning.inss.measured import (
    MeasuredRunningTime,
    fit_used_fraction,
    from_gpulet,
    from_ppipe,
)
from app.planning.inss.placement import solve_exact
from app.planning.ppipe.profiles import bundled_models
from bench.inss_curves import share_fits, table3_check

ROOT = Path(__file__).resolve().parent.parent
GPULET_SMALL = ROOT / "bench" / "workloads" / "inss" / "gpulet-small.yaml"


def test_a_share_above_what_the_batch_uses_runs_it_at_full_speed() -> None:
    curve = MeasuredRunningTime((1, 4), (0.010, 0.020), (0.2, 0.5))
    assert curve.predict(4, 1.0) == pytest.approx(0.020)
    assert curve.predict(4, 0.5) == pytest.approx(0.020)  # u(4) = 0.5: saturated
    assert curve.predict(4, 0.25) == pytest.approx(0.040)  # half of what it uses
    assert curve.predict(1, 0.1) == pytest.approx(0.020)
    # Between measured batches t₁ and u are linear: b = 2.5 → 15 ms, u 0.35.
    assert curve.predict(2.5, 0.175) == pytest.approx(0.030)
    # Beyond the largest, t₁ grows along its last segment (10 ms per 3), u holds.
    assert curve.predict(7, 1.0) == pytest.approx(0.030)
    assert curve.used_fraction(7) == pytest.approx(0.5)


def test_bad_measurements_are_refused() -> None:
    with pytest.raises(ValueError, match="one time per batch"):
        MeasuredRunningTime((1, 2), (0.01,), (0.5, 0.5))
    with pytest.raises(ValueError, match="ascending"):
        MeasuredRunningTime((2, 1), (0.01, 0.02), (0.5, 0.5))
    with pytest.raises(ValueError, match=r"used fractions must be in \(0, 1\]"):
        MeasuredRunningTime((1,), (0.01,), (1.5,))


def test_the_used_fraction_is_fitted_to_the_shares_measured() -> None:
    # t₁ = 1; at ½ no slower, at ¼ 1.6× slower: u = 0.4 fits both exactly.
    assert fit_used_fraction(1.0, [(0.5, 1.0), (0.25, 1.6)]) == pytest.approx(0.40)
    assert fit_used_fraction(1.0, [(0.5, 2.0)]) == pytest.approx(1.0)  # the linear case
    with pytest.raises(ValueError, match="at least one share"):
        fit_used_fraction(1.0, [])


def test_gpulets_mnasnet_saturates_near_where_inss_table_3_does() -> None:
    curve = from_gpulet("mnasnet1_0", "3080")
    assert curve.whole(1) == pytest.approx(8.017e-3, rel=1e-3)
    assert curve.used_fraction(4) == pytest.approx(0.2824, abs=1e-3)
    ratios = {share: round(r, 2) for share, (_, r) in table3_check().items()}
    assert ratios == {0.24: 1.17, 0.42: 1.0, 0.60: 1.0}  # Table 3: 1.24, 1.02, 1.00
    with pytest.raises(KeyError, match="no Gpulet data for model 'alexnet'"):
        from_gpulet("alexnet", "3080")


def test_ppipes_large_dnns_fill_a_gpu_and_are_fitted_per_batch() -> None:
    repvgg = from_ppipe("repvgg-b3", "T4")
    assert repvgg.batches == tuple(range(1, 9)) and set(repvgg.used) == {1.0}
    assert from_ppipe("repvgg-b3", "P4").used == (1.0,) * 8  # no share measured: linear
    # On ⅓ and ¼ shares the fit from ½ is closer than 1/ρ on V100 and no worse elsewhere.
    fits = {f.gpu: f for f in share_fits(bundled_models())}
    assert set(fits) == {"L4", "T4", "V100"} and all(f.points == 72 for f in fits.values())
    assert fits["V100"].roofline_median < 0.05 < 0.15 < fits["V100"].linear_median
    for fit in fits.values():
        assert fit.roofline_median <= fit.linear_median + 1e-9
        assert fit.roofline_p90 <= fit.linear_p90


def test_a_config_reads_measured_curves_and_names_bad_ones(tmp_path: Path) -> None:
    problem = load_problem(GPULET_SMALL)
    latency = problem.model("mnasnet1_0").latency["3080"]
    assert isinstance(latency.running_time, MeasuredRunningTime)
    assert latency.running_time.source == "gpulet 3080 mnasnet1_0"

    def config(measured: dict) -> dict:
        return {
            "devices": [{"name": "g", "kind": "3080", "memory_mb": 1000, "bandwidth_gb_per_s": 1}],
            "models": [
                {
                    "name": "m",
                    "rate": 1,
                    "slo_ms": 10,
                    "memory_mb": {"base": 1},
                    "latency": {"running_time": {"measured": measured}},
                }
            ],
        }

    at = "x: models[0]: latency: running_time: measured"
    for measured, message in (
        ({"source": "nvml", "gpu": "3080", "model": "lenet"}, "source must be gpulet or ppipe"),
        ({"source": "gpulet", "gpu": 3080, "model": "alexnet"}, "no Gpulet data for model"),
        ({"source": "gpulet", "gpu": "a100", "model": "lenet"}, "no UTIL.CSV for GPU 'a100'"),
        ({"source": "ppipe", "gpu": "T4", "model": "nope"}, "no block timings for model"),
        ({"source": "ppipe", "gpu": "T4", "model": "repvgg-b3", "duration_unit": "s"}, "only for"),
        ({"source": "gpulet", "gpu": "3080"}, "model must be a non-empty string"),
    ):
        with pytest.raises(InputError, match=message) as raised:
            problem_from_dict(config(measured), "x")
        assert str(raised.value).startswith(at)


def test_on_small_models_with_tight_slos_the_planner_shares_devices_spatially() -> None:
    plan = solve_exact(load_problem(GPULET_SMALL))
    assert plan.feasible and plan.details["time_shared"] == []
    shares = sorted(m.share for m in plan.models if m.share is not None)
    assert len(shares) == 4 and max(shares) <= 0.5  # all four served, none on a whole GPU
    assert sorted(len(d.models) for d in plan.devices) == [2, 2]


def test_a_curve_never_falls_with_the_batch_size() -> None:
    # Gpulet's LeNet runs 6.34 ms at batch 24 and 6.10 ms at 28: read as 6.34.
    lenet = from_gpulet("lenet", "3080")
    assert lenet.whole(28) == pytest.approx(lenet.whole(24)) == pytest.approx(6.3365e-3, rel=1e-3)
    times = [lenet.predict(b, 0.1) for b in range(1, 33)]
    assert times == sorted(times)
    curve = MeasuredRunningTime.monotone((1, 2, 3), [0.003, 0.002, 0.004], [0.5, 0.3, 0.6])
    assert (curve.whole_s, curve.used) == ((0.003, 0.003, 0.004), (0.5, 0.5, 0.6))
