"""Orloj's Tables 2–4 in the simulator: finish rate per case, SLO and policy.

    python -m bench.orloj_tables [--cases std-1,one-modal] [--tables 2,3]
        [--arrivals trace|poisson] [--slo-multiples 1.5,2,3,4,5]
        [--policies orloj,clockwork,nexus,clipper,symphony] [--quick]

Each case is a workload of bench/workloads/orloj/ (cases.yaml lists them and
make_workloads.py writes them; the files document the units, σ and load).
Per case the arrivals are generated once, and every SLO multiple and policy
runs on exactly those requests; the SLO is the multiple × the P99 of the
model's alone-time (orloj.txt §5.2). The finish rate is the simulator's
`slo_attainment`: requests answered within their SLO over all requests.

A policy the registry does not know (or cannot build) is reported on one
line and skipped: its column reads "—". `--quick` cuts every workload to its
first QUICK_DURATION_S seconds, a smoke run, not a result.

Output: a table per paper table on stdout in the paper's layout (rows: case
× SLO multiple; columns: policies), and `<out-dir>/<name>.json` and `.md`
(default name `tables-<arrivals>`, `-quick` appended for a quick run);
progress and notes go to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from app.scheduling.registry import make_scheduler
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import Workload, load_workload
from bench import cli
from bench.cli import UsageError, sanitize

WORKLOADS = Path(__file__).resolve().parent / "workloads" / "orloj"
OUT_DIR = Path(__file__).resolve().parent / "results" / "orloj"
POLICIES = ("orloj", "clockwork", "nexus", "clipper", "symphony")
SLO_MULTIPLES = (1.5, 2.0, 3.0, 4.0, 5.0)
QUICK_DURATION_S = 10.0
MISSING = "—"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    table: int
    path: Path


def load_cases(arrivals: str, directory: Path = WORKLOADS) -> list[Case]:
    """The cases of cases.yaml, in its order, with their workload files."""
    doc = yaml.safe_load((directory / "cases.yaml").read_text())
    if arrivals not in doc["arrivals"]:
        raise UsageError(f"--arrivals: choose one of {', '.join(doc['arrivals'])}")
    cases = []
    for entry in doc["cases"]:
        stem = f"{entry['name'].replace('/', '_')}.{arrivals}"
        cases.append(Case(entry["name"], int(entry["table"]), directory / f"{stem}.yaml"))
    return cases


def with_slo(workload: Workload, multiple: float) -> Workload:
    """Every model's SLO set to `multiple` × the P99 of its alone-time."""
    models = [dataclasses.replace(m, slo_ms=multiple * m.alone_p99_ms) for m in workload.models]
    return dataclasses.replace(workload, models=models)


def available_policies(
    policies: list[str], workload: Workload, err: Console
) -> tuple[list[str], dict[str, str]]:
    """The policies that build on `workload`; the others with the reason."""
    ok, skipped = [], {}
    for name in policies:
        try:
            make_scheduler(name, workload.model_infos(), workload.device_infos())
        except (ImportError, ValueError, TypeError) as exc:
            skipped[name] = str(exc).splitlines()[0]
            err.print(f"note: policy {name!r} skipped: {skipped[name]}", highlight=False)
        else:
            ok.append(name)
    return ok, skipped


def run_case(
    case: Case,
    policies: list[str],
    multiples: list[float],
    quick: bool,
    err: Console,
    rate_scale: float = 1.0,
) -> dict[str, Any]:
    workload = load_workload(case.path)
    if quick:
        workload = dataclasses.replace(
            workload, duration_s=min(workload.duration_s, QUICK_DURATION_S)
        )
    arrivals = generate_arrivals(workload, rate_scale)
    model = workload.models[0]
    out: dict[str, Any] = {
        "case": case.name,
        "table": case.table,
        "workload": str(case.path.relative_to(WORKLOADS.parents[1])),
        "requests": len(arrivals),
        "offered_rps": len(arrivals) / workload.duration_s,
        "alone_p99_ms": model.alone_p99_ms,
        "finish_rate": {},
        "errors": {},
    }
    for multiple in multiples:
        row: dict[str, float] = {}
        for policy in policies:
            err.print(f"{case.name} × {multiple:g} P99: {policy}", highlight=False)
            try:
                result = simulate(with_slo(workload, multiple), policy, arrivals=arrivals)
            except Exception as exc:  # one failing policy must not sink the tables
                out["errors"][f"{policy}@{multiple:g}"] = f"{type(exc).__name__}: {exc}"
                err.print(f"[red]error:[/] {policy} on {case.name}: {exc}", highlight=False)
                continue
            row[policy] = result.attainment
        out["finish_rate"][f"{multiple:g}"] = row
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.orloj_tables",
        description="Orloj Tables 2–4 in the simulator: finish rate per case, SLO and policy.",
    )
    p.add_argument("--cases", metavar="LIST", help="case names, comma-separated (default: all)")
    p.add_argument("--tables", metavar="LIST", help="paper tables to run, e.g. 2,3 (default: all)")
    p.add_argument("--arrivals", default="trace", help="trace (default) or poisson")
    p.add_argument(
        "--slo-multiples",
        metavar="LIST",
        default=",".join(f"{m:g}" for m in SLO_MULTIPLES),
        help="SLOs as multiples of the alone-time P99 (default %(default)s)",
    )
    p.add_argument(
        "--policies",
        metavar="LIST",
        default=",".join(POLICIES),
        help="policies, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"every workload cut to its first {QUICK_DURATION_S:g} s (a smoke run)",
    )
    p.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply every workload's rate (default 1: the load of cases.yaml)",
    )
    p.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where the JSON and .md go")
    p.add_argument("--name", help="file name of the outputs (default tables-<arrivals>[-quick])")
    return p


