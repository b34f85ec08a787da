"""Nexus's squishy bin packing: which models run on which device, at what batch.

Source: Nexus (Shen et al., SOSP'19), as symphony.txt §4.2 (eq. 1, Figure 3a)
and §5.2 describe it. Frontends route requests to a model's backends without
coordination, so a request may arrive just after its model's batch started and
wait a whole batch (or a whole round-robin round) before its own batch runs.

Rules, per model (rate r, SLO L, latency profile ℓ):

1. **Batch size.** B = the largest b ≤ max_batch with 2·ℓ(b) ≤ L (eq. 1),
   at least 1. One device running batches of B back to back serves
   T = B/ℓ(B) requests/s.
2. **Dedicated devices.** n = ⌊r·ℓ(B)/B⌋ = ⌊r/T⌋ devices run only this model
   at batch B (duty cycle ℓ(B), share 1).
3. **Residual.** The rest, r' = r − n·T (a fraction of one device; also a
   model with r = 0), becomes a *residual session* run on a shared device
   with a duty cycle d: every d seconds the device runs each of its sessions
   once, session i with batch bᵢ = max(1, ⌈rᵢ·d⌉) ≤ Bᵢ (the requests that
   arrive in one cycle). A device is feasible when
       Σⱼ ℓ(bⱼ) ≤ d                (the round fits in the cycle) and
       d + ℓ(bᵢ) ≤ Lᵢ  for every i  (worst case: wait one cycle, then run),
   which implies the bound stated as Σⱼ ℓ(bⱼ) + ℓ(bᵢ) ≤ Lᵢ. Session i's
   *share* of the duty cycle is ℓ(bᵢ)/d; the device's occupancy is the sum.
   Alone, a residual takes the cycle d (over the candidates
   d = min(b/r', L − ℓ(b)), b = 1..B) with the smallest share.
4. **Packing.** Residual sessions are sorted by their share alone, largest
   first (ties: model name), and placed first-fit on the shared devices in the
   order they were opened: merging takes the smallest duty cycle of the
   sessions (so every session keeps its SLO) and shrinks the batches to
   ⌈rᵢ·d⌉; it fits when the device stays feasible (occupancy ≤ 1). A session
   that fits nowhere opens a new device.

Beyond Nexus (documented choices):

- **Unknown rates** (None): the device-equivalents not used by the models
  with known rates, N − Σ r·ℓ(B)/B, are split evenly over them (rate =
  share·T); with no known rate, N/k devices each.
- **Overload**: when the plan needs more than N devices, every model's rate is
  scaled by one factor s < 1, the largest (bisection) for which the plan fits
  N devices. `Plan.scale` reports s; the scheduler then serves what it can.
- **Fill** (`fill=True`): when the plan leaves devices unused, rates are scaled
  *up* the same way so that spare devices add headroom in proportion to load
  instead of idling (Nexus would release them; a fixed cluster keeps them).
- **Too many models** for N devices even at zero load: rates are scaled to fit
  N by raw load, and sessions that fit nowhere go onto the least occupied
  device anyway (`Plan.overcommitted`); every model still gets a device.
- Devices are taken as identical, ℓ divided by one `speed` (the scheduler
  passes the slowest device's, so the SLO bound holds on all of them).

Deterministic: models are handled in name order, ties broken by name and
device index.

Requests with several items: rates and batch sizes here are in items (the
core's rate meters count items/s; a request of n items is n of them), which
is requests/s when every request has one item.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.scheduling.model import ModelInfo

EPS = 1e-9  # tolerance for float comparisons of seconds and device counts


@dataclass(frozen=True)
class Session:
    """One model's slot on one device."""

    model: str
    batch: int  # batch size the device runs for this model
    share: float  # ℓ(batch)/duty cycle: the fraction of the device's cycle it takes
    rate: float  # requests/s of the model planned onto this device (routing weight)


@dataclass(frozen=True)
class DevicePlan:
    index: int  # 0..N−1
    sessions: tuple[Session, ...]
    duty_cycle: float  # seconds; 0.0 for an unused device
    dedicated: bool = False

    @property
    def occupancy(self) -> float:
        return sum(s.share for s in self.sessions)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(s.model for s in self.sessions)


@dataclass(frozen=True)
class Plan:
    devices: tuple[DevicePlan, ...]  # all N devices, unused ones with no sessions
    placement: dict[str, tuple[int, ...]]  # model → indices of its devices
    batch: dict[str, int]  # per model B: largest b with 2·ℓ(b) ≤ SLO
    rates: dict[str, float]  # per model the planned rate (after even share and scale)
    scale: float = 1.0  # factor applied to all rates (< 1 overload, > 1 fill)
    overcommitted: bool = False  # some device holds more than one cycle's work
    dedicated: dict[str, int] = field(default_factory=dict)  # per model its count n

    @property
    def used_devices(self) -> int:
        return sum(1 for d in self.devices if d.sessions)


