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
  to the served group of least burst tolerance that is below Ḡ. Neither
  step lowers any stream's burst tolerance; both keep devices from idling.
* The solve stops at `time_limit_s` and the incumbent is accepted (status
  `time-limit`, with HiGHS's gap); no incumbent is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.planning.herd.plan import OBJECTIVES, HerdPlan, build_groups, burst_tolerances
from app.planning.herd.problem import (
    Goodput,
    ModelStream,
    Problem,
    model_streams,
    single_device_goodput,
)
from app.planning.ppipe.highs import Program

#: Below this a binary's solver value counts as 0.
_HALF = 0.5


class Infeasible(ValueError):
    """No plan meets the constraints; the message says which one cannot hold."""


@dataclass(frozen=True)
class SolveOptions:
    objective: str = "paper"
    time_limit_s: float = 10.0
    mip_rel_gap: float = 1e-4
    threads: int = 1

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if not self.time_limit_s > 0:
            raise ValueError(f"time limit must be > 0 s, got {self.time_limit_s}")


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
    n = np.array([ms.devices_needed for ms in streams])
    mem = [problem.model(ms.model).memory for ms in streams]
    sets = sorted({problem.model(ms.model).affinity for ms in streams})
    set_of = [sets.index(problem.model(ms.model).affinity) for ms in streams]
    K, J, G = len(streams), c.candidate_groups, c.max_group_size
    t_bar = float(np.min(G / n))

    p = Program()
    t = p.var(0.0, t_bar)
    p.maximise(t)
    size = [p.var(0.0, G, integer=True) for _ in range(J)]
    x = [[p.var(0.0, 1.0, integer=True) for _ in range(J)] for _ in range(K)]
    z = [[p.var(0.0, 1.0, integer=True) for _ in range(J)] for _ in range(K)]
    y = [[p.var(0.0, 1.0, integer=True) for _ in range(J)] for _ in sets]

    p.row([(s, 1.0) for s in size], upper=c.devices)  # (a)
    for j in range(J):
        p.row([(z[k][j], float(mem[k])) for k in range(K)], upper=c.model_memory)  # (c)
        p.row([(y[s][j], 1.0) for s in range(len(sets))], upper=1.0)  # (e)
        if j + 1 < J:
            p.row([(size[j], 1.0), (size[j + 1], -1.0)], lower=0.0)  # symmetry
    for k in range(K):
        p.row([(x[k][j], 1.0) for j in range(J)], lower=1.0, upper=1.0)  # (d)
        for j in range(J):
            p.row([(x[k][j], 1.0), (z[k][j], -1.0)], upper=0.0)  # (d)
            p.row([(z[k][j], 1.0), (y[set_of[k]][j], -1.0)], upper=0.0)  # (e)

    if options.objective == "paper":
        for k in range(K):
            w = [p.var(0.0, G) for _ in range(J)]
            for j in range(J):
                p.row([(w[j], 1.0), (x[k][j], -G)], upper=0.0)
                p.row([(w[j], 1.0), (size[j], -1.0)], upper=0.0)
                p.row([(w[j], 1.0), (size[j], -1.0), (x[k][j], -G)], lower=-G)
            p.row([(wj, 1.0) for wj in w] + [(t, -float(n[k]))], lower=0.0)
    else:
        load = [p.var(0.0) for _ in range(J)]
        for j in range(J):
            p.row(
                [(load[j], 1.0)] + [(x[k][j], -float(n[k])) for k in range(K)], lower=0.0, upper=0.0
            )
        total = float(n.sum())
        for k in range(K):
            big_m = total + float(n[k]) * t_bar
            for j in range(J):
                p.row(
                    [(size[j], 1.0), (load[j], -1.0), (t, -float(n[k])), (x[k][j], -big_m)],
                    lower=-big_m - float(n[k]),
                )

    solution = p.solve(options.time_limit_s, options.mip_rel_gap, threads=options.threads)
    if solution.values is None:
        raise Infeasible(
            f"HiGHS found no plan ({solution.status} after {solution.runtime_s:.2f} s): "
            "the models' memory does not fit in the groups the cluster can form "
            f"(J = {J} groups of ≤ {G} devices, N = {c.devices}), or the time limit is too short"
        )
    v = solution.values
    sizes = [round(v[s]) for s in size]
    served: list[list[ModelStream]] = [[] for _ in range(J)]
    for k, ms in enumerate(streams):
        served[int(np.argmax([v[x[k][j]] for j in range(J)]))].append(ms)
    loaded = [[streams[k].model for k in range(K) if v[z[k][j]] > _HALF] for j in range(J)]
    keep = [j for j in range(J) if served[j]]
    sizes, loaded, served = _spread_unused(
        options.objective,
        c.devices,
        G,
        [sizes[j] for j in keep],
        [loaded[j] for j in keep],
        [served[j] for j in keep],
    )
    stats = {
        "status": solution.status,
        "objective": solution.objective,
        "bound": solution.bound,
        "gap": solution.gap,
        "runtime_s": solution.runtime_s,
        "time_limit_s": options.time_limit_s,
        "variables": p.variables,
        "integers": p.integers,
        "rows": p.rows,
        "model_streams": K,
        "candidate_groups": J,
    }
    groups = build_groups(options.objective, sizes, loaded, served)
    return HerdPlan("ilp", options.objective, groups, stats)


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
