"""InSS's placement problem (inss.txt §3.3, problem (1)) and what one
device's configuration serves.

Decisions: each model on at most one device (y_ik, constraint 1e; a model
no configuration can serve is left off and reported), an MPS share ρ_ik on
a grid (`share_step`, 10 % by default; Σ ρ ≤ 1 per device, 1a) and a batch
size b_i chosen by BDA (app/scheduling/bda.py). For a device and the shares of the models
on it, `DeviceEvaluator.configure` runs BDA for each model with

* `fits(model, b)`: memory (1b/4a) and the SLO (1c/4b). Memory couples the
  models of a device; BDA checks a model's m_i(b) against the device's
  memory less its co-runners' footprint at batch 1, and when the chosen
  batches together overflow, batch sizes step down one at a time (the step
  losing least throughput first) until they fit. The SLO is checked at the
  worst case of eq. 2 for a stable queue: the *first* task of a batch
  (W = 1) arriving just after the previous batch started (the device busy
  for one more t_inf). It waits max(t_inf, (b − 1)/λ) for its batch to be
  formed and the device to be free, then runs t_inf:
  T = max(t_inf, (b − 1)/λ) + t_inf ≤ SLO. This covers eq. 2's other
  branch at W = b (T = 2·t_inf) too. A task arriving to an idle device
  ((b − 1)/λ + t_inf) is never worse, so this is the stricter reading.
* `throughput(model, b)` = b / t_inf (1d/4c: served when ≥ λ), with t_inf
  from latency.py at the model's share beside its co-runners on that device.

Given the shares, a model's t_inf depends on its own batch only (the
co-runners' L2 use depends on their shares, not batches), so BDA's batch
sizes maximise Σ throughput on the device whenever memory does not bind.

Time-sharing (`DeviceEvaluator.time_share`): several models on one whole
device (share 1.0 each), running in turn, one at a time — no co-runner
slows a batch, but each waits for the others'. Batches follow a duty cycle
(Nexus's squishy bin packing): a cycle runs one batch of every model,
D = Σ t_i(b_i) with t_i at the whole device alone; model i serves b_i / D
requests/s (≥ λ_i), and its worst case is the spatial one with D in place
of its own running batch, T = max(D, (b_i − 1)/λ_i) + t_i(b_i) ≤ SLO (its
first task arrives just after its batch left: the cycle runs before the
next). For a cycle budget C on a grid, every model starts at the least
batch covering its rate over C, ⌈λ_i·C⌉, and batches then grow one item at
a time where an item costs least time, while D ≤ C and each SLO holds;
the best Σ b_i / D over the grid is kept. With one model the cycle is its
own batch and the check is the spatial one at share 1.0. A time-shared
model's throughput is at most its best alone at share 1.0 (b_i / D ≤
b_i / t_i(b_i), and b_i meets the alone check), so the placement search's
bound still holds.

The searches (placement.py) prune on one property, checked here when a
problem is built: a co-runner never speeds a model up (α_s ≥ 0 and
2·α_s + β_s ≥ 0, so the scheduling interference of n ≥ 2 models is ≥ 0;
α_cache ≥ 0 and L2 use ≥ 0 on the share grid). Then a model that cannot be
served alone at share ρ cannot be served at ρ beside others, and a set of
models that cannot share a device cannot with one more model either.

Units: seconds, bytes, bytes/s; shares are fractions in (0, 1].
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from app.planning.inss.latency import (
    CoRunner,
    DeviceLatency,
    ModelLatency,
    RunningTime,
    exec_time,
    task_latency,
)
from app.scheduling.bda import MAX_BATCH, decide_batch


@dataclass(frozen=True)
class Saturation:
    """How much of a device a batch can use: `share_at_b1` of it at batch 1,
    all of it from `full_at_batch` on, the time at the whole device linear in
    between (inss.txt Table 3: MnasNet at batch 4 runs 4.24 ms at 24 %, 3.47
    at 42 % and 3.41 at 60 % — a larger share no longer helps)."""

    share_at_b1: float
    full_at_batch: int

    def __post_init__(self) -> None:
        if not 0.0 < self.share_at_b1 <= 1.0:
            raise ValueError(f"saturation: share_at_b1 must be in (0, 1], got {self.share_at_b1}")
        if self.full_at_batch < 2:
            raise ValueError(f"saturation: full_at_batch must be ≥ 2, got {self.full_at_batch}")


@dataclass(frozen=True)
class LinearRunningTime:
    """o_r(b, ρ) = (α·b + β) / ρ seconds: a running time linear in the batch
    size and inversely proportional to the share.

    With `saturation`, never below the floor f(b): the time at the whole
    device of a batch that cannot fill it, f(1) = (α + β) / share_at_b1,
    f(full_at_batch) = α·full_at_batch + β, linear in b (so non-decreasing
    in b, and below α·b + β from full_at_batch on): o_r = max((α·b + β)/ρ,
    f(b)). A share above (α·b + β) / f(b) gains nothing."""

    alpha_s: float
    beta_s: float
    saturation: Saturation | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha_s) and math.isfinite(self.beta_s)):
            raise ValueError(f"linear running time needs finite α, β, got {self}")
        if self.alpha_s < 0 or self.alpha_s + self.beta_s <= 0:
            raise ValueError(f"linear running time must be > 0 and not fall with b, got {self}")
        if self.saturation is not None and self.floor_slope() < 0:
            full = self.saturation.full_at_batch
            raise ValueError(
                f"saturation: the whole device at batch {full} "
                f"({(self.alpha_s * full + self.beta_s) * 1e3:g} ms) is faster than at batch 1 "
                f"({self.floor(1) * 1e3:g} ms); raise share_at_b1 or full_at_batch"
            )

    def predict(self, batch: float, share: float) -> float:
        work = self.alpha_s * batch + self.beta_s
        if self.saturation is None:
            return work / share
        return max(work / share, self.floor(batch))

    def floor(self, batch: float) -> float:
        """f(b): the least running time at any share (0 without saturation)."""
        if self.saturation is None:
            return 0.0
        first = (self.alpha_s + self.beta_s) / self.saturation.share_at_b1
        return first + self.floor_slope() * (batch - 1)

    def floor_slope(self) -> float:
        """f's growth per item (0 without saturation)."""
        if self.saturation is None:
            return 0.0
        first = (self.alpha_s + self.beta_s) / self.saturation.share_at_b1
        full = self.saturation.full_at_batch
        return (self.alpha_s * full + self.beta_s - first) / (full - 1)


