"""Side by side: this daemon (symphony, triton, clockwork policies) and Ray
Serve's best @serve.batch configuration, on the same live workloads.

    python -m bench.compare [--workload a b c] [--systems symphony,triton,clockwork,ray]
                            [--probe-duration 5] [--max-probes 8] [--out bench/results]
                            [--realtime-priority N]

For each workload every system is started on a free loopback port, its
capacity (highest offered load with ≥ 99 % of requests within SLO) is found by
bisection over short open-loop runs of `bench.loadgen`, one more run at the
workload's nominal rate gives the latency CDF, and the system is stopped. Ray
Serve is first screened over `bench.peers.ray_grid.candidate_grid` (max batch
by the SLO/2 and SLO rules × batch wait 0-5 ms), one short run per point at
the screening load, and the best point (`pick_best`) gets the capacity search.
Written under `--out/<workload>/`: results.json (every probe), summary.md (the
table), goodput.png (goodput and attainment vs offered load) and cdf.png.

`--realtime-priority N` (root or CAP_SYS_NICE) runs the daemon with
REALTIME_PRIORITY=N and the load generator at SCHED_FIFO N while it measures;
Ray Serve's processes stay at normal priority.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.repository import BUNDLED_REPOSITORY
from app.repository.loader import load_repository
from app.runtime.realtime import RealtimeUnavailable, check_permitted, fifo_while
from app.workloads.spec import Workload, load_workload
from bench.cli import sanitize
from bench.daemon_launcher import start_daemon, stop_daemon
from bench.loadgen import (
    LiveResult,
    ModelTarget,
    build_targets,
    find_live_capacity,
    prepare_targets,
    run_load,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DAEMON_POLICIES = ("symphony", "triton", "clockwork")
SYSTEMS = (*DAEMON_POLICIES, "ray")


@dataclass(frozen=True)
class Setup:
    """A workload and how both systems serve it."""

    key: str
    workload: Path
    repository: Path
    emulated_devices: int  # the daemon's emulated devices (= Ray replicas per model)
    cpu_slices: int = 0  # the daemon's CPU executors
    cpu_threads: int = 2  # ONNX threads per CPU executor / Ray replica

    @property
    def ray_devices(self) -> int:
        return self.emulated_devices or max(self.cpu_slices, 1)


LIVE = REPO_ROOT / "bench" / "repositories" / "live"
WORKLOADS = REPO_ROOT / "bench" / "workloads"
SETUPS = {
    "a": Setup("a", WORKLOADS / "live-a-resnet50-emulated.yaml", LIVE, emulated_devices=2),
    "b": Setup(
        "b", WORKLOADS / "live-b-mlp.yaml", BUNDLED_REPOSITORY, emulated_devices=0, cpu_slices=1
    ),
    "c": Setup("c", WORKLOADS / "live-c-bursty-mix.yaml", LIVE, emulated_devices=4),
    # The daemon's own ceiling: a model of ℓ(b) ≈ 0 (run with --cdf-fraction 0.5).
    "ceiling": Setup("ceiling", WORKLOADS / "live-ceiling.yaml", LIVE, emulated_devices=1),
}


@dataclass
class SystemResult:
    """One system on one workload."""

    system: str
    label: str
    startup_s: float
    capacity_rps: float
    capacity_status: str
    probes: list[dict[str, Any]]  # offered, goodput, attainment per capacity probe
    cdf_run: dict[str, Any]  # the run at the nominal rate: summary + generator
    latencies_ms: np.ndarray = field(repr=False)  # answered requests of that run
    grid: list[dict[str, Any]] = field(default_factory=list)  # Ray: the screening

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "label": self.label,
            "startup_s": self.startup_s,
            "capacity_rps": self.capacity_rps,
            "capacity_status": self.capacity_status,
            "probes": self.probes,
            "cdf_run": self.cdf_run,
            "grid": self.grid,
        }


@dataclass(frozen=True)
class Options:
    probe_duration_s: float
    max_probes: int
    cdf_scale: float
    cdf_fraction: float | None  # CDF run at this fraction of the system's capacity
    screen_scale: float | None
    workers: int
    ray_waits_s: tuple[float, ...] | None = None  # None: ray_grid.WAITS_S
    realtime_priority: int = 0  # SCHED_FIFO of the daemon and the generator (0: off)


# ------------------------------------------------------------------ measuring


def _probe_row(result: LiveResult) -> dict[str, Any]:
    overall = result.summary["overall"]
    return {
        "rate_scale": result.rate_scale,
        "offered_rps": overall["offered_rps"],
        "goodput_rps": overall["goodput_rps"],
        "slo_attainment": overall["slo_attainment"],
        "latency_p99_ms": overall.get("latency_p99_ms"),
        "fell_behind": result.fell_behind,
    }


def _latencies(result: LiveResult) -> np.ndarray:
    records = result.records
    latency = records.latency_ms[records.status == 200]
    return np.sort(latency[~np.isnan(latency)])


def measure(
    url: str,
    workload: Workload,
    targets: Sequence[ModelTarget],
    options: Options,
    *,
    system: str,
    label: str,
    startup_s: float,
) -> SystemResult:
    """Capacity search, then one run at the nominal rate for the CDF."""
    with fifo_while(options.realtime_priority, "--realtime-priority"):
        capacity, probes = find_live_capacity(
            url,
            workload,
            probe_duration_s=options.probe_duration_s,
            max_runs=options.max_probes,
            targets=targets,
            workers=options.workers,
        )
        cdf_scale = options.cdf_scale
        if options.cdf_fraction is not None and capacity.rate_scale is not None:
            cdf_scale = capacity.rate_scale * options.cdf_fraction
        cdf = asyncio.run(
            run_load(
                url,
                _short(workload, options),
                cdf_scale,
                targets=targets,
                workers=options.workers,
            )
        )
    rows = sorted((_probe_row(r) for r in probes.values()), key=lambda p: p["offered_rps"])
    return SystemResult(
        system=system,
        label=label,
        startup_s=startup_s,
        capacity_rps=capacity.capacity_rps,
        capacity_status=capacity.status,
        probes=rows,
        cdf_run={"rate_scale": cdf_scale, **cdf.summary, "generator": cdf.generator},
        latencies_ms=_latencies(cdf),
    )


def _short(workload: Workload, options: Options) -> Workload:
    import dataclasses

    return dataclasses.replace(workload, duration_s=float(options.probe_duration_s))


def free_port() -> int:
    from bench.peers.ray_serve_launcher import free_port as _free_port

    return _free_port()


def run_daemon(setup: Setup, workload: Workload, policy: str, options: Options) -> SystemResult:
    handle = start_daemon(
        setup.repository,
        free_port(),
        policy=policy,
        emulated_devices=setup.emulated_devices,
        cpu_slices=setup.cpu_slices,
        threads_per_slice=setup.cpu_threads,
        extra_env={"REALTIME_PRIORITY": str(options.realtime_priority)},
    )
    try:
        targets = asyncio.run(prepare_targets(handle.url, _short(workload, options)))
        return measure(
            handle.url,
            workload,
            targets,
            options,
            system=policy,
            label=f"daemon, policy {policy}",
            startup_s=handle.startup_s,
        )
    finally:
        stop_daemon(handle)


def ray_targets(setup: Setup, workload: Workload) -> list[ModelTarget]:
    index = load_repository(setup.repository)
    inputs = {
        name: [
            {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
            for spec in config.inputs
        ]
        for name, config in index.models.items()
    }
    return build_targets(workload, inputs)


def run_ray(
    setup: Setup, workload: Workload, options: Options, screen_scale: float
) -> SystemResult:
    from bench.peers.ray_grid import candidate_grid, pick_best, target_from_config
    from bench.peers.ray_serve_launcher import start_ray_serve
    from bench.peers.ray_serve_launcher import stop as stop_ray

    if setup.repository == BUNDLED_REPOSITORY:
        from app.repository.bundled import ensure_bundled_models

        ensure_bundled_models(setup.repository)  # the ONNX files are built on first use
    index = load_repository(setup.repository)
    names = [m.name for m in workload.models]
    grid = candidate_grid(
        [
            target_from_config(index.models[m.name], cpu_threads=setup.cpu_threads, slo_ms=m.slo_ms)
            for m in workload.models
        ],
        **({"waits_s": options.ray_waits_s} if options.ray_waits_s is not None else {}),
    )
    targets = ray_targets(setup, workload)

    def start(point: Any) -> Any:
        sizes = dict(point.max_batch_size)
        return start_ray_serve(
            setup.repository,
            free_port(),
            devices=setup.ray_devices,
            max_batch_size=sizes if len(sizes) > 1 else point.single_batch_size(),
            batch_wait_timeout_s=point.batch_wait_timeout_s,
            cpu_threads=setup.cpu_threads,
            models=names,
        )

    screened: list[tuple[Any, dict[str, Any]]] = []
    for point in grid:
        handle = start(point)
        try:
            result = asyncio.run(
                run_load(
                    handle.url,
                    _short(workload, options),
                    screen_scale,
                    targets=targets,
                    workers=options.workers,
                )
            )
        finally:
            stop_ray(handle)
        row = {**point.to_dict(), "startup_s": handle.startup_s, **_probe_row(result)}
        print(f"  ray grid {point.label}: {_fmt_row(row)}", file=sys.stderr)
        screened.append((point, {"overall": result.summary["overall"], **row}))
    best, _ = pick_best(screened)
    handle = start(best)
    try:
        measured = measure(
            handle.url,
            workload,
            targets,
            options,
            system="ray",
            label=f"Ray Serve, {best.label}",
            startup_s=handle.startup_s,
        )
    finally:
        stop_ray(handle)
    measured.grid = [{k: v for k, v in row.items() if k != "overall"} for _, row in screened]
    return measured


def _fmt_row(row: dict[str, Any]) -> str:
    return (
        f"offered {row['offered_rps']:.0f} r/s, goodput {row['goodput_rps']:.0f}, "
        f"within SLO {row['slo_attainment']:.2%}"
    )


# -------------------------------------------------------------------- output


def write_outputs(setup: Setup, workload: Workload, results: list[SystemResult], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "workload": str(setup.workload.relative_to(REPO_ROOT)),
        "repository": str(setup.repository.relative_to(REPO_ROOT)),
        "nominal_rps": workload.offered_rate(),
        "systems": [r.to_dict() for r in results],
    }
    (out / "results.json").write_text(json.dumps(sanitize(doc), indent=1) + "\n")
    table = markdown_table(results)
    (out / "summary.md").write_text(f"# {workload.name}\n\n{table}\n")
    plot(workload, results, out)
    return table


def markdown_table(results: Sequence[SystemResult]) -> str:
    ray = next((r for r in results if r.system == "ray"), None)
    lines = [
        "| system | capacity r/s (≥ 99 % within SLO) | vs Ray Serve | CDF run: offered r/s "
        "| p50 / p99 ms | within SLO | start-up s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = (
            f"{r.capacity_rps / ray.capacity_rps:.2f}×"
            if ray is not None and ray.capacity_rps > 0 and r is not ray
            else "—"
        )
        overall = r.cdf_run["overall"]
        p50, p99 = overall.get("latency_p50_ms"), overall.get("latency_p99_ms")
        latency = f"{p50:.1f} / {p99:.1f}" if p50 is not None and p99 is not None else "—"
        lines.append(
            f"| {r.label} | {r.capacity_rps:,.0f} ({r.capacity_status}) | {ratio} "
            f"| {overall['offered_rps']:,.0f} | {latency} "
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


# ----------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument(
        "--workload",
        nargs="+",
        default=["a", "b", "c"],
        choices=list(SETUPS),
        help="live workloads (a: emulated ResNet50, b: ONNX MLP, c: bursty mix, ceiling: ℓ(b) ≈ 0)",
    )
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, from {', '.join(SYSTEMS)}",
    )
    p.add_argument("--probe-duration", type=float, default=5.0, help="seconds per probe")
    p.add_argument("--max-probes", type=int, default=8, help="capacity probes per system")
    p.add_argument("--cdf-scale", type=float, default=1.0, help="rate scale of the CDF run")
    p.add_argument(
        "--cdf-fraction",
        type=float,
        default=None,
        help="run the CDF at this fraction of each system's own capacity instead",
    )
    p.add_argument(
        "--screen-scale",
        type=float,
        default=None,
        help="rate scale of Ray's grid screening (default: the daemon's capacity scale, else 1)",
    )
    p.add_argument("--workers", type=int, default=1, help="load-generator processes")
    p.add_argument(
        "--ray-waits",
        default=None,
        help="Ray Serve batch_wait_timeout values to try, in ms, comma-separated "
        "(default: 0,1,2,5)",
    )
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    p.add_argument(
        "--realtime-priority",
        type=int,
        default=0,
        metavar="N",
        help="SCHED_FIFO priority of the daemon (REALTIME_PRIORITY) and the generator "
        "(0: off; needs root or CAP_SYS_NICE)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        print(
            f"error: unknown systems {unknown}; choose from {', '.join(SYSTEMS)}", file=sys.stderr
        )
        return 2
    options = Options(
        args.probe_duration,
        args.max_probes,
        args.cdf_scale,
        args.cdf_fraction,
        args.screen_scale,
        args.workers,
        (tuple(float(v) / 1000.0 for v in args.ray_waits.split(",")) if args.ray_waits else None),
        args.realtime_priority,
    )
    try:
        check_permitted(args.realtime_priority, "--realtime-priority")
    except (ValueError, RealtimeUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for key in args.workload:
        setup = SETUPS[key]
        workload = load_workload(setup.workload)
        print(
            f"== workload ({key}) {workload.name}: nominal {workload.offered_rate():.0f} r/s",
            file=sys.stderr,
        )
        results: list[SystemResult] = []
        for system in systems:
            started = time.monotonic()
            if system == "ray":
                scale = options.screen_scale
                if scale is None:
                    ours = next((r for r in results if r.system == "symphony"), None)
                    scale = (
                        ours.capacity_rps / workload.offered_rate()
                        if ours is not None and ours.capacity_rps > 0
                        else 1.0
                    )
                result = run_ray(setup, workload, options, scale)
            else:
                result = run_daemon(setup, workload, system, options)
            results.append(result)
            print(
                f"  {result.label}: capacity {result.capacity_rps:,.0f} r/s "
                f"({result.capacity_status}; {time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
        table = write_outputs(setup, workload, results, args.out / workload.name)
        print(f"\n## ({key}) {workload.name}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
