"""Capacity: the highest offered load a policy serves with ≥ 99 % within SLO.

This is Symphony's goodput definition (symphony.txt §5: "the highest offered
load with at least 99 % of requests within SLO"). `find_capacity` searches the
rate scale — the multiplier on every arrival rate of a workload — by
bisection:

1. probe `hi`; while it passes, move `lo` up to it and double `hi` (up to
   `max_scale`);
2. probe `lo`; while it fails, move `hi` down to it and halve `lo` (down to
   `min_scale`);
3. bisect the bracket [lo passes, hi fails] until (hi − lo) / lo ≤ `rel_tol`.

`lo` is always the highest passing scale probed, so the answer is the best
passing probe. Attainment is not strictly monotone in the rate (a different
rate draws different arrivals), so the result is *a* pass/fail boundary
within `rel_tol`, as a load sweep in a paper finds it.

Determinism is the caller's `run`: the simulator regenerates arrivals from the
workload's seed at each scale, so the same workload and policy give the same
probes and the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from app.simulation.run import SimResult

# How the search ended.
CONVERGED = "converged"  # bracket narrower than rel_tol
MAX_RUNS = "max_runs"  # out of probes; the best passing scale so far
ABOVE_MAX = "above_max_scale"  # still passing at max_scale: capacity is at least this
BELOW_MIN = "below_min_scale"  # failing even at min_scale: capacity 0


@dataclass(frozen=True)
class CapacityProbe:
    scale: float
    offered_rps: float
    goodput_rps: float
    attainment: float
    passed: bool


@dataclass
class CapacityResult:
    capacity_rps: float  # offered_rps of the best passing probe; 0.0 if none passed
    rate_scale: float | None  # its rate scale; None if none passed
    target: float
    status: str  # CONVERGED, MAX_RUNS, ABOVE_MAX or BELOW_MIN
    probes: list[CapacityProbe] = field(default_factory=list)  # in the order run

    @property
    def best(self) -> CapacityProbe | None:
        passing = [p for p in self.probes if p.passed and p.scale == self.rate_scale]
        return passing[0] if passing else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity_rps": self.capacity_rps,
            "rate_scale": self.rate_scale,
            "target": self.target,
            "status": self.status,
            "probes": [asdict(p) for p in self.probes],
        }


def find_capacity(
    run: Callable[[float], SimResult],
    *,
    target: float = 0.99,
    lo: float = 0.5,
    hi: float = 1.0,
    rel_tol: float = 0.01,
    max_runs: int = 30,
    min_scale: float = 1.0 / 1024,
    max_scale: float = 1024.0,
) -> CapacityResult:
    """Highest rate scale whose run has overall SLO attainment ≥ `target`.

    `run(scale)` simulates the workload at that rate scale (same seed for
    every scale). `lo`/`hi` are the initial bracket guesses; they are widened
    as needed within [`min_scale`, `max_scale`]. At most `max_runs` distinct
    scales are simulated (each scale is run once; repeats come from a cache).
    """
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    if not (0.0 < min_scale <= lo <= hi <= max_scale) or not math.isfinite(max_scale):
        raise ValueError(
            f"need 0 < min_scale ≤ lo ≤ hi ≤ max_scale, got "
            f"min_scale={min_scale}, lo={lo}, hi={hi}, max_scale={max_scale}"
        )
    if not rel_tol > 0.0:
        raise ValueError(f"rel_tol must be > 0, got {rel_tol}")
    if max_runs < 1:
        raise ValueError(f"max_runs must be ≥ 1, got {max_runs}")

    probes: list[CapacityProbe] = []
    cache: dict[float, CapacityProbe] = {}

    class _OutOfRuns(Exception):
        pass

    def probe(scale: float) -> bool:
        if scale in cache:
            return cache[scale].passed
        if len(probes) >= max_runs:
            raise _OutOfRuns
        result = run(scale)
        overall = result.summary["overall"]
        attainment = float(overall["slo_attainment"])
        p = CapacityProbe(
            scale=scale,
            offered_rps=float(overall["offered_rps"]),
            goodput_rps=float(overall["goodput_rps"]),
            attainment=attainment,
            passed=attainment >= target,
        )
        cache[scale] = p
        probes.append(p)
        return p.passed

    best: float | None = None  # highest passing scale
    status = CONVERGED
    try:
        # Expand upwards until hi fails.
        while probe(hi):
            best = hi
            if hi >= max_scale:
                status = ABOVE_MAX
                break
            lo, hi = hi, min(hi * 2.0, max_scale)
        if status == CONVERGED and best is None:
            # hi fails; shrink downwards until lo passes.
            while not probe(lo):
                hi = lo
                if lo <= min_scale:
                    status = BELOW_MIN
                    break
                lo = max(lo / 2.0, min_scale)
            else:
                best = lo
        if status == CONVERGED:
            assert best is not None
            lo = best
            while (hi - lo) / lo > rel_tol:
                mid = 0.5 * (lo + hi)
                if probe(mid):
                    lo = best = mid
                else:
                    hi = mid
    except _OutOfRuns:
        status = MAX_RUNS

    if best is None:
        return CapacityResult(0.0, None, target, status, probes)
    return CapacityResult(cache[best].offered_rps, best, target, status, probes)
