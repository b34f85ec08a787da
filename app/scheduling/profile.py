"""Latency profiles ℓ(b): how long a batch of b requests runs on a device."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyProfile:
    """ℓ(b) in seconds for b = 1..max_batch, precomputed into a table.

    Built from a linear model ℓ(b) = α·b + β (symphony.txt §4.3) or from a
    measured per-batch-size table; between table points the latency is
    interpolated linearly, which keeps it monotone when the points are.
    """

    latency_by_size: tuple[float, ...]  # index b → ℓ(b); index 0 is 0.0
    alpha: float | None = None
    beta: float | None = None

    def __post_init__(self) -> None:
        # The policies bisect this table (max_batch_within) and test a batch
        # against it: on a table that falls somewhere the two disagree, and a
        # drop timer can re-arm one float later forever.
        table = self.latency_by_size
        for b in range(2, len(table)):
            if table[b] < table[b - 1]:
                raise ValueError(
                    "latency table must not decrease with batch size: "
                    f"ℓ({b - 1})={table[b - 1] * 1e3:g} ms > ℓ({b})={table[b] * 1e3:g} ms"
                )

    @classmethod
    def linear(cls, alpha_ms: float, beta_ms: float, max_batch: int) -> LatencyProfile:
        if alpha_ms < 0 or beta_ms < 0:
            raise ValueError(f"alpha_ms and beta_ms must be ≥ 0, got {alpha_ms}, {beta_ms}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
        table = [0.0] + [(alpha_ms * b + beta_ms) / 1000.0 for b in range(1, max_batch + 1)]
        return cls(tuple(table), alpha=alpha_ms / 1000.0, beta=beta_ms / 1000.0)

    @classmethod
    def from_table(cls, latency_ms: Mapping[int, float], max_batch: int) -> LatencyProfile:
        """Interpolate measured points; beyond the last point extrapolate with
        the last segment's slope. Points must be non-decreasing in latency."""
        if not latency_ms:
            raise ValueError("latency table is empty")
        points = sorted((int(b), float(ms)) for b, ms in latency_ms.items())
        sizes = [b for b, _ in points]
        values = [ms for _, ms in points]
        if sizes[0] < 1:
            raise ValueError(f"batch sizes in a latency table must be ≥ 1, got {sizes[0]}")
        for (b0, v0), (b1, v1) in itertools.pairwise(points):
            if v1 < v0:
                raise ValueError(
                    "latency table must not decrease with batch size: "
                    f"ℓ({b0})={v0} ms > ℓ({b1})={v1} ms"
                )
        table = [0.0]
        for b in range(1, max_batch + 1):
            table.append(_interpolate(sizes, values, b) / 1000.0)
        alpha, beta = _least_squares(sizes, values)
        return cls(tuple(table), alpha=alpha / 1000.0, beta=beta / 1000.0)

    @property
    def max_batch(self) -> int:
        return len(self.latency_by_size) - 1

    def latency(self, batch_size: int) -> float:
        """ℓ(b) in seconds; b above max_batch is clamped (callers cap sizes)."""
        table = self.latency_by_size
        if batch_size >= len(table):
            return table[-1]
        return table[batch_size]

    def scaled(self, factor: float) -> LatencyProfile:
        """ℓ(b) × `factor` for every b (a slower or faster device)."""
        if not (factor > 0 and factor < float("inf")):
            raise ValueError(f"a profile's scale factor is finite and > 0, got {factor}")
        alpha = None if self.alpha is None else self.alpha * factor
        beta = None if self.beta is None else self.beta * factor
        return LatencyProfile(tuple(t * factor for t in self.latency_by_size), alpha, beta)

    def max_batch_within(self, budget_s: float) -> int:
        """Largest b ≤ max_batch with ℓ(b) ≤ budget_s (0 if even b = 1 is too slow)."""
        # table[1:] is non-decreasing; bisect on the whole table and subtract
        # index 0 (which is 0.0 ≤ any non-negative budget).
        if budget_s < 0:
            return 0
        return bisect.bisect_right(self.latency_by_size, budget_s) - 1

    @property
    def batching_gain(self) -> float:
        """β/α of the linear fit: how much batching amortises (Symphony Table 5)."""
        if not self.alpha:
            return float("inf")
        return (self.beta or 0.0) / self.alpha


def _interpolate(sizes: list[int], values: list[float], b: int) -> float:
    if len(sizes) == 1:
        # One point: assume latency proportional to batch size beyond it.
        return values[0] * max(b, sizes[0]) / sizes[0] if b > sizes[0] else values[0]
    i = bisect.bisect_left(sizes, b)
    if i < len(sizes) and sizes[i] == b:
        return values[i]
    if i == 0:
        lo, hi = 0, 1
    elif i == len(sizes):
        lo, hi = len(sizes) - 2, len(sizes) - 1
    else:
        lo, hi = i - 1, i
    slope = (values[hi] - values[lo]) / (sizes[hi] - sizes[lo])
    value = values[lo] + slope * (b - sizes[lo])
    return max(value, 0.0) if i else min(max(value, 0.0), values[0])


def _least_squares(sizes: list[int], values: list[float]) -> tuple[float, float]:
    if len(sizes) == 1:
        return values[0] / sizes[0], 0.0
    n = len(sizes)
    mean_b = sum(sizes) / n
    mean_v = sum(values) / n
    var = sum((b - mean_b) ** 2 for b in sizes)
    cov = sum((b - mean_b) * (v - mean_v) for b, v in zip(sizes, values, strict=False))
    alpha = cov / var if var else 0.0
    return alpha, mean_v - alpha * mean_b
