"""HERD's ILP (shepherd-nsdi23.txt §4, Table 2) on HiGHS.

Variables, for model-stream k (problem.py: a model's streams together),
model k, affinity set c and candidate group j = 1 … J:

* x_kj ∈ {0, 1}: model-stream k is served by group j;
* z_kj ∈ {0, 1}: model k is loaded in group j;
* y_cj ∈ {0, 1}: group j draws its models from affinity set c;
* size_j ∈ {0, …, Ḡ}: devices of group j;
* t ≥ 0: the least burst tolerance, maximised (the max-min objective
  linearised with one auxiliary variable, as §4 says it can be).

Constraints, named as §4 names them:

* (a) cluster-size limit: Σ_j size_j ≤ N;
* (b) group-worker limit: size_j ≤ Ḡ (the variable's bound);
* (c) GPU-memory limit: Σ_k mem_k · z_kj ≤ mem − reserve — every device of
  a group holds all its models, with memory set aside for FLEX;
* (d) group surjectivity: Σ_j x_kj = 1, and x_kj ≤ z_kj (a stream goes only
  where its model is);
* (e) affinity-set surjectivity: Σ_c y_cj ≤ 1 and z_kj ≤ y_{c(k) j} (a
  group's models all come from one affinity set).

Objective rows (plan.py defines both readings of burst tolerance):

* `paper`: t · n_k ≤ Σ_j w_kj with w_kj = size_j · x_kj linearised the
  standard way — w ≤ Ḡ·x, w ≤ size_j, w ≥ size_j − Ḡ·(1 − x), w ≥ 0;
* `shared`: with L_j = Σ_m n_m x_mj (one continuous variable per group),
  size_j − L_j + n_k − t · n_k ≥ −M_k · (1 − x_kj), M_k = Σ n + n_k · t̄ —
  enforced in the group that serves k, slack elsewhere.

t̄ = min_k Ḡ / n_k bounds t under both readings (bt(k) ≤ size / n_k ≤ Ḡ / n_k).

Deviations, with reasons:

* Symmetry breaking size_j ≥ size_{j+1}: candidate groups are
  interchangeable; ordering them changes no optimum and spares the search
  J! copies of every plan.
* After the solve, groups serving no stream are dropped and every device
  the plan leaves unused (constraint (a) is ≤, and the max-min objective is
  indifferent to groups that do not hold the minimum) goes, one at a time,
  to the served group of least burst tolerance that is below Ḡ (under the
  tie-break's reading when there is one: a spare device changes no paper
  optimum, so the tie-break decides where it goes). Neither
  step lowers any stream's burst tolerance; both keep devices from idling.
* The solve stops at `time_limit_s` and the incumbent is accepted (status
  `time-limit`, with HiGHS's gap); no incumbent is an error.
* A warm start (`warm_start`): greedy.py's plan is HiGHS's starting point;
  when its least burst tolerance already equals t̄, the bound, it is
  optimal and HiGHS is not run (status `optimal`, gap 0, runtime 0).
  Without it HiGHS spent its time on the memory packing: 3.3 s at 200
  workers, a 635–715 % gap after 60 s at 1,000 (BENCHMARKS.md).
* A tie-break (`tie_break="shared"`, with the `paper` objective): the
  paper's max-min is often decided by one stream (the largest n_k), and
  every plan that gives it its group is optimal however the others are
  stacked. A second solve keeps t_paper ≥ the optimum found (less 1e-9
  relative) and maximises the least `shared` burst tolerance (its rows as
  above, t_shared free in sign), from the better of the first solve's plan
  and the greedy `shared` plan, within the time left. The plan is still an
  optimum of the paper's objective; `solver["tie_break"]` reports the
  second solve. Measured: 1,319 r/s against 1,054 for the untied optimum
  and 1,154 for random groups (BENCHMARKS.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.planning.herd.greedy import GreedyPlan, greedy_plan
from app.planning.herd.plan import OBJECTIVES, HerdPlan, build_groups, burst_tolerances
from app.planning.herd.problem import (
    Goodput,
    ModelStream,
    Problem,
    model_streams,
    single_device_goodput,
)
from app.planning.ppipe.highs import Program, Solution


class Infeasible(ValueError):
    """No plan meets the constraints; the message says which one cannot hold."""


@dataclass(frozen=True)
class SolveOptions:
    objective: str = "paper"
    time_limit_s: float = 10.0
    mip_rel_gap: float = 1e-4
    threads: int = 1
    #: Among the `paper` objective's optima, which to take: "shared" (the one
    #: of the largest least `shared` burst tolerance, a second solve with the
    #: paper's optimum held) or "none" (whichever the solver ends with).
    tie_break: str = "shared"
    warm_start: bool = True  # begin from greedy.py's plan

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if not self.time_limit_s > 0:
            raise ValueError(f"time limit must be > 0 s, got {self.time_limit_s}")
        if self.tie_break not in TIE_BREAKS:
            raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {self.tie_break!r}")


TIE_BREAKS = ("shared", "none")


def check_feasible(problem: Problem, streams: Sequence[ModelStream]) -> None:
    """Raise Infeasible for what rules out every plan before any search."""
    c = problem.cluster
    for ms in streams:
        model = problem.model(ms.model)
        if model.memory > c.model_memory:
            raise Infeasible(
                f"(c) GPU-memory limit: model {model.name!r} needs {model.memory} B, a device "
                f"has {c.model_memory} B for models ({c.device_memory} B − {c.reserve} B reserve)"
            )
    sets = {problem.model(ms.model).affinity for ms in streams}
    groups = min(c.candidate_groups, c.devices)
    if len(sets) > groups:
        raise Infeasible(
            f"(e) affinity sets: {len(sets)} affinity sets have streams, but at most {groups} "
            f"groups can get a device (N = {c.devices}, J = {c.candidate_groups})"
        )


@dataclass
class _Model:
    """The program and where its variables are."""

    program: Program
    t: dict[str, int]  # reading → its least burst tolerance variable
    size: list[int]
    x: list[list[int]]
    z: list[list[int]]
    y: list[list[int]]
    w: list[list[int]]  # paper reading's size_j · x_kj
    load: list[int]  # shared reading's L_j
    lower: dict[str, float]  # reading → its variable's lower bound
    target: str  # the reading maximised


@dataclass(frozen=True)
class _Input:
    streams: tuple[ModelStream, ...]
    n: np.ndarray
    mem: list[int]
    set_of: list[int]
    sets: int
    groups: int  # J
    max_size: int  # Ḡ
    devices: int  # N
    model_memory: int

    @property
    def t_bar(self) -> float:
        return float(np.min(self.max_size / self.n))


def _build(inp: _Input, readings: dict[str, float], target: str) -> _Model:
    """The ILP with a least-bt variable per reading in `readings` (its lower
    bound), maximising `target`'s."""
    K, J, G, n = len(inp.streams), inp.groups, inp.max_size, inp.n
    p = Program()
    t = {r: p.var(lower, inp.t_bar) for r, lower in readings.items()}
    p.maximise(t[target])
    size = [p.var(0.0, G, integer=True) for _ in range(J)]
    x = [[p.var(0.0, 1.0, integer=True) for _ in range(J)] for _ in range(K)]
    z = [[p.var(0.0, 1.0, integer=True) for _ in range(J)] for _ in range(K)]
    y = [[p.var(0.0, 1.0, integer=True) for _ in range(J)] for _ in range(inp.sets)]

    p.row([(s, 1.0) for s in size], upper=inp.devices)  # (a)
    for j in range(J):
        p.row([(z[k][j], float(inp.mem[k])) for k in range(K)], upper=inp.model_memory)  # (c)
        p.row([(y[s][j], 1.0) for s in range(inp.sets)], upper=1.0)  # (e)
        if j + 1 < J:
            p.row([(size[j], 1.0), (size[j + 1], -1.0)], lower=0.0)  # symmetry
    for k in range(K):
        p.row([(x[k][j], 1.0) for j in range(J)], lower=1.0, upper=1.0)  # (d)
        for j in range(J):
            p.row([(x[k][j], 1.0), (z[k][j], -1.0)], upper=0.0)  # (d)
            p.row([(z[k][j], 1.0), (y[inp.set_of[k]][j], -1.0)], upper=0.0)  # (e)

    w: list[list[int]] = []
    load: list[int] = []
    if "paper" in readings:
        for k in range(K):
            w.append([p.var(0.0, G) for _ in range(J)])
            for j in range(J):
                p.row([(w[k][j], 1.0), (x[k][j], -G)], upper=0.0)
                p.row([(w[k][j], 1.0), (size[j], -1.0)], upper=0.0)
                p.row([(w[k][j], 1.0), (size[j], -1.0), (x[k][j], -G)], lower=-G)
            p.row([(wj, 1.0) for wj in w[k]] + [(t["paper"], -float(n[k]))], lower=0.0)
    if "shared" in readings:
        load = [p.var(0.0) for _ in range(J)]
        for j in range(J):
            p.row(
                [(load[j], 1.0)] + [(x[k][j], -float(n[k])) for k in range(K)], lower=0.0, upper=0.0
            )
        total = float(n.sum())
        low = min(0.0, readings["shared"])
        for k in range(K):
            big_m = total + float(n[k]) * (inp.t_bar - low)
            for j in range(J):
                p.row(
                    [
                        (size[j], 1.0),
                        (load[j], -1.0),
                        (t["shared"], -float(n[k])),
                        (x[k][j], -big_m),
                    ],
                    lower=-big_m - float(n[k]),
                )
    return _Model(p, t, size, x, z, y, w, load, dict(readings), target)


