"""Symphony's model partitioning (symphony.txt §4.7, App. A.1) as a
mixed-integer program solved with HiGHS under a time limit.

Every epoch, the models are split into disjoint sets, one per sub-cluster;
every backend of a sub-cluster loads all its models, and one scheduling
core (a RankThread) dispatches all its requests. As implemented, for m
models and l sub-clusters:

* x_ij ∈ {0, 1}, Σ_j x_ij = 1 — each model in exactly one sub-cluster
  ((9), (10));
* **rate** (5): Σ_i r_i x_ij ≤ R_max for every j — what one core dispatches;
* **memory** (6): Σ_i s_i x_ij + max_i d_i x_ij ≤ S_max for every j — the
  static memory of all the sub-cluster's models plus the largest dynamic
  memory among them (batches of one backend run one at a time);
* **balance** (7), (8): |Σ_i r_i x_ij − R̄| ≤ ΔR and |Σ_i s_i x_ij − S̄| ≤ ΔS
  for every j, R̄ = Σ r_i / l and S̄ = Σ s_i / l;
* **change cost** (11), with a current assignment X' and a C_max:
  Σ_ij c_ij |x_ij − x'_ij| ≤ C_max;
* objective (4): minimise ΔR + w·ΔS.

HiGHS runs for at most the time limit (default 10 s, the paper's); when the
limit ends the search, the incumbent is the plan and the plan says so
(status `time-limit` and HiGHS's gap to its bound — the LP relaxation
balances perfectly, so on large problems the bound stays near 0 and the
gap near 1 even for good incumbents).

Deviations, and why:

* The max in (6) is linearised exactly with one variable per sub-cluster,
  D_j ≥ d_i x_ij for every i, and Σ_i s_i x_ij + D_j ≤ S_max: a D_j that fits
  exists iff the largest d_i fits.
* |x_ij − x'_ij| needs no variable y_ij: x'_ij is a constant, so it is x_ij
  where x'_ij = 0 and 1 − x_ij where x'_ij = 1, and (11) is one linear row.
* c_ij = c_i: a model's cost does not depend on the sub-cluster (nothing in
  the input distinguishes them), so a move costs 2·c_i (unloaded and
  loaded) and a new model c_i, as (11) counts them. Models of X' that are no
  longer served are unloaded whatever the plan; they are not in (11).
* (11) applies only with a current assignment; without one the program is
  the initial assignment's ((4)–(10)).
* The weight w multiplies the *normalised* memory term: the objective is
  ΔR/R̄ + w·ΔS/S̄ (the paper's with w_paper = w·R̄/S̄, scaled by 1/R̄). Rates
  and bytes differ by nine orders of magnitude; so scaled, w = 1 weighs a
  1 % rate deviation like a 1 % memory deviation whatever the units, and
  the solver works on numbers near 1.
* The search starts from a feasible point where one is at hand (the
  paper's CPLEX run has its own heuristics): the current assignment with
  new models placed greedily, else a greedy assignment (models by
  decreasing normalised size, each to the fitting sub-cluster where the
  larger of its normalised rate and memory ends lowest). HiGHS then
  improves on it; the plan records the start's objective, so what the
  search added is visible.
"""

from __future__ import annotations

import math

import numpy as np

from app.planning.partition.plan import PartitionPlan, SolverResult, build_plan
from app.planning.partition.problem import PartitionProblem, measure, why_infeasible
from app.planning.ppipe.highs import Program

DEFAULT_TIME_LIMIT_S = 10.0


class InfeasibleError(ValueError):
    """No assignment meets the bounds; the message says which and why."""


def solve(
    problem: PartitionProblem,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    mip_rel_gap: float = 1e-4,
    threads: int = 1,
) -> PartitionPlan:
    """The MILP's plan within `time_limit_s`: optimal, or the incumbent
    when the limit hits. Raises InfeasibleError when no assignment exists
    (or none was found in time)."""
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise ValueError(f"time limit must be > 0 s, got {time_limit_s}")
    reasons = why_infeasible(problem)
    if reasons:
        raise InfeasibleError("no assignment is feasible: " + "; ".join(reasons))
    program, x = build_program(problem)
    start = start_assignment(problem)
    point = None if start is None else _point(program, x, problem, start)
    solution = program.solve(time_limit_s, mip_rel_gap, point, threads)
    if solution.values is None:
        if solution.status == "infeasible":
            raise InfeasibleError(
                "no assignment is feasible: HiGHS proved that no assignment meets R_max, "
                "S_max" + (" and C_max" if problem.bounds_change() else "") + " together"
            )
        raise InfeasibleError(
            f"no feasible assignment found within {time_limit_s:g} s (HiGHS: {solution.status}); "
            "give it more time or loosen R_max, S_max or C_max"
        )
    assignment = np.argmax(solution.values[x].reshape(len(problem.models), -1), axis=1)
    gap = solution.gap if math.isfinite(solution.gap) else None
    details = {
        "variables": program.variables,
        "integers": program.integers,
        "constraints": program.rows,
        "start_objective": None if start is None else measure(problem, start).objective,
    }
    result = SolverResult(
        solver="milp",
        status=solution.status,
        runtime_s=solution.runtime_s,
        time_limit_s=time_limit_s,
        gap=gap,
        bound=-solution.bound if math.isfinite(solution.bound) else None,
        details=details,
    )
    return build_plan(problem, assignment, result)


