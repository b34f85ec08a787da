"""`python -m app plan ppipe …` — PPipe's control plane from the command line.

Normal mode reads a cluster and its models from a YAML file — or, with
`--repository DIR`, `--from URL` or a cluster file (`kind: cluster`), the
repository's models that have block profiles in the cluster file's
`ppipe.timings` (app/planning/cluster_inputs.py) — prints the plan and
writes it (`--out`) in the form the simulator and daemon load:

    cluster:
      classes: {L4: 25, T4: 75}     # whole devices per class
      bandwidth_gbps: 10            # each node's uplink and downlink
      devices_per_node: 1           # or per class: {L4: 4, T4: 2}
    timings: data/ppipe             # block timings (the artifact's layout);
                                    # relative to this file; default: bundled;
                                    # --timings DIR wins over it
    models:
      - {name: repvgg-b3, weight: 0.3, slo_ms: 47.5}
      - {name: googlenet-v3-pytorch, weight: 0.7, slo_multiple: 5}
    planner:                        # optional; flags override
      variant: ppipe                # ppipe | np | dart-r
      max_partitions: 2
      margin: 0.4
      batch_build_factor: 1.3
      time_limit_s: 60
      shares: {L4: [1, 2, 3, 4]}    # default: every share profiled
      integer_devices_per_stage: true

`slo_multiple` is × the model's batch-1 latency on the fastest class of the
cluster (whole device), as the paper sets its SLOs.

Reference mode (`--reference FILE`) re-solves the problem one of the
artifact's reference plans describes and prints one JSON object: ours
against theirs (`reference.py`).

Bad input: a message on stderr naming the problem, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TextIO

import yaml

from app.planning.cluster_cli import (
    ClusterReader,
    add_cluster_arguments,
    left_out,
    load_cluster,
    wants_cluster,
)
from app.planning.cluster_inputs import ppipe_input
from app.planning.config_input import InputError, mapping, only
from app.planning.plan_files import MadeFrom, inputs_of
from app.planning.ppipe.options import ModelDemand
from app.planning.ppipe.plan import Cluster, Plan, read_plan, write_plan
from app.planning.ppipe.planner import PlannerOptions, plan
from app.planning.ppipe.profiles import BUNDLED_DIR, load_profile
from app.planning.ppipe.reference import resolve_reference, timings_root

PROG = "python -m app plan ppipe"
_PLANNER_KEYS = {f.name for f in fields(PlannerOptions)} - {"devices_per_node"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app plan", description="Make a serving plan.")
    planners = parser.add_subparsers(dest="planner", required=True)
    ppipe = planners.add_parser(
        "ppipe",
        help="PPipe: partitioned models on pools of heterogeneous devices (MILP, HiGHS)",
        description="Plan pipelines of model partitions over device pools (ppipe.txt §5.3), "
        "or re-solve a reference plan of the PPipe artifact (--reference).",
    )
    ppipe.add_argument(
        "config", nargs="?", type=Path, help="cluster and models (YAML), or a cluster file"
    )
    ppipe.add_argument("--out", type=Path, help="write the plan to this file")
    ppipe.add_argument("--start", type=Path, help="warm-start from this earlier plan file")
    ppipe.add_argument("--variant", choices=("ppipe", "np", "dart-r"))
    ppipe.add_argument("--max-partitions", type=int, choices=(1, 2, 3))
    ppipe.add_argument("--margin", type=float, help="SLO fraction kept back (default 0.4)")
    ppipe.add_argument("--time-limit", type=float, help="solver time limit, seconds")
    ppipe.add_argument("--reference", type=Path, help="a reference plan file to re-solve")
    ppipe.add_argument(
        "--timings",
        type=Path,
        help=f"block timings directory (over the config's `timings`; default {BUNDLED_DIR})",
    )
    add_cluster_arguments(ppipe)
    return parser


def main(
    argv: Sequence[str],
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    cluster_reader: ClusterReader | None = None,
) -> int:
    """`argv` is what follows `plan`; `cluster_reader` reads `--repository`
    and `--from` (app/cluster_sources/)."""
    args = build_parser().parse_args(list(argv))
    try:
        if args.reference is not None:
            if args.config is not None:
                raise InputError("give a config file or --reference, not both")
            timings = args.timings if args.timings is not None else BUNDLED_DIR
            report = resolve_reference(args.reference, timings, args.time_limit or 60.0)
            out.write(json.dumps(report, indent=2) + "\n")
            return 0
        if wants_cluster(args):
            the_cluster = load_cluster(args, cluster_reader, err)
            body, left = ppipe_input(the_cluster, args.timings)
            left_out(left, err)
            where = the_cluster.source
            cluster, demands, options, timings = config_from_body(body, where, Path.cwd(), args)
        elif args.config is None:
            raise InputError(
                "give a config file (YAML), --repository DIR, --from URL or --reference"
            )
        else:
            cluster, demands, options, timings = read_config(args.config, args)
        start = read_plan(args.start) if args.start is not None else None
        result = plan(cluster, demands, options, start)
        # The daemon serving the plan (PPIPE_PLAN) reads its profiles here.
        result.details["timings"] = str(timings.resolve())
    except (ValueError, TypeError, KeyError, FileNotFoundError, yaml.YAMLError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        err.write(f"{PROG}: error: {message}\n")
        return 2
    out.write(format_plan(result))
    if args.out is not None:
        # PPipe plans by weights, not rates: `rates` stays empty.
        made_from = MadeFrom.now("ppipe", inputs_of(args, "start"), argv[1:])
        write_plan(result, args.out, made_from)
        out.write(f"plan written to {args.out}\n")
    return 0


def read_config(
    path: Path, args: argparse.Namespace
) -> tuple[Cluster, list[ModelDemand], PlannerOptions, Path]:
    """The cluster, models and planner options a YAML file describes, with
    the command line's flags over its `planner` section, and the directory
    of the block timings."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    return config_from_body(yaml.safe_load(path.read_text()), str(path), path.parent, args)


