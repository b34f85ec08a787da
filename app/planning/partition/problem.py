"""The partitioning problem (symphony.txt App. A.1) as plain values, and
what any assignment of it measures: each sub-cluster's rate and memory, the
imbalance factors, feasibility and the cost of changing from a current
assignment. Both solvers (milp.py, random_solver.py) and the plan use these.

Units: requests/s and bytes. The objective is the paper's (4) on
normalised terms: ΔR/R̄ + w·ΔS/S̄ (milp.py says why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: Slack on capacity comparisons, relative, so that a solver's rounding
#: does not turn a binding constraint into a violation.
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class PartitionModel:
    """One model: its request rate r_i (requests/s), static memory s_i (its
    weights, loaded on every backend of its sub-cluster) and dynamic memory
    d_i (the run-time memory of a batch, needed while it runs: only the
    largest of a sub-cluster's counts) in bytes, and the cost of loading or
    unloading it (c_i, any unit C_max is in; default one per load)."""

    name: str
    rate: float
    static_bytes: float
    dynamic_bytes: float = 0.0
    load_cost: float = 1.0

    def __post_init__(self) -> None:
        for key in ("rate", "static_bytes", "dynamic_bytes", "load_cost"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"model {self.name!r}: {key} must be a number ≥ 0, got {value}")


@dataclass(frozen=True)
class PartitionProblem:
    """m models into `sub_clusters` sub-clusters. `r_max` is what one
    scheduling core dispatches (requests/s), `s_max_bytes` a backend's memory,
    `w` the weight of memory balance against rate balance, `current` the
    assignment in force (model → sub-cluster; models missing from it are
    new) and `c_max` the bound on the cost of changing from it (None: no
    bound)."""

    models: tuple[PartitionModel, ...]
    sub_clusters: int
    r_max: float
    s_max_bytes: float
    w: float = 1.0
    current: Mapping[str, int] = field(default_factory=dict)
    c_max: float | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("no models to partition")
        names = [m.name for m in self.models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"models named twice: {twice}")
        if self.sub_clusters < 1:
            raise ValueError(f"sub_clusters must be ≥ 1, got {self.sub_clusters}")
        for key in ("r_max", "s_max_bytes"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a number > 0, got {value}")
        if not (math.isfinite(self.w) and self.w >= 0):
            raise ValueError(f"w must be a number ≥ 0, got {self.w}")
        if self.c_max is not None and not (math.isfinite(self.c_max) and self.c_max >= 0):
            raise ValueError(f"c_max must be a number ≥ 0, got {self.c_max}")
        for model, index in self.current.items():
            if not 0 <= index < self.sub_clusters:
                raise ValueError(
                    f"current assignment puts {model!r} in sub-cluster {index}, "
                    f"outside 0..{self.sub_clusters - 1}"
                )

    # ------------------------------------------------------------ arrays

    @property
    def rates(self) -> np.ndarray:
        return np.array([m.rate for m in self.models])

    @property
    def static(self) -> np.ndarray:
        return np.array([m.static_bytes for m in self.models])

    @property
    def dynamic(self) -> np.ndarray:
        return np.array([m.dynamic_bytes for m in self.models])

    @property
    def costs(self) -> np.ndarray:
        return np.array([m.load_cost for m in self.models])

    @property
    def average_rate(self) -> float:
        """R̄ = Σ r_i / l."""
        return float(self.rates.sum()) / self.sub_clusters

    @property
    def average_static(self) -> float:
        """S̄ = Σ s_i / l."""
        return float(self.static.sum()) / self.sub_clusters

    def current_index(self) -> np.ndarray:
        """Each model's current sub-cluster, −1 for a new model."""
        return np.array([self.current.get(m.name, -1) for m in self.models])

    def removed(self) -> tuple[str, ...]:
        """Models of the current assignment that are no longer served."""
        names = {m.name for m in self.models}
        return tuple(sorted(n for n in self.current if n not in names))

    def bounds_change(self) -> bool:
        """Whether (11) applies: a current assignment and a C_max."""
        return self.c_max is not None and bool(self.current)


def why_infeasible(problem: PartitionProblem) -> list[str]:
    """Reasons no assignment can exist that need no search: a model alone
    over a bound, totals over all sub-clusters' capacity, or new models
    whose loading alone costs more than C_max. Empty: the solver decides."""
    reasons = []
    for m in problem.models:
        if m.rate > problem.r_max * (1 + _TOLERANCE):
            reasons.append(f"model {m.name!r} alone has rate {m.rate:g} > R_max {problem.r_max:g}")
        if m.static_bytes + m.dynamic_bytes > problem.s_max_bytes * (1 + _TOLERANCE):
            reasons.append(
                f"model {m.name!r} alone needs {(m.static_bytes + m.dynamic_bytes) / 1e6:g} MB "
                f"(static + dynamic) > S_max {problem.s_max_bytes / 1e6:g} MB"
            )
    total_rate = float(problem.rates.sum())
    if total_rate > problem.sub_clusters * problem.r_max * (1 + _TOLERANCE):
        reasons.append(
            f"total rate {total_rate:g} > {problem.sub_clusters} sub-clusters × "
            f"R_max {problem.r_max:g}"
        )
    total_static = float(problem.static.sum())
    if total_static > problem.sub_clusters * problem.s_max_bytes * (1 + _TOLERANCE):
        reasons.append(
            f"total static memory {total_static / 1e6:g} MB > {problem.sub_clusters} "
            f"sub-clusters × S_max {problem.s_max_bytes / 1e6:g} MB"
        )
    if problem.bounds_change():
        new = problem.current_index() < 0
        forced = float(problem.costs[new].sum())
        if forced > problem.c_max * (1 + _TOLERANCE):  # type: ignore[operator]
            reasons.append(
                f"loading the {int(new.sum())} new models costs {forced:g} > C_max "
                f"{problem.c_max:g}"
            )
    return reasons


@dataclass(frozen=True)
class Measures:
    """What an assignment gives: per sub-cluster rate, static memory and
    largest dynamic memory; the paper's ΔR and ΔS; the imbalance factors
    (max − min)/avg of rate and of static memory (App. A.2); the change cost
    (11) from the current assignment; and whether it meets every bound."""

    rate: np.ndarray
    static: np.ndarray
    max_dynamic: np.ndarray
    delta_r: float
    delta_s: float
    objective: float
    load_imbalance: float
    memory_imbalance: float
    change_cost: float
    feasible: bool


def imbalance(values: np.ndarray) -> float:
    """(max − min) / avg; 0 for an all-zero vector."""
    mean = float(values.mean())
    return float(values.max() - values.min()) / mean if mean > 0 else 0.0


def change_costs(problem: PartitionProblem, assignment: np.ndarray) -> np.ndarray:
    """Each model's share of (11): 0 where it stays, c_i loaded where it is
    new, 2·c_i (unloaded and loaded) where it moves."""
    current = problem.current_index()
    costs = problem.costs
    return np.where(current < 0, costs, np.where(current == assignment, 0.0, 2.0 * costs))


def measure(problem: PartitionProblem, assignment: Sequence[int] | np.ndarray) -> Measures:
    """The measures of `assignment` (model i → its sub-cluster)."""
    x = np.asarray(assignment, dtype=int)
    if x.shape != (len(problem.models),) or x.min() < 0 or x.max() >= problem.sub_clusters:
        raise ValueError(
            f"an assignment gives each of the {len(problem.models)} models a sub-cluster "
            f"in 0..{problem.sub_clusters - 1}"
        )
    l = problem.sub_clusters  # noqa: E741 — the paper's name
    rate = np.bincount(x, weights=problem.rates, minlength=l)
    static = np.bincount(x, weights=problem.static, minlength=l)
    max_dynamic = np.zeros(l)
    np.maximum.at(max_dynamic, x, problem.dynamic)
    delta_r = float(np.abs(rate - problem.average_rate).max())
    delta_s = float(np.abs(static - problem.average_static).max())
    cost = float(change_costs(problem, x).sum()) if problem.current else 0.0
    slack = 1 + _TOLERANCE
    feasible = bool(
        (rate <= problem.r_max * slack).all()
        and (static + max_dynamic <= problem.s_max_bytes * slack).all()
        and (not problem.bounds_change() or cost <= problem.c_max * slack)  # type: ignore[operator]
    )
    return Measures(
        rate=rate,
        static=static,
        max_dynamic=max_dynamic,
        delta_r=delta_r,
        delta_s=delta_s,
        objective=normalised_objective(problem, delta_r, delta_s),
        load_imbalance=imbalance(rate),
        memory_imbalance=imbalance(static),
        change_cost=cost,
        feasible=feasible,
    )


def normalised_objective(problem: PartitionProblem, delta_r: float, delta_s: float) -> float:
    """ΔR/R̄ + w·ΔS/S̄ (a zero average contributes nothing)."""
    r_bar, s_bar = problem.average_rate, problem.average_static
    return (delta_r / r_bar if r_bar > 0 else 0.0) + problem.w * (
        delta_s / s_bar if s_bar > 0 else 0.0
    )
