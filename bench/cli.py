"""Command-line plumbing shared by `bench.loadgen` and `bench.simulate`: the
workload, capacity-search and output options, their checks, JSON-safe
output, and the wrapper that turns errors into messages and exit statuses
(2 usage, 1 run failed, 130 interrupted)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.workloads.spec import Workload, load_workload


class UsageError(Exception):
    """Bad command line or input file: message on stderr, exit status 2."""


# --------------------------------------------------------------------------- options


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """--workload FILE and --rate-scale X."""
    p.add_argument("--workload", required=True, metavar="FILE", help="workload YAML file")
    p.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="multiply every arrival rate of the workload by X (default 1)",
    )


def add_capacity_options(p: argparse.ArgumentParser, *, what: str, tol: float) -> None:
    """--capacity (search `what`), --target and --capacity-tol (default `tol`)."""
    p.add_argument(
        "--capacity",
        action="store_true",
        help=f"also find {what}: the highest offered load with ≥ --target of requests "
        "within SLO (bisection on the rate scale)",
    )
    p.add_argument(
        "--target", type=float, default=0.99, help="SLO attainment for --capacity (0.99)"
    )
    p.add_argument(
        "--capacity-tol",
        type=float,
        default=tol,
        metavar="REL",
        help=f"relative precision of the capacity search on the rate scale ({tol:g})",
    )


def add_output_options(p: argparse.ArgumentParser, *, plot: str) -> None:
    """--json, --plot OUT.png (help: `plot`) and --quiet."""
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument("--plot", metavar="OUT.png", help=plot)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display on stderr")


# --------------------------------------------------------------------------- checks


def check_positive(option: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{option} must be a positive number, got {value}")


def check_target(target: float) -> None:
    if not 0.0 < target <= 1.0:
        raise UsageError(f"--target must be in (0, 1], got {target}")


def check_plot(plot: str | None) -> None:
    if plot and Path(plot).suffix.lower() != ".png":
        raise UsageError(f"--plot: expected a .png file name, got {plot!r}")


def read_workload(name: str) -> tuple[Path, Workload]:
    """The --workload file: its path and the parsed workload."""
    path = Path(name)
    if not path.is_file():
        raise UsageError(f"workload file not found: {path}")
    try:
        return path, load_workload(path)
    except (ValueError, TypeError, KeyError) as exc:
        raise UsageError(f"bad workload file: {exc}") from None


# --------------------------------------------------------------------------- output


def workload_info(workload: Workload, path: str | Path) -> dict[str, Any]:
    """The `workload` block of the JSON document (both commands)."""
    return {
        "name": workload.name,
        "file": str(path),
        "duration_s": workload.duration_s,
        "devices": len(workload.devices),
        "models": [m.name for m in workload.models],
        "offered_rps": workload.offered_rate(),
        "seed": workload.seed,
    }


def sanitize(value: Any) -> Any:
    """JSON-safe: non-finite floats become null, numpy scalars Python numbers."""
    if isinstance(value, dict):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, np.bool_):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    return str(value)


# --------------------------------------------------------------------------- main


def run_main(
    body: Callable[[list[str] | None, Any], int],
    argv: list[str] | None,
    *,
    usage_errors: tuple[type[BaseException], ...] = (),
    run_errors: tuple[type[BaseException], ...] = (),
) -> int:
    """`body(argv, err)` as a command, `err` a rich Console on stderr:
    UsageError and `usage_errors` are reported as `error:` (exit 2),
    `run_errors` as `run failed:` (exit 1), Ctrl-C as `interrupted` (130)."""
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True)
    try:
        return body(argv, err)
    except (UsageError, *usage_errors) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except run_errors as exc:
        err.print(f"[red]run failed:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
