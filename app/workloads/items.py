"""Request sizes in a workload: how many items (batch dimension) each request carries.

A model's `items:` (or the top-level default) is either one integer — every
request has that many items — or a mapping from item counts to their
probabilities, e.g. ``{1: 0.7, 4: 0.3}``. Counts are integers from 1 to the
model's `max_batch` (a request is never split, so a larger one could never
run); probabilities are ≥ 0 and sum to 1. Absent, every request has one item.

Rates (`rate`, `total_rate`, the arrival processes) stay in requests/s; the
core plans with items/s, the rate times the mean items (`ItemSizes.mean`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.config_fields import FieldReader

_SUM_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ItemSizes:
    """A distribution of request sizes: `sizes[i]` items with `weights[i]`."""

    sizes: tuple[int, ...] = (1,)
    weights: tuple[float, ...] = (1.0,)

    @property
    def mean(self) -> float:
        return float(sum(s * w for s, w in zip(self.sizes, self.weights, strict=True)))

    @property
    def largest(self) -> int:
        return max(self.sizes)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Items of `n` requests (int32); no draws at all for a single size."""
        if len(self.sizes) == 1:
            return np.full(n, self.sizes[0], dtype=np.int32)
        return rng.choice(np.array(self.sizes, dtype=np.int32), size=n, p=self.weights)


ONE_ITEM = ItemSizes()


def parse_items(ctx: FieldReader, raw: Any, where: str) -> ItemSizes:
    """`items:` as the module docstring describes it (not yet checked against
    a model's max_batch: `check_items`)."""
    if isinstance(raw, bool):
        ctx.fail(where, f"must be an item count or a mapping {{count: probability}}, got {raw!r}")
    if isinstance(raw, int):
        if raw < 1:
            ctx.fail(where, f"an item count must be ≥ 1, got {raw}")
        return ItemSizes((raw,), (1.0,))
    if not isinstance(raw, Mapping) or not raw:
        ctx.fail(
            where,
            f"must be an item count (e.g. 4) or a mapping {{count: probability}} "
            f"(e.g. {{1: 0.7, 4: 0.3}}), got {raw!r}",
        )
    sizes: list[int] = []
    weights: list[float] = []
    for key, value in sorted(raw.items(), key=lambda kv: str(kv[0])):
        count = key
        if isinstance(count, str) and count.strip().isdigit():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            ctx.fail(where, f"item counts must be integers ≥ 1, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            ctx.fail(f"{where}[{count}]", f"must be a probability, got {value!r}")
        if not (math.isfinite(value) and value >= 0):
            ctx.fail(f"{where}[{count}]", f"must be a probability ≥ 0, got {value}")
        sizes.append(count)
        weights.append(float(value))
    total = sum(weights)
    if abs(total - 1.0) > _SUM_TOLERANCE:
        ctx.fail(where, f"probabilities must sum to 1, got {total:g}")
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    kept = [i for i in order if weights[i] > 0]
    if not kept:
        ctx.fail(where, "needs an item count with probability > 0")
    # Normalised exactly, as numpy's choice requires.
    norm = sum(weights[i] for i in kept)
    return ItemSizes(tuple(sizes[i] for i in kept), tuple(weights[i] / norm for i in kept))


def check_items(ctx: FieldReader, items: ItemSizes, where: str, max_batch: int) -> None:
    if items.largest > max_batch:
        ctx.fail(
            where,
            f"requests of {items.largest} items exceed max_batch {max_batch}: "
            "a request is never split, so it could never run",
        )