def nexus_batch(model: ModelInfo, speed: float = 1.0) -> int:
    """Largest b ≤ max_batch with 2·ℓ(b)/speed ≤ SLO (symphony.txt eq. 1), at least 1."""
    return max(1, min(model.max_batch, model.profile.max_batch_within(model.slo * speed / 2.0)))


# --------------------------------------------------------------------- internals


@dataclass
class _Residual:
    model: str
    rate: float
    slo: float
    max_b: int  # B
    lat: tuple[float, ...]  # ℓ(b) for b = 0..B, speed applied
    cycle: float = 0.0  # duty cycle alone
    share: float = 0.0  # share alone

    def batch_at(self, cycle: float) -> int:
        return min(self.max_b, max(1, math.ceil(self.rate * cycle - EPS)))


@dataclass
class _Shared:
    members: list[_Residual]
    cycle: float
    batches: list[int]
    busy: float  # Σ ℓ(bᵢ)


def _merge(members: list[_Residual]) -> _Shared:
    cycle = min(m.cycle for m in members)
    batches = [m.batch_at(cycle) for m in members]
    busy = sum(m.lat[b] for m, b in zip(members, batches, strict=True))
    return _Shared(members, cycle, batches, busy)


def _feasible(shared: _Shared) -> bool:
    if shared.busy > shared.cycle + EPS:
        return False
    pairs = zip(shared.members, shared.batches, strict=True)
    return all(shared.cycle + m.lat[b] <= m.slo + EPS for m, b in pairs)


def _alone(res: _Residual) -> None:
    """Choose the residual's own duty cycle: the candidate with the smallest share."""
    best: tuple[float, float] | None = None  # (share, −cycle)
    for b in range(1, res.max_b + 1):
        cycle = res.slo - res.lat[b]
        if res.rate > 0:
            cycle = min(cycle, b / res.rate)
        if cycle <= 0:
            continue
        actual = res.batch_at(cycle)
        if res.lat[actual] > cycle + EPS or cycle + res.lat[actual] > res.slo + EPS:
            continue
        key = (res.lat[actual] / cycle, -cycle)
        if best is None or key < best:
            best = key
    if best is None:
        # Even batch 1 cannot meet 2·ℓ(1) ≤ SLO: run back to back, alone.
        res.cycle = res.lat[1]
        res.share = 1.0
    else:
        res.share, res.cycle = best[0], -best[1]


@dataclass
class _Layout:
    dedicated: list[tuple[str, int]]  # (model, count) in name order
    shared: list[_Shared]
    overcommitted: bool = False

    @property
    def count(self) -> int:
        return sum(n for _, n in self.dedicated) + len(self.shared)


class _Planner:
    def __init__(self, models: Sequence[ModelInfo], speed: float) -> None:
        self.models = sorted(models, key=lambda m: m.name)
        self.batch = {m.name: nexus_batch(m, speed) for m in self.models}
        self.slo = {m.name: m.slo for m in self.models}
        self.lat = {
            m.name: tuple(
                m.profile.latency(b) / speed if b else 0.0 for b in range(self.batch[m.name] + 1)
            )
            for m in self.models
        }
        # Throughput of one dedicated device, T = B/ℓ(B).
        self.tput = {
            m.name: self.batch[m.name] / self.lat[m.name][self.batch[m.name]] for m in self.models
        }

    def load(self, rates: Mapping[str, float]) -> float:
        """Device-equivalents Σ r/T."""
        return sum(rates[m.name] / self.tput[m.name] for m in self.models)

    def layout(self, rates: Mapping[str, float], limit: int | None = None) -> _Layout:
        dedicated: list[tuple[str, int]] = []
        residuals: list[_Residual] = []
        for m in self.models:
            name = m.name
            load = rates[name] / self.tput[name]
            n = math.floor(load + EPS)
            dedicated.append((name, n))
            rest = load - n
            if rest > EPS or n == 0:
                res = _Residual(
                    name,
                    max(rest, 0.0) * self.tput[name],
                    m.slo,
                    self.batch[name],
                    self.lat[name],
                )
                _alone(res)
                residuals.append(res)
        residuals.sort(key=lambda r: (-r.share, r.model))
        n_dedicated = sum(n for _, n in dedicated)
        shared: list[_Shared] = []
        overcommitted = False
        for res in residuals:
            for i, dev in enumerate(shared):
                merged = _merge([*dev.members, res])
                if _feasible(merged):
                    shared[i] = merged
                    break
            else:
                if limit is None or n_dedicated + len(shared) < limit:
                    shared.append(_merge([res]))
                else:
                    overcommitted = True
                    shared = self._force(shared, dedicated, res)
        return _Layout(dedicated, shared, overcommitted)

    def _force(
        self,
        shared: list[_Shared],
        dedicated: list[tuple[str, int]],
        res: _Residual,
    ) -> list[_Shared]:
        """Put `res` on the least occupied of the devices in use (all N are).

        Ties go to shared devices before dedicated ones, then to the lower
        device index. A dedicated device chosen (only when every shared device
        is at least full) turns into a shared one holding its model's
        full-batch session (cycle ℓ(B)) plus `res`, shrunk to that cycle.
        """
        best: tuple[float, int, int] | None = None  # (occupancy, dedicated?, index)
        for i, dev in enumerate(shared):
            key = (dev.busy / dev.cycle, 0, i)
            if best is None or key < best:
                best = key
        for k, (_, n) in enumerate(dedicated):
            if n and (best is None or (1.0, 1, k) < best):
                best = (1.0, 1, k)
        assert best is not None  # N ≥ 1 devices are all in use
        _, is_dedicated, i = best
        shared = list(shared)
        if not is_dedicated:
            shared[i] = _merge([*shared[i].members, res])
            return shared
        name, n = dedicated[i]
        dedicated[i] = (name, n - 1)
        b = self.batch[name]
        full = _Residual(name, self.tput[name], self.slo[name], b, self.lat[name])
        full.cycle, full.share = self.lat[name][b], 1.0
        return [*shared, _merge([full, res])]


