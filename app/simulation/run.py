"""Run a policy on a workload in the simulator and summarise the result."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.scheduling.registry import make_scheduler
from app.simulation.engine import DROPPED, GOOD, LATE, Trace, run_simulation
from app.simulation.metrics import summarize_run
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload


@dataclass(frozen=True)
class ServingPath:
    """What the live daemon puts between a request and the scheduling core,
    for comparing a live run with the simulator on equal terms.

    `deadline_margin_ms`: the daemon's DEADLINE_MARGIN_MS — the core plans
    every request to finish this much before its SLO (requests are still
    judged at the SLO). `intake_delay_ms`: the mean of an exponential delay
    between a request's arrival (when its SLO starts) and the moment the
    core sees it — parsing and the event loop's queue, live.
    `dispatch_lead_ms`: the daemon's dispatcher runs the core this long
    before each of its timers (its TIMER_LEAD_MS, 2 ms by default),
    so a batch is formed that much before its planned start — from the
    requests that arrived by then. The core's control delay `d_ctrl`
    (symphony.txt §4.3) is that very gap, so it is modelled as `d_ctrl`."""

    deadline_margin_ms: float = 0.0
    intake_delay_ms: float = 0.0
    dispatch_lead_ms: float = 0.0

    def __post_init__(self) -> None:
        for name in (f.name for f in dataclasses.fields(self)):
            value = getattr(self, name)
            if not (value >= 0.0 and np.isfinite(value)):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {value}")

    @property
    def is_direct(self) -> bool:
        return self == ServingPath()


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
    serving: ServingPath | None = None,
) -> SimResult:
    """Simulate `policy` (a registry name) on `workload`.

    Pass `arrivals` to run several policies on exactly the same sequence;
    `serving` to model the live daemon's margin, intake delay and dispatch lead.
    """
    params = dict(params or {})
    serving = serving or ServingPath()
    if serving.dispatch_lead_ms:
        params.setdefault("d_ctrl", serving.dispatch_lead_ms / 1000.0)
    models = workload.model_infos()
    devices = workload.device_infos()
    if arrivals is None:
        arrivals = generate_arrivals(workload, rate_scale)
    if policy in ("flex", "flex-np") and workload.preemption_delay_ms:
        params.setdefault("preemption_delay_ms", workload.preemption_delay_ms)
    scheduler = make_scheduler(policy, models, devices, **params)
    started = time.perf_counter()
    slos = np.array([m.slo for m in models])
    deadlines = arrivals.times + slos[arrivals.model_index]
    # The core sees each request `seen` (its arrival plus the intake delay),
    # in that order, and plans for its deadline less the margin.
    seen = arrivals.times
    order = np.arange(seen.size)
    if serving.intake_delay_ms:
        rng = np.random.default_rng([workload.seed, 1])
        seen = seen + rng.exponential(serving.intake_delay_ms / 1000.0, seen.size)
        order = np.argsort(seen, kind="stable")
    trace = run_simulation(
        scheduler,
        models,
        devices,
        seen[order],
        arrivals.model_index[order],
        jitter=workload.jitter,
        preemption_delay=workload.preemption_delay_ms / 1000.0,
        seed=workload.seed,
        deadlines=deadlines[order] - serving.deadline_margin_ms / 1000.0,
    )
    if not serving.is_direct:
        trace = _judged_from_arrival(trace, order, arrivals.times, deadlines)
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


def _judged_from_arrival(
    trace: Trace, order: np.ndarray, arrival: np.ndarray, deadline: np.ndarray
) -> Trace:
    """`trace` (requests in the order the core saw them) back in arrival
    order, timed from each request's arrival and judged at its SLO."""
    back = np.empty_like(order)
    back[order] = np.arange(order.size)
    finish = trace.finish[back]
    status = trace.status[back].copy()
    served = status != DROPPED
    status[served] = np.where(finish[served] <= deadline[served], GOOD, LATE)
    return dataclasses.replace(
        trace,
        arrival=np.asarray(arrival, dtype=float),
        deadline=deadline,
        model_index=trace.model_index[back],
        status=status,
        finish=finish,
        start=trace.start[back],
        batch_size=trace.batch_size[back],
        drop_reason=trace.drop_reason[back],
    )