def _least_bts(inp: _Input, sizes: Sequence[int], group_of: Sequence[int]) -> dict[str, float]:
    members: list[list[ModelStream]] = [[] for _ in sizes]
    for k, j in enumerate(group_of):
        members[j].append(inp.streams[k])
    out = {}
    for reading in OBJECTIVES:
        out[reading] = min(
            min(burst_tolerances(reading, sizes[j], members[j]).values())
            for j in range(len(sizes))
            if members[j]
        )
    return out


def _point(
    model: _Model, inp: _Input, sizes: Sequence[int], group_of: Sequence[int]
) -> tuple[np.ndarray, dict[str, float]] | None:
    """The program's variables at the plan (sizes, group_of), groups put in
    the symmetry rows' order; None where the plan breaks a bound."""
    order = sorted(range(len(sizes)), key=lambda j: (-sizes[j], j))
    rank = {j: r for r, j in enumerate(order)}
    sizes = [sizes[j] for j in order]
    group_of = [rank[j] for j in group_of]
    bts = _least_bts(inp, sizes, group_of)
    v = np.zeros(model.program.variables)
    for reading, column in model.t.items():
        value = min(bts[reading], inp.t_bar)
        if value < model.lower[reading] - 1e-9:
            return None
        v[column] = value
    loads = [0.0] * len(sizes)
    for j, s in enumerate(sizes):
        v[model.size[j]] = s
    for k, j in enumerate(group_of):
        v[model.x[k][j]] = v[model.z[k][j]] = v[model.y[inp.set_of[k]][j]] = 1.0
        loads[j] += float(inp.n[k])
        if model.w:
            v[model.w[k][j]] = sizes[j]
    for j, column in enumerate(model.load):
        v[column] = loads[j]
    return v, bts