@dataclass(frozen=True)
class MemoryUse:
    """m_i(b), bytes: `base + per_item·b`, or a table {b: bytes} read with
    linear interpolation between listed sizes; a table must list batch 1,
    and its largest batch size caps the model's batch (nothing is known
    beyond it)."""

    base_bytes: float = 0.0
    per_item_bytes: float = 0.0
    table: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        table = tuple(sorted((int(b), float(m)) for b, m in self.table))
        object.__setattr__(self, "table", table)
        if table:
            if table[0][0] != 1:
                sizes = [b for b, _ in table]
                raise ValueError(f"a memory table must list batch 1, got sizes {sizes}")
            if any(m < 0 or not math.isfinite(m) for _, m in table):
                raise ValueError("memory table entries must be finite and ≥ 0")
        elif not all(math.isfinite(v) and v >= 0 for v in (self.base_bytes, self.per_item_bytes)):
            raise ValueError(f"memory base and per-item bytes must be finite and ≥ 0, got {self}")

    @property
    def max_batch(self) -> int:
        return min(MAX_BATCH, self.table[-1][0]) if self.table else MAX_BATCH

    def at(self, batch: int) -> float:
        if not self.table:
            return self.base_bytes + self.per_item_bytes * batch
        sizes = [b for b, _ in self.table]
        if batch > sizes[-1]:
            raise ValueError(f"no memory figure for batch {batch} (largest listed {sizes[-1]})")
        i = bisect.bisect_left(sizes, batch)
        if sizes[i] == batch:
            return self.table[i][1]
        (b0, m0), (b1, m1) = self.table[i - 1], self.table[i]
        return m0 + (m1 - m0) * (batch - b0) / (b1 - b0)


