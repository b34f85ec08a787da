"""HERD's input (shepherd-nsdi23.txt §4, Table 2): models, request streams,
the cluster; and the first step, each stream's single-device goodput T_i and
its average-load device count n_i = rate_i / T_i.

T_i is computed by default, not measured: the largest batch b ≤ max_batch
with 2·ℓ(b) ≤ SLO, T = b / ℓ(b). On one device a request that arrives just
after a batch of b started waits ℓ(b) before its own batch of b runs, so
that b is the largest that meets every deadline when arrivals are steady —
Symphony's eq. 1/eq. 2 at N = 1 (app/planning/capacity.py,
`devices_for_model` at one device), read from the profile's table so
measured profiles work too. It costs nothing, so planning 1,000 streams
takes seconds in all.

The paper measures "the maximum goodput each stream can achieve on a
single GPU"; app/simulation/herd_goodput.py does that in the simulator (a
capacity search per distinct profile, SLO and max batch; `--goodput
measured` on the command line), and `model_streams` takes either as its `goodput`. The two differ:
the analytic T assumes steady arrivals, and under Poisson arrivals one
device meets a 99 % target at less — 0.56–0.87 of it on Table 5's 35
profiles with FLEX, most near 0.70 — so with the analytic T the n_i read
low, and the burst tolerances high, by about that factor.

Streams of one model are aggregated into a *model-stream* (§4, "HERD
complexity"): n_k = Σ n_i over the model's streams — each stream keeps its
own SLO in its T_i — and the ILP works on model-streams.

Units: seconds and bytes; rates in requests/s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from app.scheduling.profile import LatencyProfile


@dataclass(frozen=True)
class Model:
    name: str
    profile: LatencyProfile
    slo: float  # seconds: the SLO of streams that name none
    memory: int  # bytes it occupies on every device of a group serving it
    affinity: str = "default"  # affinity set (§4 constraint (e))


@dataclass(frozen=True)
class Stream:
    model: str
    rate: float  # requests/s, average
    slo: float | None = None  # seconds; None: the model's


@dataclass(frozen=True)
class Cluster:
    devices: int  # N
    device_memory: int  # bytes per device (mem)
    max_group_size: int  # Ḡ, the online scheduler's scalability limit
    reserve: int = 0  # bytes per device set aside for FLEX's own operation
    groups: int | None = None  # candidate groups J; None: ⌈N / Ḡ⌉

    @property
    def model_memory(self) -> int:
        """Bytes a group's models may take on each of its devices."""
        return self.device_memory - self.reserve

    @property
    def candidate_groups(self) -> int:
        return (
            self.groups
            if self.groups is not None
            else math.ceil(self.devices / self.max_group_size)
        )


@dataclass(frozen=True)
class Problem:
    models: tuple[Model, ...]
    streams: tuple[Stream, ...]
    cluster: Cluster

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names repeat: {names}")
        c = self.cluster
        if c.devices < 1 or c.max_group_size < 1:
            raise ValueError("devices and max_group_size must be ≥ 1")
        if c.model_memory <= 0:
            raise ValueError(
                f"reserve {c.reserve} B leaves no memory of the device's {c.device_memory} B"
            )
        if c.groups is not None and c.groups < 1:
            raise ValueError(f"groups must be ≥ 1, got {c.groups}")
        known = set(names)
        for i, s in enumerate(self.streams):
            if s.model not in known:
                raise ValueError(f"stream {i}: unknown model {s.model!r}")
            if not (s.rate > 0 and math.isfinite(s.rate)):
                raise ValueError(f"stream {i}: rate must be a positive number, got {s.rate}")

    def model(self, name: str) -> Model:
        return next(m for m in self.models if m.name == name)


#: T(profile, SLO, max batch) → requests/s: `single_device_goodput` or a
#: measured.MeasuredGoodput.
Goodput = Callable[[LatencyProfile, float, int], float]


def single_device_goodput(profile: LatencyProfile, slo: float, max_batch: int) -> float:
    """T: requests/s one device serves within `slo` (the largest b with
    2·ℓ(b) ≤ SLO, at b / ℓ(b)); 0 when even b = 1 misses."""
    b = min(max_batch, profile.max_batch_within(slo / 2.0))
    if b < 1:
        return 0.0
    return b / profile.latency(b)


@dataclass(frozen=True)
class ModelStream:
    """Every stream of one model: what the ILP groups."""

    model: str
    streams: tuple[int, ...]  # indices into Problem.streams
    rate: float  # Σ rate_i
    devices_needed: float  # n_k = Σ rate_i / T_i


def model_streams(
    problem: Problem, goodput: Goodput = single_device_goodput
) -> tuple[ModelStream, ...]:
    """The model-streams, in the models' order, with T_i from `goodput`;
    models without streams are left out (nothing to serve). Raises
    ValueError for a stream whose SLO no single device meets (T = 0: n
    would be infinite)."""
    members: dict[str, list[int]] = {m.name: [] for m in problem.models}
    need: dict[str, float] = {m.name: 0.0 for m in problem.models}
    for i, s in enumerate(problem.streams):
        model = problem.model(s.model)
        slo = model.slo if s.slo is None else s.slo
        t = goodput(model.profile, slo, model.profile.max_batch)
        if t <= 0.0:
            why = (
                "even a batch of one misses half its SLO"
                if goodput is single_device_goodput
                else "no rate passes the single-device measurement"
            )
            raise ValueError(
                f"stream {i} ({s.model}): {why} "
                f"({slo * 1e3:g} ms; ℓ(1) = {model.profile.latency(1) * 1e3:g} ms), "
                "so no device serves it"
            )
        members[s.model].append(i)
        need[s.model] += s.rate / t
    return tuple(
        ModelStream(
            m.name,
            tuple(members[m.name]),
            sum(problem.streams[i].rate for i in members[m.name]),
            need[m.name],
        )
        for m in problem.models
        if members[m.name]
    )
