"""A PPipe plan: what the control plane decided and the data plane serves.

ppipe.txt §5.3: each model is served by one or more *pipelines*; a pipeline
is a sequence of stages, each a partition (a block range) of the model run on
a pool of same-class devices (or same-size shares of them), all at one batch
size. Its throughput is that of its slowest stage. A plan also names the
cluster it was made for and its objective, the minimum over models of
planned throughput ÷ weight.

Two file forms are read:

* ours (`write_plan` / `read_plan`), the file `python -m app plan ppipe`
  writes and the simulator and daemon load;
* the PPipe artifact's reference plans (`data/ppipe/plans-maf19/*.json`,
  `read_reference_plan`), whose file name carries the group, weights,
  cluster, bandwidth and SLO multiplier.

A stage's pool is `devices` instances of 1/`share` of a device each, so it
occupies devices/share whole devices of its class.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.planning.plan_files import MadeFrom, envelope, read_json, unwrap, write_json

PLAN_KIND = "ppipe-plan"


@dataclass(frozen=True)
class Cluster:
    """Device classes and how many whole devices of each; every node holds
    `devices_per_node` devices and has an uplink and a downlink of
    `bandwidth_gbps` each."""

    classes: dict[str, int]
    bandwidth_gbps: float
    devices_per_node: int = 1

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("a cluster needs at least one device class")
        for name, count in self.classes.items():
            if count < 0:
                raise ValueError(f"device class {name!r}: count must be ≥ 0, got {count}")
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")
        if self.devices_per_node < 1:
            raise ValueError(f"devices_per_node must be ≥ 1, got {self.devices_per_node}")


@dataclass(frozen=True)
class Stage:
    """Blocks [start, end) of a model on `devices` instances of 1/`share`
    of a `device_class` device. `latency_s` runs one batch of the pipeline's
    size; `transfer_s` sends its output to the next stage (0 for the last)."""

    start: int
    end: int
    device_class: str
    share: int
    devices: int
    latency_s: float
    transfer_s: float = 0.0

    @property
    def whole_devices(self) -> float:
        return self.devices / self.share


@dataclass(frozen=True)
class Pipeline:
    """One pipeline of `model`: its stages in order, its batch size and
    planned throughput (requests/s, that of its slowest stage)."""

    model: str
    batch: int
    stages: tuple[Stage, ...]
    throughput: float

    @property
    def latency_s(self) -> float:
        """Compute plus transfers of one batch through every stage."""
        return sum(s.latency_s + s.transfer_s for s in self.stages)


@dataclass(frozen=True)
class ModelTarget:
    """A model the plan serves: its weight in the objective, SLO and the
    throughput the plan gives it (requests/s)."""

    name: str
    weight: float
    slo_s: float
    throughput: float = 0.0


@dataclass(frozen=True)
class Plan:
    cluster: Cluster
    models: tuple[ModelTarget, ...]
    pipelines: tuple[Pipeline, ...]
    variant: str = "ppipe"  # ppipe | np (no partitioning) | dart-r
    objective: float = 0.0  # min over models of throughput / weight
    gap: float = 0.0  # the solver's relative MIP gap at the end
    runtime_s: float = 0.0  # solve time
    details: dict[str, Any] = field(default_factory=dict)

    def pipelines_of(self, model: str) -> list[Pipeline]:
        return [p for p in self.pipelines if p.model == model]

    def devices_used(self) -> dict[str, float]:
        """Whole devices used per class."""
        used: dict[str, float] = dict.fromkeys(self.cluster.classes, 0.0)
        for pipeline in self.pipelines:
            for stage in pipeline.stages:
                used[stage.device_class] = used.get(stage.device_class, 0.0) + stage.whole_devices
        return used


def plan_to_dict(plan: Plan, made_from: MadeFrom | None = None) -> dict[str, Any]:
    return envelope(PLAN_KIND, asdict(plan), made_from)


def plan_from_dict(body: dict[str, Any], source: str = "plan") -> Plan:
    body = unwrap(body, PLAN_KIND, "a PPipe plan", source)
    try:
        cluster = Cluster(**body["cluster"])
        models = tuple(ModelTarget(**m) for m in body["models"])
        pipelines = tuple(
            Pipeline(
                model=p["model"],
                batch=int(p["batch"]),
                stages=tuple(Stage(**s) for s in p["stages"]),
                throughput=float(p["throughput"]),
            )
            for p in body["pipelines"]
        )
        return Plan(
            cluster=cluster,
            models=models,
            pipelines=pipelines,
            variant=str(body.get("variant", "ppipe")),
            objective=float(body.get("objective", 0.0)),
            gap=float(body.get("gap", 0.0)),
            runtime_s=float(body.get("runtime_s", 0.0)),
            details=dict(body.get("details", {})),
        )
    except (KeyError, TypeError) as error:
        raise ValueError(f"{source}: malformed plan: {error}") from error


def write_plan(plan: Plan, path: Path, made_from: MadeFrom | None = None) -> None:
    write_json(plan_to_dict(plan, made_from), path)


def read_plan(path: Path) -> Plan:
    return plan_from_dict(read_json(path), str(path))


# ------------------------------------------------------------ reference plans

_REFERENCE_NAME = re.compile(
    r"^(?P<models>.+)_(?P<weights>[0-9.]+(?:-[0-9.]+)*)_(?P<classes>[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)"
    r"_(?P<counts>[0-9]+(?:-[0-9]+)*)_bw-gbps-(?P<bw>[0-9.]+)_sla-multiplier-(?P<slo>[0-9.]+)"
    r"_(?P<variant>v4|bl|dart-r)$"
)
_VARIANTS = {"v4": "ppipe", "bl": "np", "dart-r": "dart-r"}


@dataclass(frozen=True)
class ReferenceName:
    """What a reference plan's file name says."""

    weights: tuple[float, ...]
    classes: dict[str, int]
    bandwidth_gbps: float
    slo_multiplier: float
    variant: str


