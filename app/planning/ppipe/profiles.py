"""Block profiles: a model as a chain of blocks (ppipe.txt §5.2).

A model is pre-partitioned into N blocks of roughly equal runtime (N ≈ 10).
Each block has a latency per device class, share and batch size, and each
cut between consecutive blocks sends a tensor of known size to the next
stage. A partition is a range of blocks `[start, end)`; its latency at batch
size b is the sum of its blocks' latencies (the artifact's blockwise mode).

Shares are the artifact's vGPU sizes: `share` v means 1/v of a device (MPS
on a GPU; a slice of the cores on a CPU). v = 1 is a whole device.

On-disk layout (the PPipe artifact's, `data/ppipe/`):

* `block-timing/{model}-{class}-{v}.csv` — one row per block, one column per
  batch size from 1, latencies in µs;
* `cut-bytes/{model}.csv` — bytes sent at each of the N − 1 cuts, batch 1.

Everything here is in seconds and bytes, as elsewhere in the project.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_TIMING_NAME = re.compile(r"^(?P<model>.+)-(?P<cls>[A-Za-z0-9_]+)-(?P<share>[1-9][0-9]*)$")

#: The artifact's data, bundled (see data/ppipe/README.md).
BUNDLED_DIR = Path(__file__).resolve().parents[3] / "data" / "ppipe"


@dataclass(frozen=True)
class BlockProfile:
    """One model's blocks.

    `latency[(device_class, share)]` is an array of shape (blocks, max batch):
    entry [i, b − 1] is block i's latency in seconds at batch size b.
    `cut_bytes[i]` is the size of what crosses the cut after block i (between
    blocks i and i + 1) for one request."""

    model: str
    latency: Mapping[tuple[str, int], np.ndarray]
    cut_bytes: np.ndarray
    _cumulative: dict[tuple[str, int], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.latency:
            raise ValueError(f"model {self.model!r}: no block latencies")
        blocks = {table.shape[0] for table in self.latency.values()}
        if len(blocks) != 1:
            raise ValueError(f"model {self.model!r}: block counts differ across classes: {blocks}")
        (count,) = blocks
        if len(self.cut_bytes) != count - 1:
            raise ValueError(
                f"model {self.model!r}: {count} blocks need {count - 1} cut sizes, "
                f"got {len(self.cut_bytes)}"
            )
        for key, table in self.latency.items():
            if table.ndim != 2 or table.shape[1] < 1 or not np.all(table > 0):
                raise ValueError(f"model {self.model!r} on {key}: latencies must be > 0")
            # cumulative[b − 1, i] = latency of blocks [0, i) at batch b
            padded = np.zeros((table.shape[1], count + 1))
            padded[:, 1:] = np.cumsum(table.T, axis=1)
            self._cumulative[key] = padded

    @property
    def blocks(self) -> int:
        return len(self.cut_bytes) + 1

    @property
    def placements(self) -> list[tuple[str, int]]:
        """The (device class, share) pairs this model was profiled on."""
        return sorted(self.latency)

    def classes(self) -> list[str]:
        return sorted({cls for cls, _ in self.latency})

    def shares(self, device_class: str) -> list[int]:
        return sorted(share for cls, share in self.latency if cls == device_class)

    def max_batch(self, device_class: str, share: int = 1) -> int:
        return int(self._table(device_class, share).shape[1])

    def partition_latency(
        self, start: int, end: int, batch: int, device_class: str, share: int = 1
    ) -> float:
        """Seconds to run blocks [start, end) at `batch` on one (class, share)."""
        if not 0 <= start < end <= self.blocks:
            raise ValueError(f"model {self.model!r}: bad block range [{start}, {end})")
        cumulative = self._cumulative_for(device_class, share)
        if not 1 <= batch <= cumulative.shape[0]:
            raise ValueError(
                f"model {self.model!r} on {device_class}/{share}: batch {batch} outside "
                f"1..{cumulative.shape[0]}"
            )
        row = cumulative[batch - 1]
        return float(row[end] - row[start])

    def whole_latency(self, batch: int, device_class: str, share: int = 1) -> float:
        return self.partition_latency(0, self.blocks, batch, device_class, share)

    def transfer_bytes(self, cut_after: int, batch: int) -> float:
        """Bytes a batch sends at the cut after block `cut_after` (a range
        ending at `cut_after + 1` hands over to one starting there)."""
        return float(self.cut_bytes[cut_after]) * batch

    def _table(self, device_class: str, share: int) -> np.ndarray:
        table = self.latency.get((device_class, share))
        if table is None:
            raise KeyError(
                f"model {self.model!r} has no profile on {device_class} share 1/{share} "
                f"(profiled: {', '.join(f'{c}/{s}' for c, s in self.placements)})"
            )
        return table

    def _cumulative_for(self, device_class: str, share: int) -> np.ndarray:
        self._table(device_class, share)
        return self._cumulative[(device_class, share)]


def transfer_seconds(size_bytes: float, bandwidth_gbps: float) -> float:
    """Time to send `size_bytes` over a link of `bandwidth_gbps` (10⁹ bit/s)."""
    if not bandwidth_gbps > 0:
        raise ValueError(f"bandwidth must be > 0 Gbit/s, got {bandwidth_gbps}")
    return size_bytes * 8.0 / (bandwidth_gbps * 1e9)


def _read_rows(path: Path) -> list[list[float]]:
    with path.open(newline="") as handle:
        rows = [[float(cell) for cell in row] for row in csv.reader(handle) if row]
    if not rows:
        raise ValueError(f"{path}: empty")
    widths = {len(row) for row in rows}
    if len(widths) != 1:
        raise ValueError(f"{path}: rows of different lengths {sorted(widths)}")
    return rows


def load_profile(
    model: str, directory: Path = BUNDLED_DIR, classes: Iterable[str] | None = None
) -> BlockProfile:
    """Read one model's block timings (µs → s) and cut sizes from `directory`
    (the artifact's layout), for every class and share found, or only those
    in `classes`."""
    wanted = set(classes) if classes is not None else None
    timing_dir = directory / "block-timing"
    latency: dict[tuple[str, int], np.ndarray] = {}
    for path in sorted(timing_dir.glob(f"{model}-*.csv")):
        match = _TIMING_NAME.match(path.stem)
        if match is None or match["model"] != model:
            continue
        cls = match["cls"]
        if wanted is not None and cls not in wanted:
            continue
        latency[(cls, int(match["share"]))] = np.asarray(_read_rows(path)) * 1e-6
    if not latency:
        raise FileNotFoundError(
            f"no block timings for model {model!r} under {timing_dir}"
            + (f" on {sorted(wanted)}" if wanted else "")
        )
    cut_path = directory / "cut-bytes" / f"{model}.csv"
    if not cut_path.exists():
        raise FileNotFoundError(f"no cut sizes for model {model!r}: {cut_path} is missing")
    cuts = np.asarray([row[0] for row in _read_rows(cut_path)])
    if not np.all(np.isfinite(cuts)) or np.any(cuts < 0) or math.isnan(cuts.sum()):
        raise ValueError(f"{cut_path}: cut sizes must be finite and ≥ 0")
    return BlockProfile(model, latency, cuts)


def bundled_models(directory: Path = BUNDLED_DIR) -> list[str]:
    """The models of the paper's main evaluation (`model_list.txt`)."""
    return [
        line.strip()
        for line in (directory / "model_list.txt").read_text().splitlines()
        if line.strip()
    ]
