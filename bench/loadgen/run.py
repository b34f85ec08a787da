"""One load-generator run: a workload's arrival schedule sent to a server,
split over the worker processes, and its measurements.

The send schedule is the workload's arrival sequence — the very one the
simulator replays (`generate_arrivals(workload, rate_scale)`) — so a live run
and a simulated run of one workload file compare field by field. Each request
times out at its model's SLO + `timeout_margin_ms` from its intended send
time; a run of more than `max_requests` arrivals is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload
from bench.loadgen.client import CLIENTS, ClientConfig, make_sender
from bench.loadgen.driver import RUN_GRACE_S, START_DELAY_S, Schedule, drive, run_limit
from bench.loadgen.errors import LoadGenError
from bench.loadgen.records import Records
from bench.loadgen.results import LiveResult, generator_stats, live_result
from bench.loadgen.targets import ModelTarget, check_loopback, prepare_targets
from bench.loadgen.variants import workload_variants
from bench.loadgen.workers import WorkerPlan, run_workers

DEFAULT_TIMEOUT_MARGIN_MS = 500.0
DEFAULT_MAX_REQUESTS = 500_000
DEFAULT_LAG_THRESHOLD_MS = 5.0
MAX_CONNECTIONS = 1024  # per worker

ProgressCallback = Callable[[int, int, int], None]  # (sent, done, total)


@dataclass(frozen=True)
class RequestVariants:
    """Several request bodies, and which one each request of a run sends
    (`body_index[i]` for the i-th arrival): for models whose execution time
    depends on the input, each request carries its own input (and application
    id) while the schedule stays the workload's."""

    bodies: Sequence[bytes]
    body_index: np.ndarray


async def run_load(
    url: str,
    workload: Workload,
    rate_scale: float = 1.0,
    *,
    duration_s: float | None = None,
    workers: int = 1,
    connections: int | None = None,
    timeout_margin_ms: float = DEFAULT_TIMEOUT_MARGIN_MS,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    devices: int | None = None,
    client: str = "raw",
    targets: Sequence[ModelTarget] | None = None,
    arrivals: Arrivals | None = None,
    progress: ProgressCallback | None = None,
    variants: RequestVariants | None = None,
) -> LiveResult:
    """Send `workload` (at `rate_scale`, for `duration_s` or the workload's
    duration) to the server at `url`, open loop; return the measurements.

    `targets` (from `prepare_targets`) skips the model checks; `arrivals`
    replaces the generated schedule (times in seconds from the start, as
    `generate_arrivals` makes them). `devices` is only the denominator of
    `device_busy_fraction` (default: the workload's device count).
    `progress(sent, done, total)` is called about ten times a second.
    `client` is the data-plane HTTP client: "raw" (pre-built request bytes
    on pooled keep-alive asyncio connections, the default) or "httpx".
    `variants` sends request i the body `variants.bodies[variants.body_index[i]]`
    instead of its model's one body (requests whose inputs differ).
    Raises LoadGenError (bad target/inputs) or RunFailed.
    """
    base = check_loopback(url)
    if workers < 1:
        raise LoadGenError(f"workers must be ≥ 1, got {workers}")
    if client not in CLIENTS:
        raise LoadGenError(f"client must be one of {CLIENTS}, got {client!r}")
    workload, arrivals = run_schedule(workload, rate_scale, duration_s, max_requests, arrivals)
    total = len(arrivals)
    if targets is None:
        targets = await prepare_targets(base, workload)
    if [t.name for t in targets] != [m.name for m in workload.models]:
        raise LoadGenError("targets do not match the workload's models")

    slo_ms = [t.slo_ms for t in targets]
    timeouts = [(s + timeout_margin_ms) / 1000.0 for s in slo_ms]
    limit = run_limit(workload.duration_s, timeouts)
    rate = total / workload.duration_s / workers if workload.duration_s else 0.0
    # In flight = rate × latency, and latency ≤ the timeout: enough connections
    # for that (up to MAX_CONNECTIONS), of which those for rate × 2·SLO are
    # opened before the start; the pool opens the others when needed.
    conns = connections or min(MAX_CONNECTIONS, max(32, math.ceil(rate * max(timeouts)) + 16))
    warm = min(conns, math.ceil(rate * max(slo_ms) / 1000.0 * 2.0) + 16)
    variants = _request_variants(variants, workload, arrivals, targets)
    config = ClientConfig(
        client=client,
        base_url=base,
        bodies=[t.body for t in targets] if variants is None else list(variants.bodies),
        paths=[t.path for t in targets] if variants is None else None,
        connections=conns,
        warm_connections=warm,
        timeout_s=max(timeouts) + RUN_GRACE_S,
    )
    schedules = [
        Schedule(
            intended=arrivals.times[w::workers].copy(),
            model_index=arrivals.model_index[w::workers].copy(),
            timeouts_s=timeouts,
            run_limit_s=limit,
            body_index=None if variants is None else variants.body_index[w::workers].copy(),
        )
        for w in range(workers)
    ]

    def cb(sent: int, done: int) -> None:
        if progress is not None:
            progress(sent, done, total)

    started = time.perf_counter()
    if workers == 1:
        sender = make_sender(config)
        try:
            await sender.warm(config.warm_connections)
            t0 = asyncio.get_running_loop().time() + START_DELAY_S
            parts = [await drive(schedules[0], t0, sender, cb if progress else None)]
        finally:
            await sender.aclose()
    else:
        plans = [WorkerPlan(config, schedule) for schedule in schedules]
        parts, t0 = await run_workers(plans, cb if progress else None)
    wall = time.perf_counter() - started
    records = Records.merge(parts)
    gen = generator_stats(records, lag_threshold_ms, workers, conns)
    gen["client"] = client
    n_devices = devices if devices is not None else len(workload.devices)
    names = [t.name for t in targets]
    return live_result(base, workload, rate_scale, records, names, slo_ms, n_devices, gen, wall)


