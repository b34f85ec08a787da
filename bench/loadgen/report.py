"""What a run reports: the `--json` document (bench/loadgen_schema.json; its
`overall` and `models` entries carry the simulator's metrics,
bench/simulate_schema.json), or a rich table on stdout, a warning when the
generator fell behind, and the plot (`--plot`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from app.simulation.capacity_search import CapacityResult
from app.workloads.spec import Workload
from bench import cli
from bench.cli import sanitize
from bench.loadgen.plot import plot_run
from bench.loadgen.results import TIMING_PARTS, LiveResult


def build_document(
    workload: Workload,
    path: str | Path,
    result: LiveResult,
    capacity: CapacityResult | None = None,
    probes: dict[float, LiveResult] | None = None,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `--json` document (bench/loadgen_schema.json)."""
    doc: dict[str, Any] = {"workload": cli.workload_info(workload, path)}
    if server:
        doc["server"] = server
    doc.update(result.to_dict())
    if capacity is not None:
        probes = probes or {}
        doc["capacity_target"] = capacity.target
        doc["capacity_rps"] = capacity.capacity_rps
        doc["capacity_rate_scale"] = capacity.rate_scale
        doc["capacity_status"] = capacity.status
        doc["capacity_probes"] = [
            {
                **dataclasses.asdict(p),
                "duration_s": probes[p.scale].duration_s if p.scale in probes else None,
                "send_lag_p99_ms": (
                    probes[p.scale].generator["send_lag_p99_ms"] if p.scale in probes else None
                ),
                "fell_behind": probes[p.scale].fell_behind if p.scale in probes else None,
            }
            for p in capacity.probes
        ]
    return sanitize(doc)


def report_run(
    args: argparse.Namespace,
    err: Any,
    workload: Workload,
    path: Path,
    result: LiveResult,
    capacity: CapacityResult | None,
    probes: dict[float, LiveResult] | None,
    server: dict[str, Any] | None,
) -> None:
    """Warn if the generator fell behind; write the plot (--plot) and the
    JSON document (--json) or the table."""
    if result.fell_behind:
        g = result.generator
        err.print(
            f"[yellow]warning:[/] the generator fell behind: {100 * g['behind_fraction']:.2f} % "
            f"of sends over {g['lag_threshold_ms']:g} ms late (p99 {g['send_lag_p99_ms']:.2f} ms, "
            f"max {g['send_lag_max_ms']:.2f} ms): latencies include the generator's delay "
            "(busy machine? simultaneous bursts? more --workers on a bigger machine)",
            highlight=False,
        )
    doc = build_document(workload, path, result, capacity, probes, server)
    if args.plot:
        plot_run(result, Path(args.plot), capacity, args.target)
        err.print(f"wrote {args.plot}", highlight=False)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    else:
        print_table(doc)


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console(width=None if sys.stdout.isatty() else 200)
    w = doc["workload"]
    table = Table(
        title=f"{w['name']} → {doc['url']}: {doc['duration_s']:g} s, rate ×{doc['rate_scale']:g}",
        title_justify="left",
    )
    cols = ["", "requests", "offered", "goodput", "attain", "drop", "late", "error"]
    cols += ["p50 ms", "p99 ms", "p99.9 ms", "mean batch"]
    for c in cols:
        table.add_column(c, justify="left" if not c else "right", no_wrap=True)

    def row(label: str, m: dict[str, Any], style: str | None = None) -> None:
        def pct(x: float) -> str:
            return f"{100 * x:.2f}%"

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        table.add_row(
            label,
            f"{m['requests']:,}",
            f"{m['offered_rps']:,.1f}",
            f"{m['goodput_rps']:,.1f}",
            pct(m["slo_attainment"]),
            pct(m["drop_fraction"]),
            pct(m["late_fraction"]),
            pct(m["error_fraction"]),
            ms(m["latency_p50_ms"]),
            ms(m["latency_p99_ms"]),
            ms(m["latency_p999_ms"]),
            f"{m['mean_batch_size']:.2f}",
            style=style,
        )

    row("overall", doc["overall"], "bold")
    if len(doc["models"]) > 1:
        for name, m in doc["models"].items():
            row(f"  └ {name}", m, "dim")
    out.print(table)
    g = doc["generator"]
    out.print(
        f"generator: {g['workers']} worker(s), send lag p50 {g['send_lag_p50_ms'] or 0:.2f} ms, "
        f"p99 {g['send_lag_p99_ms'] or 0:.2f} ms, max {g['send_lag_max_ms'] or 0:.2f} ms; "
        f"{100 * g['behind_fraction']:.2f} % over {g['lag_threshold_ms']:g} ms"
        + ("  [FELL BEHIND]" if g["fell_behind"] else ""),
        highlight=False,
    )
    for name in doc["overall"]["error_reasons"]:
        out.print(f"errors: {name} x{doc['overall']['error_reasons'][name]}", highlight=False)
    breakdown = doc.get("timing_breakdown")
    for group in ("served", "late"):
        parts = breakdown[group] if breakdown else None
        if not parts or not parts["requests"]:
            continue
        shown = [
            f"{name} {parts[name]['p50_ms']:.2f}/{parts[name]['p99_ms']:.2f}"
            for name in TIMING_PARTS
            if parts[name]["p50_ms"] is not None
        ]
        out.print(
            f"{group} ({parts['requests']}), p50/p99 ms: " + ", ".join(shown), highlight=False
        )
    if "capacity_rps" in doc:
        out.print(
            f"capacity (≥ {100 * doc['capacity_target']:g} % within SLO): "
            f"{doc['capacity_rps']:,.1f} req/s at ×{doc['capacity_rate_scale'] or 0:.4g} "
            f"({doc['capacity_status']}, {len(doc['capacity_probes'])} probes)",
            highlight=False,
        )
