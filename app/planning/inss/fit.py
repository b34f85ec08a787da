"""Least-squares fits of InSS's latency coefficients (inss.txt §4.1,
"Prediction Overhead": "fit all coefficients α and β using the least
squares method").

* L2 use alone (Fig. 12): l = α_u·ρ + β_u from (share, L2 use) points.
* Scheduling interference (Fig. 10): a kernel's scheduling time with n > 1
  models on the device is o_sch + α_s·n + β_s; α_s, β_s from (n, seconds per
  kernel) points and the alone time o_sch.
* Cache interference: t_co = t_alone·(1 + α_cache·L) with L the co-runners'
  summed L2 use; α_cache from co-located running times against alone ones —
  a line through the origin in (t_alone·L, t_co − t_alone). When the alone
  time was not measured (only co-located times at several L),
  ``fit_cache_interference(..., alone_s=None)`` fits it as the intercept of
  t_co = t_alone + (t_alone·α_cache)·L.

Each fit returns its coefficients and its quality: the root-mean-square
residual (in the fitted quantity's unit) and r² = 1 − SS_res/SS_tot (about
the mean; for the line through the origin it can be negative, and it is NaN
when the observations do not vary).

Deviation: the paper says nothing about weighting; all fits are ordinary
(unweighted) least squares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.planning.inss.latency import L2Use


@dataclass(frozen=True)
class FitQuality:
    points: int
    rms_residual: float
    r_squared: float


@dataclass(frozen=True)
class L2Fit:
    l2: L2Use
    quality: FitQuality


@dataclass(frozen=True)
class SchedInterferenceFit:
    alpha_s: float  # seconds per kernel per model on the device
    beta_s: float  # seconds per kernel
    quality: FitQuality


@dataclass(frozen=True)
class CacheInterferenceFit:
    alpha_cache: float  # per unit of summed co-runner L2 use
    alone_s: float | None  # the fitted alone time when it was not given
    quality: FitQuality


def fit_l2_use(shares: Sequence[float], l2_use: Sequence[float]) -> L2Fit:
    """α_u, β_u from L2 use measured alone at several shares."""
    x, y = _arrays("share", shares, "L2 use", l2_use, minimum=2)
    if np.any((x <= 0) | (x > 1)):
        raise ValueError(f"shares must be fractions in (0, 1], got {x[(x <= 0) | (x > 1)][0]:g}")
    slope, intercept, quality = _line(x, y, "shares")
    return L2Fit(L2Use(slope, intercept), quality)


def fit_sched_interference(
    models_on_device: Sequence[int], per_kernel_s: Sequence[float], alone_per_kernel_s: float
) -> SchedInterferenceFit:
    """α_s, β_s from the scheduling time per kernel with n > 1 models placed
    (n counts the model itself) and o_sch, the time alone."""
    x, y = _arrays("model count", models_on_device, "seconds per kernel", per_kernel_s, minimum=2)
    if not math.isfinite(alone_per_kernel_s):
        raise ValueError(f"alone scheduling time must be finite, got {alone_per_kernel_s}")
    if np.any(x <= 1):
        raise ValueError(
            "scheduling interference is 0 by definition with ≤ 1 model on the device; "
            f"give only points with n > 1 (got n = {x[x <= 1][0]:g}) and the alone time "
            "as alone_per_kernel_s"
        )
    slope, intercept, quality = _line(x, y - alone_per_kernel_s, "model counts")
    return SchedInterferenceFit(slope, intercept, quality)


def fit_cache_interference(
    co_runner_l2: Sequence[float],
    co_located_s: Sequence[float],
    alone_s: Sequence[float] | None = None,
) -> CacheInterferenceFit:
    """α_cache from running times beside co-runners whose summed L2 use is
    `co_runner_l2`, against the same configurations' times alone (`alone_s`),
    or with the alone time fitted as well when `alone_s` is None (one model
    at one configuration, co-runners varied)."""
    load, co = _arrays("co-runner L2 use", co_runner_l2, "co-located time", co_located_s, 1)
    if np.any(co <= 0):
        raise ValueError("co-located running times must be > 0 s")
    if alone_s is None:
        if len(load) < 2:
            raise ValueError(f"fitting the alone time too needs ≥ 2 points, got {len(load)}")
        slope, intercept, quality = _line(load, co, "co-runner L2 uses")
        if not intercept > 0:
            raise ValueError(f"the fitted alone time is {intercept:.3g} s, not > 0")
        return CacheInterferenceFit(slope / intercept, intercept, quality)
    _, alone = _arrays("co-runner L2 use", co_runner_l2, "alone time", alone_s, 1)
    if np.any(alone <= 0):
        raise ValueError("alone running times must be > 0 s")
    x = alone * load
    if not np.any(x != 0):
        raise ValueError("co-runner L2 use is 0 at every point: α_cache is not determined")
    y = co - alone
    alpha = float(np.dot(x, y) / np.dot(x, x))
    return CacheInterferenceFit(alpha, None, _quality(y, alpha * x))


def _arrays(
    x_name: str, xs: Sequence[float], y_name: str, ys: Sequence[float], minimum: int
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if x.ndim != 1 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"{x_name} and {y_name} must be equal-length lists ({len(x)}, {len(y)})")
    if len(x) < minimum:
        raise ValueError(f"fit needs at least {minimum} points, got {len(x)}")
    for name, values in ((x_name, x), (y_name, y)):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} values must be finite, got {values[~np.isfinite(values)][0]}")
    return x, y


def _line(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, float, FitQuality]:
    if np.ptp(x) == 0:
        raise ValueError(f"all {what} are equal ({x[0]:g}): the slope is not determined")
    design = np.column_stack([x, np.ones_like(x)])
    (slope, intercept), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(slope), float(intercept), _quality(y, design @ np.array([slope, intercept]))


def _quality(observed: np.ndarray, fitted: np.ndarray) -> FitQuality:
    residual = observed - fitted
    ss_res = float(np.dot(residual, residual))
    centred = observed - observed.mean()
    ss_tot = float(np.dot(centred, centred))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan
    return FitQuality(len(observed), math.sqrt(ss_res / len(observed)), r2)
