"""The `--plot` picture of a live run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from app.results import Outcome
from app.simulation.capacity_search import CapacityResult
from bench.loadgen.results import LiveResult


def plot_run(
    result: LiveResult,
    out: Path,
    capacity: CapacityResult | None = None,
    target: float = 0.99,
) -> None:
    """Latency CDF per model, a per-second timeline of outcomes, the send lag
    over the run, and (with --capacity) the probes' attainment vs offered load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = result.records
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    cdf, timeline, lag_ax, cap_ax = axes.ravel()
    for k, name in enumerate(result.model_names):
        lat = rec.latency_ms[(rec.model_index == k) & (rec.status == 200)]
        lat = np.sort(lat[~np.isnan(lat)])
        if lat.size:
            (line,) = cdf.plot(lat, np.arange(1, lat.size + 1) / lat.size * 100, label=name)
            cdf.axvline(result.slo_ms[k], ls="--", lw=0.8, color=line.get_color())
    cdf.set_xlabel("latency from intended send (ms)")
    cdf.set_ylabel("% of answered requests")
    cdf.set_title("latency CDF (dashed: SLO)")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize="small")

    outcome = rec.outcomes(np.asarray(result.slo_ms))
    bins = np.arange(0.0, math.ceil(result.duration_s) + 1.0)
    second = np.clip(rec.intended, 0, bins[-1] - 1e-9)
    for code in (Outcome.GOOD, Outcome.LATE, Outcome.DROPPED, Outcome.ERROR):
        counts, _ = np.histogram(second[outcome == code], bins)
        if counts.any() or code == Outcome.GOOD:
            timeline.stairs(counts, bins, label=code.name.lower())
    offered, _ = np.histogram(second, bins)
    timeline.stairs(offered, bins, color="grey", ls=":", label="offered")
    timeline.set_xlabel("intended send time (s)")
    timeline.set_ylabel("requests per second")
    timeline.set_title("outcomes over the run")
    timeline.grid(alpha=0.3)
    timeline.legend(fontsize="small")

    lag = rec.send_lag_ms
    ok = ~np.isnan(lag)
    lag_ax.plot(rec.intended[ok], lag[ok], ",", alpha=0.5)
    lag_ax.axhline(result.generator["lag_threshold_ms"], ls="--", color="red", lw=0.8)
    lag_ax.set_xlabel("intended send time (s)")
    lag_ax.set_ylabel("send lag (ms)")
    lag_ax.set_title(
        f"generator send lag: p99 {result.generator['send_lag_p99_ms'] or 0:.2f} ms"
        + (" (fell behind)" if result.fell_behind else "")
    )
    lag_ax.grid(alpha=0.3)

    if capacity is not None and capacity.probes:
        probes = sorted(capacity.probes, key=lambda p: p.offered_rps)
        cap_ax.plot(
            [p.offered_rps for p in probes], [100 * p.attainment for p in probes], marker="o"
        )
        cap_ax.axhline(100 * target, ls="--", color="red", lw=0.8)
        if capacity.capacity_rps:
            cap_ax.axvline(capacity.capacity_rps, ls=":", color="green", lw=0.8)
        cap_ax.set_xlabel("offered load (req/s)")
        cap_ax.set_ylabel("requests within SLO (%)")
        cap_ax.set_title(f"capacity probes: {capacity.capacity_rps:,.1f} req/s")
        cap_ax.grid(alpha=0.3)
    else:
        cap_ax.axis("off")
    o = result.summary["overall"]
    fig.suptitle(
        f"{result.workload} → {result.url}: offered {o['offered_rps']:,.1f} req/s, "
        f"goodput {o['goodput_rps']:,.1f} req/s ({100 * o['slo_attainment']:.2f} % within SLO)"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
