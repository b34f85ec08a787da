"""PPipe's planner against the artifact's reference plans (Gurobi).

    python -m bench.ppipe_planner [--variants v4,bl,dart-r] [--time-limit S]
        [--match TEXT …] [--timings DIR] [--out DIR]

Re-solves every reference plan in `data/ppipe/plans-maf19/` (or those whose
file name contains every `--match`) with HiGHS, one after another in this process,
and prints a table: our objective, the reference's, the gap between them,
HiGHS's own gap at the end, our solve time and the reference's Gurobi time.
Writes `ppipe-planner.json` (every report in full) and `ppipe-planner.md`
(the table and a summary) under `--out` (default bench/results/ppipe).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from app.planning.ppipe.plan import parse_reference_name
from app.planning.ppipe.profiles import BUNDLED_DIR
from app.planning.ppipe.reference import resolve_reference

SUFFIXES = {"v4": "ppipe", "bl": "np", "dart-r": "dart-r"}
DEFAULT_OUT = Path(__file__).parent / "results" / "ppipe"


def short_name(path: Path) -> str:
    """Group (first letters of each model), cluster, variant."""
    name = parse_reference_name(path)
    stem = path.stem
    models = stem[: stem.index("_" + "-".join(f"{w:g}" for w in name.weights))]
    cluster = "-".join(name.classes)
    variant = stem.rsplit("_", 1)[1]
    return f"{models[:28]}… {cluster} {variant}"


def select(directory: Path, variants: list[str], match: list[str] | None) -> list[Path]:
    unknown = set(variants) - set(SUFFIXES)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)} (known: {', '.join(SUFFIXES)})")
    files = sorted(
        p
        for p in directory.glob("*.json")
        if p.stem.rsplit("_", 1)[-1] in variants and all(m in p.name for m in match or [])
    )
    if not files:
        raise SystemExit(f"no reference plans in {directory} match")
    return files


def row(report: dict[str, Any]) -> str:
    gap = report["gap"]
    mip = report["mip_gap"]
    return (
        f"| {short_name(Path(report['file']))} | {report['objective']:.1f} | "
        f"{report['reference_objective']:.1f} | {gap * 100:+.3f} | "
        f"{'–' if mip is None else f'{mip * 100:.3f}'} | {report['status']} | "
        f"{report['runtime_s']:.2f} | {report['reference_runtime_s']:.2f} |"
    )


HEADER = (
    "| reference plan | ours | reference | gap % | MIP gap % | status | ours s | Gurobi s |\n"
    "|---|---:|---:|---:|---:|---|---:|---:|"
)


def summary(reports: list[dict[str, Any]], time_limit: float) -> list[str]:
    lines = []
    for suffix in SUFFIXES:
        mine = [r for r in reports if r["file"].endswith(f"_{suffix}.json")]
        if not mine:
            continue
        within = sum(1 for r in mine if abs(r["gap"]) <= 0.01)
        times = [r["runtime_s"] for r in mine]
        gurobi = [r["reference_runtime_s"] for r in mine]
        lines.append(
            f"- `_{suffix}`: {within}/{len(mine)} within 1 % of the reference objective "
            f"(worst gap {min(r['gap'] for r in mine) * 100:+.3f} %, best "
            f"{max(r['gap'] for r in mine) * 100:+.3f} %); "
            f"{sum(r['status'] == 'time-limit' for r in mine)} stopped by the {time_limit:g} s "
            f"limit; HiGHS mean {statistics.mean(times):.2f} s, median "
            f"{statistics.median(times):.2f} s, max {max(times):.2f} s; the reference's Gurobi "
            f"mean {statistics.mean(gurobi):.2f} s"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="v4,bl,dart-r")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument(
        "--match", action="append", help="only files whose name contains this (repeatable: all)"
    )
    parser.add_argument("--timings", type=Path, default=BUNDLED_DIR)
    parser.add_argument("--plans", type=Path, default=BUNDLED_DIR / "plans-maf19")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    files = select(args.plans, args.variants.split(","), args.match)
    print(HEADER)
    reports = []
    for path in files:
        report = resolve_reference(path, args.timings, args.time_limit)
        reports.append(report)
        print(row(report), flush=True)
    lines = summary(reports, args.time_limit)
    print("\n" + "\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "time_limit_s": args.time_limit,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "files": len(files),
    }
    body = {"meta": meta, "reports": reports}
    (args.out / "ppipe-planner.json").write_text(json.dumps(body, indent=2) + "\n")
    (args.out / "ppipe-planner.md").write_text(
        "# PPipe planner against the reference plans\n\n"
        f"`python -m bench.ppipe_planner --time-limit {args.time_limit:g}"
        + "".join(f" --match {m}" for m in args.match or [])
        + f" --variants {args.variants}`; HiGHS on one thread.\n\n"
        + HEADER
        + "\n"
        + "\n".join(row(r) for r in reports)
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )
    print(f"\nwritten: {args.out / 'ppipe-planner.json'}, {args.out / 'ppipe-planner.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
