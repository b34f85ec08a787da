"""Gpulet's measured utilisation and interference coefficients (bundled in
`data/gpulet/`, see its README), the data InSS's running-time interference
term builds on (inss.txt §4.1, "GPU Running Latency": L2 cache utilisation
as the measure of a model's demand on the shared cache).

* `{gpu}/UTIL.CSV` → `KernelProfile` per (model, batch): average duration,
  SM, L2 and DRAM utilisation, achieved and theoretical occupancy.
* `{gpu}/INT_MODEL_CONSTANT.CSV` → `InterferenceConstants`: Gpulet's linear
  slow-down model, `slowdown()` evaluating it as Gpulet's
  `interference_model::get_interference` does at profiled batch sizes.

Readings, each for a reason:

* Utilisations and occupancies are returned as fractions (the files' per
  cent / 100, as Gpulet's reader divides them).
* The duration column is read in the unit its header names (ms → s). The
  2080 Ti file's values are ~1000× the 3080's smaller, so they are likely
  seconds already; we do not guess a per-file unit (the README records it).
* Gpulet interpolates utilisation between the powers of two around an
  unprofiled batch size; `slowdown()` takes the utilisations the caller
  picked and leaves batch interpolation to it.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

#: The bundled copy (see data/gpulet/README.md).
BUNDLED_DIR = Path(__file__).resolve().parents[3] / "data" / "gpulet"

_UTIL_HEADER = (
    "bench",
    "batch",
    "avg_duration(ms)",
    "SM_util(%)",
    "l2_util(%)",
    "mem_util(%)",
    "achieved occupancy",
    "theoretical occupancy",
)
_CONSTANT_HEADER = ("l2_util_m1", "l2_util_m2", "dram_util_m1", "dram_util_m2", "constant")


@dataclass(frozen=True)
class KernelProfile:
    """One row of UTIL.CSV; fractions in [0, 1], duration in seconds."""

    model: str
    batch: int
    duration_s: float
    sm_util: float
    l2_util: float
    dram_util: float
    achieved_occupancy: float
    theoretical_occupancy: float


@dataclass(frozen=True)
class InterferenceConstants:
    """Gpulet's slow-down factor of model 1 beside model 2:
    constant + l2_self·l2₁ + l2_other·l2₂ + dram_self·dram₁ + dram_other·dram₂."""

    l2_self: float
    l2_other: float
    dram_self: float
    dram_other: float
    constant: float

    def slowdown(
        self, own: KernelProfile, own_share: float, other: KernelProfile, other_share: float
    ) -> float:
        """The factor by which `own` at `own_share` slows beside `other`
        (utilisations scaled by each one's share, as Gpulet's partitions)."""
        for share in (own_share, other_share):
            if not (math.isfinite(share) and 0 < share <= 1):
                raise ValueError(f"a share must be a fraction in (0, 1], got {share}")
        return (
            self.constant
            + self.l2_self * own.l2_util * own_share
            + self.l2_other * other.l2_util * other_share
            + self.dram_self * own.dram_util * own_share
            + self.dram_other * other.dram_util * other_share
        )


def gpus(directory: Path = BUNDLED_DIR) -> list[str]:
    """The GPUs with data under `directory` (`2080ti`, `3080` bundled)."""
    return sorted(p.parent.name for p in directory.glob("*/UTIL.CSV"))


def load_util(gpu: str, directory: Path = BUNDLED_DIR) -> dict[tuple[str, int], KernelProfile]:
    """UTIL.CSV of `gpu`, keyed by (model, batch), in file order."""
    path = _path(directory, gpu, "UTIL.CSV")
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or tuple(cell.strip() for cell in rows[0]) != _UTIL_HEADER:
        raise ValueError(f"{path}: expected the header {','.join(_UTIL_HEADER)}")
    profiles: dict[tuple[str, int], KernelProfile] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        cells = row[:-1] if row[-1] == "" else row  # each data row ends with a comma
        if len(cells) != len(_UTIL_HEADER):
            raise ValueError(
                f"{path}:{line}: expected {len(_UTIL_HEADER)} fields, got {len(cells)}"
            )
        try:
            batch = int(cells[1])
            values = [float(cell) for cell in cells[2:]]
        except ValueError as error:
            raise ValueError(f"{path}:{line}: {error}") from None
        if batch < 1 or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"{path}:{line}: batch must be ≥ 1 and values finite and ≥ 0")
        key = (cells[0].strip(), batch)
        if key in profiles:
            raise ValueError(f"{path}:{line}: {key[0]} at batch {batch} appears twice")
        duration_ms, *percents = values
        profiles[key] = KernelProfile(
            key[0], batch, duration_ms * 1e-3, *(p / 100.0 for p in percents)
        )
    if not profiles:
        raise ValueError(f"{path}: no data rows")
    return profiles


def load_interference_constants(gpu: str, directory: Path = BUNDLED_DIR) -> InterferenceConstants:
    """INT_MODEL_CONSTANT.CSV of `gpu`."""
    path = _path(directory, gpu, "INT_MODEL_CONSTANT.CSV")
    with path.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    if len(rows) != 2 or tuple(cell.strip() for cell in rows[0]) != _CONSTANT_HEADER:
        raise ValueError(f"{path}: expected the header {','.join(_CONSTANT_HEADER)} and one row")
    try:
        values = [float(cell) for cell in rows[1]]
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    if len(values) != 5 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{path}: expected 5 finite coefficients, got {rows[1]}")
    return InterferenceConstants(*values)


def _path(directory: Path, gpu: str, name: str) -> Path:
    path = directory / gpu / name
    if not path.exists():
        known = ", ".join(gpus(directory)) or "none"
        raise FileNotFoundError(f"no {name} for GPU {gpu!r} under {directory} (have: {known})")
    return path
