"""A workload run partitioned (symphony.txt §4.7): one scheduling core per
sub-cluster, over that sub-cluster's devices and models only, each driven
by the engine on its share of the arrivals; the traces merged back into
one, in the workload's request order, and summarised as a single run.

The sub-clusters do not interact: a request of a model goes to the core of
the model's sub-cluster and runs on that sub-cluster's devices (every
backend of a sub-cluster holds all its models), which is what the
partitioning buys — cores that need no coordination. Devices are split
among the sub-clusters that have models, in contiguous runs as even as
possible, unless `device_groups` gives them (a list of device indices per
sub-cluster).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.simulation.engine import Trace, run_simulation
from app.simulation.metrics import summarize_run
from app.simulation.run import SimResult
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload


@dataclass(frozen=True)
class CoreRun:
    """One sub-cluster's core: its models and devices (workload indices),
    and the requests it was handed."""

    sub_cluster: int
    models: tuple[str, ...]
    devices: tuple[int, ...]
    requests: int


@dataclass
class PartitionedResult:
    result: SimResult  # the merged run, as `simulate` reports one
    cores: list[CoreRun]


def split_devices(count: int, groups: int) -> list[list[int]]:
    """`count` devices in `groups` contiguous runs, sizes differing by ≤ 1."""
    if count < groups:
        raise ValueError(f"{count} devices cannot serve {groups} sub-clusters (one each at least)")
    sizes = [count // groups + (1 if g < count % groups else 0) for g in range(groups)]
    starts = np.cumsum([0, *sizes])
    return [list(range(starts[g], starts[g + 1])) for g in range(groups)]


def simulate_partitioned(
    workload: Workload,
    assignment: Mapping[str, int],
    policy: str,
    params: dict[str, Any] | None = None,
    *,
    rate_scale: float = 1.0,
    arrivals: Arrivals | None = None,
    device_groups: Mapping[int, Sequence[int]] | None = None,
) -> PartitionedResult:
    """Simulate `policy` with one core per sub-cluster of `assignment`
    (model name → sub-cluster, e.g. `PartitionPlan.assignment()`)."""
    params = dict(params or {})
    names = [m.name for m in workload.models]
    missing = sorted(set(names) - set(assignment))
    if missing:
        raise ValueError(f"models without a sub-cluster: {missing}")
    unknown = sorted(set(assignment) - set(names))
    if unknown:
        raise ValueError(f"the assignment names models the workload lacks: {unknown}")
    used = sorted({assignment[n] for n in names})
    all_devices = workload.device_infos()
    if device_groups is None:
        device_groups = dict(zip(used, split_devices(len(all_devices), len(used)), strict=True))
    _check_groups(device_groups, used, len(all_devices))
    if arrivals is None:
        arrivals = generate_arrivals(workload, rate_scale)
    if policy in ("flex", "flex-np") and workload.preemption_delay_ms:
        params.setdefault("preemption_delay_ms", workload.preemption_delay_ms)
    infos = workload.model_infos()
    dynamic = any(m.dynamic is not None for m in infos)
    merged = _empty_trace(arrivals, len(all_devices))
    cores: list[CoreRun] = []
    advised = 0.0
    started = time.perf_counter()
    for sub in used:
        mine = [i for i, name in enumerate(names) if assignment[name] == sub]
        keep = np.isin(arrivals.model_index, mine)
        part = arrivals.select(keep)
        local = np.searchsorted(np.array(mine), part.model_index)  # the core's model index
        models = [infos[i] for i in mine]
        group = list(device_groups[sub])
        # The core numbers its own devices from 0; the merged trace maps back.
        devices = [
            DeviceInfo(k, all_devices[d].name, all_devices[d].speed, all_devices[d].kind)
            for k, d in enumerate(group)
        ]
        core = make_scheduler(policy, models, devices, **params)
        trace = run_simulation(
            core,
            models,
            devices,
            part.times,
            local,
            jitter=workload.jitter,
            preemption_delay=workload.preemption_delay_ms / 1000.0,
            seed=workload.seed + sub,
            items=part.items,
            apps=part.apps if dynamic else None,
            work=part.work if dynamic else None,
            profile_sample_rate=workload.profile_sample_rate,
        )
        _merge(merged, trace, np.flatnonzero(keep), group)
        advised += core.signals(trace.end_time).advised_device_change
        cores.append(CoreRun(sub, tuple(names[i] for i in mine), tuple(group), int(keep.sum())))
    wall_s = time.perf_counter() - started
    summary = summarize_run(merged, infos, workload.duration_s, len(all_devices))
    autoscale = {"advised_device_change": advised, "cores": len(cores)}
    result = SimResult(policy, params, rate_scale, summary, autoscale, wall_s, merged)
    return PartitionedResult(result, cores)


def _check_groups(groups: Mapping[int, Sequence[int]], used: list[int], devices: int) -> None:
    lacking = [s for s in used if not groups.get(s)]
    if lacking:
        raise ValueError(f"sub-clusters {lacking} have models but no devices")
    seen: list[int] = [d for s in used for d in groups[s]]
    if len(seen) != len(set(seen)):
        raise ValueError("a device is in two sub-clusters")
    outside = sorted(d for d in seen if not 0 <= d < devices)
    if outside:
        raise ValueError(f"device indices {outside} outside 0..{devices - 1}")


def _empty_trace(arrivals: Arrivals, devices: int) -> Trace:
    n = len(arrivals)
    nan = np.full(n, np.nan)
    return Trace(
        arrival=arrivals.times.copy(),
        deadline=nan.copy(),
        model_index=arrivals.model_index.copy(),
        status=np.zeros(n, dtype=np.int8),
        finish=nan.copy(),
        start=nan.copy(),
        batch_size=np.zeros(n, dtype=np.int32),
        drop_reason=np.full(n, -1, dtype=np.int8),
        device_busy=np.zeros(devices),
        batches=0,
        preemptions=0,
        end_time=0.0,
        items=np.ones(n, np.int32) if arrivals.items is None else arrivals.items.astype(np.int32),
    )


def _merge(merged: Trace, part: Trace, rows: np.ndarray, devices: list[int]) -> None:
    """Write one core's trace into the merged one at `rows`."""
    merged.deadline[rows] = part.deadline
    merged.status[rows] = part.status
    merged.finish[rows] = part.finish
    merged.start[rows] = part.start
    merged.batch_size[rows] = part.batch_size
    merged.drop_reason[rows] = part.drop_reason
    merged.device_busy[devices] += part.device_busy
    merged.batches += part.batches
    merged.preemptions += part.preemptions
    merged.end_time = max(merged.end_time, part.end_time)
