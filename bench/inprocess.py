"""Live runs without HTTP: the daemon's service driven from its own process.

    python -m bench.inprocess --workload FILE [--rate-scale X] [--duration S]
        [--repository DIR] [--emulated-devices N] [--policy NAME]
        [--deadline-margin-ms MS] [--timer-lead-ms MS] [--realtime-priority N]
        [--capacity] [--probe-duration S] [--json] [--plot out.png] [-q]

symphony.txt §5.1 runs its system two ways: "scheduler-only (s) runs only the
scheduler and the load generator sends requests in the same process", and
end-to-end (e) with frontends, backends and load generators apart; the two
agree, which is how it shows the scheduler predicts the end-to-end result.
This is (s) for this daemon: everything `python -m app serve` runs — the model
repository, one executor process per device, the shared-memory arenas, the
dispatcher and the scheduling core, on uvloop as under uvicorn — without the
HTTP layer. At each send time of the workload's arrival schedule (the one
`bench.loadgen` and the simulator replay) the generator calls the service's
`infer` in the same process and event loop.

So one workload measured three ways splits where capacity goes: against
`bench.simulate` (no serving path at all) this shows what the live core,
executors, pipes and timers cost; against `bench.loadgen` on the daemon, what
the HTTP layer costs.

Measured and reported like `bench.loadgen` (the same outcomes, JSON document
and table; `url` is "in-process"): latency runs from the intended send time to
the return of `infer`, and the core is given the actual send time as the
request's arrival (the HTTP daemon stamps the first byte's arrival). A dropped
request is the service's error, recorded with its status and reason as the
HTTP API would answer it. Usage errors exit 2, a failed run 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import ServingError
from app.repository.config import ModelConfig
from app.runtime.realtime import RealtimeUnavailable, check_permitted
from app.scheduling.registry import policy_names
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from app.simulation.capacity_search import CapacityResult
from app.workloads.spec import Workload
from bench import cli
from bench.cli import UsageError
from bench.loadgen.capacity import DEFAULT_PROBE_DURATION_S, search_capacity
from bench.loadgen.client import Reply
from bench.loadgen.command_line import (
    add_run_options,
    progress_bars,
    read_run_args,
    search_options,
)
from bench.loadgen.driver import START_DELAY_S, Schedule, drive, run_limit
from bench.loadgen.errors import LoadGenError, RunFailed
from bench.loadgen.report import report_run
from bench.loadgen.results import LiveResult, generator_stats, live_result
from bench.loadgen.run import (
    DEFAULT_LAG_THRESHOLD_MS,
    DEFAULT_MAX_REQUESTS,
    DEFAULT_TIMEOUT_MARGIN_MS,
    ProgressCallback,
    run_schedule,
)

IN_PROCESS = "in-process"
DEFAULT_REPOSITORY = Path(__file__).resolve().parent / "repositories" / "live"


# --------------------------------------------------------------------------- the service


def service_settings(
    repository: Path,
    emulated_devices: int,
    *,
    policy: str | None = None,
    deadline_margin_ms: float | None = None,
    timer_lead_ms: float | None = None,
    realtime_priority: int | None = None,
) -> Settings:
    """The daemon's settings (environment variables included, as under
    `python -m app serve`) with these overrides. The priority goes in as
    REALTIME_PRIORITY, so the slack defaults that follow from it do too."""
    env = dict(os.environ)
    if realtime_priority is not None:
        env["REALTIME_PRIORITY"] = str(realtime_priority)
    given = {
        "policy": policy,
        "deadline_margin_ms": deadline_margin_ms,
        "timer_lead_ms": timer_lead_ms,
    }
    return dataclasses.replace(
        Settings.from_env(env),
        repository=Path(repository),
        emulated_devices=emulated_devices,
        **{name: value for name, value in given.items() if value is not None},
    )


@contextlib.asynccontextmanager
async def running_service(settings: Settings) -> AsyncIterator[LiveService]:
    """A started LiveService (executor processes and all), stopped on exit."""
    service = LiveService(settings, Metrics(settings.metrics_prefix))
    try:
        await service.start()
        yield service
    finally:
        await service.stop()


def request_inputs(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """One request's inputs (batch dimension 1): random floats in [-1, 1),
    small random integers, random booleans — as bench.loadgen sends them."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in config.inputs:
        shape = (1, *(max(int(d), 1) for d in spec.item_shape))
        kind = spec.dtype.kind  # the repository's datatypes: floats, integers, BOOL
        if kind == "f":
            inputs[spec.name] = rng.uniform(-1.0, 1.0, shape).astype(spec.dtype)
        elif kind == "b":
            inputs[spec.name] = rng.random(shape) < 0.5
        else:
            inputs[spec.name] = rng.integers(0, 10, shape).astype(spec.dtype)
    return inputs


