"""The random baseline of symphony.txt App. A.2: draw a random partition,
check it against every constraint ((5), (6) and, with a current assignment,
(11)), score it with the MILP's objective, repeat until the time budget is
spent, and keep the best feasible one.

Partitions are uniform (each model to a sub-cluster drawn independently)
and scored in blocks of `block` at a time with numpy, so the budget buys as
many tries as this machine can score; the plan records how many.
"""

from __future__ import annotations

import math
import time

import numpy as np

from app.planning.partition.milp import InfeasibleError
from app.planning.partition.plan import PartitionPlan, SolverResult, build_plan
from app.planning.partition.problem import PartitionProblem, why_infeasible


def solve_random(
    problem: PartitionProblem,
    time_limit_s: float,
    seed: int = 0,
    block: int = 256,
    max_tries: int | None = None,
) -> PartitionPlan:
    """The best feasible random partition found within `time_limit_s` (or
    `max_tries` draws, whichever ends first). Raises InfeasibleError when
    none of the draws was feasible."""
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ValueError(f"time limit must be > 0 s, got {time_limit_s}")
    reasons = why_infeasible(problem)
    if reasons:
        raise InfeasibleError("no assignment is feasible: " + "; ".join(reasons))
    rng = np.random.default_rng(seed)
    m, l = len(problem.models), problem.sub_clusters  # noqa: E741 — the paper's names
    rates, static, dynamic = problem.rates, problem.static, problem.dynamic
    r_bar, s_bar = problem.average_rate or 1.0, problem.average_static or 1.0
    current = problem.current_index()
    bound_change = problem.bounds_change()
    best: np.ndarray | None = None
    best_objective = math.inf
    tries = feasible = 0
    began = time.perf_counter()
    while time.perf_counter() - began < time_limit_s:
        size = block if max_tries is None else min(block, max_tries - tries)
        if size <= 0:
            break
        draws = rng.integers(l, size=(size, m))
        cells = (draws + l * np.arange(size)[:, None]).ravel()  # (row, sub-cluster) cell
        load = np.bincount(cells, np.tile(rates, size), minlength=size * l).reshape(size, l)
        memory = np.bincount(cells, np.tile(static, size), minlength=size * l).reshape(size, l)
        largest = np.zeros(size * l)
        np.maximum.at(largest, cells, np.tile(dynamic, size))
        largest = largest.reshape(size, l)
        ok = (load <= problem.r_max).all(axis=1) & (memory + largest <= problem.s_max_bytes).all(
            axis=1
        )
        if bound_change:
            moved = np.where(current < 0, 1.0, np.where(draws == current, 0.0, 2.0))
            ok &= moved @ problem.costs <= problem.c_max  # type: ignore[operator]
        delta_r = np.abs(load - problem.average_rate).max(axis=1) / r_bar
        delta_s = np.abs(memory - problem.average_static).max(axis=1) / s_bar
        objective = np.where(ok, delta_r + problem.w * delta_s, np.inf)
        tries += size
        feasible += int(ok.sum())
        k = int(np.argmin(objective))
        if objective[k] < best_objective:
            best_objective = float(objective[k])
            best = draws[k].copy()
    runtime = time.perf_counter() - began
    if best is None:
        raise InfeasibleError(
            f"no feasible assignment among {tries} random ones in {runtime:.3g} s"
        )
    result = SolverResult(
        solver="random",
        status="best-of-random",
        runtime_s=runtime,
        time_limit_s=time_limit_s,
        details={"tries": tries, "feasible": feasible, "seed": seed},
    )
    return build_plan(problem, best, result)
