"""DART-r (ppipe.txt §7.1): DART chains every device into one pipeline;
DART-r instead replicates the best configuration for a *pair* of one
high-class and one low-class device, and leftover devices of the larger
class run whole models on their own.

The rule, as the PPipe artifact makes these plans (`get_multidnn_dart_plan`):

1. an NP plan (no partitioning) of the whole group divides the devices
   among models: a model gets the whole devices its pipelines use, and each
   class's unused devices are split evenly (integer division) among models;
2. per model with limits (a, b) on the two classes: min(a, b) pairs, each
   planned as one pair (1 + 1 devices, whole devices, up to D partitions,
   the same MILP), and max − min single devices of the larger class
   (ties: the first class) each running the whole model (the NP MILP on
   one device);
3. the pair's and the single's plans are replicated: devices and
   throughput times the number of pairs or singles.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from app.planning.ppipe.milp import PlannerOptions, solve_group, with_budgets, with_estimates
from app.planning.ppipe.options import ModelDemand
from app.planning.ppipe.plan import Cluster, ModelTarget, Pipeline, Plan


def device_split(plan: Plan, classes: Sequence[str]) -> dict[str, dict[str, int]]:
    """Step 1: each model's device limit per class after an NP plan."""
    used = {m.name: dict.fromkeys(classes, 0) for m in plan.models}
    for pipeline in plan.pipelines:
        for stage in pipeline.stages:
            used[pipeline.model][stage.device_class] += round(stage.whole_devices)
    share = {
        c: (plan.cluster.classes[c] - sum(u[c] for u in used.values())) // len(used)
        for c in classes
    }
    return {name: {c: u[c] + share[c] for c in classes} for name, u in used.items()}


def scaled(pipeline: Pipeline, count: int) -> Pipeline:
    """`count` copies of a pipeline, pooled: devices and throughput × count."""
    stages = tuple(replace(s, devices=s.devices * count) for s in pipeline.stages)
    return replace(pipeline, stages=stages, throughput=pipeline.throughput * count)


def plan_dart_r(cluster: Cluster, demands: Sequence[ModelDemand], options: PlannerOptions) -> Plan:
    classes = [c for c, count in cluster.classes.items() if count > 0]
    if len(classes) != 2:
        raise ValueError(
            f"DART-r pairs a high- and a low-class device: the cluster needs exactly two "
            f"device classes with devices, has {classes}"
        )
    demands = with_estimates(cluster, with_budgets(demands, options.margin), options)
    split_plan = solve_group(cluster, demands, replace(options, variant="np"))
    limits = device_split(split_plan, classes)
    runtime = split_plan.runtime_s
    gap = split_plan.gap
    pipelines: list[Pipeline] = []
    layout: dict[str, dict[str, int | str]] = {}
    pair_options = replace(options, variant="ppipe", shares={c: (1,) for c in classes})
    for demand in demands:
        counts = [limits[demand.name][c] for c in classes]
        pairs, singles = min(counts), max(counts) - min(counts)
        larger = classes[counts.index(max(counts))]
        layout[demand.name] = {"pairs": pairs, "singles": singles, "single_class": larger}
        parts: list[tuple[Plan, int]] = []
        if pairs > 0:
            pair = Cluster(
                dict.fromkeys(classes, 1), cluster.bandwidth_gbps, cluster.devices_per_node
            )
            parts.append((solve_group(pair, [demand], pair_options), pairs))
        if singles > 0:
            one = Cluster({larger: 1}, cluster.bandwidth_gbps, cluster.devices_per_node)
            single_options = replace(options, variant="np", shares=None)
            parts.append((solve_group(one, [demand], single_options), singles))
        for part, count in parts:
            runtime += part.runtime_s
            gap = max(gap, part.gap)
            pipelines.extend(scaled(p, count) for p in part.pipelines)
    served = {d.name: 0.0 for d in demands}
    for pipeline in pipelines:
        served[pipeline.model] += pipeline.throughput
    models = tuple(ModelTarget(d.name, d.weight, d.slo_s, served[d.name]) for d in demands)
    details = dict(split_plan.details)
    details.update({"split": limits, "layout": layout, "split_objective": split_plan.objective})
    return Plan(
        cluster=cluster,
        models=models,
        pipelines=tuple(pipelines),
        variant="dart-r",
        objective=min(m.throughput / m.weight for m in models),
        gap=gap,
        runtime_s=runtime,
        details=details,
    )