class ServiceSender:
    """The driver's sender (`bench.loadgen.driver.drive`) that calls
    `service.infer` instead of a server. The reply carries what the HTTP API
    would: the timing of a result (as a dict: no JSON to write and parse back
    on the loop being measured), or the status and reason of an error."""

    def __init__(
        self,
        service: LiveService,
        names: Sequence[str],
        inputs: Sequence[dict[str, np.ndarray]],
        slo_ms: Sequence[float],
    ) -> None:
        self.service = service
        self.names = list(names)
        self.inputs = list(inputs)
        self.slo_ms = list(slo_ms)

    async def send(self, m: int, on_sent: Callable[[], None]) -> Reply:
        on_sent()
        try:
            result = await self.service.infer(
                self.names[m],
                self.inputs[m],
                slo_ms=self.slo_ms[m],
                received_at=time.monotonic(),
            )
        except ServingError as exc:
            end = time.monotonic()
            return Reply(exc.status, json.dumps({"reason": exc.reason}).encode(), end)
        return Reply(200, b"", time.monotonic(), result.timing())


# --------------------------------------------------------------------------- runs


async def run_inprocess(
    service: LiveService,
    workload: Workload,
    rate_scale: float = 1.0,
    *,
    duration_s: float | None = None,
    timeout_margin_ms: float = DEFAULT_TIMEOUT_MARGIN_MS,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    progress: ProgressCallback | None = None,
) -> LiveResult:
    """Send `workload` (at `rate_scale`, for `duration_s` or the workload's
    duration) to `service`, open loop, on the running loop; the measurements
    as `bench.loadgen.run_load` returns them. Raises LoadGenError when the
    service does not serve a model of the workload."""
    workload, arrivals = run_schedule(workload, rate_scale, duration_s, max_requests)
    total = len(arrivals)
    names = [m.name for m in workload.models]
    served = service.model_names()
    missing = [name for name in names if name not in served]
    if missing:
        raise LoadGenError(
            f"model(s) {', '.join(missing)} of the workload are not served "
            f"(served: {', '.join(served) or 'none'})"
        )
    slo_ms = [m.slo_ms for m in workload.models]
    inputs = [request_inputs(service.model_config(name), seed=k) for k, name in enumerate(names)]
    timeouts = [(s + timeout_margin_ms) / 1000.0 for s in slo_ms]
    schedule = Schedule(
        intended=arrivals.times.copy(),
        model_index=arrivals.model_index.copy(),
        timeouts_s=timeouts,
        run_limit_s=run_limit(workload.duration_s, timeouts),
    )

    def report(sent: int, done: int) -> None:
        if progress is not None:
            progress(sent, done, total)

    sender = ServiceSender(service, names, inputs, slo_ms)
    started = time.perf_counter()
    # time.monotonic(), not the loop's clock: uvloop's counts whole milliseconds.
    t0 = time.monotonic() + START_DELAY_S
    records = await drive(schedule, t0, sender, report if progress else None, clock=time.monotonic)
    wall = time.perf_counter() - started
    gen = generator_stats(records, lag_threshold_ms, 1, 0)
    gen["client"] = IN_PROCESS
    devices = len(workload.devices)
    return live_result(IN_PROCESS, workload, rate_scale, records, names, slo_ms, devices, gen, wall)


async def find_inprocess_capacity(
    service: LiveService,
    workload: Workload,
    *,
    target: float = 0.99,
    lo: float = 0.5,
    hi: float = 1.0,
    rel_tol: float = 0.05,
    max_runs: int = 12,
    probe_duration_s: float | None = DEFAULT_PROBE_DURATION_S,
    settle_s: float = 0.5,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    on_probe: Callable[[float], ProgressCallback | None] | None = None,
    **run_kwargs: Any,
) -> tuple[CapacityResult, dict[float, LiveResult]]:
    """`bench.loadgen.find_live_capacity` against `service`: the simulator's
    bisection (`find_capacity`, synchronous) runs in a thread and each probe
    on this loop, so the service stays up across probes."""
    loop = asyncio.get_running_loop()

    def run_probe(short: Workload, scale: float, progress: ProgressCallback | None) -> LiveResult:
        run = run_inprocess(
            service, short, scale, max_requests=max_requests, progress=progress, **run_kwargs
        )
        return asyncio.run_coroutine_threadsafe(run, loop).result()

    return await asyncio.to_thread(
        search_capacity,
        run_probe,
        workload,
        target=target,
        lo=lo,
        hi=hi,
        rel_tol=rel_tol,
        max_runs=max_runs,
        probe_duration_s=probe_duration_s,
        settle_s=settle_s,
        max_requests=max_requests,
        on_probe=on_probe,
    )