@dataclass(frozen=True)
class Device:
    """A device k: its memory M_k and its fitted latency terms; `kind` names
    the model latency fits that apply to it."""

    name: str
    kind: str
    memory_bytes: float
    latency: DeviceLatency

    def __post_init__(self) -> None:
        if not (math.isfinite(self.memory_bytes) and self.memory_bytes > 0):
            raise ValueError(f"device {self.name!r}: memory must be finite and > 0")

    @property
    def signature(self) -> tuple[object, ...]:
        """Devices with equal signatures are interchangeable."""
        lat = self.latency
        return (self.kind, self.memory_bytes, lat.bandwidth_bytes_per_s, lat.alpha_s, lat.beta_s)


@dataclass(frozen=True)
class ModelSpec:
    """A model i: its rate λ_i (requests/s), SLO, memory m_i(b) and its
    latency fit per device kind."""

    name: str
    rate: float
    slo_s: float
    memory: MemoryUse
    latency: Mapping[str, ModelLatency]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"model {self.name!r}: rate must be finite and > 0, got {self.rate}")
        if not (math.isfinite(self.slo_s) and self.slo_s > 0):
            raise ValueError(f"model {self.name!r}: SLO must be finite and > 0, got {self.slo_s}")


@dataclass(frozen=True)
class Problem:
    """Problem (1): the devices, the models and the share grid's step."""

    devices: tuple[Device, ...]
    models: tuple[ModelSpec, ...]
    share_step: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "models", tuple(self.models))
        if not self.devices or not self.models:
            raise ValueError("a placement problem needs at least one device and one model")
        for what, names in (
            ("device", [d.name for d in self.devices]),
            ("model", [m.name for m in self.models]),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"{what} names must be unique, got {names}")
        units = 1.0 / self.share_step if self.share_step > 0 else math.inf
        if not (0 < self.share_step <= 1 and abs(units - round(units)) < 1e-9):
            raise ValueError(f"share step must divide 1 (0.1, 0.05, 0.25 …), got {self.share_step}")
        for model in self.models:
            for device in self.devices:
                if device.kind not in model.latency:
                    raise ValueError(
                        f"model {model.name!r} has no latency fit for device kind {device.kind!r}"
                    )
                _check_monotone(model.latency[device.kind], device, self.share_step)

    @property
    def units(self) -> int:
        """Share grid points per device: shares are u·share_step, u = 1 … units."""
        return round(1.0 / self.share_step)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)


def _check_monotone(model: ModelLatency, device: Device, step: float) -> None:
    where = f"model {model.name!r} on device {device.name!r}"
    lat = device.latency
    if lat.alpha_s < 0 or 2 * lat.alpha_s + lat.beta_s < 0:
        raise ValueError(
            f"device {device.name!r}: scheduling interference α_s·n + β_s must be ≥ 0 for n ≥ 2 "
            f"(α_s = {lat.alpha_s:g}, β_s = {lat.beta_s:g}); the placement searches rely on it"
        )
    if model.alpha_cache < 0:
        raise ValueError(f"{where}: α_cache must be ≥ 0, got {model.alpha_cache:g}")
    if min(model.l2.at(step), model.l2.at(1.0)) < 0:
        raise ValueError(f"{where}: L2 use α_u·ρ + β_u must be ≥ 0 on the share grid")


@dataclass(frozen=True)
class Served:
    """One model's outcome at its share on a device: BDA's batch (None when
    not even 1 fits), its t_inf, throughput, worst-case latency (module
    docstring) and memory; `ok` when it meets memory, SLO and its rate."""

    model: str
    share: float
    batch: int | None
    exec_s: float
    throughput: float
    worst_latency_s: float
    memory_bytes: float
    ok: bool