def parse_reference_name(path: Path) -> ReferenceName:
    match = _REFERENCE_NAME.match(path.stem)
    if match is None:
        raise ValueError(
            f"{path.name}: not a reference plan name "
            "(…_WEIGHTS_CLASSES_COUNTS_bw-gbps-B_sla-multiplier-M_VARIANT)"
        )
    names = match["classes"].split("-")
    counts = [int(c) for c in match["counts"].split("-")]
    if len(names) != len(counts):
        raise ValueError(f"{path.name}: {len(names)} device classes but {len(counts)} counts")
    return ReferenceName(
        weights=tuple(float(w) for w in match["weights"].split("-")),
        classes=dict(zip(names, counts, strict=True)),
        bandwidth_gbps=float(match["bw"]),
        slo_multiplier=float(match["slo"]),
        variant=_VARIANTS[match["variant"]],
    )


def read_reference_plan(path: Path) -> Plan:
    """A reference plan from the PPipe artifact, in our form. Its models'
    order and weights come from the file name, SLOs and throughputs from
    its entries (µs → s); `details["configs"]` keeps each entry's `config`."""
    name = parse_reference_name(path)
    entries = json.loads(path.read_text())
    if len(entries) != len(name.weights):
        raise ValueError(f"{path.name}: {len(entries)} entries but {len(name.weights)} weights")
    models: list[ModelTarget] = []
    pipelines: list[Pipeline] = []
    for entry, weight in zip(entries, name.weights, strict=True):
        config = entry["config"]
        model = config["dnn_name"]
        models.append(ModelTarget(model, weight, config["sla"] * 1e-6, float(entry["xput"])))
        for raw in entry["pipelines"]:
            parts = raw["partitions"]
            stages = tuple(
                Stage(
                    start=int(p["layers"][0]),
                    end=int(p["layers"][1]),
                    device_class=p["gpu"],
                    share=int(p["mps"]) + 1,
                    devices=round(p["num_gpu"] * (int(p["mps"]) + 1)),
                    latency_s=p["lat_infer"] * 1e-6,
                    transfer_s=p["lat_trans"] * 1e-6,
                )
                for p in parts
            )
            if any(s.devices == 0 for s in stages):
                continue  # an inactive option the solver left in
            pipelines.append(Pipeline(model, int(parts[0]["bs"]), stages, float(raw["xput"])))
    objective = min(m.throughput / m.weight for m in models)
    configs = [e["config"] for e in entries]
    devices_per_node = int(configs[0].get("num_gpu_per_server_arr", [1])[0])
    return Plan(
        cluster=Cluster(name.classes, name.bandwidth_gbps, devices_per_node),
        models=tuple(models),
        pipelines=tuple(pipelines),
        variant=name.variant,
        objective=objective,
        gap=float(entries[0].get("mipgap", 0.0)),
        runtime_s=float(entries[0].get("runtime", 0.0)),
        details={"configs": configs, "slo_multiplier": name.slo_multiplier, "source": path.name},
    )
