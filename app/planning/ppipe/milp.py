"""PPipe's control plane (ppipe.txt §5.3, App. A.2) as a mixed-integer
program solved with HiGHS.

The problem is the PPipe artifact's (`milp_solver/ilp_v4.py`): every model
has one slot per class sequence of length D; a slot runs one configuration
(cut points, batch size, share per stage; `options.py` enumerates them with
the SLO already applied) or none — the *inactive option*, which the paper's
printed formulation lacks. Variables per option o:

* y_o ∈ {0, 1}: the slot runs o (Σ y ≤ 1 per slot);
* n_{o,d} ∈ ℕ: instances (vGPUs) at stage d, n ≤ (class count × share) · y;
* t_o ≥ 0: its throughput, t_o ≤ rate_{o,d} · n_{o,d} for every stage d —
  the slowest stage bounds the pipeline (a one-stage option needs no t).

Devices: stage d uses n/share whole devices. As in the artifact's main runs
(`force_sum_gpu_integer_per_partition`), a model's stages at the same
position on the same class are rounded up to whole devices together
(integer w ≥ Σ n/share) before Σ w ≤ the class's count; without that
option, Σ n/share ≤ count directly.

Objective: maximise z with z ≤ (Σ_o t_o) / weight_m for every model m —
the worst model's throughput per unit of weight.

Variants: `ppipe` (up to D partitions, every profiled share), `np` (no
partitioning: one stage, whole devices), `dart-r` (`dart.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce

import numpy as np

from app.planning.ppipe.highs import Program, Solution
from app.planning.ppipe.options import (
    VARIANTS,
    Enumeration,
    ModelDemand,
    PipelineOption,
    Slot,
    StageOption,
    enumerate_slots,
)
from app.planning.ppipe.plan import Cluster, ModelTarget, Pipeline, Plan, Stage

#: Below this a solver value counts as zero (throughputs are requests/s).
_EPS = 1e-6


@dataclass(frozen=True)
class PlannerOptions:
    """How to plan. `shares` per class (default: every share profiled;
    `np` uses whole devices only); `devices_per_node` per class (default:
    the cluster's `devices_per_node`) sets how many instances share a node's
    links; `est_throughput` of a model missing it comes from an NP plan
    without batch building, as the artifact does."""

    variant: str = "ppipe"
    max_partitions: int = 2
    margin: float = 0.4
    batch_build_factor: float = 1.3
    shares: Mapping[str, Sequence[int]] | None = None
    devices_per_node: Mapping[str, int] | None = None
    integer_devices_per_stage: bool = True
    time_limit_s: float = 60.0
    mip_rel_gap: float = 1e-4
    threads: int = 1

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if not 1 <= self.max_partitions <= 3:
            raise ValueError(f"max_partitions must be 1, 2 or 3, got {self.max_partitions}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")
        if self.batch_build_factor < 0:
            raise ValueError(f"batch_build_factor must be ≥ 0, got {self.batch_build_factor}")
        if not self.time_limit_s > 0:
            raise ValueError(f"time limit must be > 0 s, got {self.time_limit_s}")


def plan_pipelines(
    cluster: Cluster,
    demands: Sequence[ModelDemand],
    options: PlannerOptions = PlannerOptions(),
    start: Plan | None = None,
) -> Plan:
    """The `ppipe` or `np` plan for `demands` on `cluster` (app/planning/
    ppipe/planner.py's `plan` picks the variant). `start` (a previous plan of
    the same variant) warm-starts the solver where its pipelines are options."""
    check_demands(cluster, demands)
    demands = with_estimates(cluster, with_budgets(demands, options.margin), options)
    label = None if start is None else "given plan"
    if start is None and options.variant == "ppipe":
        # The NP plan (milliseconds) is a feasible point of PPipe's program:
        # the search starts with an incumbent, and a time limit never ends
        # it with nothing.
        start = solve_group(cluster, demands, replace(options, variant="np"))
        label = "np plan"
    result = solve_group(cluster, demands, options, start)
    runtime = result.runtime_s + (start.runtime_s if label == "np plan" else 0.0)
    return replace(result, runtime_s=runtime, details={**result.details, "warm_start": label})


def check_demands(cluster: Cluster, demands: Sequence[ModelDemand]) -> None:
    if not demands:
        raise ValueError("no models to plan")
    names = [d.name for d in demands]
    if len(set(names)) != len(names):
        raise ValueError(f"models named twice: {sorted({n for n in names if names.count(n) > 1})}")
    for demand in demands:
        profiled = set(demand.profile.classes())
        if not profiled & set(cluster.classes):
            raise ValueError(
                f"model {demand.name!r} is profiled on {sorted(profiled)}, "
                f"none of the cluster's classes {sorted(cluster.classes)}"
            )


def with_budgets(demands: Sequence[ModelDemand], margin: float) -> list[ModelDemand]:
    """Each model's latency budget: its own, or the SLO less the margin."""
    return [
        d if d.budget_s is not None else replace(d, budget_s=d.slo_s * (1.0 - margin))
        for d in demands
    ]


def with_estimates(
    cluster: Cluster, demands: Sequence[ModelDemand], options: PlannerOptions
) -> list[ModelDemand]:
    """Fill in missing throughput estimates (for the batch-building wait)
    from an NP plan without batch building (the artifact's `est_xput`)."""
    if options.batch_build_factor == 0 or all(d.est_throughput is not None for d in demands):
        return list(demands)
    rough = solve_group(
        cluster, demands, replace(options, variant="np", batch_build_factor=0.0, shares=None)
    )
    got = {m.name: m.throughput for m in rough.models}
    return [
        d if d.est_throughput is not None else replace(d, est_throughput=got[d.name] or None)
        for d in demands
    ]


def enumeration_for(
    cluster: Cluster, demands: Sequence[ModelDemand], options: PlannerOptions
) -> Enumeration:
    classes = [c for c, count in cluster.classes.items() if count > 0]
    if options.variant == "np":
        shares: dict[str, tuple[int, ...]] = {c: (1,) for c in classes}
        partitions = 1
    else:
        profiled = {c: sorted({s for d in demands for s in d.profile.shares(c)}) for c in classes}
        wanted = options.shares or {}
        unknown = set(wanted) - set(cluster.classes)
        if unknown:
            raise ValueError(f"shares given for classes not in the cluster: {sorted(unknown)}")
        shares = {c: tuple(wanted.get(c, profiled[c])) for c in classes}
        partitions = options.max_partitions
    per_node = dict(options.devices_per_node or {})
    for c in classes:
        per_node.setdefault(c, cluster.devices_per_node)
    return Enumeration(
        shares=shares,
        max_partitions=partitions,
        bandwidth_gbps=cluster.bandwidth_gbps,
        devices_per_node=per_node,
        batch_build_factor=options.batch_build_factor,
    )


@dataclass
class _Columns:
    """Where each option's variables are in the program."""

    z: int = 0
    # per slot, per option: (y, [n per stage], throughput terms)
    options: list[list[tuple[int, list[int], list[tuple[int, float]]]]] = field(
        default_factory=list
    )
    # (model, stage position, class) → w
    whole: dict[tuple[int, int, str], int] = field(default_factory=dict)


def build_program(
    cluster: Cluster,
    demands: Sequence[ModelDemand],
    slots: Sequence[Slot],
    integer_devices_per_stage: bool,
) -> tuple[Program, _Columns]:
    program = Program()
    cols = _Columns(z=program.var())
    program.maximise(cols.z)
    served: list[list[tuple[int, float]]] = [[] for _ in demands]
    # (model, position, class) → [(n column, 1/share)]
    usage: dict[tuple[int, int, str], list[tuple[int, int]]] = {}
    for slot in slots:
        picks: list[int] = []
        slot_cols = []
        for option in slot.options:
            y = program.var(0, 1, integer=True)
            picks.append(y)
            counts = []
            for position, stage in enumerate(option.stages):
                bound = cluster.classes[stage.device_class] * stage.share
                n = program.var(0, bound, integer=True)
                counts.append(n)
                program.row([(n, 1.0), (y, -float(bound))], upper=0.0)
                usage.setdefault((slot.model, position, stage.device_class), []).append(
                    (n, stage.share)
                )
            if len(option.stages) == 1:
                terms = [(counts[0], option.stages[0].rate)]
            else:
                t = program.var()
                for n, stage in zip(counts, option.stages, strict=True):
                    program.row([(t, 1.0), (n, -stage.rate)], upper=0.0)
                terms = [(t, 1.0)]
            served[slot.model].extend(terms)
            slot_cols.append((y, counts, terms))
        program.row([(y, 1.0) for y in picks], upper=1.0)
        cols.options.append(slot_cols)
    for model, terms in enumerate(served):
        weight = demands[model].weight
        program.row([(cols.z, 1.0)] + [(c, -v / weight) for c, v in terms], upper=0.0)
    # whole devices, in units of 1/L of a device so that coefficients are integers
    scale = reduce(math.lcm, {share for uses in usage.values() for _, share in uses}, 1)
    per_class: dict[str, list[tuple[int, float]]] = {}
    for (model, position, cls), uses in usage.items():
        terms = [(n, float(scale // share)) for n, share in uses]
        if integer_devices_per_stage:
            w = program.var(0, cluster.classes[cls], integer=True)
            cols.whole[(model, position, cls)] = w
            program.row([*terms, (w, -float(scale))], upper=0.0)
            per_class.setdefault(cls, []).append((w, float(scale)))
        else:
            per_class.setdefault(cls, []).extend(terms)
    for cls, terms in per_class.items():
        program.row(terms, upper=float(scale * cluster.classes[cls]))
    return program, cols


def solve_group(
    cluster: Cluster,
    demands: Sequence[ModelDemand],
    options: PlannerOptions,
    start: Plan | None = None,
) -> Plan:
    """Enumerate, build, solve (demands carry their budgets and estimates)."""
    setup = enumeration_for(cluster, demands, options)
    slots = enumerate_slots(demands, list(setup.shares), setup)
    program, cols = build_program(cluster, demands, slots, options.integer_devices_per_stage)
    point = _start_point(program, cols, slots, demands, start)
    solution = program.solve(options.time_limit_s, options.mip_rel_gap, point, options.threads)
    details = {
        "status": solution.status,
        "bound": solution.bound,
        "variables": program.variables,
        "integers": program.integers,
        "constraints": program.rows,
        "options": sum(len(s.options) for s in slots),
        "slots": len(slots),
        "max_partitions": setup.max_partitions,
        "shares": {c: list(s) for c, s in setup.shares.items()},
        "devices_per_node": dict(setup.devices_per_node),
        "batch_build_factor": setup.batch_build_factor,
        "budgets_s": {d.name: d.budget_s for d in demands},
        "est_throughput": {d.name: d.est_throughput for d in demands},
        "integer_devices_per_stage": options.integer_devices_per_stage,
        "time_limit_s": options.time_limit_s,
    }
    return _extract(cluster, demands, slots, cols, solution, options.variant, details)


def _extract(
    cluster: Cluster,
    demands: Sequence[ModelDemand],
    slots: Sequence[Slot],
    cols: _Columns,
    solution: Solution,
    variant: str,
    details: dict,
) -> Plan:
    pipelines: list[Pipeline] = []
    values = solution.values
    if values is not None:
        for slot, slot_cols in zip(slots, cols.options, strict=True):
            for option, (y, counts, _) in zip(slot.options, slot_cols, strict=True):
                if values[y] < 0.5:
                    continue
                devices = [round(values[n]) for n in counts]
                if min(devices) == 0:
                    continue  # chosen but given no instances: inactive
                pipelines.append(_pipeline(demands[slot.model].name, option, devices))
    served = {d.name: 0.0 for d in demands}
    for pipeline in pipelines:
        served[pipeline.model] += pipeline.throughput
    models = tuple(ModelTarget(d.name, d.weight, d.slo_s, served[d.name]) for d in demands)
    return Plan(
        cluster=cluster,
        models=models,
        pipelines=tuple(pipelines),
        variant=variant,
        objective=min(m.throughput / m.weight for m in models),
        gap=solution.gap,
        runtime_s=solution.runtime_s,
        details=details,
    )


def _pipeline(model: str, option: PipelineOption, devices: list[int]) -> Pipeline:
    stages = tuple(
        Stage(s.start, s.end, s.device_class, s.share, n, s.latency_s, s.transfer_s)
        for s, n in zip(option.stages, devices, strict=True)
    )
    throughput = min(s.rate * n for s, n in zip(option.stages, devices, strict=True))
    return Pipeline(model, option.batch, stages, throughput)


def _shape(batch: int, stages: Sequence[Stage] | Sequence[StageOption]) -> tuple:
    """What identifies a pipeline's configuration (not its device counts)."""
    return (batch, tuple((s.start, s.end, s.device_class, s.share) for s in stages))


def _start_point(
    program: Program,
    cols: _Columns,
    slots: Sequence[Slot],
    demands: Sequence[ModelDemand],
    start: Plan | None,
) -> np.ndarray:
    """A feasible point: all slots inactive, or `start`'s pipelines placed
    in free slots where they are options (others are left out)."""
    point = np.zeros(program.variables)
    if start is None:
        return point
    index = {d.name: i for i, d in enumerate(demands)}
    used_slots: set[int] = set()
    served = [0.0] * len(demands)
    whole: dict[tuple[int, int, str], float] = {}
    for pipeline in start.pipelines:
        model = index.get(pipeline.model)
        if model is None:
            continue
        wanted = _shape(pipeline.batch, pipeline.stages)
        for k, (slot, slot_cols) in enumerate(zip(slots, cols.options, strict=True)):
            if k in used_slots or slot.model != model:
                continue
            match = next(
                (
                    (option, c)
                    for option, c in zip(slot.options, slot_cols, strict=True)
                    if _shape(option.batch, option.stages) == wanted
                ),
                None,
            )
            if match is None:
                continue
            option, (y, counts, terms) = match
            used_slots.add(k)
            point[y] = 1
            pairs = list(zip(option.stages, pipeline.stages, strict=True))
            for position, (n, (stage, planned)) in enumerate(zip(counts, pairs, strict=True)):
                point[n] = planned.devices
                key = (model, position, stage.device_class)
                whole[key] = whole.get(key, 0.0) + planned.devices / stage.share
            rate = min(s.rate * p.devices for s, p in pairs)
            if len(option.stages) > 1:
                point[terms[0][0]] = rate
            served[model] += rate
            break
    for key, amount in whole.items():
        if key in cols.whole:
            point[cols.whole[key]] = math.ceil(amount - 1e-9)
    point[cols.z] = min(s / d.weight for s, d in zip(served, demands, strict=True))
    return point
