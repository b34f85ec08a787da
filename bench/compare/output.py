"""The comparison's outputs: results.json, the markdown table and the plots."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from app.workloads.spec import Workload
from bench.cli import sanitize
from bench.compare.measure import SystemResult
from bench.compare.setups import REPO_ROOT, Setup

# Peers the table gives a ratio column for, in this order, with their titles.
RATIO_PEERS = {"tritonserver": "Triton", "bentoml": "BentoML", "ray": "Ray Serve"}


def write_outputs(setup: Setup, workload: Workload, results: list[SystemResult], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "workload": str(setup.workload.relative_to(REPO_ROOT)),
        "repository": str(setup.repository.relative_to(REPO_ROOT)),
        "devices": setup.devices,
        "nominal_rps": workload.offered_rate(),
        "systems": [r.to_dict() for r in results],
    }
    (out / "results.json").write_text(json.dumps(sanitize(doc), indent=1) + "\n")
    table = markdown_table(results)
    (out / "summary.md").write_text(f"# {workload.name}\n\n{table}\n")
    plot(workload, results, out)
    return table


def markdown_table(results: Sequence[SystemResult]) -> str:
    """One row per system: capacity, its ratio to each peer present, the CDF
    run's load, p50 / p99, attainment and start-up time."""
    peers = [
        (title, r)
        for name, title in RATIO_PEERS.items()
        for r in results
        if r.system == name and r.capacity_rps > 0
    ]
    ratio_heads = "".join(f" vs {title} |" for title, _ in peers)
    lines = [
        f"| system | capacity r/s (≥ 99 % within SLO) |{ratio_heads} CDF run: offered r/s "
        "| p50 / p99 ms | within SLO | start-up s |",
        "|---|---|" + "---|" * len(peers) + "---|---|---|---|",
    ]
    for r in results:
        ratios = "".join(
            f" {r.capacity_rps / peer.capacity_rps:.2f}× |" if r is not peer else " — |"
            for _, peer in peers
        )
        overall = r.cdf_run["overall"]
        p50, p99 = overall.get("latency_p50_ms"), overall.get("latency_p99_ms")
        latency = f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "—"
        lines.append(
            f"| {r.label} | {r.capacity_rps:,.0f} ({r.capacity_status}) |{ratios}"
            f" {overall['offered_rps']:,.0f} | {latency} "
            f"| {overall['slo_attainment']:.2%} | {r.startup_s:.1f} |"
        )
    return "\n".join(lines)


def plot(workload: Workload, results: Sequence[SystemResult], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (goodput_ax, attain_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        offered = [p["offered_rps"] for p in r.probes]
        goodput_ax.plot(offered, [p["goodput_rps"] for p in r.probes], "o-", label=r.system)
        attain_ax.plot(offered, [100 * p["slo_attainment"] for p in r.probes], "o-", label=r.system)
    lim = max((p["offered_rps"] for r in results for p in r.probes), default=1.0)
    goodput_ax.plot([0, lim], [0, lim], ":", color="grey", lw=0.8)
    goodput_ax.set(xlabel="offered load (r/s)", ylabel="goodput (r/s)", title=workload.name)
    attain_ax.axhline(99, ls="--", color="grey", lw=0.8)
    attain_ax.set(xlabel="offered load (r/s)", ylabel="% within SLO", title="SLO attainment")
    for ax in (goodput_ax, attain_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "goodput.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in results:
        lat = r.latencies_ms
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size * 100, label=r.system)
    for slo in sorted({m.slo_ms for m in workload.models}):
        ax.axvline(slo, ls="--", color="grey", lw=0.8)
    loads = sorted({round(r.cdf_run["overall"]["offered_rps"]) for r in results})
    ax.set(
        xlabel="latency (ms)",
        ylabel="% of answered requests",
        title=f"latency CDF at {'/'.join(map(str, loads))} r/s (dashed: SLO)",
    )
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "cdf.png", dpi=110)
    plt.close(fig)
