"""Run a policy on a workload in the simulator and summarise the result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from app.scheduling.registry import make_scheduler
from app.simulation.engine import Trace, run_simulation
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
) -> SimResult:
    """Simulate `policy` (a registry name) on `workload`.

    Pass `arrivals` to run several policies on exactly the same sequence.
    """
    params = dict(params or {})
    models = workload.model_infos()
    devices = workload.device_infos()
    if arrivals is None:
        arrivals = generate_arrivals(workload, rate_scale)
    if policy in ("flex", "flex-np") and workload.preemption_delay_ms:
        params.setdefault("preemption_delay_ms", workload.preemption_delay_ms)
    scheduler = make_scheduler(policy, models, devices, **params)
    started = time.perf_counter()
    trace = run_simulation(
        scheduler,
        models,
        devices,
        arrivals.times,
        arrivals.model_index,
        jitter=workload.jitter,
        preemption_delay=workload.preemption_delay_ms / 1000.0,
        seed=workload.seed,
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