def plan(
    models: Sequence[ModelInfo],
    rates: Mapping[str, float | None],
    n_devices: int,
    *,
    speed: float = 1.0,
    fill: bool = False,
) -> Plan:
    """Squishy bin packing of `models` at `rates` (req/s; None = unknown, or a
    model missing from `rates`) onto `n_devices` identical devices."""
    if n_devices < 1:
        raise ValueError(f"n_devices must be ≥ 1, got {n_devices}")
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    if not models:
        raise ValueError("plan needs at least one model")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    planner = _Planner(models, speed)

    # Known rates as given; unknown ones get an even share of what is left.
    base: dict[str, float] = {}
    unknown: list[str] = []
    for m in planner.models:
        rate = rates.get(m.name)
        if rate is None:
            unknown.append(m.name)
        else:
            if rate < 0 or math.isnan(rate):
                raise ValueError(f"rate of {m.name!r} must be ≥ 0, got {rate}")
            base[m.name] = float(rate)
    if unknown:
        left = max(n_devices - planner.load(base | dict.fromkeys(unknown, 0.0)), 0.0)
        for name in unknown:
            base[name] = left / len(unknown) * planner.tput[name]

    def scaled(s: float) -> dict[str, float]:
        return {name: r * s for name, r in base.items()}

    def fits(s: float) -> bool:
        return planner.layout(scaled(s)).count <= n_devices

    scale = 1.0
    limit: int | None = None
    if not fits(1.0):
        if fits(0.0):
            lo, hi = 0.0, 1.0
            scale = _bisect(fits, lo, hi)
        else:
            total = planner.load(base)
            scale = min(1.0, n_devices / total) if total > 0 else 1.0
            limit = n_devices
    elif fill and any(r > 0 for r in base.values()):
        hi = 2.0
        for _ in range(64):
            if not fits(hi):
                break
            hi *= 2.0
        else:
            hi = 0.0
        if hi:
            scale = _bisect(fits, hi / 2.0, hi)
    final = scaled(scale)
    layout = planner.layout(final, limit)
    return _build(planner, layout, final, scale, n_devices)


def _bisect(fits, lo: float, hi: float) -> float:
    """Largest s in [lo, hi) with fits(s), given fits(lo) and not fits(hi)."""
    for _ in range(100):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = (lo + hi) / 2.0
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _build(
    planner: _Planner, layout: _Layout, rates: dict[str, float], scale: float, n_devices: int
) -> Plan:
    devices: list[DevicePlan] = []
    placement: dict[str, list[int]] = {m.name: [] for m in planner.models}
    for name, n in layout.dedicated:
        b = planner.batch[name]
        session = Session(name, b, 1.0, planner.tput[name])
        for _ in range(n):
            placement[name].append(len(devices))
            devices.append(DevicePlan(len(devices), (session,), planner.lat[name][b], True))
    for dev in layout.shared:
        sessions = []
        for m, b in zip(dev.members, dev.batches, strict=True):
            placement[m.model].append(len(devices))
            sessions.append(Session(m.model, b, m.lat[b] / dev.cycle, m.rate))
        devices.append(DevicePlan(len(devices), tuple(sessions), dev.cycle, False))
    while len(devices) < n_devices:
        devices.append(DevicePlan(len(devices), (), 0.0, False))
    return Plan(
        devices=tuple(devices),
        placement={name: tuple(idx) for name, idx in placement.items()},
        batch=dict(planner.batch),
        rates=rates,
        scale=scale,
        overcommitted=layout.overcommitted,
        dedicated=dict(layout.dedicated),
    )
