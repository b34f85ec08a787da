"""Folded-trace arrivals: how the PPipe artifact plays its "Bursty" workload,
the Azure Functions invocation trace of 2021 (MAF-2021), at a target rate.

The artifact (JonnyKong/PPipe at 03cd8df,
cluster-sim/src/main/java/edu/purdue/dsnl/clustersim/TraceRequestGenerator.java,
`loadArrivalTimesFromTrace`, `scaleTrace`, `getNextInterarrival`; used by
scripts/run_sim_in_batch.py for `multi_dnn_maf21`, with the plans of
data/plans/maf21, workload weights 0.39/0.26/0.35) takes every invocation's
start (`end_timestamp - duration`) over the whole two-week trace, sorts them,
cuts the trace into segments of (n - 1) / rate seconds — n invocations, so
the segments laid on top of each other (t mod segment) run at `rate` — and
replays the gaps between the folded, sorted times from the start, wrapping
around. A 30-s run at 1,000 requests/s thus sees about 600 windows of the
trace, each ~33 minutes apart, superposed.

What that does to burstiness: counts in a window of length Δ of the folded
process sum the counts of ~600 far-apart windows of the trace, so their index
of dispersion (variance / mean) is the trace's own at scale Δ, and the
minute-scale swings of the trace's rate average out: only what the trace does
within Δ (invocations that start together) survives. `burstiness` measures
both statistics.

The trace itself (305 MB, a Git LFS object of the artifact) is not bundled.
`read_invocation_trace` reads it where a user has it (the dataset's CSV:
app, func, end_timestamp, duration); otherwise `synthetic_trace` builds a
two-week trace from the statistics published about it (`MAF21`, sources in
its comments): its size and span, and its per-30-s rate variation.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TraceStatistics:
    """What a synthetic stand-in for a per-request trace reproduces."""

    span_s: float  # first to last invocation
    invocations: int
    interval_s: float  # the interval whose rate varies
    interval_cv: float  # coefficient of variation of the per-interval rate

    @property
    def mean_rate(self) -> float:
        return self.invocations / self.span_s


# MAF-2021 (Azure Functions Invocation Trace 2021, Zhang et al., SOSP'21;
# Azure/AzurePublicDataset AzureFunctionsInvocationTrace2021.md: "two weeks
# starting on 2021-01-31"). Its size and its rate variation as characterised
# from the full trace in a public benchmark (github.com, scalerl
# benchmarks/v1/README.md, "Azure workloads", validated 2026-09-24):
# 1,980,951 invocations with timestamps spanning 0-1,209,600 s; six one-hour
# windows at 30-s intervals with per-interval rate CVs 0.174, 0.668, 0.676,
# 0.801, 0.553, 0.600 (median 0.634) and peak/mean 2.1-4.8.
MAF21 = TraceStatistics(
    span_s=1_209_600.0, invocations=1_980_951, interval_s=30.0, interval_cv=0.634
)


def synthetic_trace(stats: TraceStatistics, seed: int = 0) -> np.ndarray:
    """Sorted invocation start times over [0, span): the per-interval rate
    Gamma-distributed, independent between intervals, Poisson within an
    interval (uniform given its count), so that the per-interval counts have
    the declared mean and CV (the rate's CV² is the declared one less the
    Poisson part, 1 / expected count)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 21]))
    intervals = round(stats.span_s / stats.interval_s)
    rate_cv2 = stats.interval_cv**2 - 1.0 / (stats.mean_rate * stats.interval_s)
    if not rate_cv2 > 0.0:
        raise ValueError(f"interval CV {stats.interval_cv} is below Poisson's at this rate")
    shape = 1.0 / rate_cv2
    rates = rng.gamma(shape, stats.mean_rate / shape, intervals)
    counts = rng.poisson(rates * stats.interval_s)
    starts = np.arange(intervals, dtype=np.float64) * stats.interval_s
    times = np.repeat(starts, counts) + rng.random(int(counts.sum())) * stats.interval_s
    times.sort()
    return times


def read_invocation_trace(path: Path) -> np.ndarray:
    """Sorted invocation starts (end_timestamp - duration, seconds) of a
    trace in the MAF-2021 CSV layout."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"end_timestamp", "duration"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: no column {sorted(missing)} (MAF-2021 layout)")
        starts = [float(r["end_timestamp"]) - float(r["duration"]) for r in reader]
    if len(starts) < 2:
        raise ValueError(f"{path}: a trace needs at least two invocations")
    return np.sort(np.asarray(starts))


def fold(starts: np.ndarray, rate: float, duration_s: float) -> np.ndarray:
    """Arrival times in [0, duration_s) at `rate` requests/s from the sorted
    trace `starts`, the artifact's way (module docstring): fold at
    (n - 1) / rate seconds, replay the gaps from the first folded time."""
    if not rate > 0.0:
        raise ValueError(f"rate must be > 0 requests/s, got {rate}")
    n = len(starts)
    if n < 2:
        raise ValueError("a trace needs at least two invocations")
    segment = (n - 1) / rate
    folded = np.mod(starts, segment)
    if duration_s < segment:
        # Only the first duration_s after the earliest folded time is replayed.
        folded = folded[folded < folded.min() + duration_s]
    folded.sort()
    gaps = np.diff(folded, append=folded[0] + segment)  # wraps around, as the artifact's
    laps = int(np.ceil(duration_s / segment)) + 1
    times = np.cumsum(np.tile(gaps, laps))
    times = np.concatenate(([0.0], times[:-1]))
    return times[times < duration_s]


def burstiness(times: np.ndarray, window_s: float, duration_s: float) -> tuple[float, float]:
    """(index of dispersion of counts in windows of `window_s`, coefficient
    of variation of the inter-arrival times) of arrivals in [0, duration_s).
    Poisson gives (1, 1)."""
    bins = int(duration_s / window_s)
    counts = np.bincount((times // window_s).astype(np.int64), minlength=bins)[:bins]
    gaps = np.diff(times)
    return float(counts.var() / counts.mean()), float(gaps.std() / gaps.mean())
