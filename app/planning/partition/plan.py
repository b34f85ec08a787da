"""A partition plan (`python -m app plan partition … --out FILE`): which
models each sub-cluster serves, with its rate and memory, the imbalance
factors, the moves from the assignment in force and their cost, and how
the solver ended (status, gap). JSON through app/planning/plan_files.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.planning.partition.problem import PartitionProblem, change_costs, measure
from app.planning.plan_files import MadeFrom, envelope, read_json, unwrap, write_json

KIND = "symphony-partition"


@dataclass(frozen=True)
class SubCluster:
    """One sub-cluster: its models (each backend loads them all), their
    total rate (what its scheduling core dispatches), static memory and the
    largest dynamic memory among them; memory_bytes = static + that."""

    index: int
    models: tuple[str, ...]
    rate: float
    static_bytes: float
    max_dynamic_bytes: float

    @property
    def memory_bytes(self) -> float:
        return self.static_bytes + self.max_dynamic_bytes


@dataclass(frozen=True)
class Move:
    """A model that changes sub-cluster (`source` None: a new model) and
    what the change costs under (11)."""

    model: str
    source: int | None
    target: int
    cost: float


@dataclass(frozen=True)
class SolverResult:
    """How a solver ended. `status`: optimal, time-limit (the incumbent
    when the limit hit), best-of-random; `gap` is HiGHS's relative gap
    between the incumbent and its bound (None for the random solver)."""

    solver: str  # milp | random
    status: str
    runtime_s: float
    time_limit_s: float
    gap: float | None = None
    bound: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionPlan:
    sub_clusters: tuple[SubCluster, ...]
    r_max: float
    s_max_bytes: float
    w: float
    c_max: float | None
    objective: float  # ΔR/R̄ + w·ΔS/S̄
    load_imbalance: float
    memory_imbalance: float
    moves: tuple[Move, ...]
    change_cost: float
    removed: tuple[str, ...]  # models of the current assignment no longer served
    result: SolverResult

    def assignment(self) -> dict[str, int]:
        """Model → sub-cluster."""
        return {m: s.index for s in self.sub_clusters for m in s.models}


def build_plan(
    problem: PartitionProblem, assignment: np.ndarray, result: SolverResult
) -> PartitionPlan:
    """The plan of a feasible `assignment` (model i → sub-cluster)."""
    measures = measure(problem, assignment)
    names = [m.name for m in problem.models]
    subs = tuple(
        SubCluster(
            j,
            tuple(n for n, x in zip(names, assignment, strict=True) if x == j),
            float(measures.rate[j]),
            float(measures.static[j]),
            float(measures.max_dynamic[j]),
        )
        for j in range(problem.sub_clusters)
    )
    moves: list[Move] = []
    if problem.current:
        costs = change_costs(problem, assignment)
        for i, name in enumerate(names):
            source = problem.current.get(name)
            if source != int(assignment[i]):
                moves.append(Move(name, source, int(assignment[i]), float(costs[i])))
    return PartitionPlan(
        sub_clusters=subs,
        r_max=problem.r_max,
        s_max_bytes=problem.s_max_bytes,
        w=problem.w,
        c_max=problem.c_max if problem.bounds_change() else None,
        objective=measures.objective,
        load_imbalance=measures.load_imbalance,
        memory_imbalance=measures.memory_imbalance,
        moves=tuple(moves),
        change_cost=measures.change_cost,
        removed=problem.removed(),
        result=result,
    )


# ------------------------------------------------------------------ files


def plan_to_dict(plan: PartitionPlan, made_from: MadeFrom | None = None) -> dict[str, Any]:
    r = plan.result
    return envelope(
        KIND,
        {
            "r_max": plan.r_max,
            "s_max_bytes": plan.s_max_bytes,
            "w": plan.w,
            "c_max": plan.c_max,
            "objective": plan.objective,
            "load_imbalance": plan.load_imbalance,
            "memory_imbalance": plan.memory_imbalance,
            "change_cost": plan.change_cost,
            "sub_clusters": [
                {
                    "index": s.index,
                    "models": list(s.models),
                    "rate": s.rate,
                    "static_bytes": s.static_bytes,
                    "max_dynamic_bytes": s.max_dynamic_bytes,
                    "memory_bytes": s.memory_bytes,
                }
                for s in plan.sub_clusters
            ],
            "moves": [
                {"model": m.model, "from": m.source, "to": m.target, "cost": m.cost}
                for m in plan.moves
            ],
            "removed": list(plan.removed),
            "solver": {
                "solver": r.solver,
                "status": r.status,
                "runtime_s": r.runtime_s,
                "time_limit_s": r.time_limit_s,
                "gap": r.gap,
                "bound": r.bound,
                "details": r.details,
            },
        },
        made_from,
    )


def plan_from_dict(body: dict[str, Any], source: str = "<plan>") -> PartitionPlan:
    body = unwrap(body, KIND, "a Symphony partition plan", source)
    try:
        solver = body["solver"]
        return PartitionPlan(
            sub_clusters=tuple(
                SubCluster(
                    int(s["index"]),
                    tuple(s["models"]),
                    float(s["rate"]),
                    float(s["static_bytes"]),
                    float(s["max_dynamic_bytes"]),
                )
                for s in body["sub_clusters"]
            ),
            r_max=float(body["r_max"]),
            s_max_bytes=float(body["s_max_bytes"]),
            w=float(body["w"]),
            c_max=None if body["c_max"] is None else float(body["c_max"]),
            objective=float(body["objective"]),
            load_imbalance=float(body["load_imbalance"]),
            memory_imbalance=float(body["memory_imbalance"]),
            moves=tuple(
                Move(m["model"], m["from"], int(m["to"]), float(m["cost"])) for m in body["moves"]
            ),
            change_cost=float(body["change_cost"]),
            removed=tuple(body["removed"]),
            result=SolverResult(
                solver=solver["solver"],
                status=solver["status"],
                runtime_s=float(solver["runtime_s"]),
                time_limit_s=float(solver["time_limit_s"]),
                gap=solver["gap"],
                bound=solver["bound"],
                details=dict(solver["details"]),
            ),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{source}: malformed partition plan: {error!r}") from error


def write_plan(plan: PartitionPlan, path: Path, made_from: MadeFrom | None = None) -> None:
    write_json(plan_to_dict(plan, made_from), path)


def read_plan(path: Path) -> PartitionPlan:
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    return plan_from_dict(read_json(path), str(path))
