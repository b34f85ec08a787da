"""Lay a PPipe plan onto device instances and nodes: the `Layout` the data
plane (app/scheduling/ppipe/) serves. See app/scheduling/ppipe/layout.py for
the rules (physical devices onto nodes per class, shares packed in plan
order, latencies per batch size from the block profiles)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from app.planning.ppipe.plan import Plan
from app.planning.ppipe.profiles import BlockProfile, transfer_seconds
from app.scheduling.ppipe.layout import DeviceInstance, Layout, PoolPipeline, PoolStage


def build_layout(
    plan: Plan,
    profiles: Mapping[str, BlockProfile],
    *,
    devices_per_node: Mapping[str, int] | None = None,
    models: set[str] | None = None,
    handoff_s: float = 0.0,
) -> Layout:
    """Lay `plan` onto devices and nodes. `devices_per_node` per class
    defaults to the plan's cluster figure for every class; `models` keeps
    only those models' pipelines (their devices keep the ids and nodes they
    have in the whole plan's layout); `handoff_s` is every pipeline's
    hand-over between stages (`PoolPipeline.handoff_s`)."""
    if not handoff_s >= 0.0:
        raise ValueError(f"handoff_s must be ≥ 0, got {handoff_s}")
    cluster = plan.cluster
    per_node = {cls: cluster.devices_per_node for cls in cluster.classes}
    if devices_per_node is not None:
        for cls, count in devices_per_node.items():
            if cls not in cluster.classes:
                raise ValueError(f"devices_per_node names {cls!r}, not a class of the cluster")
            if count < 1:
                raise ValueError(f"devices_per_node[{cls!r}] must be ≥ 1, got {count}")
            per_node[cls] = count
    # Physical device p of class c sits on node first_node[c] + p // per_node[c].
    first_node: dict[str, int] = {}
    nodes = 0
    for cls, count in cluster.classes.items():
        first_node[cls] = nodes
        nodes += math.ceil(count / per_node[cls])
    next_physical = dict.fromkeys(cluster.classes, 0)
    # The last physical device of each class: (index, share, instances left).
    open_device: dict[str, tuple[int, int, int]] = {}
    instances: list[DeviceInstance] = []
    pipelines: list[PoolPipeline] = []
    for pipeline in plan.pipelines:
        if pipeline.model not in profiles:
            raise KeyError(f"no block profile for model {pipeline.model!r}")
        profile = profiles[pipeline.model]
        stages: list[PoolStage] = []
        largest = min(profile.max_batch(s.device_class, s.share) for s in pipeline.stages)
        for k, stage in enumerate(pipeline.stages):
            cls = stage.device_class
            if cls not in cluster.classes:
                raise ValueError(
                    f"pipeline of {pipeline.model!r}: stage {k} on {cls!r}, "
                    f"not a class of the cluster ({', '.join(cluster.classes)})"
                )
            ids: list[int] = []
            for _ in range(stage.devices):
                physical, share, left = open_device.get(cls, (-1, 0, 0))
                if left == 0 or share != stage.share:
                    physical = next_physical[cls]
                    if physical >= cluster.classes[cls]:
                        raise ValueError(
                            f"plan needs more than the cluster's {cluster.classes[cls]} "
                            f"{cls} devices (pipeline of {pipeline.model!r}, stage {k})"
                        )
                    next_physical[cls] = physical + 1
                    share, left = stage.share, stage.share
                node = first_node[cls] + physical // per_node[cls]
                instances.append(DeviceInstance(len(instances), cls, share, physical, node))
                ids.append(instances[-1].id)
                open_device[cls] = (physical, share, left - 1)
            # Every size the profile covers, not only up to the planned one:
            # a request of more items than the planned batch runs whole.
            batches = range(1, max(pipeline.batch, largest) + 1)
            latency = tuple(
                profile.partition_latency(stage.start, stage.end, b, cls, stage.share)
                for b in batches
            )
            if k == 0:
                transfer = tuple(0.0 for _ in batches)
            else:
                cut = pipeline.stages[k - 1].end - 1
                transfer = tuple(
                    transfer_seconds(profile.transfer_bytes(cut, b), cluster.bandwidth_gbps)
                    for b in batches
                )
            stages.append(
                PoolStage(
                    stage.start,
                    stage.end,
                    cls,
                    stage.share,
                    tuple(ids),
                    latency,
                    transfer,
                    frozenset(instances[i].node for i in ids),
                )
            )
        if models is None or pipeline.model in models:
            pipelines.append(
                PoolPipeline(
                    len(pipelines),
                    pipeline.model,
                    pipeline.batch,
                    tuple(stages),
                    pipeline.throughput,
                    handoff_s,
                )
            )
    slo = {m.name: m.slo_s for m in plan.models if models is None or m.name in models}
    return Layout(tuple(instances), nodes, tuple(pipelines), slo, dict(cluster.classes))


def reference_devices_per_node(plan: Plan) -> dict[str, int] | None:
    """Devices per node per class as a reference plan's config gives them
    (`num_gpu_per_server_arr` beside `gpu_name_arr`); None for other plans."""
    configs = plan.details.get("configs")
    if not configs:
        return None
    config = configs[0]
    names = config.get("gpu_name_arr")
    counts = config.get("num_gpu_per_server_arr")
    if not names or not counts or len(names) != len(counts):
        return None
    return {str(n): int(c) for n, c in zip(names, counts, strict=True)}