def _list(text: str, option: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise UsageError(f"{option}: empty list")
    return items


def _multiples(text: str) -> list[float]:
    try:
        values = [float(s) for s in _list(text, "--slo-multiples")]
    except ValueError:
        raise UsageError(f"--slo-multiples: expected numbers, got {text!r}") from None
    if any(not v > 0 for v in values):
        raise UsageError(f"--slo-multiples: expected positive numbers, got {text!r}")
    return values


def select_cases(args: argparse.Namespace) -> list[Case]:
    cases = load_cases(args.arrivals)
    if args.tables:
        try:
            tables = {int(t) for t in _list(args.tables, "--tables")}
        except ValueError:
            raise UsageError(f"--tables: expected table numbers, got {args.tables!r}") from None
        cases = [c for c in cases if c.table in tables]
    if args.cases:
        wanted = _list(args.cases, "--cases")
        known = {c.name for c in cases}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise UsageError(f"--cases: unknown {unknown}; choose from {sorted(known)}")
        cases = [c for c in cases if c.name in wanted]
    if not cases:
        raise UsageError("no case selected")
    return cases


def render_tables(doc: dict[str, Any]) -> list[Table]:
    """One rich table per paper table, rows as in the paper."""
    tables = []
    for number in sorted({c["table"] for c in doc["cases"]}):
        table = Table(title=f"Table {number}: finish rate ({doc['arrivals']} arrivals)")
        table.add_column("Case ID")
        table.add_column("SLO (× P99)", justify="right")
        for policy in doc["policies"]:
            table.add_column(policy, justify="right")
        for case in (c for c in doc["cases"] if c["table"] == number):
            for multiple, row in case["finish_rate"].items():
                table.add_row(case["case"], multiple, *_cells(row, doc["policies"]))
            table.add_section()
        tables.append(table)
    return tables


def _cells(row: dict[str, float], policies: list[str]) -> list[str]:
    return [f"{row[p]:.2f}" if p in row else MISSING for p in policies]


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Orloj Tables 2–4, simulated ({doc['arrivals']} arrivals"
        + (", quick" if doc["quick"] else "")
        + ")",
        "",
        "Finish rate = requests answered within the SLO / all requests; "
        "SLO = multiple × P99 of the alone-time. Command: "
        f"`{doc['command']}`.",
    ]
    if doc["skipped"]:
        lines += ["", "Skipped: " + "; ".join(f"{p} ({r})" for p, r in doc["skipped"].items())]
    for number in sorted({c["table"] for c in doc["cases"]}):
        lines += ["", f"## Table {number}", ""]
        lines.append("| Case ID | SLO (× P99) | " + " | ".join(doc["policies"]) + " |")
        lines.append("|---|---:|" + "---:|" * len(doc["policies"]))
        for case in (c for c in doc["cases"] if c["table"] == number):
            for multiple, row in case["finish_rate"].items():
                cells = " | ".join(_cells(row, doc["policies"]))
                lines.append(f"| {case['case']} | {multiple} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return cli.run_main(_main, argv)


def _main(argv: list[str] | None, err: Console) -> int:
    args = build_parser().parse_args(argv)
    multiples = _multiples(args.slo_multiples)
    wanted = _list(args.policies, "--policies")
    cases = select_cases(args)
    first = load_workload(cases[0].path)
    policies, skipped = available_policies(wanted, first, err)
    cli.check_positive("--rate-scale", args.rate_scale)
    results = [run_case(c, policies, multiples, args.quick, err, args.rate_scale) for c in cases]
    doc = {
        "arrivals": args.arrivals,
        "quick": args.quick,
        "rate_scale": args.rate_scale,
        "command": "python -m bench.orloj_tables "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "slo_multiples": multiples,
        "policies": wanted,
        "skipped": skipped,
        "cases": results,
    }
    name = args.name or f"tables-{args.arrivals}" + ("-quick" if args.quick else "")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = args.out_dir / f"{name}.json", args.out_dir / f"{name}.md"
    json_path.write_text(json.dumps(sanitize(doc), indent=2, allow_nan=False) + "\n")
    md_path.write_text(markdown(doc))
    out = Console()
    for table in render_tables(doc):
        out.print(table)
    err.print(f"wrote {json_path} and {md_path}", highlight=False)
    return 0 if any(c["finish_rate"] and any(c["finish_rate"].values()) for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
