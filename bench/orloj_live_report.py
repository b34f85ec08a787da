"""The tables of bench.orloj_live: the calibration's fit printed, and the
runs (live beside simulated) as a rich table and as markdown."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


def table_rows(runs: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in runs:
        live, sim = r["live"], r["simulated"]
        rows.append(
            [
                r["policy"],
                f"{r['sample_rate']:g}",
                f"{live['finish_rate']:.3f}",
                f"{sim['finish_rate']:.3f}",
                f"{100.0 * (live['finish_rate'] - sim['finish_rate']):+.1f}",
                f"{live['goodput_rps']:.1f}",
                f"{sim['goodput_rps']:.1f}",
                f"{live['alone_times']:.0f}",
            ]
        )
    return rows


HEADERS = [
    "policy",
    "sample rate",
    "live finish",
    "sim finish",
    "live − sim (pts)",
    "live goodput r/s",
    "sim goodput r/s",
    "alone-times",
]


def markdown(doc: dict[str, Any]) -> str:
    cal, wl = doc["calibration"], doc["workload"]
    lines = [
        f"# Orloj live: {wl.get('model', 'earlyexit')}, live vs simulated",
        "",
        f"Calibration (eq. 3, {cal['threads']} threads): c0 = {cal['c0_ms']:.3f} ms, "
        f"c1 = {cal['c1_ms_per_row_step']:.4f} ms per row-step, r² = {cal['r2']:.4f}, "
        f"largest residual {cal['max_abs_residual_pct']:.1f} %.",
        "",
        f"Workload: {wl['duration_s']:g} s, {wl['requests']} requests at "
        f"{wl['rate_rps']:.1f} r/s (load {wl['load']:g} × {wl['capacity_rps']:.1f} r/s at the "
        f"mean), SLO {wl['slo_ms']:.2f} ms = {wl['slo_multiple']:g} × P99 alone-time.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(doc["runs"])]
    return "\n".join(lines) + "\n"


def print_table(runs: Sequence[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="live vs simulated (finish rate = within SLO / all)")
    for h in HEADERS:
        table.add_column(h, justify="left" if h == "policy" else "right")
    for row in table_rows(runs):
        table.add_row(*row)
    Console().print(table)


def print_calibration(cal: dict[str, Any]) -> None:
    print(
        f"calibration: t = {cal['c0_ms']:.3f} ms + {cal['c1_ms_per_row_step']:.4f} ms·k·s "
        f"(r² {cal['r2']:.4f}, {cal['threads']} threads)",
        file=sys.stderr,
    )
    for p in cal["points"]:
        print(
            f"  k={p['batch']} s={p['steps']:2d}: measured {p['measured_ms']:7.3f} ms, "
            f"fit {p['fitted_ms']:7.3f}, residual {p['residual_pct']:+6.1f} %",
            file=sys.stderr,
        )
    extra = cal["per_step_fit"]
    if extra is not None:
        print(
            f"  with a per-step term: {extra['c0_ms']:.3f} + {extra['c_step_ms']:.4f}·s "
            f"+ {extra['c1_ms']:.4f}·k·s ms (largest residual "
            f"{extra['max_abs_residual_pct']:.1f} %)",
            file=sys.stderr,
        )
