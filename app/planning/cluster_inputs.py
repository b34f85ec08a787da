"""Each planner's input from one cluster (app/planning/cluster.py): the
cluster's devices, models and rates, and the planner's own section of the
cluster file, put into the planner's own schema and read by its own reader,
so that every check is the one its YAML gets. Model names are the
repository's. The sections' keys (docs/architecture.md, "Planning"):

    partition: {devices, device_memory_mb, sub_clusters, r_max, s_max_mb, w,
                c_max, current, load_cost}
    herd: {devices, device_memory_mb, reserve_mb, max_group_size, groups,
           objective, time_limit_s, affinity}
    inss: {devices, device_memory_mb, share_step, bandwidth_gb_per_s,
           alpha_s_us, beta_s_us}
    ppipe: {timings, classes, bandwidth_gbps, devices_per_node, planner,
            weights, slo_multiple}

The herd, inss and partition planners plan over one pool of devices
(`cluster.device_pool`): the section's `devices`, else the kind most
models may run on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from app.planning.cluster import MB, ClusterDescription, ClusterModel, Pool, device_pool
from app.planning.config_input import InputError, only
from app.scheduling.profile import LatencyProfile

MIB = 1 << 20

PARTITION_KEYS = {
    "devices",
    "device_memory_mb",
    "sub_clusters",
    "r_max",
    "s_max_mb",
    "w",
    "c_max",
    "current",
    "load_cost",
}
HERD_KEYS = {
    "devices",
    "device_memory_mb",
    "reserve_mb",
    "max_group_size",
    "groups",
    "objective",
    "time_limit_s",
    "affinity",
}
INSS_KEYS = {
    "devices",
    "device_memory_mb",
    "share_step",
    "bandwidth_gb_per_s",
    "alpha_s_us",
    "beta_s_us",
}
#: Symphony's dispatch bound per scheduling core (requests/s) when the
#: partition section gives no r_max.
DEFAULT_R_MAX = 5000.0
#: A host link's bandwidth when the inss section gives none: PCIe 3.0 ×16.
DEFAULT_BANDWIDTH_GB_PER_S = 12.0


def _section(cluster: ClusterDescription, name: str, keys: set[str]) -> dict[str, Any]:
    section = cluster.section(name)
    only(section, keys, f"{cluster.source}: {name}")
    return section


def table_ms(profile: LatencyProfile) -> dict[int, float]:
    """ℓ(b) in ms for b = 1 … max batch."""
    return {b: profile.latency(b) * 1e3 for b in range(1, profile.max_batch + 1)}


def partition_input(cluster: ClusterDescription) -> dict[str, Any]:
    """The partition planner's YAML body (app/planning/partition/config.py):
    every model with its rate and memory; sub_clusters defaults to the
    pool's devices, s_max_mb to the least device memory."""
    section = _section(cluster, "partition", PARTITION_KEYS)
    pool = device_pool(cluster, "partition")
    memory = min(cluster.device_memory_mb(cluster.devices[i], "partition") for i in pool.devices)
    load_cost = section.pop("load_cost", 1.0)
    for key in ("devices", "device_memory_mb"):  # the pool's, used above
        section.pop(key, None)
    models = [
        {
            "name": m.name,
            "rate": cluster.rate(m),
            "static_mb": m.memory_bytes / MB,
            "dynamic_mb": m.item_bytes * m.max_batch / MB,
            "load_cost": load_cost,
        }
        for m in cluster.models
    ]
    return {
        "sub_clusters": len(pool.devices),
        "r_max": DEFAULT_R_MAX,
        "s_max_mb": memory,
        **section,
        "models": models,
    }


def herd_input(cluster: ClusterDescription) -> tuple[dict[str, Any], Pool]:
    """HERD's YAML body (app/planning/herd/config.py) over the pool's
    devices, and the pool (its devices' indices are the server's: the plan's
    groups are renumbered to them, `server_devices`)."""
    section = _section(cluster, "herd", HERD_KEYS)
    pool = device_pool(cluster, "herd")
    kind = cluster.devices[pool.devices[0]].kind
    memory = min(cluster.device_memory_mb(cluster.devices[i], "herd") for i in pool.devices)
    n = len(pool.devices)
    body = {
        "cluster": {
            "devices": n,
            "device_memory_mb": memory * MB / MIB,
            "reserve_mb": section.get("reserve_mb", 0),
            "max_group_size": section.get("max_group_size", min(n, 4)),
            **({"groups": section["groups"]} if "groups" in section else {}),
        },
        "models": [_herd_model(m, kind, section.get("affinity", {})) for m in pool.models],
        "streams": [{"model": m.name, "rate": cluster.rate(m)} for m in pool.models],
        "max_batch": max(m.max_batch for m in pool.models),
    }
    for key in ("objective", "time_limit_s"):
        if key in section:
            body[key] = section[key]
    return body, pool


def _herd_model(model: ClusterModel, kind: str, affinity: dict[str, str]) -> dict[str, Any]:
    return {
        "name": model.name,
        "profile": {"latency_ms": table_ms(model.profile(kind))},
        "slo_ms": model.slo_s * 1e3,
        # HERD places a model's weights on each device of its group; at least 1 MiB.
        "memory_mb": max(model.memory_bytes / MIB, 1.0),
        "affinity": affinity.get(model.name, "default"),
    }


