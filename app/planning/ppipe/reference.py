"""Re-solving the problem a PPipe reference plan describes.

A reference plan file (`data/ppipe/plans-maf19/*.json`) names its group,
weights, cluster, bandwidth and SLO multiplier; each entry's `config` holds
the artifact's planner inputs for one model (µs in the file):

* `sla` − `hist_adjustment` − `hist_adjustment_w_scheduling` is the latency
  budget (the artifact deducts the 40 % margin as `hist_adjustment`);
* `est_xput` and `batch_build_factor` estimate the batch-building wait;
* `num_mps_levels` per class: shares 1 … levels; `max_num_parts` is D;
* `num_gpu_per_server_arr` per class: how many devices share a node's links;
* `force_sum_gpu_integer_per_partition`: whole devices per stage position;
* `transmit_time_us_arr`: cut bytes · 8 / bandwidth, checked against the
  cut sizes of the timings directory so that both describe the same model.

The suffix says the variant: `_v4` PPipe, `_bl` NP, `_dart-r` DART-r.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.planning.ppipe.options import ModelDemand
from app.planning.ppipe.plan import Cluster, Plan, parse_reference_name, read_reference_plan
from app.planning.ppipe.planner import PlannerOptions, plan
from app.planning.ppipe.profiles import load_profile, transfer_seconds


@dataclass(frozen=True)
class ReferenceProblem:
    reference: Plan
    reference_runtime_s: float  # the artifact's Gurobi time, all entries
    cluster: Cluster
    demands: tuple[ModelDemand, ...]
    options: PlannerOptions


def timings_root(directory: Path) -> Path:
    """The directory holding `block-timing/` and `cut-bytes/` (given it or
    its `block-timing/`)."""
    if directory.name == "block-timing" and (directory.parent / "cut-bytes").is_dir():
        directory = directory.parent
    if not (directory / "block-timing").is_dir() or not (directory / "cut-bytes").is_dir():
        raise FileNotFoundError(
            f"{directory}: no block-timing/ and cut-bytes/ in it (the artifact's layout)"
        )
    return directory


def _same(configs: list[dict[str, Any]], key: str, source: str) -> Any:
    values = {json.dumps(c[key], sort_keys=True) for c in configs}
    if len(values) != 1:
        raise ValueError(f"{source}: entries disagree on {key!r}: {sorted(values)}")
    return configs[0][key]


def reference_problem(path: Path, timings: Path, time_limit_s: float = 60.0) -> ReferenceProblem:
    name = parse_reference_name(path)  # a bad name fails before the file is read
    reference = read_reference_plan(path)
    root = timings_root(timings)
    source = path.name
    entries = json.loads(path.read_text())
    configs: list[dict[str, Any]] = reference.details["configs"]
    try:
        classes = list(_same(configs, "gpu_name_arr", source))
        if classes != list(name.classes):
            raise ValueError(f"{source}: classes {classes} but the name says {list(name.classes)}")
        levels = _same(configs, "num_mps_levels", source)
        per_node = _same(configs, "num_gpu_per_server_arr", source)
        options = PlannerOptions(
            variant=name.variant,
            max_partitions=int(_same(configs, "max_num_parts", source)),
            margin=0.0,  # the budget below already has it deducted
            batch_build_factor=float(_same(configs, "batch_build_factor", source)),
            shares={c: tuple(range(1, int(k) + 1)) for c, k in zip(classes, levels, strict=True)},
            devices_per_node={c: int(n) for c, n in zip(classes, per_node, strict=True)},
            integer_devices_per_stage=bool(
                _same(configs, "force_sum_gpu_integer_per_partition", source)
            ),
            time_limit_s=time_limit_s,
        )
        bandwidth = float(_same(configs, "bw_gbps", source))
        demands = []
        for model, config in zip(reference.models, configs, strict=True):
            profile = load_profile(model.name, root, classes)
            _check_transfers(profile.cut_bytes, config["transmit_time_us_arr"], bandwidth, source)
            budget_us = (
                config["sla"] - config["hist_adjustment"] - config["hist_adjustment_w_scheduling"]
            )
            demands.append(
                ModelDemand(
                    name=model.name,
                    weight=model.weight,
                    slo_s=config["sla"] * 1e-6,
                    profile=profile,
                    budget_s=budget_us * 1e-6,
                    est_throughput=float(config["est_xput"]) if config.get("est_xput") else None,
                )
            )
    except KeyError as error:
        raise ValueError(f"{source}: a config entry lacks {error}") from error
    if bandwidth != name.bandwidth_gbps:
        raise ValueError(f"{source}: bw_gbps {bandwidth} but the name says {name.bandwidth_gbps}")
    cluster = Cluster(dict(name.classes), bandwidth, reference.cluster.devices_per_node)
    runtime = sum(float(e.get("runtime") or 0.0) for e in entries)
    return ReferenceProblem(reference, runtime, cluster, tuple(demands), options)


def _check_transfers(cut_bytes, transmit_us: list[float], bandwidth: float, source: str) -> None:
    if len(transmit_us) != len(cut_bytes):
        raise ValueError(
            f"{source}: {len(transmit_us)} transfer times but the timings have "
            f"{len(cut_bytes)} cuts"
        )
    for i, (size, given) in enumerate(zip(cut_bytes, transmit_us, strict=True)):
        ours = transfer_seconds(float(size), bandwidth) * 1e6
        if not math.isclose(ours, given, rel_tol=1e-6, abs_tol=1e-6):
            raise ValueError(
                f"{source}: cut {i} takes {given} µs in the reference but {ours} µs from the "
                "timings' cut sizes: not the same model data"
            )


def resolve_reference(path: Path, timings: Path, time_limit_s: float = 60.0) -> dict[str, Any]:
    """Solve the reference's problem; ours against theirs, as a JSON-able
    dict. `gap` = (ours − reference) / reference."""
    problem = reference_problem(path, timings, time_limit_s)
    ours = plan(problem.cluster, list(problem.demands), problem.options)
    ref = problem.reference
    gap = (ours.objective - ref.objective) / ref.objective if ref.objective else None
    return {
        "file": path.name,
        "variant": ours.variant,
        "objective": ours.objective,
        "reference_objective": ref.objective,
        "gap": gap,
        "mip_gap": ours.gap if math.isfinite(ours.gap) else None,  # None: no incumbent
        "status": ours.details.get("status"),
        "runtime_s": ours.runtime_s,
        "reference_runtime_s": problem.reference_runtime_s,
        "reference_mip_gap": ref.gap,
        "time_limit_s": time_limit_s,
        "variables": ours.details.get("variables"),
        "integers": ours.details.get("integers"),
        "constraints": ours.details.get("constraints"),
        "models": [
            {
                "name": m.name,
                "weight": m.weight,
                "throughput": m.throughput,
                "reference_throughput": r.throughput,
            }
            for m, r in zip(ours.models, ref.models, strict=True)
        ],
        "pipelines": [pipeline_summary(p) for p in ours.pipelines],
    }


def pipeline_summary(pipeline) -> dict[str, Any]:
    return {
        "model": pipeline.model,
        "batch": pipeline.batch,
        "throughput": pipeline.throughput,
        "stages": [
            {
                "blocks": [s.start, s.end],
                "class": s.device_class,
                "share": s.share,
                "devices": s.devices,
                "latency_ms": s.latency_s * 1e3,
                "transfer_ms": s.transfer_s * 1e3,
            }
            for s in pipeline.stages
        ],
    }
