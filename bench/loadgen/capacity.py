"""Live capacity: the highest offered load with ≥ `target` (99 %) of
requests within SLO, by bisection over short runs (`probe_duration_s`, 5 s),
reusing the simulator's `find_capacity`. `search_capacity` takes any probe
runner, so `bench.inprocess` searches its service the same way.

Before each probe the server must have drained the previous one
(`wait_drained`): a server that queues without bound (Triton with no queue
timeout, BentoML, Ray Serve) is still working through an overloaded probe's
backlog when the next one starts, and a fixed pause would charge that backlog
to the next, lower rate. One request of each model answered within its SLO
says the queues are empty.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from app.simulation.capacity_search import CapacityResult, find_capacity
from app.workloads.spec import Workload
from bench.loadgen.results import LiveResult
from bench.loadgen.run import DEFAULT_MAX_REQUESTS, ProgressCallback, run_load
from bench.loadgen.targets import ModelTarget, prepare_targets

DEFAULT_PROBE_DURATION_S = 5.0
DRAIN_TIMEOUT_S = 30.0  # the longest wait for a server to drain before a probe


def wait_drained(
    url: str,
    targets: Sequence[ModelTarget],
    *,
    timeout_s: float = DRAIN_TIMEOUT_S,
    client: httpx.Client | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> float | None:
    """Send one request of each target, in turn, until a round comes back
    with every answer within its SLO: the server holds no backlog. Returns
    the seconds it took, or None when `timeout_s` passed first (the probe
    then runs anyway)."""
    own = client is None
    http = client or httpx.Client(base_url=url, timeout=timeout_s)
    started = clock()
    try:
        while True:
            drained = True
            for target in targets:
                left = timeout_s - (clock() - started)
                if left <= 0:
                    return None
                sent = clock()
                try:
                    # A hung server holds no request past the timeout.
                    http.post(
                        target.path,
                        content=target.body,
                        headers={"content-type": "application/json"},
                        timeout=left,
                    )
                except httpx.HTTPError:
                    drained = False
                    continue
                if (clock() - sent) * 1000.0 > target.slo_ms:
                    drained = False
            if drained:
                return clock() - started
            if clock() - started >= timeout_s:
                return None
            pause(0.1)
    finally:
        if own:
            http.close()


def find_live_capacity(
    url: str,
    workload: Workload,
    *,
    target: float = 0.99,
    lo: float = 0.5,
    hi: float = 1.0,
    rel_tol: float = 0.05,
    max_runs: int = 12,
    probe_duration_s: float | None = DEFAULT_PROBE_DURATION_S,
    settle_s: float = 0.5,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    targets: Sequence[ModelTarget] | None = None,
    on_probe: Callable[[float], ProgressCallback | None] | None = None,
    **run_kwargs: Any,
) -> tuple[CapacityResult, dict[float, LiveResult]]:
    """Highest rate scale with overall SLO attainment ≥ `target`, by bisection
    over short live runs (`find_capacity` of the simulator). Synchronous: each
    probe is an `asyncio.run(run_load(...))`; from async code call it through
    `asyncio.to_thread`. Returns the search and every probe's LiveResult by
    scale. Each probe first waits for the server to drain, at most
    `drain_timeout_s` (`wait_drained`). `on_probe(scale)` may return a
    progress callback for that probe; `run_kwargs` go to every `run_load`
    (workers, client, ...)."""
    if targets is None:
        targets = asyncio.run(prepare_targets(url, probe_workload(workload, probe_duration_s)))

    def run_probe(short: Workload, scale: float, progress: ProgressCallback | None) -> LiveResult:
        run = run_load(
            url,
            short,
            scale,
            targets=targets,
            max_requests=max_requests,
            progress=progress,
            **run_kwargs,
        )
        return asyncio.run(run)

    return search_capacity(
        run_probe,
        workload,
        drain=lambda: wait_drained(url, targets, timeout_s=drain_timeout_s),
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


def probe_workload(workload: Workload, probe_duration_s: float | None) -> Workload:
    """`workload` cut to the length of one capacity probe (None: its own)."""
    duration = probe_duration_s or workload.duration_s
    return dataclasses.replace(workload, duration_s=float(duration))


ProbeRunner = Callable[[Workload, float, ProgressCallback | None], LiveResult]


def search_capacity(
    run_probe: ProbeRunner,
    workload: Workload,
    *,
    target: float,
    lo: float,
    hi: float,
    rel_tol: float,
    max_runs: int,
    probe_duration_s: float | None,
    settle_s: float,
    max_requests: int,
    on_probe: Callable[[float], ProgressCallback | None] | None,
    drain: Callable[[], object] | None = None,
) -> tuple[CapacityResult, dict[float, LiveResult]]:
    """The simulator's `find_capacity` over live probes: `run_probe(short,
    scale, progress)` runs `short` (the workload cut to one probe) at a rate
    scale, synchronously. Each probe waits `settle_s`, then for `drain()`
    (the server's backlog gone, `wait_drained`) first; no rate scale
    whose probe would exceed `max_requests` is tried. Returns the search and
    every probe's LiveResult by scale."""
    short = probe_workload(workload, probe_duration_s)
    results: dict[float, LiveResult] = {}

    def probe(scale: float) -> LiveResult:
        time.sleep(settle_s)  # let the server drain the previous probe
        if drain is not None:
            drain()
        progress = on_probe(scale) if on_probe is not None else None
        results[scale] = run_probe(short, scale, progress)
        return results[scale]

    nominal = short.offered_rate() * short.duration_s
    max_scale = 1024.0 if nominal <= 0 else max(hi, min(1024.0, max_requests / nominal / 1.2))
    capacity = find_capacity(
        probe,  # type: ignore[arg-type]  # LiveResult has the .summary find_capacity reads
        target=target,
        lo=min(lo, max_scale),
        hi=min(hi, max_scale),
        rel_tol=rel_tol,
        max_runs=max_runs,
        max_scale=max_scale,
        min_scale=min(1.0 / 1024, lo),
    )
    return capacity, results
