"""An InSS plan (placement, shares and batch sizes) and its file.

The file is the planners' plan file (app/planning/plan_files.py: kind,
version, what it was made from, this plan): `write_plan` / `read_plan`
round-trip a `Plan` exactly. Units: seconds, bytes, requests/s; shares are fractions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.planning.plan_files import MadeFrom, envelope, read_json, unwrap, write_json

if TYPE_CHECKING:
    from app.planning.inss.problem import ModelSpec, Served

PLAN_KIND = "inss-plan"


@dataclass(frozen=True)
class ModelPlan:
    """One model: where it runs (None when it is not served), its share and
    batch, predicted t_inf, throughput and worst-case latency (problem.py),
    and why it is not served ("" when it is)."""

    model: str
    rate: float
    slo_s: float
    device: str | None
    share: float | None
    batch: int | None
    exec_s: float | None
    throughput: float
    worst_latency_s: float | None
    memory_bytes: float | None
    reason: str = ""

    @property
    def served(self) -> bool:
        return self.device is not None

    @classmethod
    def on(cls, spec: ModelSpec, device: str, outcome: Served) -> ModelPlan:
        """`spec` served on `device` as `outcome` says."""
        return cls(
            model=spec.name,
            rate=spec.rate,
            slo_s=spec.slo_s,
            device=device,
            share=round(outcome.share, 12),
            batch=outcome.batch,
            exec_s=outcome.exec_s,
            throughput=outcome.throughput,
            worst_latency_s=outcome.worst_latency_s,
            memory_bytes=outcome.memory_bytes,
        )

    @classmethod
    def unserved(cls, spec: ModelSpec, reason: str) -> ModelPlan:
        """`spec` left off, and why."""
        return cls(
            model=spec.name,
            rate=spec.rate,
            slo_s=spec.slo_s,
            device=None,
            share=None,
            batch=None,
            exec_s=None,
            throughput=0.0,
            worst_latency_s=None,
            memory_bytes=None,
            reason=reason,
        )


@dataclass(frozen=True)
class DevicePlan:
    """One device: the models on it, the shares and memory they take."""

    device: str
    kind: str
    models: tuple[str, ...]
    shares_used: float
    memory_bytes: float
    memory_used_bytes: float


@dataclass(frozen=True)
class Plan:
    """Problem (1) solved: `objective` is Σ throughput of the served models
    (requests/s); `feasible` when every model is served; `method` is
    "exact", "greedy" or "learned"; `details` says what the search did."""

    method: str
    share_step: float
    models: tuple[ModelPlan, ...]
    devices: tuple[DevicePlan, ...]
    objective: float
    feasible: bool
    details: dict[str, Any] = field(default_factory=dict)

    def model(self, name: str) -> ModelPlan:
        for m in self.models:
            if m.model == name:
                return m
        raise KeyError(f"no model {name!r} in the plan")

    def unserved(self) -> dict[str, str]:
        """Model → why it is not served."""
        return {m.model: m.reason for m in self.models if not m.served}


def plan_to_dict(plan: Plan, made_from: MadeFrom | None = None) -> dict[str, Any]:
    body = asdict(plan)
    # JSON has no NaN: an unknown figure is null.
    for m in body["models"]:
        for key, value in m.items():
            if isinstance(value, float) and not math.isfinite(value):
                m[key] = None
    return envelope(PLAN_KIND, body, made_from)


def plan_from_dict(body: dict[str, Any], source: str = "plan") -> Plan:
    return plan_from_body(unwrap(body, PLAN_KIND, "an InSS plan", source), source)


def plan_from_body(body: dict[str, Any], source: str = "plan") -> Plan:
    """The plan from its fields (a plan file's `plan`)."""
    try:
        return Plan(
            method=str(body["method"]),
            share_step=float(body["share_step"]),
            models=tuple(ModelPlan(**m) for m in body["models"]),
            devices=tuple(
                DevicePlan(**{**d, "models": tuple(d["models"])}) for d in body["devices"]
            ),
            objective=float(body["objective"]),
            feasible=bool(body["feasible"]),
            details=dict(body.get("details", {})),
        )
    except (KeyError, TypeError) as error:
        raise ValueError(f"{source}: malformed plan: {error}") from error


def placement_plan(
    placed: Mapping[str, tuple[str, float, int]], kind: str, slo_s: float, memory_bytes: float
) -> Plan:
    """A plan placing each model on its (device, share, batch) as given, on
    devices of `kind` with `memory_bytes` each: a plan made by hand (a
    bench's or a test's, posted as any plan is). What a planner predicts —
    running times, throughputs — is left out; the server does not read it."""
    models = tuple(
        ModelPlan(name, 0.0, slo_s, device, share, batch, None, 0.0, None, None)
        for name, (device, share, batch) in placed.items()
    )
    devices = tuple(
        DevicePlan(
            device,
            kind,
            tuple(name for name, where in placed.items() if where[0] == device),
            sum(where[1] for where in placed.values() if where[0] == device),
            memory_bytes,
            0.0,
        )
        for device in dict.fromkeys(where[0] for where in placed.values())
    )
    return Plan("exact", 0.1, models, devices, 0.0, True)


def write_plan(plan: Plan, path: Path, made_from: MadeFrom | None = None) -> None:
    write_json(plan_to_dict(plan, made_from), path)


def read_plan(path: Path) -> Plan:
    return plan_from_dict(read_json(path), str(path))
