"""Run a policy on a workload in the simulator and summarise the result."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.scheduling.registry import make_scheduler
from app.simulation.engine import DeviceFault, Trace, run_simulation
from app.simulation.metrics import summarize_run
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload


@dataclass
class SimResult:
    policy: str
    params: dict[str, Any]
    rate_scale: float
    summary: dict[str, Any]  # {"overall": {...}, "models": {name: {...}}}
    autoscale: dict[str, Any]
    wall_s: float
    trace: Trace = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        requests = self.summary["overall"]["requests"]
        return {
            "policy": self.policy,
            "params": self.params,
            "rate_scale": self.rate_scale,
            **self.summary,
            "autoscale": self.autoscale,
            "wall_s": self.wall_s,
            "simulated_requests_per_wall_s": requests / self.wall_s if self.wall_s > 0 else None,
        }

    @property
    def attainment(self) -> float:
        return self.summary["overall"]["slo_attainment"]

    @property
    def goodput(self) -> float:
        return self.summary["overall"]["goodput_rps"]


def simulate(
    workload: Workload,
    policy: str,
    params: dict[str, Any] | None = None,
    *,
    rate_scale: float = 1.0,
    arrivals: Arrivals | None = None,
    intake_delay_ms: float = 0.0,
    faults: Sequence[DeviceFault] = (),
) -> SimResult:
    """Simulate `policy` (a registry name) with its options `params` on
    `workload`.

    Pass `arrivals` to run several policies on exactly the same sequence.
    The live serving path's slack is the core's own options, in `params` as
    the daemon passes them: `deadline_margin` and `timer_lead` (seconds; the
    daemon's DEADLINE_MARGIN_MS and TIMER_LEAD_MS). What only the live path
    has is modelled here: `intake_delay_ms`, the mean of an exponential delay
    between a request's arrival (its SLO starts there) and the moment the
    core sees it — parsing and the event loop's queue. `faults` script
    device failures and returns. Input-dependent models run each batch from
    the arrivals' work and feed the simulated profiler
    (`workload.profile_sample_rate`; app/simulation/engine.py).
    """
    if not (intake_delay_ms >= 0.0 and math.isfinite(intake_delay_ms)):
        raise ValueError(f"intake_delay_ms must be a finite number ≥ 0, got {intake_delay_ms}")
    params = dict(params or {})
    models = workload.model_infos()
    devices = workload.device_infos()
    if arrivals is None:
        arrivals = generate_arrivals(workload, rate_scale)
    if policy in ("flex", "flex-np") and workload.preemption_delay_ms:
        params.setdefault("preemption_delay_ms", workload.preemption_delay_ms)
    scheduler = make_scheduler(policy, models, devices, **params)
    dynamic = any(m.dynamic is not None for m in models)
    started = time.perf_counter()
    seen = None
    if intake_delay_ms:
        rng = np.random.default_rng([workload.seed, 1])
        seen = arrivals.times + rng.exponential(intake_delay_ms / 1000.0, arrivals.times.size)
    trace = run_simulation(
        scheduler,
        models,
        devices,
        arrivals.times,
        arrivals.model_index,
        jitter=workload.jitter,
        preemption_delay=workload.preemption_delay_ms / 1000.0,
        seed=workload.seed,
        seen_times=seen,
        faults=faults,
        items=arrivals.items,
        # Applications and work matter to input-dependent models only; a
        # static workload keeps the plain path.
        apps=arrivals.apps if dynamic else None,
        work=arrivals.work if dynamic else None,
        profile_sample_rate=workload.profile_sample_rate,
    )
    wall_s = time.perf_counter() - started
    signals = scheduler.signals(trace.end_time)
    autoscale = {
        "window_s": signals.window_s,
        "bad_rate": signals.bad_rate,
        "idle_fraction": signals.idle_fraction,
        "advised_device_change": signals.advised_device_change,
    }
    summary = summarize_run(trace, models, workload.duration_s, len(devices))
    return SimResult(policy, params, rate_scale, summary, autoscale, wall_s, trace)
