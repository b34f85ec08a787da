"""The command line, `python -m bench.loadgen` (see the package's docstring),
and the options and progress bars of a measured run it shares with
`bench.inprocess`.

Output: a rich table on stdout, or with `--json` one JSON document. Progress
goes to stderr. Exit status: 0 run done, 1 the run failed (server
unreachable, worker crashed), 2 usage errors (bad arguments, workload,
non-loopback URL, model not on the server).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.runtime.realtime import RealtimeUnavailable, check_priority, set_fifo
from app.workloads.spec import Workload
from bench import cli
from bench.cli import UsageError
from bench.loadgen.capacity import DEFAULT_PROBE_DURATION_S, find_live_capacity
from bench.loadgen.client import CLIENTS
from bench.loadgen.errors import LoadGenError, RunFailed
from bench.loadgen.report import report_run
from bench.loadgen.run import (
    DEFAULT_LAG_THRESHOLD_MS,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_TIMEOUT_MARGIN_MS,
    ProgressCallback,
    run_load,
)
from bench.loadgen.targets import check_loopback, prepare_targets, server_info


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description="Open-loop HTTP load generator: send a workload to a server on loopback "
        "and measure goodput at SLO.",
    )
    p.add_argument("--url", required=True, help="server base URL (loopback only)")
    cli.add_workload_options(p)
    p.add_argument("--workers", type=int, default=1, metavar="N", help="sender processes (1)")
    p.add_argument(
        "--connections", type=int, metavar="N", help="HTTP connections per worker (auto)"
    )
    p.add_argument(
        "--client",
        choices=CLIENTS,
        default="raw",
        help="data-plane HTTP client: raw (pre-built requests on asyncio keep-alive "
        "connections; default, cheapest) or httpx",
    )
    p.add_argument(
        "--devices",
        type=int,
        help="devices the server runs (only for device_busy_fraction; default: the workload's)",
    )
    add_run_options(p, what="the server's capacity")
    return p


def add_run_options(
    p: argparse.ArgumentParser, *, what: str, realtime_what: str = "the generator"
) -> None:
    """The options of a measured run and its capacity search, and the output
    options (bench.loadgen and bench.inprocess)."""
    p.add_argument(
        "--duration", type=float, metavar="S", help="run length (default: the workload's)"
    )
    p.add_argument(
        "--timeout-margin-ms",
        type=float,
        default=DEFAULT_TIMEOUT_MARGIN_MS,
        help="per-request hard timeout = SLO + this, from the intended send time (500)",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help=f"refuse runs with more arrivals than this ({DEFAULT_MAX_REQUESTS})",
    )
    p.add_argument(
        "--lag-threshold-ms",
        type=float,
        default=DEFAULT_LAG_THRESHOLD_MS,
        help="a send this late counts as the generator falling behind (5)",
    )
    cli.add_capacity_options(p, what=what, tol=0.05)
    p.add_argument(
        "--probe-duration",
        type=float,
        default=DEFAULT_PROBE_DURATION_S,
        metavar="S",
        help="length of each capacity probe (5)",
    )
    p.add_argument("--max-probes", type=int, default=12, help="capacity probes at most (12)")
    p.add_argument(
        "--realtime-priority",
        type=int,
        default=0,
        metavar="N",
        help=f"SCHED_FIFO priority of {realtime_what} (0: off; needs root or CAP_SYS_NICE)",
    )
    cli.add_output_options(p, plot="write a plot of the run")


def read_run_args(args: argparse.Namespace) -> tuple[Path, Workload]:
    """Check the options of `add_run_options`; the workload file's path and
    the workload, with --duration applied."""
    for name in ("rate_scale", "probe_duration", "capacity_tol", "timeout_margin_ms"):
        cli.check_positive(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.duration is not None:
        cli.check_positive("--duration", args.duration)
    cli.check_target(args.target)
    cli.check_plot(args.plot)
    try:
        check_priority(args.realtime_priority, "--realtime-priority")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path, workload = cli.read_workload(args.workload)
    if args.duration is not None:
        workload = dataclasses.replace(workload, duration_s=float(args.duration))
    return path, workload


def search_options(
    args: argparse.Namespace, bar: Callable[[str], ProgressCallback]
) -> dict[str, Any]:
    """The capacity search's options from `add_run_options`: bisection from
    --rate-scale, one progress bar per probe."""
    return {
        "target": args.target,
        "lo": args.rate_scale,
        "hi": args.rate_scale,
        "rel_tol": args.capacity_tol,
        "max_runs": args.max_probes,
        "probe_duration_s": args.probe_duration,
        "on_probe": lambda scale: bar(f"capacity probe ×{scale:.4g}"),
    }


def progress_bars(err: Any, quiet: bool) -> tuple[Any, Callable[[str], ProgressCallback]]:
    """A rich Progress on `err` and `bar(description)`, which adds a bar
    and returns the ProgressCallback that moves it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sent {task.fields[sent]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet,
        refresh_per_second=4,
    )

    def bar(description: str) -> ProgressCallback:
        task = progress.add_task(description, total=None, sent=0)

        def update(sent: int, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, sent=sent)

        return update

    return progress, bar


def main(argv: list[str] | None = None) -> int:
    return cli.run_main(_main, argv, usage_errors=(LoadGenError,), run_errors=(RunFailed,))


def _main(argv: list[str] | None, err: Any) -> int:
    args = build_parser().parse_args(argv)
    url = check_loopback(args.url)
    if args.workers < 1 or args.workers > 64:
        raise UsageError(f"--workers must be in 1..64, got {args.workers}")
    path, workload = read_run_args(args)
    try:
        # Before any worker starts: they inherit it.
        set_fifo(args.realtime_priority, "--realtime-priority")
    except RealtimeUnavailable as exc:
        raise UsageError(str(exc)) from None
    progress, bar = progress_bars(err, args.quiet)
    common = {
        "client": args.client,
        "workers": args.workers,
        "connections": args.connections,
        "timeout_margin_ms": args.timeout_margin_ms,
        "lag_threshold_ms": args.lag_threshold_ms,
        "devices": args.devices,
    }
    with progress:
        targets = asyncio.run(prepare_targets(url, workload))
        server = asyncio.run(server_info(url))
        result = asyncio.run(
            run_load(
                url,
                workload,
                args.rate_scale,
                targets=targets,
                max_requests=args.max_requests,
                progress=bar(f"{workload.name} ×{args.rate_scale:g}"),
                **common,
            )
        )
        capacity = probes = None
        if args.capacity:
            capacity, probes = find_live_capacity(
                url,
                workload,
                max_requests=args.max_requests,
                **search_options(args, bar),
                **common,
            )
    report_run(args, err, workload, path, result, capacity, probes, server)
    return 0
