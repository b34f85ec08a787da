"""A workload served by several serving groups, each its own scheduling core
over its own devices and models (Shepherd's FLEX per HERD group,
shepherd-nsdi23.txt §3.2: "schedulers per serving group ... serve requests
across streams within each serving group independently").

Groups share nothing, so each runs as its own simulation on the arrivals of
its models (the request router's job: a request goes to the group holding
its model), and the outcomes are summed. Every workload model must be in
exactly one group and every device in at most one: a request then reaches
exactly one core, and is answered there exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.results import Outcome
from app.scheduling.base import Scheduler
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.simulation.engine import Trace, run_simulation
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload


@dataclass(frozen=True)
class GroupSpec:
    devices: tuple[int, ...]  # indices into the workload's devices
    models: tuple[str, ...]  # names of the workload's models


@dataclass
class GroupRun:
    spec: GroupSpec
    core: Scheduler = field(repr=False)
    trace: Trace = field(repr=False)
    model_index: np.ndarray = field(repr=False)  # the group's request → workload model index


@dataclass
class GroupedResult:
    groups: list[GroupRun]
    summary: dict[str, Any]  # {"overall": {...}, "models": {name: {...}}}

    @property
    def goodput(self) -> float:
        return float(self.summary["overall"]["goodput_rps"])


def check_groups(workload: Workload, groups: Sequence[GroupSpec]) -> None:
    """Raise ValueError unless every model is in exactly one group and every
    device in at most one, each group with a device and a model."""
    names = [m.name for m in workload.models]
    seen_models: dict[str, int] = {}
    seen_devices: dict[int, int] = {}
    for j, g in enumerate(groups):
        if not g.devices or not g.models:
            raise ValueError(f"group {j} needs at least one device and one model")
        for m in g.models:
            if m not in names:
                raise ValueError(f"group {j}: unknown model {m!r}")
            if m in seen_models:
                raise ValueError(f"model {m!r} is in groups {seen_models[m]} and {j}")
            seen_models[m] = j
        for d in g.devices:
            if not 0 <= d < len(workload.devices):
                raise ValueError(f"group {j}: no device {d} ({len(workload.devices)} devices)")
            if d in seen_devices:
                raise ValueError(f"device {d} is in groups {seen_devices[d]} and {j}")
            seen_devices[d] = j
    missing = [n for n in names if n not in seen_models]
    if missing:
        raise ValueError(f"models in no group: {missing}")


def simulate_groups(
    workload: Workload,
    groups: Sequence[GroupSpec],
    policy: str = "flex",
    params: dict[str, Any] | None = None,
    *,
    arrivals: Arrivals | None = None,
) -> GroupedResult:
    """One `policy` core per group on its devices and models; outcomes summed.
    Pass `arrivals` to serve the same sequence with several groupings."""
    check_groups(workload, groups)
    if arrivals is None:
        arrivals = generate_arrivals(workload)
    infos = workload.model_infos()
    all_devices = workload.device_infos()
    names = [m.name for m in workload.models]
    n = len(names)
    good = np.zeros(n, dtype=np.int64)
    late = np.zeros(n, dtype=np.int64)
    runs = []
    for g in groups:
        order = np.array(sorted(names.index(m) for m in g.models))
        keep = np.isin(arrivals.model_index, order)
        local = np.searchsorted(order, arrivals.model_index[keep]).astype(np.int32)
        models = [infos[i] for i in order]
        devices = [
            DeviceInfo(k, all_devices[d].name, all_devices[d].speed, all_devices[d].kind)
            for k, d in enumerate(g.devices)
        ]
        core = make_scheduler(policy, models, devices, **dict(params or {}))
        trace = run_simulation(
            core,
            models,
            devices,
            arrivals.times[keep],
            local,
            jitter=workload.jitter,
            preemption_delay=workload.preemption_delay_ms / 1000.0,
            seed=workload.seed,
        )
        for j, i in enumerate(order):
            mine = trace.model_index == j
            good[i] += int((trace.status[mine] == Outcome.GOOD).sum())
            late[i] += int((trace.status[mine] == Outcome.LATE).sum())
        runs.append(GroupRun(g, core, trace, order[local]))
    offered = arrivals.counts(n)
    duration = workload.duration_s
    total = int(offered.sum())
    served = int(good.sum())
    models_out = {
        name: {
            "offered": int(offered[i]),
            "good": int(good[i]),
            "late": int(late[i]),
            "dropped": int(offered[i] - good[i] - late[i]),
        }
        for i, name in enumerate(names)
    }
    overall = {
        "requests": total,
        "offered_rps": total / duration,
        "goodput_rps": served / duration,
        "slo_attainment": served / total if total else 1.0,
        "groups": len(groups),
    }
    return GroupedResult(runs, {"overall": overall, "models": models_out})