def config_from_body(
    raw: Any, path: str, base: Path, args: argparse.Namespace
) -> tuple[Cluster, list[ModelDemand], PlannerOptions, Path]:
    """`read_config` of a body read already; `base` is where a relative
    `timings` is."""
    body = mapping(raw, path)
    only(body, {"cluster", "models", "timings", "planner"}, path)
    raw_cluster = mapping(body.get("cluster"), f"{path}: cluster")
    only(raw_cluster, {"classes", "bandwidth_gbps", "devices_per_node"}, f"{path}: cluster")
    classes = {str(c): int(n) for c, n in mapping(raw_cluster.get("classes"), "classes").items()}
    per_node = raw_cluster.get("devices_per_node", 1)
    per_class = (
        {str(c): int(n) for c, n in per_node.items()} if isinstance(per_node, dict) else None
    )
    if per_class is not None and set(per_class) != set(classes):
        raise InputError(f"{path}: devices_per_node names {sorted(per_class)}, not the classes")
    if "bandwidth_gbps" not in raw_cluster:
        raise InputError(f"{path}: cluster.bandwidth_gbps is missing")
    cluster = Cluster(
        classes,
        float(raw_cluster["bandwidth_gbps"]),
        next(iter(per_class.values())) if per_class else int(per_node),
    )
    timings = Path(body["timings"]) if "timings" in body else BUNDLED_DIR
    if not timings.is_absolute():
        timings = base / timings
    if args.timings is not None:  # the flag wins over the file
        timings = args.timings
    root = timings_root(timings)
    planner = dict(mapping(body.get("planner", {}), f"{path}: planner"))
    only(planner, _PLANNER_KEYS, f"{path}: planner")
    for flag, key in (
        ("variant", "variant"),
        ("max_partitions", "max_partitions"),
        ("margin", "margin"),
        ("time_limit", "time_limit_s"),
    ):
        if getattr(args, flag) is not None:
            planner[key] = getattr(args, flag)
    if "shares" in planner:
        planner["shares"] = {str(c): tuple(int(s) for s in v) for c, v in planner["shares"].items()}
    options = PlannerOptions(**planner, devices_per_node=per_class)
    models = body.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(f"{path}: models must be a non-empty list")
    demands = [_demand(m, i, root, cluster, path) for i, m in enumerate(models)]
    return cluster, demands, options, root


def _demand(raw: Any, index: int, root: Path, cluster: Cluster, path: str) -> ModelDemand:
    where = f"{path}: models[{index}]"
    body = mapping(raw, where)
    only(body, {"name", "weight", "slo_ms", "slo_multiple"}, where)
    if "name" not in body:
        raise InputError(f"{where}: name is missing")
    profile = load_profile(str(body["name"]), root, cluster.classes)
    if ("slo_ms" in body) == ("slo_multiple" in body):
        raise InputError(f"{where}: give exactly one of slo_ms and slo_multiple")
    if "slo_ms" in body:
        slo = float(body["slo_ms"]) * 1e-3
    else:
        fastest = min(
            profile.whole_latency(1, c) for c in profile.classes() if (c, 1) in profile.latency
        )
        slo = float(body["slo_multiple"]) * fastest
    return ModelDemand(profile.model, float(body.get("weight", 1.0)), slo, profile)


def format_plan(result: Plan) -> str:
    """The plan as a person reads it."""
    cluster = result.cluster
    status = result.details.get("status", "?")
    lines = [
        f"PPipe plan ({result.variant}) on "
        + " + ".join(f"{n}×{c}" for c, n in cluster.classes.items())
        + f", {cluster.bandwidth_gbps:g} Gbit/s links",
        f"objective {result.objective:.2f} requests/s per unit of weight "
        f"(solver: {status}, gap {result.gap * 100:.3f} %, {result.runtime_s:.2f} s)",
        "",
        f"{'model':<48} {'weight':>6} {'SLO ms':>8} {'req/s':>9} {'req/s ÷ w':>10}",
    ]
    for m in result.models:
        lines.append(
            f"{m.name:<48} {m.weight:>6.2f} {m.slo_s * 1e3:>8.1f} {m.throughput:>9.1f} "
            f"{m.throughput / m.weight:>10.1f}"
        )
    lines.append("")
    for p in result.pipelines:
        stages = " → ".join(
            f"[{s.start},{s.end}) {s.devices}×{s.device_class}/{s.share} "
            f"{s.latency_s * 1e3:.1f} ms"
            + (f" +{s.transfer_s * 1e3:.1f} ms" if s.transfer_s else "")
            for s in p.stages
        )
        lines.append(f"{p.model}: batch {p.batch}, {p.throughput:.1f} req/s: {stages}")
    used = result.devices_used()
    lines.append("")
    lines.append(
        "devices used: "
        + ", ".join(f"{c} {used.get(c, 0.0):g}/{n}" for c, n in cluster.classes.items())
    )
    return "\n".join(lines) + "\n"