def build_program(problem: PartitionProblem) -> tuple[Program, np.ndarray]:
    """The program on normalised terms and the columns of x (row-major m×l)."""
    m, l = len(problem.models), problem.sub_clusters  # noqa: E741 — the paper's names
    r_bar = problem.average_rate or 1.0
    s_bar = problem.average_static or 1.0
    rates = problem.rates / r_bar
    static = problem.static / s_bar
    dynamic = problem.dynamic / s_bar
    r_max = problem.r_max / r_bar
    s_max = problem.s_max_bytes / s_bar
    program = Program()
    x = np.array([[program.var(0, 1, integer=True) for _ in range(l)] for _ in range(m)])
    largest = [program.var(0, float(dynamic.max())) for _ in range(l)]  # D_j
    delta_r = program.var()
    delta_s = program.var()
    # Program maximises; minimise ΔR' + w·ΔS' as maximise −(…).
    program.maximise(delta_r, -1.0)
    program.maximise(delta_s, -problem.w)
    for i in range(m):  # (9)
        program.row([(int(c), 1.0) for c in x[i]], lower=1.0, upper=1.0)
    for j in range(l):
        load = [(int(x[i, j]), float(rates[i])) for i in range(m)]
        memory = [(int(x[i, j]), float(static[i])) for i in range(m)]
        program.row(load, upper=r_max)  # (5)
        program.row([*memory, (largest[j], 1.0)], upper=s_max)  # (6)
        for i in range(m):
            if dynamic[i] > 0:
                program.row([(largest[j], 1.0), (int(x[i, j]), -float(dynamic[i]))], lower=0.0)
        program.row([*load, (delta_r, -1.0)], upper=1.0)  # (7): Σ r' x − 1 ≤ ΔR'
        program.row([*load, (delta_r, 1.0)], lower=1.0)  # 1 − Σ r' x ≤ ΔR'
        program.row([*memory, (delta_s, -1.0)], upper=1.0)  # (8)
        program.row([*memory, (delta_s, 1.0)], lower=1.0)
    if problem.bounds_change():  # (11), constant part moved to the right
        current = problem.current_index()
        costs = problem.costs
        terms, constant = [], 0.0
        for i in range(m):
            for j in range(l):
                if current[i] == j:
                    constant += costs[i]
                    terms.append((int(x[i, j]), -float(costs[i])))
                else:
                    terms.append((int(x[i, j]), float(costs[i])))
        program.row(terms, upper=float(problem.c_max) - constant)  # type: ignore[arg-type]
    return program, x.reshape(-1)


def start_assignment(problem: PartitionProblem) -> np.ndarray | None:
    """A feasible assignment to start from, or None if the cheap ones fail:
    the current one with new models placed greedily, else a greedy one."""
    candidates = []
    if problem.current:
        fixed = problem.current_index()
        candidates.append(greedy_assignment(problem, fixed))
    candidates.append(greedy_assignment(problem, np.full(len(problem.models), -1)))
    for assignment in candidates:
        if assignment is not None and measure(problem, assignment).feasible:
            return assignment
    return None


def greedy_assignment(problem: PartitionProblem, fixed: np.ndarray) -> np.ndarray | None:
    """Models with fixed[i] ≥ 0 stay there; the others, by decreasing
    normalised rate + memory, each to the fitting sub-cluster where the larger
    of its normalised rate and static memory ends lowest. None when one fits
    nowhere."""
    l = problem.sub_clusters  # noqa: E741
    r_bar = problem.average_rate or 1.0
    s_bar = problem.average_static or 1.0
    rates, static, dynamic = problem.rates, problem.static, problem.dynamic
    assignment = fixed.copy()
    load = np.bincount(fixed[fixed >= 0], weights=rates[fixed >= 0], minlength=l)
    memory = np.bincount(fixed[fixed >= 0], weights=static[fixed >= 0], minlength=l)
    largest = np.zeros(l)
    np.maximum.at(largest, fixed[fixed >= 0], dynamic[fixed >= 0])
    free = np.flatnonzero(fixed < 0)
    order = free[np.argsort(-(rates[free] / r_bar + static[free] / s_bar), kind="stable")]
    for i in order:
        fits = (load + rates[i] <= problem.r_max) & (
            memory + static[i] + np.maximum(largest, dynamic[i]) <= problem.s_max_bytes
        )
        if not fits.any():
            return None
        after = np.maximum((load + rates[i]) / r_bar, (memory + static[i]) / s_bar)
        score = np.where(fits, after, np.inf)
        j = int(np.argmin(score))
        assignment[i] = j
        load[j] += rates[i]
        memory[j] += static[i]
        largest[j] = max(largest[j], dynamic[i])
    return assignment


def _point(
    program: Program, x: np.ndarray, problem: PartitionProblem, assignment: np.ndarray
) -> np.ndarray:
    """`assignment` as a full point of the program (x, D_j, ΔR', ΔS')."""
    m, l = len(problem.models), problem.sub_clusters  # noqa: E741
    point = np.zeros(program.variables)
    point[x.reshape(m, l)[np.arange(m), assignment]] = 1.0
    measures = measure(problem, assignment)
    s_bar = problem.average_static or 1.0
    first_d = int(x[-1]) + 1  # D_j follow x, then ΔR', ΔS'
    point[first_d : first_d + l] = measures.max_dynamic / s_bar
    point[first_d + l] = measures.delta_r / (problem.average_rate or 1.0)
    point[first_d + l + 1] = measures.delta_s / s_bar
    return point
