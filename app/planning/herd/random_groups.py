"""The random-grouping baseline HERD is measured against
(shepherd-nsdi23.txt §3.1: "even random assignment of models and GPU
workers to serving groups can achieve decent workload predictability").

The N devices are cut into J groups (the cluster's candidate groups,
⌈N / Ḡ⌉ unless the input names J) of sizes as equal as possible, each ≤ Ḡ;
model-streams, in a random order, each go to a group drawn at random among
those whose models still fit in memory with it and whose affinity set
matches (constraints (c) and (e) of ilp.py hold; (a), (b), (d) hold by
construction). A draw that leaves a model nowhere to go starts
over, up to `attempts` times.
"""

from __future__ import annotations

import numpy as np

from app.planning.herd.ilp import Infeasible
from app.planning.herd.plan import HerdPlan, build_groups
from app.planning.herd.problem import (
    Goodput,
    ModelStream,
    Problem,
    model_streams,
    single_device_goodput,
)


def random_plan(
    problem: Problem,
    seed: int = 0,
    objective: str = "paper",
    attempts: int = 100,
    goodput: Goodput = single_device_goodput,
) -> HerdPlan:
    streams = model_streams(problem, goodput)
    c = problem.cluster
    count = c.candidate_groups
    base, extra = divmod(min(c.devices, count * c.max_group_size), count)
    sizes = [base + (1 if j < extra else 0) for j in range(count)]
    rng = np.random.default_rng(seed)
    for attempt in range(attempts):
        placed = _draw(problem, streams, count, rng)
        if placed is not None:
            loaded = [[ms.model for ms in members] for members in placed]
            groups = build_groups(objective, sizes, loaded, placed)
            return HerdPlan("random", objective, groups, {"seed": seed, "attempts": attempt + 1})
    raise Infeasible(
        f"no random grouping fits the models in memory after {attempts} attempts "
        f"({count} groups, {c.model_memory} B per device for models)"
    )


def _draw(
    problem: Problem, streams: tuple[ModelStream, ...], count: int, rng: np.random.Generator
) -> list[list[ModelStream]] | None:
    used = [0] * count
    affinity: list[str | None] = [None] * count
    placed: list[list[ModelStream]] = [[] for _ in range(count)]
    for k in rng.permutation(len(streams)):
        ms = streams[int(k)]
        model = problem.model(ms.model)
        fits = [
            j
            for j in range(count)
            if used[j] + model.memory <= problem.cluster.model_memory
            and affinity[j] in (None, model.affinity)
        ]
        if not fits:
            return None
        j = int(rng.choice(fits))
        used[j] += model.memory
        affinity[j] = model.affinity
        placed[j].append(ms)
    return placed
