"""Output of `python -m bench.simulate`: the JSON document (schema:
bench/simulate_schema.json), the rich table, and the goodput/attainment
plot (Symphony Figure 10, left)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from app.simulation.capacity_search import CapacityResult
from app.simulation.run import SimResult
from app.workloads.spec import Workload
from bench import cli
from bench.simulate_notes import notes

MAX_MODEL_ROWS = 8  # per-model rows in the table only for workloads this small


def build_document(
    workload: Workload,
    path: Path,
    rate_scale: float,
    results: dict[str, SimResult],
    capacities: dict[str, CapacityResult],
    curves: dict[str, list[dict[str, float]]],
    errors: dict[str, str],
) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for label, result in results.items():
        entry = result.to_dict()
        entry.pop("trace", None)
        cap = capacities.get(label)
        if cap is not None:
            entry["capacity_rps"] = cap.capacity_rps
            entry["capacity_rate_scale"] = cap.rate_scale
            entry["capacity_status"] = cap.status
            entry["capacity_probes"] = [dataclasses.asdict(p) for p in cap.probes]
        policies[label] = entry
    doc: dict[str, Any] = {
        "workload": cli.workload_info(workload, path),
        "rate_scale": rate_scale,
        "policies": policies,
    }
    if capacities:
        doc["capacity_target"] = next(iter(capacities.values())).target
    if curves:
        doc["curves"] = curves
    if errors:
        doc["errors"] = errors
    return doc


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.2f}%"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


TABLE_WIDTH = 100  # the tables fit a console this wide (tests/test_bench_simulate.py)


def print_table(
    doc: dict[str, Any], workload: Workload, capacity: bool, console: Console | None = None
) -> None:
    """Two tables of one row per policy, each within TABLE_WIDTH columns:
    the requests' fate (goodput, SLO attainment, latency, batch size, and
    capacity with --capacity), then the devices and the run (offered load,
    busy, Symphony's autoscaling signals, simulation cost). Per-model rows
    follow each policy in the first table for workloads of a few models."""
    out = console or Console(width=None if sys.stdout.isatty() else 240)
    w = doc["workload"]
    title = (
        f"{w['name']}: {w['devices']} devices, {len(w['models'])} model(s), "
        f"{w['duration_s']:g} s, rate ×{doc['rate_scale']:g} "
        f"({w['offered_rps'] * doc['rate_scale']:,.1f} req/s nominal)"
    )
    serving = doc.get("serving_path")
    if serving:
        title += (
            f"; serving path: margin {serving['deadline_margin_ms']:g} ms, "
            f"timer lead {serving['timer_lead_ms']:g} ms, "
            f"intake delay {serving['intake_delay_ms']:g} ms (mean)"
        )
    fate = _table(None, ["goodput", "attain", "drop", "late", "p50 ms", "p99 ms", "batch"])
    if capacity:
        fate.add_column("capacity", justify="right")
    devices = _table(
        "devices, autoscaling signals and simulation cost",
        ["offered", "busy", "bad rate", "idle", "advised Δdev", "wall s", "sim req/s"],
    )
    per_model = len(workload.models) <= MAX_MODEL_ROWS and len(workload.models) > 1
    target = doc.get("capacity_target", 0.99)
    for label, entry in doc["policies"].items():
        o, a = entry["overall"], entry["autoscale"]
        style = "green" if o["slo_attainment"] >= target else None
        rate = entry.get("simulated_requests_per_wall_s")
        row = [label, *_fate_cells(o)]
        if capacity:
            cap = entry.get("capacity_rps")
            row.append(
                "-"
                if cap is None
                else f"{cap:,.1f} ×{entry['capacity_rate_scale'] or 0:.3g}"
                + ("" if entry["capacity_status"] == "converged" else "*")
            )
        fate.add_row(*row, style=style)
        if per_model:
            for model, m in entry["models"].items():
                cells = [""] if capacity else []
                fate.add_row(f"└─{model}", *_fate_cells(m), *cells, style="dim")
        devices.add_row(
            label,
            _num(o["offered_rps"]),
            _pct(o["device_busy_fraction"]),
            _pct(a["bad_rate"]),
            _pct(a["idle_fraction"]),
            f"{a['advised_device_change']:+d}",
            f"{entry['wall_s']:.2f}",
            "-" if rate is None else f"{rate:,.0f}",
        )
    out.print(title, highlight=False)  # at the console's width, not the table's
    out.print(fate)
    out.print(devices)
    if capacity and any(
        e.get("capacity_status", "converged") != "converged" for e in doc["policies"].values()
    ):
        out.print("* capacity search did not converge (see capacity_status in --json)")
    for label, msg in doc.get("errors", {}).items():
        out.print(f"[red]{label}[/]: {msg}", highlight=False)
    for note in notes(doc, workload):  # why a row looks odd (bench/simulate_notes.py)
        out.print(f"note: {note}", highlight=False, markup=False)


def _table(title: str | None, columns: list[str]) -> Table:
    """A table with a `policy` column (long labels with options fold onto
    further lines) and right-aligned number columns that never wrap; light
    borders, so that the numbers get the width."""
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0)
    )
    table.add_column("policy", overflow="fold", min_width=11)
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    return table


def _fate_cells(m: dict[str, Any]) -> list[str]:
    return [
        _num(m["goodput_rps"]),
        _pct(m["slo_attainment"]),
        _pct(m["drop_fraction"]),
        _pct(m["late_fraction"]),
        _num(m["latency_p50_ms"], 2),
        _num(m["latency_p99_ms"], 2),
        _num(m["mean_batch_size"], 2),
    ]


def plot_curves(doc: dict[str, Any], out: Path, *, target: float = 0.99) -> None:
    """Goodput (left) and SLO attainment (right) against offered load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = doc.get("curves", {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    top = 0.0
    for label, points in curves.items():
        if not points:
            continue
        x = [p["offered_rps"] for p in points]
        (line,) = left.plot(x, [p["goodput_rps"] for p in points], marker="o", label=label)
        right.plot(
            x, [100.0 * p["slo_attainment"] for p in points], marker="o", color=line.get_color()
        )
        cap = doc["policies"].get(label, {}).get("capacity_rps")
        if cap:
            right.plot([cap], [100.0 * target], marker="x", ms=10, color=line.get_color())
        top = max(top, *x)
    if top > 0:
        left.plot([0, top], [0, top], ls="--", color="grey", lw=0.8, label="offered")
    left.set_xlabel("offered load (req/s)")
    left.set_ylabel("goodput (req/s within SLO)")
    left.set_title("goodput")
    left.set_xlim(left=0)
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.legend(fontsize="small")
    right.axhline(100.0 * target, ls="--", color="red", lw=0.8, label=f"{100 * target:g} %")
    if any(doc["policies"].get(label, {}).get("capacity_rps") for label in curves):
        right.plot([], [], ls="", marker="x", color="black", label="capacity")
    right.set_xlabel("offered load (req/s)")
    right.set_ylabel("requests within SLO (%)")
    right.set_title("SLO attainment")
    right.set_xlim(left=0)
    right.grid(alpha=0.3)
    right.legend(fontsize="small")
    w = doc["workload"]
    title = f"{w['name']} ({w['devices']} devices)"
    if doc.get("sweep_requests"):
        title += f"; each point ≈{doc['sweep_requests']:,} requests, the main run's in full"
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
