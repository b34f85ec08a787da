"""A model's running time alone, o_r(b, ρ), by locally weighted regression
(inss.txt §4.1, "GPU Running Latency"; LWR after Cleveland & Devlin [9]).

The paper profiles each model alone at a handful of (batch size, share)
configurations (16: 4 batch sizes × 4 shares) and predicts the running time
elsewhere with LWR, because the dependence on b and ρ is "complex and
nonlinear" (Fig. 11). For a query q = (b, ρ) the fit is a *local linear* one:

    w_j  = exp(−‖z_j − z_q‖² / (2·h²))               (Gaussian kernel)
    θ    = argmin Σ_j w_j·(y_j − θ₀ − θ₁·z_{j,b} − θ₂·z_{j,ρ})²
    ô(q) = θ₀ + θ₁·z_{q,b} + θ₂·z_{q,ρ}

where z are the axes standardized by the profile's own mean and standard
deviation (so that a batch step and a share step weigh alike) and h is the
bandwidth in those standard units. The weighted least squares is solved with
``numpy.linalg.lstsq``.

Deviations, each for a reason:

* The paper regresses on ρ·C_k (share times the device's computing power).
  A profile belongs to one device, so C_k is a constant factor on that axis,
  which standardization removes: ρ alone gives the same fit.
* An axis on which every profiled point has the same value (say, a profile at
  batch 4 only) carries no slope; it is left out of the local fit and the
  profile can answer only at that value (anything else is an error, not an
  extrapolation we cannot back).
* ``log_space=True`` fits log o_r against (log b, log ρ) instead — a
  power-law shape that follows the "inversely related to the share" curve of
  Fig. 11 from fewer points. Off by default (the paper's LWR is on the raw
  axes); bench/inss_tables.py reports both.
* A prediction ≤ 0 s (a local line extrapolated past the profile) is an
  error naming the query, not a running time.

Units: seconds; a share is a fraction in (0, 1]; a batch size is ≥ 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: Weights below this fraction of the largest one are treated as zero when
#: checking that the local fit is determined.
_NEGLIGIBLE_WEIGHT = 1e-12


@dataclass(frozen=True)
class ProfilePoint:
    """One profiled configuration: running time alone at (batch, share)."""

    batch: float
    share: float
    seconds: float


@dataclass(frozen=True)
class LocallyWeightedRegression:
    """o_r(b, ρ) from profiled points; see the module docstring.

    `bandwidth` is h in standard units of the axes (1.0: a point one standard
    deviation away weighs e^(−1/2) ≈ 0.61 of one at the query)."""

    points: tuple[ProfilePoint, ...]
    bandwidth: float = 1.0
    log_space: bool = False
    _x: np.ndarray = field(init=False, repr=False, compare=False)
    _y: np.ndarray = field(init=False, repr=False, compare=False)
    _mean: np.ndarray = field(init=False, repr=False, compare=False)
    _scale: np.ndarray = field(init=False, repr=False, compare=False)
    _active: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        points = tuple(self.points)
        object.__setattr__(self, "points", points)
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(f"LWR bandwidth must be finite and > 0, got {self.bandwidth}")
        if not points:
            raise ValueError("LWR needs at least one profiled point, got none")
        raw = np.array([[p.batch, p.share, p.seconds] for p in points], dtype=float)
        if not np.all(np.isfinite(raw)):
            bad = [p for p, row in zip(points, raw, strict=True) if not np.all(np.isfinite(row))]
            raise ValueError(f"LWR points must be finite, got {bad[0]}")
        _check_axes(raw[:, 0], raw[:, 1])
        if np.any(raw[:, 2] <= 0):
            raise ValueError(f"LWR running times must be > 0 s, got {raw[:, 2].min()}")
        x = np.log(raw[:, :2]) if self.log_space else raw[:, :2]
        y = np.log(raw[:, 2]) if self.log_space else raw[:, 2]
        mean = x.mean(axis=0)
        spread = x.std(axis=0)
        active = spread > 1e-12 * np.maximum(1.0, np.abs(mean))
        needed = 1 + int(active.sum())
        if len(points) < needed:
            raise ValueError(
                f"LWR needs at least {needed} points for a local linear fit over "
                f"{int(active.sum())} varying axes, got {len(points)}"
            )
        object.__setattr__(self, "_x", x)
        object.__setattr__(self, "_y", y)
        object.__setattr__(self, "_mean", mean)
        object.__setattr__(self, "_scale", np.where(active, spread, 1.0))
        object.__setattr__(self, "_active", active)

    @classmethod
    def from_arrays(
        cls,
        batches: Sequence[float],
        shares: Sequence[float],
        seconds: Sequence[float],
        bandwidth: float = 1.0,
        log_space: bool = False,
    ) -> LocallyWeightedRegression:
        if not len(batches) == len(shares) == len(seconds):
            raise ValueError(
                f"LWR arrays differ in length: {len(batches)} batches, {len(shares)} shares, "
                f"{len(seconds)} times"
            )
        points = tuple(
            ProfilePoint(float(b), float(r), float(s))
            for b, r, s in zip(batches, shares, seconds, strict=True)
        )
        return cls(points, bandwidth, log_space)

    def predict(self, batch: float, share: float) -> float:
        """Running time alone, seconds, at (batch, share)."""
        if not (math.isfinite(batch) and math.isfinite(share)):
            raise ValueError(f"LWR query must be finite, got batch {batch}, share {share}")
        _check_axes(np.array([batch]), np.array([share]))
        query = np.array([batch, share], dtype=float)
        q = np.log(query) if self.log_space else query
        for axis, name in ((0, "batch"), (1, "share")):
            profiled = self._mean[axis]
            if not self._active[axis] and not math.isclose(q[axis], profiled, rel_tol=1e-9):
                only = math.exp(profiled) if self.log_space else profiled
                raise ValueError(
                    f"the profile has the single {name} {only:g}; it cannot predict "
                    f"{name} {query[axis]:g}"
                )
        active = self._active
        z = (self._x[:, active] - self._mean[active]) / self._scale[active]
        zq = (q[active] - self._mean[active]) / self._scale[active]
        d2 = np.sum((z - zq) ** 2, axis=1)
        # Shifting by the nearest distance rescales all weights alike (the
        # weighted fit is unchanged) and keeps far queries from underflowing.
        weights = np.exp(-(d2 - d2.min()) / (2.0 * self.bandwidth**2))
        design = np.hstack([np.ones((len(z), 1)), z - zq])
        if np.count_nonzero(weights > _NEGLIGIBLE_WEIGHT) < design.shape[1]:
            raise ValueError(
                f"LWR bandwidth {self.bandwidth} is too small for the query (batch {batch:g}, "
                f"share {share:g}): fewer than {design.shape[1]} points carry weight"
            )
        root = np.sqrt(weights)[:, None]
        theta, _, rank, _ = np.linalg.lstsq(design * root, self._y * root[:, 0], rcond=None)
        if rank < design.shape[1]:
            raise ValueError(
                f"LWR local fit at (batch {batch:g}, share {share:g}) is not determined: "
                "the weighted points are collinear"
            )
        value = float(theta[0])  # the design is centred on the query
        seconds = math.exp(value) if self.log_space else value
        if not seconds > 0:
            raise ValueError(
                f"LWR predicts a non-positive running time ({seconds:.3g} s) at batch {batch:g}, "
                f"share {share:g}: the query is outside what the profile supports"
            )
        return seconds


def _check_axes(batches: np.ndarray, shares: np.ndarray) -> None:
    if np.any(batches < 1):
        raise ValueError(f"batch sizes must be ≥ 1, got {batches.min():g}")
    if np.any((shares <= 0) | (shares > 1)):
        bad = shares[(shares <= 0) | (shares > 1)][0]
        raise ValueError(f"shares must be fractions in (0, 1], got {bad:g}")