def _decode(model: _Model, inp: _Input, v: np.ndarray) -> tuple[list[int], list[int]]:
    sizes = [round(v[s]) for s in model.size]
    group_of = [int(np.argmax([v[c] for c in row])) for row in model.x]
    return sizes, group_of


def solve(
    problem: Problem,
    options: SolveOptions | None = None,
    goodput: Goodput = single_device_goodput,
) -> HerdPlan:
    """The plan; `goodput` gives each stream's T_i (problem.py)."""
    options = options or SolveOptions()
    streams = model_streams(problem, goodput)
    if not streams:
        raise Infeasible("no streams to serve")
    check_feasible(problem, streams)
    c = problem.cluster
    sets = sorted({problem.model(ms.model).affinity for ms in streams})
    inp = _Input(
        streams,
        np.array([ms.devices_needed for ms in streams]),
        [problem.model(ms.model).memory for ms in streams],
        [sets.index(problem.model(ms.model).affinity) for ms in streams],
        len(sets),
        c.candidate_groups,
        c.max_group_size,
        c.devices,
        c.model_memory,
    )
    objective = options.objective
    spread = "shared" if objective == "paper" and options.tie_break == "shared" else None
    greedy = _greedy(objective, streams, inp, spread) if options.warm_start else None
    first = _build(inp, {objective: 0.0}, objective)
    start = _point(first, inp, greedy.sizes, greedy.group_of) if greedy else None
    stats: dict[str, object] = {"greedy_least_bt": greedy.least_bt if greedy else None}
    solution = _run(first, start, inp.t_bar, options.time_limit_s, options)
    if solution.values is None:
        raise Infeasible(
            f"HiGHS found no plan ({solution.status} after {solution.runtime_s:.2f} s): "
            "the models' memory does not fit in the groups the cluster can form "
            f"(J = {inp.groups} groups of ≤ {inp.max_size} devices, N = {c.devices}), "
            "or the time limit is too short"
        )
    sizes, group_of = _decode(first, inp, solution.values)
    runtime = solution.runtime_s
    stats |= {
        "status": solution.status,
        "objective": solution.objective,
        "bound": solution.bound,
        "gap": solution.gap,
        "variables": first.program.variables,
        "integers": first.program.integers,
        "rows": first.program.rows,
    }
    left = options.time_limit_s - runtime
    if objective == "paper" and options.tie_break == "shared" and left > 0:
        tie, tied_plan = _tie_break(
            inp, streams, solution.objective, (sizes, group_of), left, options
        )
        runtime += tie.runtime_s
        if tied_plan is not None:
            sizes, group_of = tied_plan
        stats["tie_break"] = {
            "reading": "shared",
            "status": tie.status,
            "objective": tie.objective,
            "bound": tie.bound,
            "gap": tie.gap,
            "runtime_s": tie.runtime_s,
        }
    stats |= {
        "runtime_s": runtime,
        "time_limit_s": options.time_limit_s,
        "model_streams": len(streams),
        "candidate_groups": inp.groups,
    }
    served: list[list[ModelStream]] = [[] for _ in sizes]
    for k, j in enumerate(group_of):
        served[j].append(streams[k])
    keep = [j for j in range(len(sizes)) if served[j]]
    tied = objective == "paper" and options.tie_break == "shared"
    final_sizes, loaded, final_served = _spread_unused(
        "shared" if tied else objective,
        c.devices,
        inp.max_size,
        [sizes[j] for j in keep],
        [[ms.model for ms in served[j]] for j in keep],
        [served[j] for j in keep],
    )
    groups = build_groups(objective, final_sizes, loaded, final_served)
    return HerdPlan("ilp", objective, groups, stats)


