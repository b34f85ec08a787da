"""`python -m bench.compare`: the command line (see the package docstring)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from app.runtime.realtime import RealtimeUnavailable, check_permitted
from app.workloads.spec import load_workload
from bench.compare.measure import Options, SystemResult, run_daemon
from bench.compare.output import write_outputs
from bench.compare.peers import PEERS, PLACEMENTS, PeerUnavailable, run_peer
from bench.compare.setups import REPO_ROOT, SETUPS
from bench.progress import Status, about_subject

DAEMON_POLICIES = ("symphony", "triton", "clockwork")


def build_parser() -> argparse.ArgumentParser:
    from bench.compare import __doc__ as doc

    p = argparse.ArgumentParser(prog="python -m bench.compare", description=doc.split("\n")[0])
    p.add_argument(
        "--workload",
        nargs="+",
        default=["a", "b", "c"],
        choices=list(SETUPS),
        help="live workloads (a: emulated ResNet50, b: ONNX MLP, c: bursty mix, ceiling: "
        "ℓ(b) ≈ 0, zoo8 / zoo8-bursty: 8 Table 5 models on 8 devices, Poisson / Γ(0.5))",
    )
    p.add_argument(
        "--systems",
        default=",".join(DAEMON_POLICIES),
        help=f"the daemon's policies, comma-separated, from {', '.join(DAEMON_POLICIES)} "
        "('none': no daemon run)",
    )
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"peer servers, comma-separated, from {', '.join(PEERS)} ('none': no peer)",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help="emulated devices for every system (rates scaled in proportion to the "
        "workload file's devices; 0: the file's own count; a CPU workload keeps its executor); "
        "default 1, and the file's 8 for zoo8 and zoo8-bursty",
    )
    p.add_argument("--probe-duration", type=float, default=5.0, help="seconds per probe")
    p.add_argument("--max-probes", type=int, default=8, help="capacity probes per system")
    p.add_argument(
        "--screen-probes",
        type=int,
        default=4,
        help="capacity probes per peer grid point when screening its grid",
    )
    p.add_argument("--cdf-scale", type=float, default=1.0, help="rate scale of the CDF run")
    p.add_argument(
        "--cdf-fraction",
        type=float,
        default=None,
        help="run the CDF at this fraction of each system's own capacity instead",
    )
    p.add_argument("--workers", type=int, default=1, help="load-generator processes")
    _add_grid_options(p)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    p.add_argument(
        "--realtime-priority",
        type=int,
        default=0,
        metavar="N",
        help="SCHED_FIFO priority of the daemon (REALTIME_PRIORITY) and the generator "
        "(0: off; needs root or CAP_SYS_NICE)",
    )
    p.add_argument(
        "--cpu-rates",
        default="",
        help="offered r/s, comma-separated: after its CDF run, each system's CPU ms per "
        "answered request at each, per process (bench.cpu_per_request; default: none)",
    )
    return p


def _add_grid_options(p: argparse.ArgumentParser) -> None:
    """The options that narrow or widen the peers' grids."""
    p.add_argument(
        "--ray-waits",
        default=None,
        help="Ray Serve batch_wait_timeout values to try, in ms, comma-separated "
        "(default: 0,1,2,5)",
    )
    p.add_argument(
        "--triton-delays",
        default=None,
        help="Triton max_queue_delay values to try, in ms, comma-separated (default: 0,1,3)",
    )
    p.add_argument(
        "--placements",
        default=None,
        help="Triton's and Ray Serve's model placements to try, comma-separated, from "
        "shared (every model on every device) and partition (each model on devices of its "
        "own); default: both where several emulated models can each have a device, else shared",
    )


def _names(raw: str) -> list[str]:
    names = [s.strip() for s in raw.split(",") if s.strip()]
    return [] if names == ["none"] else names


def _milliseconds(raw: str | None, flag: str) -> tuple[float, ...] | None:
    """A comma-separated list of milliseconds ≥ 0 (None when not given)."""
    if not raw:
        return None
    try:
        values = tuple(float(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"{flag} takes milliseconds ≥ 0, comma-separated; got {raw!r}")
    return values


def _placements(raw: str | None) -> tuple[str, ...] | None:
    """--placements as a tuple (None when not given)."""
    if raw is None:
        return None
    names = tuple(_names(raw))
    bad = [n for n in names if n not in PLACEMENTS]
    if not names or bad:
        raise ValueError(
            f"--placements takes {', '.join(PLACEMENTS)}, comma-separated; got {raw!r}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    systems, peers = _names(args.systems), _names(args.peers)
    unknown = [s for s in systems if s not in DAEMON_POLICIES]
    unknown += [p for p in peers if p not in PEERS]
    if unknown or not (systems or peers):
        print(
            f"error: unknown systems {unknown}; the daemon's policies are "
            f"{', '.join(DAEMON_POLICIES)}, the peers {', '.join(PEERS)}",
            file=sys.stderr,
        )
        return 2
    if (args.devices is not None and args.devices < 0) or args.screen_probes < 1:
        print("error: --devices must be ≥ 0 and --screen-probes ≥ 1", file=sys.stderr)
        return 2
    try:
        ray_waits_ms = _milliseconds(args.ray_waits, "--ray-waits")
        triton_delays_ms = _milliseconds(args.triton_delays, "--triton-delays")
        placements = _placements(args.placements)
        check_permitted(args.realtime_priority, "--realtime-priority")
        for name in peers:
            PEERS[name].check()
    except (ValueError, RealtimeUnavailable, PeerUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = Options(
        probe_duration_s=args.probe_duration,
        max_probes=args.max_probes,
        cdf_scale=args.cdf_scale,
        cdf_fraction=args.cdf_fraction,
        workers=args.workers,
        screen_probes=args.screen_probes,
        ray_waits_s=None if ray_waits_ms is None else tuple(v / 1000.0 for v in ray_waits_ms),
        triton_delays_us=(
            None if triton_delays_ms is None else tuple(round(v * 1000) for v in triton_delays_ms)
        ),
        placements=placements,
        realtime_priority=args.realtime_priority,
        cpu_rates=tuple(float(v) for v in args.cpu_rates.split(",") if v.strip()),
    )
    # A line at least every 5 s on what runs now (bench/progress.py).
    with Status(Console(stderr=True)):
        return _compare(args, systems, peers, options)


def _compare(args: Any, systems: list[str], peers: list[str], options: Options) -> int:
    for key in args.workload:
        setup = SETUPS[key]
        setup = setup.on_devices(setup.default_devices if args.devices is None else args.devices)
        workload = setup.workload_on_devices(load_workload(setup.workload))
        print(
            f"== workload ({key}) {workload.name} on {setup.devices} device(s): "
            f"nominal {workload.offered_rate():.0f} r/s",
            file=sys.stderr,
        )
        results: list[SystemResult] = []
        for system in [*systems, *peers]:
            started = time.monotonic()
            about_subject(f"({key}) {system}")
            if system in PEERS:
                result = run_peer(PEERS[system], setup, workload, options)
            else:
                result = run_daemon(setup, workload, system, options)
            results.append(result)
            print(
                f"  {result.label}: capacity {result.capacity_rps:,.0f} r/s "
                f"({result.capacity_status}; {time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
        file_devices = len(load_workload(SETUPS[key].workload).devices)
        folder = workload.name
        if setup.devices != file_devices and setup.emulated_devices:
            folder = f"{workload.name}-{setup.devices}dev"
        table = write_outputs(setup, workload, results, args.out / folder)
        print(f"\n## ({key}) {workload.name}, {setup.devices} device(s)\n\n{table}\n")
    return 0
