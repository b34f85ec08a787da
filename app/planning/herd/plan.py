"""A HERD plan: serving groups (devices, models, streams) and each group's
burst tolerance; its JSON file (`python -m app plan herd --out FILE`).

Burst tolerance (shepherd-nsdi23.txt §4) of a model-stream k in group j:

* `paper` — bt(k) = size_j / n_k, as §4 prints it: the GPUs the stream can
  use at its peak over the GPUs its average load needs. It ignores the other
  streams in the group;
* `shared` — bt(k) = (size_j − Σ_{m∈j} n_m + n_k) / n_k: the GPUs left to k
  at its peak while every other stream of the group runs at its average load.
  Equal to `paper` for a stream alone in its group; never larger.

A group's burst tolerance is the least over its model-streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.planning.herd.problem import ModelStream
from app.planning.plan_files import MadeFrom, envelope, read_json, unwrap, write_json

KIND = "herd-plan"
OBJECTIVES = ("paper", "shared")


@dataclass(frozen=True)
class ServingGroup:
    devices: tuple[int, ...]  # device indices 0 … N−1, disjoint across groups
    models: tuple[str, ...]  # models loaded on every device of the group
    streams: tuple[int, ...]  # indices of the problem's streams routed here
    burst_tolerance: float  # least bt over the group's model-streams (inf: none)


@dataclass(frozen=True)
class HerdPlan:
    method: str  # "ilp" | "random"
    objective: str  # how burst tolerance is read (OBJECTIVES)
    groups: tuple[ServingGroup, ...]
    solver: dict[str, Any] = field(default_factory=dict)

    @property
    def min_burst_tolerance(self) -> float:
        served = [g.burst_tolerance for g in self.groups if g.streams]
        return min(served) if served else float("inf")

    def group_of_model(self) -> dict[str, int]:
        return {m: j for j, g in enumerate(self.groups) for m in g.models}

    def to_dict(self, made_from: MadeFrom | None = None) -> dict[str, Any]:
        return envelope(
            KIND,
            {
                "method": self.method,
                "objective": self.objective,
                "min_burst_tolerance": self.min_burst_tolerance,
                "groups": [
                    {
                        "devices": list(g.devices),
                        "models": list(g.models),
                        "streams": list(g.streams),
                        "burst_tolerance": g.burst_tolerance,
                    }
                    for g in self.groups
                ],
                "solver": self.solver,
            },
            made_from,
        )

    @classmethod
    def from_dict(cls, body: dict[str, Any], source: str = "<plan>") -> HerdPlan:
        body = unwrap(body, KIND, "a HERD plan", source)
        groups = tuple(
            ServingGroup(
                tuple(int(d) for d in g["devices"]),
                tuple(str(m) for m in g["models"]),
                tuple(int(s) for s in g["streams"]),
                float(g["burst_tolerance"]),
            )
            for g in body["groups"]
        )
        return cls(str(body["method"]), str(body["objective"]), groups, dict(body["solver"]))


def write_plan(plan: HerdPlan, path: Path, made_from: MadeFrom | None = None) -> None:
    write_json(plan.to_dict(made_from), path)


def read_plan(path: Path) -> HerdPlan:
    return HerdPlan.from_dict(read_json(path), str(path))


def burst_tolerances(objective: str, size: int, members: Sequence[ModelStream]) -> dict[str, float]:
    """bt of each model-stream in a group of `size` devices holding `members`."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    load = sum(ms.devices_needed for ms in members)
    out: dict[str, float] = {}
    for ms in members:
        usable = size if objective == "paper" else size - load + ms.devices_needed
        out[ms.model] = usable / ms.devices_needed
    return out


def least_burst_tolerance(plan: HerdPlan, streams: Sequence[ModelStream]) -> float:
    """The least burst tolerance of `plan`'s groups for `streams` — e.g. the
    model-streams of other rates than the plan was made for (re-planning
    scores the plan in force so); inf when no group serves any."""
    by_model = {ms.model: ms for ms in streams}
    least = float("inf")
    for group in plan.groups:
        members = [by_model[m] for m in group.models if m in by_model]
        if members:
            bts = burst_tolerances(plan.objective, len(group.devices), members)
            least = min(least, min(bts.values()))
    return least


def build_groups(
    objective: str,
    sizes: Sequence[int],
    models: Sequence[Sequence[str]],
    served: Sequence[Sequence[ModelStream]],
) -> tuple[ServingGroup, ...]:
    """Groups with consecutive device indices, in the order given."""
    groups = []
    first = 0
    for size, names, members in zip(sizes, models, served, strict=True):
        bts = burst_tolerances(objective, size, members)
        streams = tuple(sorted(i for ms in members for i in ms.streams))
        groups.append(
            ServingGroup(
                tuple(range(first, first + size)),
                tuple(names),
                streams,
                min(bts.values()) if bts else float("inf"),
            )
        )
        first += size
    return tuple(groups)