def _greedy(
    objective: str, streams: list[ModelStream], inp: _Input, spread: str | None = None
) -> GreedyPlan | None:
    """The greedy plan (greedy.py) for `objective`: the solver's start."""
    return greedy_plan(
        objective,
        streams,
        inp.mem,
        inp.set_of,
        inp.groups,
        inp.devices,
        inp.max_size,
        inp.model_memory,
        spread=spread,
    )


def _tie_break(
    inp: _Input,
    streams: list[ModelStream],
    best: float,
    plan: tuple[list[int], list[int]],
    time_limit_s: float,
    options: SolveOptions,
) -> tuple[Solution, tuple[list[int], list[int]] | None]:
    """Among the paper objective's optima (within 1e-9 of `best`), the one
    with the best `shared` reading, started from `plan` or the shared
    greedy plan, whichever reads better. Returns the solve and its plan
    (None: none found in time)."""
    second = _build(inp, {"paper": best * (1.0 - 1e-9), "shared": -math.inf}, "shared")
    candidates = [plan]
    shared_greedy = _greedy("shared", streams, inp)
    if shared_greedy is not None:
        candidates.append((list(shared_greedy.sizes), list(shared_greedy.group_of)))
    points = [_point(second, inp, s, g) for s, g in candidates]
    feasible = [pt for pt in points if pt is not None]
    start = max(feasible, key=lambda pt: pt[1]["shared"]) if feasible else None
    tie = _run(second, start, inp.t_bar, time_limit_s, options)
    if tie.values is None:
        return tie, None
    return tie, _decode(second, inp, tie.values)


def _run(
    model: _Model,
    start: tuple[np.ndarray, dict[str, float]] | None,
    bound: float,
    time_limit_s: float,
    options: SolveOptions,
) -> Solution:
    """HiGHS from `start`; no search when the start already meets the
    target's upper bound (min_k Ḡ / n_k), which proves it optimal."""
    target = model.target
    if start is not None and start[1][target] >= bound * (1.0 - 1e-9):
        value = float(start[0][model.t[target]])
        return Solution("optimal", value, bound, 0.0, 0.0, start[0])
    return model.program.solve(
        time_limit_s,
        options.mip_rel_gap,
        start=None if start is None else start[0],
        threads=options.threads,
    )


def _spread_unused(
    objective: str,
    devices: int,
    max_size: int,
    sizes: list[int],
    loaded: list[list[str]],
    served: list[list[ModelStream]],
) -> tuple[list[int], list[list[str]], list[list[ModelStream]]]:
    """Hand devices no group uses to the served group of least burst
    tolerance below Ḡ, one at a time."""
    sizes = list(sizes)
    for _ in range(devices - sum(sizes)):
        open_groups = [j for j in range(len(sizes)) if sizes[j] < max_size]
        if not open_groups:
            break
        worst = min(
            open_groups,
            key=lambda j: min(burst_tolerances(objective, sizes[j], served[j]).values()),
        )
        sizes[worst] += 1
    return sizes, loaded, served