def run_on_daemon_loop(main: Callable[[], Any]) -> Any:
    """Run coroutine function `main` on uvloop when installed (the daemon's
    loop under uvicorn), else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.run(main())
    return uvloop.run(main())


def server_block(service: LiveService) -> dict[str, Any]:
    """The `server` block of the JSON document: what was measured."""
    settings = service.settings
    return {
        "name": "deadline-serve",
        "mode": IN_PROCESS,
        "policy": settings.policy,
        "deadline_margin_ms": settings.deadline_margin_ms,
        "timer_lead_ms": settings.timer_lead_ms,
        "realtime_priority": settings.realtime_priority,
        "devices": [device.name for device in service.devices],
    }


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.inprocess",
        description="Open-loop load on the daemon's service in this process, without HTTP "
        "(symphony.txt §5.1 'scheduler-only'); output as bench.loadgen's.",
    )
    cli.add_workload_options(p)
    p.add_argument(
        "--repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        metavar="DIR",
        help="model repository (default: bench/repositories/live)",
    )
    p.add_argument(
        "--emulated-devices",
        type=int,
        metavar="N",
        help="emulated devices (default: the workload's device count)",
    )
    p.add_argument("--policy", help="scheduling policy (default: POLICY or symphony)")
    p.add_argument(
        "--deadline-margin-ms",
        type=float,
        metavar="MS",
        help="the daemon's DEADLINE_MARGIN_MS (default: its setting)",
    )
    p.add_argument(
        "--timer-lead-ms",
        type=float,
        metavar="MS",
        help="the daemon's TIMER_LEAD_MS (default: its setting)",
    )
    add_run_options(
        p,
        what="the service's capacity",
        realtime_what="the service's event loop, which the generator shares (executors one below)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    # A ServingError here is the service failing to start (an executor died).
    return cli.run_main(
        _main, argv, usage_errors=(LoadGenError,), run_errors=(RunFailed, ServingError)
    )


def _main(argv: list[str] | None, err: Any) -> int:
    args = build_parser().parse_args(argv)
    for name in ("deadline_margin_ms", "timer_lead_ms"):
        value = getattr(args, name)
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise UsageError(f"--{name.replace('_', '-')} must be ≥ 0, got {value}")
    if args.policy is not None and args.policy not in policy_names():
        raise UsageError(f"--policy must be one of {', '.join(policy_names())}")
    if not args.repository.is_dir():
        raise UsageError(f"--repository: no such directory: {args.repository}")
    path, workload = read_run_args(args)
    devices = args.emulated_devices if args.emulated_devices is not None else len(workload.devices)
    if devices < 1:
        raise UsageError(f"--emulated-devices must be ≥ 1, got {devices}")
    try:
        settings = service_settings(
            args.repository,
            devices,
            policy=args.policy,
            deadline_margin_ms=args.deadline_margin_ms,
            timer_lead_ms=args.timer_lead_ms,
            realtime_priority=args.realtime_priority or None,
        )
        check_permitted(settings.realtime_priority, "--realtime-priority")
    except ValueError as exc:  # the daemon's environment variables (POLICY, ...)
        raise UsageError(str(exc)) from None
    except RealtimeUnavailable as exc:
        raise UsageError(str(exc)) from None
    progress, bar = progress_bars(err, args.quiet)
    common = {
        "timeout_margin_ms": args.timeout_margin_ms,
        "lag_threshold_ms": args.lag_threshold_ms,
        "max_requests": args.max_requests,
    }

    async def measure() -> tuple[LiveResult, Any, Any, dict[str, Any]]:
        async with running_service(settings) as service:
            result = await run_inprocess(
                service,
                workload,
                args.rate_scale,
                progress=bar(f"{workload.name} ×{args.rate_scale:g} (in-process)"),
                **common,
            )
            capacity = probes = None
            if args.capacity:
                capacity, probes = await find_inprocess_capacity(
                    service,
                    workload,
                    **search_options(args, bar),
                    **common,
                )
            return result, capacity, probes, server_block(service)

    # The service logs its start-up at INFO; here only warnings matter.
    logging.getLogger("app").setLevel(logging.WARNING)
    with progress:
        result, capacity, probes, server = run_on_daemon_loop(measure)
    report_run(args, err, workload, path, result, capacity, probes, server)
    return 0


if __name__ == "__main__":
    # The canonical module's main, so that what crosses to the executor
    # processes pickles as bench.inprocess.*, not __main__.*.
    from bench import inprocess as _canonical

    sys.exit(_canonical.main())