def inss_input(cluster: ClusterDescription) -> dict[str, Any]:
    """InSS's YAML body (app/planning/inss/config.py): the pool's whole
    devices (InSS chooses the shares), each model's profile as InSS's
    linear running time (α·b + β)/ρ and its memory as weights + tensors
    per request, up to its batch cap."""
    section = _section(cluster, "inss", INSS_KEYS)
    pool = device_pool(cluster, "inss")
    wholes: dict[str, Any] = {}
    for i in pool.devices:
        device = cluster.devices[i]
        wholes.setdefault(
            device.whole,
            {
                "name": device.whole,
                "kind": device.kind,
                "memory_mb": cluster.device_memory_mb(device, "inss"),
                "bandwidth_gb_per_s": section.get("bandwidth_gb_per_s", DEFAULT_BANDWIDTH_GB_PER_S),
                "alpha_s_us": section.get("alpha_s_us", 0.0),
                "beta_s_us": section.get("beta_s_us", 0.0),
            },
        )
    kinds = {d["kind"] for d in wholes.values()}
    models = [_inss_model(cluster, m, kinds) for m in pool.models]
    body: dict[str, Any] = {"devices": list(wholes.values()), "models": models}
    if "share_step" in section:
        body["share_step"] = section["share_step"]
    return body


def _inss_model(cluster: ClusterDescription, model: ClusterModel, kinds: set[str]) -> dict:
    def fit(kind: str) -> dict[str, Any]:
        profile = model.profile(kind)
        alpha, beta = profile.alpha or 0.0, profile.beta or 0.0
        return {"running_time": {"linear_ms": {"alpha": alpha * 1e3, "beta": max(beta, 0.0) * 1e3}}}

    base, item = model.memory_bytes / MB, model.item_bytes / MB
    # a table up to the batch cap: linear between, and no batch beyond it
    memory = {1: base + item}
    if model.max_batch > 1:
        memory[model.max_batch] = base + item * model.max_batch
    return {
        "name": model.name,
        "rate": cluster.rate(model),
        "slo_ms": model.slo_s * 1e3,
        "memory_mb": memory,
        "input_bytes": model.input_bytes,
        "output_bytes": model.output_bytes,
        "latency_per_kind": {kind: fit(kind) for kind in sorted(kinds)},
    }


PPIPE_KEYS = {
    "timings",
    "classes",
    "bandwidth_gbps",
    "devices_per_node",
    "planner",
    "weights",
    "slo_multiple",
}
#: Stages on one machine hand over through shared memory: a link that is
#: never the bottleneck (bench/workloads/ppipe/chain-live.yaml).
ONE_MACHINE_GBPS = 1e6


def ppipe_input(
    cluster: ClusterDescription, timings: Path | None = None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """PPipe's YAML body (app/planning/ppipe/cli.py) and the models left out
    (no block profile in `timings`, else the section's `timings`, relative
    to the working directory). Classes: the section's,
    else the devices' `class`, counted; a model's weight: the section's,
    else its rate when every model has one, else 1."""
    section = _section(cluster, "ppipe", PPIPE_KEYS)
    if timings is None and "timings" not in section:
        raise InputError(
            f"{cluster.source}: ppipe.timings names no directory: PPipe plans from block "
            "profiles (`python -m app.repository.block_profile MODEL.onnx --name NAME --out DIR`)"
        )
    root = timings if timings is not None else Path(str(section["timings"]))
    classes = section.get("classes") or dict(
        Counter(d.device_class for d in cluster.devices if d.device_class is not None)
    )
    if not classes:
        raise InputError(
            f"{cluster.source}: give ppipe.classes {{CLASS: devices}} or devices with a `class`"
        )
    one_machine = all(d.node is None for d in cluster.devices)
    weights = dict(section.get("weights", {}))
    multiples = dict(section.get("slo_multiple", {}))
    profiled = [m for m in cluster.models if (root / "cut-bytes" / f"{m.name}.csv").is_file()]
    left = [
        f"{m.name}: no block profile in {root} (ppipe.timings)"
        for m in cluster.models
        if m not in profiled
    ]
    rated = all(m.rate for m in profiled)
    models = []
    for m in profiled:
        entry: dict[str, Any] = {
            "name": m.name,
            "weight": weights.get(m.name, m.rate if rated else 1.0),
        }
        if m.name in multiples:
            entry["slo_multiple"] = multiples[m.name]
        else:
            entry["slo_ms"] = m.slo_s * 1e3
        models.append(entry)
    bandwidth = section.get("bandwidth_gbps", ONE_MACHINE_GBPS if one_machine else None)
    link = {} if bandwidth is None else {"bandwidth_gbps": bandwidth}
    per_node = section.get("devices_per_node", sum(classes.values()) if one_machine else 1)
    body = {
        "cluster": {"classes": classes, **link, "devices_per_node": per_node},
        "timings": str(root.resolve()),
        "models": models,
    }
    if "planner" in section:
        body["planner"] = section["planner"]
    return body, tuple(left)
