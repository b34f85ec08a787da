"""What the MILP chooses from: every way to run one model on one pipeline
slot, worked out before the solver starts.

The PPipe artifact's MILP (ppipe.txt App. A.2) gives every model one
*slot* per sequence of device classes of length D (D = 2 in the main runs:
L4→L4, L4→T4, T4→L4, T4→T4 on an L4/T4 cluster). A slot runs one
configuration or none: a prefix of its class sequence (later partitions may
be left out, so a slot may also run the whole model on its first class),
cut points, one batch size for all stages and a share (vGPU size) per
stage; only the number of instances per stage is left to the solver.

Instead of binary variables for every cut, batch and share, with the SLO as
a constraint, the options are enumerated here with their latency known:

* an option whose compute + transfers + batch building exceed the model's
  latency budget is dropped (the SLO constraint, decided in advance);
* per stage an instance serves `rate` requests/s: batch ÷ latency, capped by
  what the node's links carry — a node's link is shared by all the
  instances on it (devices per node × share), and each request sends the
  bytes of the cut it enters by and of the cut it leaves by;
* of the options of one slot with the same number of stages and the same
  shares, one whose rates are all ≤ another's is dropped: the other serves at
  least as much with the same instances (Pareto filter, exact).

Everything here is in seconds, bytes and requests/s.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.planning.ppipe.profiles import BlockProfile, transfer_seconds

VARIANTS = ("ppipe", "np", "dart-r")


@dataclass(frozen=True)
class ModelDemand:
    """A model the planner serves: its weight in the objective (throughput ÷
    weight is maximised for the worst model), SLO and block profile.

    `budget_s` is what one batch's compute, transfers and batch building may
    take (default: the SLO less the margin). `est_throughput` (requests/s)
    estimates how long a batch takes to fill; None: the planner estimates it
    (see `planner.plan`)."""

    name: str
    weight: float
    slo_s: float
    profile: BlockProfile
    budget_s: float | None = None
    est_throughput: float | None = None

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"model {self.name!r}: weight must be > 0, got {self.weight}")
        if not self.slo_s > 0:
            raise ValueError(f"model {self.name!r}: SLO must be > 0 s, got {self.slo_s}")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"model {self.name!r}: latency budget must be > 0 s")


@dataclass(frozen=True)
class StageOption:
    """Blocks [start, end) on one instance of 1/`share` of a `device_class`
    device: `latency_s` per batch, `transfer_s` to send the batch on (0 for
    the last stage), `rate` requests/s one instance serves."""

    start: int
    end: int
    device_class: str
    share: int
    latency_s: float
    transfer_s: float
    rate: float


@dataclass(frozen=True)
class PipelineOption:
    """One configuration a slot may run: its stages at one batch size and
    the latency of a batch from the first request's arrival (batch building
    included)."""

    batch: int
    stages: tuple[StageOption, ...]
    latency_s: float


@dataclass(frozen=True)
class Slot:
    """A model's slot: a class sequence and the options it may run."""

    model: int
    classes: tuple[str, ...]
    options: tuple[PipelineOption, ...]


@dataclass(frozen=True)
class Enumeration:
    """What the stage options were made with."""

    shares: Mapping[str, Sequence[int]]  # per class, the vGPU sizes allowed
    max_partitions: int
    bandwidth_gbps: float
    devices_per_node: Mapping[str, int]
    batch_build_factor: float


def batch_build_s(batch: int, est_throughput: float | None, factor: float) -> float:
    """The artifact's estimate of the wait for a batch to fill: `factor` ×
    (batch − 1) arrivals at the estimated rate."""
    if not est_throughput or factor == 0:
        return 0.0
    return factor * (batch - 1) / est_throughput


def _link_rate(profile: BlockProfile, cut: int, bandwidth: float, sharers: int) -> float:
    """Requests/s one instance's share of a node link carries at the cut
    after block `cut`; unlimited for the model's own input and output."""
    if cut < 0 or cut >= profile.blocks - 1:
        return float("inf")
    seconds = transfer_seconds(profile.transfer_bytes(cut, 1), bandwidth)
    return float("inf") if seconds <= 0 else 1.0 / (seconds * sharers)


def _stage(
    profile: BlockProfile,
    start: int,
    end: int,
    batch: int,
    cls: str,
    share: int,
    setup: Enumeration,
) -> StageOption:
    latency = profile.partition_latency(start, end, batch, cls, share)
    last = end == profile.blocks
    transfer = (
        0.0
        if last
        else transfer_seconds(profile.transfer_bytes(end - 1, batch), setup.bandwidth_gbps)
    )
    sharers = share * setup.devices_per_node[cls]
    rate = min(
        batch / latency,
        _link_rate(profile, start - 1, setup.bandwidth_gbps, sharers),
        _link_rate(profile, end - 1, setup.bandwidth_gbps, sharers),
    )
    return StageOption(start, end, cls, share, latency, transfer, rate)


def _dominated(rates: tuple[float, ...], kept: list[tuple[float, ...]]) -> bool:
    return any(all(k >= r for k, r in zip(other, rates, strict=True)) for other in kept)


def prefix_options(
    demand: ModelDemand, classes: tuple[str, ...], setup: Enumeration
) -> list[PipelineOption]:
    """The options that run exactly the stages `classes`, within the latency
    budget, Pareto-filtered per tuple of shares."""
    profile = demand.profile
    budget = demand.budget_s if demand.budget_s is not None else demand.slo_s
    blocks = profile.blocks
    if len(classes) > blocks:
        return []
    share_sets = [[s for s in setup.shares[c] if (c, s) in profile.latency] for c in classes]
    options: list[PipelineOption] = []
    for shares in itertools.product(*share_sets):
        max_batch = min(profile.max_batch(c, s) for c, s in zip(classes, shares, strict=True))
        candidates: list[tuple[tuple[float, ...], PipelineOption]] = []
        for cuts in itertools.combinations(range(1, blocks), len(classes) - 1):
            bounds = (0, *cuts, blocks)
            for batch in range(1, max_batch + 1):
                stages = tuple(
                    _stage(profile, bounds[d], bounds[d + 1], batch, c, s, setup)
                    for d, (c, s) in enumerate(zip(classes, shares, strict=True))
                )
                latency = sum(s.latency_s + s.transfer_s for s in stages) + batch_build_s(
                    batch, demand.est_throughput, setup.batch_build_factor
                )
                if latency > budget:
                    continue
                rates = tuple(s.rate for s in stages)
                candidates.append((rates, PipelineOption(batch, stages, latency)))
        # best first, so that an equal later candidate is the one dropped
        candidates.sort(key=lambda item: tuple(-r for r in item[0]))
        kept: list[tuple[float, ...]] = []
        for rates, option in candidates:
            if not _dominated(rates, kept):
                kept.append(rates)
                options.append(option)
    return options


def enumerate_slots(
    demands: Sequence[ModelDemand], class_names: Sequence[str], setup: Enumeration
) -> list[Slot]:
    """Every model's slots (one per class sequence of length D) with their
    options: each prefix of the sequence that meets the budget."""
    slots: list[Slot] = []
    for index, demand in enumerate(demands):
        cache: dict[tuple[str, ...], list[PipelineOption]] = {}
        for sequence in itertools.product(class_names, repeat=setup.max_partitions):
            options: list[PipelineOption] = []
            for length in range(1, len(sequence) + 1):
                prefix = sequence[:length]
                if prefix not in cache:
                    cache[prefix] = prefix_options(demand, prefix, setup)
                options.extend(cache[prefix])
            if options:
                slots.append(Slot(index, sequence, tuple(options)))
    return slots