def worst_latency(t_inf: float, batch: int, rate: float) -> float:
    """The SLO check's worst case of eq. 2 (module docstring)."""
    return task_latency(t_inf, 1, batch, rate, t_inf)


class _CachedRunningTime:
    """o_r memoised: the searches ask the same (b, ρ) many times."""

    def __init__(self, inner: RunningTime) -> None:
        self._inner = inner
        self._cache: dict[tuple[int, float], float] = {}

    def predict(self, batch: float, share: float) -> float:
        key = (int(batch), round(share, 12))
        if key not in self._cache:
            self._cache[key] = self._inner.predict(batch, share)
        return self._cache[key]


@dataclass
class DeviceEvaluator:
    """Evaluates device configurations of `problem` (module docstring)."""

    problem: Problem
    configurations: int = 0  # share vectors evaluated, for the plan's details
    _latency: dict[tuple[str, str], ModelLatency] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for model in self.problem.models:
            for kind, fitted in model.latency.items():
                cached = _CachedRunningTime(fitted.running_time)
                self._latency[model.name, kind] = replace(fitted, running_time=cached)

    def latency(self, model: str, device: Device) -> ModelLatency:
        return self._latency[model, device.kind]

    def configure(
        self, device: Device, shares: Mapping[str, float], stop_at_failure: bool = False
    ) -> tuple[Served, ...]:
        """Each model's outcome with `shares` (model → share) on `device`;
        with `stop_at_failure`, the outcomes up to the first model not served."""
        self.configurations += 1
        specs = {name: self.problem.model(name) for name in shares}
        base = {name: spec.memory.at(1) for name, spec in specs.items()}
        outcomes: list[Served] = []
        for name, share in shares.items():
            spec = specs[name]
            t_inf = self._exec_fn(device, name, shares)
            room = device.memory_bytes - (sum(base.values()) - base[name])
            decision = decide_batch(
                name,
                spec.rate,
                partial(_fits, spec, room, t_inf),
                partial(_throughput, t_inf),
                max_batch=spec.memory.max_batch,
            )
            outcomes.append(self._served(spec, share, decision.batch, t_inf))
            if stop_at_failure and not outcomes[-1].ok:
                return tuple(outcomes)
        return self._fit_memory(device, outcomes, shares)

    def _exec_fn(
        self, device: Device, name: str, shares: Mapping[str, float]
    ) -> Callable[[int], float]:
        """batch → t_inf of `name` at its share beside the others of `shares`."""
        model = self.latency(name, device)
        co = tuple(CoRunner.of(self.latency(v, device), s) for v, s in shares.items() if v != name)
        return partial(_exec, model, device.latency, shares[name], co)

    def _served(
        self, spec: ModelSpec, share: float, batch: int | None, t_inf: Callable[[int], float]
    ) -> Served:
        if batch is None:
            return Served(spec.name, share, None, math.nan, 0.0, math.nan, math.nan, False)
        t = t_inf(batch)
        rate_ok = batch / t >= spec.rate
        return Served(
            spec.name,
            share,
            batch,
            t,
            batch / t,
            worst_latency(t, batch, spec.rate),
            spec.memory.at(batch),
            rate_ok,
        )

    def time_share(self, device: Device, names: Sequence[str]) -> tuple[Served, ...] | None:
        """The models of `names` in turn on the whole `device` (module
        docstring), or None when no duty cycle serves them all."""
        self.configurations += 1
        specs = [self.problem.model(n) for n in names]
        t_inf = [self._exec_fn(device, n, {n: 1.0}) for n in names]
        lo = sum(t(1) for t in t_inf)
        hi = min(spec.slo_s for spec in specs)
        best: tuple[float, list[int]] | None = None
        for k in range(CYCLE_GRID):
            budget = lo * (hi / lo) ** (k / (CYCLE_GRID - 1)) if hi > lo else lo
            batches = _cycle_batches(specs, t_inf, budget, device.memory_bytes)
            if batches is None:
                continue
            value = sum(batches) / sum(t(b) for t, b in zip(t_inf, batches, strict=True))
            if best is None or value > best[0] + 1e-12:
                best = (value, batches)
        if best is None:
            return None
        batches = best[1]
        cycle = sum(t(b) for t, b in zip(t_inf, batches, strict=True))
        return tuple(
            Served(
                spec.name,
                1.0,
                b,
                t(b),
                b / cycle,
                max(cycle, (b - 1) / spec.rate) + t(b),
                spec.memory.at(b),
                True,
            )
            for spec, t, b in zip(specs, t_inf, batches, strict=True)
        )

    def _fit_memory(
        self, device: Device, outcomes: Sequence[Served], shares: Mapping[str, float]
    ) -> tuple[Served, ...]:
        """Step batch sizes down until the device's memory holds them all."""
        current = list(outcomes)
        while sum(o.memory_bytes for o in current if o.batch) > device.memory_bytes:
            steps = []
            for i, o in enumerate(current):
                if o.batch is not None and o.batch > 1:
                    spec = self.problem.model(o.model)
                    t_inf = self._exec_fn(device, o.model, shares)
                    smaller = self._served(spec, o.share, o.batch - 1, t_inf)
                    steps.append((o.throughput - smaller.throughput, i, smaller))
            if not steps:  # every model at batch 1 and still too much
                return tuple(replace(o, ok=False) for o in current)
            _, i, smaller = min(steps, key=lambda s: (s[0], s[1]))
            current[i] = smaller
        return tuple(current)


