"""o_r(b, ρ) from measurements on real GPUs: a running time that saturates
where the device saturates (inss.txt §4.1, "GPU Running Latency"; issue:
InSS on real-device curves).

A batch that keeps only a fraction u(b) of a GPU's SMs busy when it runs
alone on the whole GPU loses nothing on a share ρ ≥ u(b), and on a smaller
share runs its work on ρ of the SMs (a roofline in the share):

    o_r(b, ρ) = t₁(b) · max(1, u(b) / ρ)

t₁(b) is the measured time on the whole device. The linear model of the
paper's setting ((α·b + β)/ρ, problem.py) is the case u = 1: there a share
never runs anything at full speed, so spatial sharing can never beat
running the models in turn; here a small model at a small batch (a tight
SLO) leaves most of the GPU to its co-runners — the case InSS is for
(inss.txt Table 3: MnasNet at batch 4 runs 4.24 ms at 24 %, 3.47 at 42 %,
3.41 at 60 %: saturated from ~40 %).

Two sources, both bundled in `data/` with their source lines:

* **Gpulet** (`data/gpulet/{gpu}/UTIL.CSV`, `from_gpulet`): per model and
  batch, the whole-GPU duration t₁(b) and the SM utilisation, read as u(b).
  No share was measured there; the roofline is the reading. For MnasNet at
  batch 4 on the 3080 (u = 0.28) it predicts 1.17× at a 24 % share and
  1.00× at 42 % and 60 %, against Table 3's 1.24×, 1.02× and 1.00×.
* **PPipe** (`data/ppipe/block-timing`, `from_ppipe`): the blocks' times
  summed, on a whole GPU (v = 1, batches 1–8) and under MPS at ½, ⅓ and ¼
  of it (batches 1–4, 1–2, 1–2). u(b) is fitted per batch to the shares
  measured there (least squares in log time, `fit_used_fraction`), and held
  from the largest such batch on. Fitted on the ½ shares alone, it
  predicts the ⅓ and ¼ shares of the paper's 18 main DNNs with a median
  error of 6.5 % (L4), 7.9 % (T4) and 4.4 % (V100), against 8.4 %, 7.9 %
  and 17 % for 1/ρ (`python -m bench.inss_curves`): these large DNNs fill
  a GPU already at batch 1 (median u 1.00 on L4 and T4, 0.91 on V100). A GPU
  with no share measured (P4) gets u = 1, the linear case.

Between measured batch sizes t₁ and u are linear in b; beyond the largest,
t₁ grows along its last segment and u stays at its last value; below
batch 1 both stay at batch 1's.

Readings, each for a reason:

* t₁ and u are made non-decreasing in b (running maxima) where the data
  fall (Gpulet's LeNet: 6.34 ms at batch 24, 6.10 at 28): a larger batch
  can always run as a smaller one padded, and the scheduler's profiles
  must not fall with b (app/scheduling/profile.py);
* SM utilisation is an average over the run: a kernel may need more SMs
  than the average for a while, so on a share just above u(b) a batch may
  run slightly slower than alone. The roofline ignores that (the Table 3
  check above is its size: 1.17× against 1.24×);
* Gpulet's duration column: the 3080's is in the header's unit (ms); the
  2080 Ti's values are ~1000× smaller, likely seconds (data/gpulet/
  README.md), so `from_gpulet` takes the unit as an argument, the
  header's by default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.planning.inss import gpulet_data
from app.planning.ppipe import profiles as ppipe_profiles

#: u(b) is searched on this grid of device fractions.
_USED_GRID = np.linspace(0.01, 1.0, 100)


@dataclass(frozen=True)
class MeasuredRunningTime:
    """o_r(b, ρ) = t₁(b)·max(1, u(b)/ρ) seconds from measured points
    (module docstring); `batches` ascending, `whole_s` and `used` beside it."""

    batches: tuple[int, ...]
    whole_s: tuple[float, ...]
    used: tuple[float, ...]
    source: str = ""

    @classmethod
    def monotone(
        cls,
        batches: tuple[int, ...],
        whole_s: Sequence[float],
        used: Sequence[float],
        source: str = "",
    ) -> MeasuredRunningTime:
        """The curve with t₁ and u made non-decreasing in b (module docstring)."""
        return cls(
            batches,
            tuple(float(t) for t in np.maximum.accumulate(np.asarray(whole_s, dtype=float))),
            tuple(float(u) for u in np.maximum.accumulate(np.asarray(used, dtype=float))),
            source,
        )

    def __post_init__(self) -> None:
        where = self.source or "measured running time"
        if not self.batches or len(self.whole_s) != len(self.batches):
            raise ValueError(f"{where}: needs one time per batch size")
        if len(self.used) != len(self.batches):
            raise ValueError(f"{where}: needs one used fraction per batch size")
        if any(b < 1 for b in self.batches) or list(self.batches) != sorted(set(self.batches)):
            raise ValueError(f"{where}: batch sizes must be ≥ 1, distinct and ascending")
        if not all(math.isfinite(t) and t > 0 for t in self.whole_s):
            raise ValueError(f"{where}: times must be finite and > 0")
        if not all(0 < u <= 1 for u in self.used):
            raise ValueError(f"{where}: used fractions must be in (0, 1]")

    def whole(self, batch: float) -> float:
        """t₁(b): the time on the whole device."""
        if len(self.batches) == 1 or batch <= self.batches[-1]:
            return float(np.interp(batch, self.batches, self.whole_s))
        slope = (self.whole_s[-1] - self.whole_s[-2]) / (self.batches[-1] - self.batches[-2])
        return self.whole_s[-1] + max(slope, 0.0) * (batch - self.batches[-1])

    def used_fraction(self, batch: float) -> float:
        """u(b): the share above which a larger one gains nothing."""
        return float(np.interp(batch, self.batches, self.used))

    def predict(self, batch: float, share: float) -> float:
        return self.whole(batch) * max(1.0, self.used_fraction(batch) / share)


def fit_used_fraction(whole_s: float, measured: Sequence[tuple[float, float]]) -> float:
    """u minimising Σ (log t − log(t₁·max(1, u/ρ)))² over (ρ, t) measured on
    shares ρ < 1 (a grid of 1 % steps)."""
    if not measured:
        raise ValueError("fitting u needs at least one share below the whole device")
    shares = np.array([share for share, _ in measured])
    times = np.log([t for _, t in measured])
    predicted = np.log(whole_s) + np.log(np.maximum(1.0, _USED_GRID[:, None] / shares[None, :]))
    errors = ((predicted - times[None, :]) ** 2).sum(axis=1)
    return float(_USED_GRID[int(np.argmin(errors))])


def from_gpulet(
    model: str,
    gpu: str,
    directory: Path = gpulet_data.BUNDLED_DIR,
    duration_unit_s: float = 1e-3,
) -> MeasuredRunningTime:
    """Gpulet's whole-GPU durations and SM utilisation of `model` on `gpu`;
    `duration_unit_s`: seconds per unit of the duration column (the
    header's ms by default)."""
    rows = gpulet_data.load_util(gpu, directory)
    points = sorted((batch, p) for (name, batch), p in rows.items() if name == model)
    if not points:
        known = sorted({name for name, _ in rows})
        raise KeyError(f"no Gpulet data for model {model!r} on {gpu} (have: {', '.join(known)})")
    scale = duration_unit_s / 1e-3  # load_util read the column as ms
    return MeasuredRunningTime.monotone(
        tuple(batch for batch, _ in points),
        tuple(p.duration_s * scale for _, p in points),
        tuple(min(1.0, max(p.sm_util, 0.01)) for _, p in points),
        f"gpulet {gpu} {model}",
    )


def from_ppipe(
    model: str, gpu: str, directory: Path = ppipe_profiles.BUNDLED_DIR
) -> MeasuredRunningTime:
    """PPipe's whole-model times of `model` on `gpu` (its blocks summed), u
    fitted per batch to its MPS shares (module docstring)."""
    profile = ppipe_profiles.load_profile(model, directory, classes=[gpu])
    shares = profile.shares(gpu)
    if 1 not in shares:
        raise KeyError(f"PPipe data for {model!r} on {gpu} has no whole-GPU timings")
    batches = tuple(range(1, profile.max_batch(gpu, 1) + 1))
    whole = tuple(profile.whole_latency(b, gpu, 1) for b in batches)
    used: list[float] = []
    for batch, t1 in zip(batches, whole, strict=True):
        measured = [
            (1.0 / v, profile.whole_latency(batch, gpu, v))
            for v in shares
            if v > 1 and batch <= profile.max_batch(gpu, v)
        ]
        used.append(fit_used_fraction(t1, measured) if measured else used[-1] if used else 1.0)
    return MeasuredRunningTime.monotone(batches, whole, used, f"ppipe {gpu} {model}")
