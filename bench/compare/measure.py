"""Measuring one system on one workload: its capacity by bisection over short
open-loop runs of `bench.loadgen`, then one run for the latency CDF."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.runtime.realtime import fifo_while
from app.workloads.spec import Workload
from bench.compare.setups import Setup
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen import LiveResult, ModelTarget, find_live_capacity, prepare_targets, run_load
from bench.loadgen.capacity import wait_drained
from bench.progress import say


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
    grid: list[dict[str, Any]] = field(default_factory=list)  # peers: the screening
    # --cpu-rates: CPU ms per answered request at fixed rates (bench.cpu_per_request)
    cpu_per_request: list[dict[str, Any]] = field(default_factory=list)

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
            "cpu_per_request": self.cpu_per_request,
        }


@dataclass(frozen=True)
class Options:
    probe_duration_s: float
    max_probes: int
    cdf_scale: float
    cdf_fraction: float | None  # CDF run at this fraction of the system's capacity
    workers: int
    screen_probes: int = 4  # capacity probes per peer grid point
    ray_waits_s: tuple[float, ...] | None = None  # None: ray_grid.WAITS_S
    triton_delays_us: tuple[int, ...] | None = None  # None: triton_grid.DELAYS_US
    # Triton's and Ray Serve's model placements to try (None: peers.placements_for).
    placements: tuple[str, ...] | None = None
    realtime_priority: int = 0  # SCHED_FIFO of the daemon and the generator (0: off)
    cpu_rates: tuple[float, ...] = ()  # offered r/s of the CPU-per-request probes (none: off)


def probe_row(result: LiveResult) -> dict[str, Any]:
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


def short(workload: Workload, options: Options) -> Workload:
    """The workload cut to one probe's duration."""
    return dataclasses.replace(workload, duration_s=float(options.probe_duration_s))


# Before a search, a short run at a fraction of the nominal rate, not counted:
# a server's first requests pay one-off costs (a peer's backend stubs and
# first batches, connections), which would fail the first probe of any system.
WARM_UP_S = 2.0
WARM_UP_SCALE = 0.25


def capacity_search(
    url: str,
    workload: Workload,
    targets: Sequence[ModelTarget],
    options: Options,
    max_probes: int,
) -> tuple[Any, list[dict[str, Any]]]:
    """A warm-up run, then the bisection: (CapacityResult, probe rows sorted
    by offered load)."""
    warm = dataclasses.replace(workload, duration_s=min(WARM_UP_S, options.probe_duration_s))
    say(f"warm-up run ({warm.duration_s:g} s)")
    asyncio.run(run_load(url, warm, WARM_UP_SCALE, targets=targets, workers=options.workers))
    count = iter(range(1, max_probes + 1))

    def on_probe(scale: float) -> None:
        say(
            f"capacity probe {next(count)} of at most {max_probes}: "
            f"{workload.offered_rate() * scale:,.0f} r/s offered, "
            f"{options.probe_duration_s:g} s"
        )

    capacity, probes = find_live_capacity(
        url,
        workload,
        probe_duration_s=options.probe_duration_s,
        max_runs=max_probes,
        targets=targets,
        workers=options.workers,
        on_probe=on_probe,
    )
    rows = sorted((probe_row(r) for r in probes.values()), key=lambda p: p["offered_rps"])
    return capacity, rows


def measure(
    url: str,
    workload: Workload,
    targets: Sequence[ModelTarget],
    options: Options,
    *,
    system: str,
    label: str,
    startup_s: float,
    pid: int | None = None,
) -> SystemResult:
    """Capacity search, then one run at the nominal rate (or at
    `cdf_fraction` of the capacity) for the CDF; with `options.cpu_rates`,
    the CPU of the process tree under `pid` per answered request at each."""
    with fifo_while(options.realtime_priority, "--realtime-priority"):
        capacity, rows = capacity_search(url, workload, targets, options, options.max_probes)
        cdf_scale = options.cdf_scale
        if options.cdf_fraction is not None and capacity.rate_scale is not None:
            cdf_scale = capacity.rate_scale * options.cdf_fraction
        wait_drained(url, targets)  # the last probe may have left a backlog
        say(f"latency CDF run at ×{cdf_scale:.3g}")
        cdf = asyncio.run(
            run_load(
                url, short(workload, options), cdf_scale, targets=targets, workers=options.workers
            )
        )
    cpu_rows = []
    if options.cpu_rates and pid is not None:
        from bench.cpu_per_request import cpu_probes

        cpu_rows = cpu_probes(
            url, pid, workload, targets, options.cpu_rates, options.probe_duration_s
        )
    return SystemResult(
        system=system,
        label=label,
        startup_s=startup_s,
        capacity_rps=capacity.capacity_rps,
        capacity_status=capacity.status,
        probes=rows,
        cdf_run={"rate_scale": cdf_scale, **cdf.summary, "generator": cdf.generator},
        latencies_ms=_latencies(cdf),
        cpu_per_request=cpu_rows,
    )


def run_daemon(setup: Setup, workload: Workload, policy: str, options: Options) -> SystemResult:
    """The daemon with `policy` on the setup's devices."""
    # The bundled repository also holds emulated models, which a CPU setup has
    # no device for: the daemon serves the others (the workload's).
    cpu_only = {"EXIT_ON_ERROR": "0", "STRICT_READINESS": "0"} if not setup.emulated_devices else {}
    say("starting the daemon")
    handle = start_daemon(
        setup.repository,
        free_port(),
        policy=policy,
        emulated_devices=setup.emulated_devices,
        cpu_slices=setup.cpu_slices,
        threads_per_slice=setup.cpu_threads,
        extra_env={
            "REALTIME_PRIORITY": str(options.realtime_priority),
            **cpu_only,
        },
    )
    try:
        targets = asyncio.run(prepare_targets(handle.url, short(workload, options)))
        return measure(
            handle.url,
            workload,
            targets,
            options,
            system=policy,
            label=f"daemon, policy {policy}",
            startup_s=handle.startup_s,
            pid=handle.process.pid,
        )
    finally:
        stop_daemon(handle)