def _request_variants(
    variants: RequestVariants | None,
    workload: Workload,
    arrivals: Arrivals,
    targets: Sequence[ModelTarget],
) -> RequestVariants | None:
    """The bodies of requests whose inputs differ: those given, or for
    dynamic models their app ids and per-application inputs (native API)."""
    if variants is None and all(t.path == "/infer" for t in targets):
        made = workload_variants(workload, arrivals, targets)
        variants = None if made is None else RequestVariants(*made)
    total = len(arrivals)
    if variants is not None and len(variants.body_index) != total:
        raise LoadGenError(
            f"variants name a body for {len(variants.body_index)} requests, the run has {total}"
        )
    return variants


def run_schedule(
    workload: Workload,
    rate_scale: float,
    duration_s: float | None,
    max_requests: int,
    arrivals: Arrivals | None = None,
) -> tuple[Workload, Arrivals]:
    """A run's workload (`duration_s` applied) and arrival schedule
    (`arrivals`, or the workload's at `rate_scale`), checked."""
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise LoadGenError(f"rate scale must be a positive number, got {rate_scale}")
    sized = [m.name for m in workload.models if m.items.sizes != (1,)]
    if sized:
        raise LoadGenError(
            f"the live load generator sends one-item requests; models {sized} have request "
            "sizes (items) other than 1: the simulator runs such a workload, this does not"
        )
    if duration_s is not None:
        if not (duration_s > 0 and math.isfinite(duration_s)):
            raise LoadGenError(f"duration must be a positive number of seconds, got {duration_s}")
        workload = dataclasses.replace(workload, duration_s=float(duration_s))
    if arrivals is None:
        arrivals = generate_arrivals(workload, rate_scale)
    if len(arrivals) > max_requests:
        raise LoadGenError(
            f"{len(arrivals)} requests at rate scale {rate_scale:g} over "
            f"{workload.duration_s:g} s exceed the limit of {max_requests} (--max-requests)"
        )
    return workload, arrivals