#: Cycle budgets tried between Σ t_i(1) and the tightest SLO (geometric).
CYCLE_GRID = 16


def _cycle_batches(
    specs: Sequence[ModelSpec],
    t_inf: Sequence[Callable[[int], float]],
    budget: float,
    memory_bytes: float,
) -> list[int] | None:
    """Batches for a duty cycle of at most `budget` seconds (module
    docstring): each ⌈λ·budget⌉, then grown where an item costs least."""
    batches = []
    for spec, t in zip(specs, t_inf, strict=True):
        b = max(1, math.ceil(spec.rate * budget - 1e-9))
        if b > spec.memory.max_batch or not _cycle_ok(spec, t, b, budget):
            return None
        batches.append(b)
    used = sum(t(b) for t, b in zip(t_inf, batches, strict=True))
    memory = sum(spec.memory.at(b) for spec, b in zip(specs, batches, strict=True))
    if used > budget or memory > memory_bytes:
        return None
    while True:
        steps = []
        for i, (spec, t) in enumerate(zip(specs, t_inf, strict=True)):
            b = batches[i] + 1
            if b > spec.memory.max_batch:
                continue
            cost, grown = t(b) - t(b - 1), spec.memory.at(b) - spec.memory.at(b - 1)
            fits = used + cost <= budget and memory + grown <= memory_bytes
            if fits and _cycle_ok(spec, t, b, budget):
                steps.append((cost, i, grown))
        if not steps:
            return batches
        cost, i, grown = min(steps)
        batches[i] += 1
        used, memory = used + cost, memory + grown


def _cycle_ok(spec: ModelSpec, t: Callable[[int], float], batch: int, cycle: float) -> bool:
    return max(cycle, (batch - 1) / spec.rate) + t(batch) <= spec.slo_s


def _exec(
    model: ModelLatency,
    device: DeviceLatency,
    share: float,
    co_runners: Sequence[CoRunner],
    batch: int,
) -> float:
    return exec_time(model, device, batch, share, co_runners)


def _fits(
    spec: ModelSpec, room: float, t_inf: Callable[[int], float], _: object, batch: int
) -> bool:
    """BDA's 4a and 4b (module docstring)."""
    if spec.memory.at(batch) > room:
        return False
    return worst_latency(t_inf(batch), batch, spec.rate) <= spec.slo_s


def _throughput(t_inf: Callable[[int], float], _: object, batch: int) -> float:
    return batch / t_inf(batch)
