"""Symphony's analytical batch sizes, throughputs and device counts.

symphony.txt §4.2 and §5.2.2 (Table 4). With a linear latency profile
ℓ(b) = α·b + β and uniform arrivals:

* **No coordination** (Nexus-like, each backend batches on its own): a
  request that arrives just after a batch started waits a whole ℓ(b) before
  its own batch runs, so 2·ℓ(b) ≤ SLO (eq. 1) and
  b = ⌊(SLO/2 − β)/α⌋.
* **Staggered execution** (a centralised scheduler spaces the N backends
  ℓ(b)/N apart): the worst queueing delay drops to ℓ(b)/N, so
  (1 + 1/N)·ℓ(b) ≤ SLO (eq. 2) and b = ⌊(SLO/(1 + 1/N) − β)/α⌋.
* **Throughput** of N devices running batches of b back to back:
  N·b/ℓ(b) = N·b/(α·b + β) (eq. 3's left-hand side).
* **Devices for a rate λ**: the smallest N with N·b/ℓ(b) ≥ λ where b is the
  staggered batch size for that N (eqs. 2 and 3 solved together, as §4.2
  does when a model is introduced or an epoch rebalances).

Units: every time (α, β, SLO, ℓ) is in seconds, as everywhere in this
project; throughputs are requests per second. Table 4 quotes α and β in ms —
pass ``1.053e-3``, not ``1.053``. Table 4's throughputs are these values
rounded to the nearest integer (``round``): flooring would give 4500 r/s for
ResNet50 without coordination where the paper prints 4501, and ceiling would
give 5840, 714 and 1084 where it prints 5839, 713 and 1083.

Batch sizes are floors of real numbers; a tolerance of 1e-9 absorbs the
floating-point error of ``(SLO/2 − β)/α`` landing a hair under an integer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from app.scheduling.model import ModelInfo

_FLOOR_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """N devices each running batches of `batch_size` back to back."""

    devices: int
    batch_size: int
    batch_latency: float  # ℓ(b), seconds
    throughput: float  # requests/s over all `devices`
    worst_queueing_delay: float  # ℓ(b) without coordination, ℓ(b)/N staggered

    @property
    def throughput_rps(self) -> int:
        """Throughput rounded as Symphony's Table 4 prints it (nearest integer)."""
        return round(self.throughput)


@dataclass(frozen=True, slots=True)
class CapacityComparison:
    """One row of Symphony's Table 4: both execution styles for one model."""

    no_coordination: OperatingPoint
    staggered: OperatingPoint

    @property
    def throughput_gain(self) -> float:
        """Staggered over uncoordinated throughput (§5.2.2: 30 % to 50 % more)."""
        if self.no_coordination.throughput == 0:
            return math.inf if self.staggered.throughput > 0 else 1.0
        return self.staggered.throughput / self.no_coordination.throughput


# ------------------------------------------------------------------ batch sizes


def no_coordination_batch_size(
    alpha: float, beta: float, slo: float, *, max_batch: int | None = None
) -> int:
    """⌊(SLO/2 − β)/α⌋ (eq. 1), capped at `max_batch`; 0 if even b = 1 misses."""
    return _batch_within(alpha, beta, slo / 2.0, max_batch)


def staggered_batch_size(
    alpha: float, beta: float, slo: float, devices: int, *, max_batch: int | None = None
) -> int:
    """⌊(SLO/(1 + 1/N) − β)/α⌋ (eq. 2), capped at `max_batch`; 0 if b = 1 misses."""
    _check_devices(devices)
    return _batch_within(alpha, beta, slo / (1.0 + 1.0 / devices), max_batch)


def throughput(alpha: float, beta: float, batch_size: int, devices: int = 1) -> float:
    """N·b/(α·b + β) requests/s: N devices running batches of b back to back."""
    _check_devices(devices)
    if batch_size < 0:
        raise ValueError(f"batch_size must be ≥ 0, got {batch_size}")
    if batch_size == 0:
        return 0.0
    return devices * batch_size / (alpha * batch_size + beta)


# ------------------------------------------------------------- operating points


def no_coordination(
    alpha: float, beta: float, slo: float, devices: int, *, max_batch: int | None = None
) -> OperatingPoint:
    """N backends batching independently (eq. 1)."""
    b = no_coordination_batch_size(alpha, beta, slo, max_batch=max_batch)
    latency = alpha * b + beta if b else 0.0
    return OperatingPoint(
        devices=devices,
        batch_size=b,
        batch_latency=latency,
        throughput=throughput(alpha, beta, b, devices),
        worst_queueing_delay=latency,
    )


def staggered(
    alpha: float, beta: float, slo: float, devices: int, *, max_batch: int | None = None
) -> OperatingPoint:
    """N backends staggered ℓ(b)/N apart by a central scheduler (eq. 2)."""
    b = staggered_batch_size(alpha, beta, slo, devices, max_batch=max_batch)
    latency = alpha * b + beta if b else 0.0
    return OperatingPoint(
        devices=devices,
        batch_size=b,
        batch_latency=latency,
        throughput=throughput(alpha, beta, b, devices),
        worst_queueing_delay=latency / devices,
    )


def compare(
    alpha: float, beta: float, slo: float, devices: int, *, max_batch: int | None = None
) -> CapacityComparison:
    """Both execution styles side by side: one row of Table 4."""
    return CapacityComparison(
        no_coordination=no_coordination(alpha, beta, slo, devices, max_batch=max_batch),
        staggered=staggered(alpha, beta, slo, devices, max_batch=max_batch),
    )


# ------------------------------------------------------------ devices for a rate


def devices_for_rate(
    alpha: float,
    beta: float,
    slo: float,
    rate: float,
    *,
    max_batch: int | None = None,
    max_devices: int = 100_000,
) -> OperatingPoint:
    """Smallest N with N·b/ℓ(b) ≥ λ, b the staggered batch size for N (eqs. 2–3).

    Raises ValueError when no N ≤ `max_devices` serves `rate` (in particular
    when ℓ(1) ≥ SLO: (1 + 1/N)·ℓ(1) > SLO for every finite N).
    """
    _check_profile(alpha, beta, max_batch)

    def point(n: int) -> OperatingPoint:
        return staggered(alpha, beta, slo, n, max_batch=max_batch)

    return _smallest_n(
        point,
        rate,
        max_devices,
        single_fits=alpha + beta < slo,
        what=f"α={alpha}, β={beta}, SLO={slo}",
    )


def devices_for_model(
    model: ModelInfo, rate: float, *, max_devices: int = 100_000
) -> OperatingPoint:
    """`devices_for_rate` for a model's own profile, linear or measured.

    b for N is the largest b ≤ model.max_batch with (1 + 1/N)·ℓ(b) ≤ SLO,
    read from the profile's ℓ table, so non-linear profiles work too.
    """
    profile = model.profile

    def point(n: int) -> OperatingPoint:
        _check_devices(n)
        budget = model.slo / (1.0 + 1.0 / n)
        b = min(model.max_batch, profile.max_batch_within(budget))
        latency = profile.latency(b) if b else 0.0
        rps = n * b / latency if b and latency > 0 else (math.inf if b else 0.0)
        return OperatingPoint(
            devices=n,
            batch_size=b,
            batch_latency=latency,
            throughput=rps,
            worst_queueing_delay=latency / n,
        )

    return _smallest_n(
        point,
        rate,
        max_devices,
        single_fits=profile.latency(1) < model.slo,
        what=f"model {model.name!r}",
    )


# ---------------------------------------------------------------------- helpers


def _smallest_n(
    point: Callable[[int], OperatingPoint],
    rate: float,
    max_devices: int,
    *,
    single_fits: bool,
    what: str,
) -> OperatingPoint:
    """First N (1, 2, …) whose operating point reaches `rate`.

    A linear scan, not a bisection: b(N) never shrinks as N grows, but with
    a measured (non-linear) profile N·b/ℓ(b) need not be monotone in N.
    """
    if rate < 0:
        raise ValueError(f"rate must be ≥ 0, got {rate}")
    if not single_fits:
        raise ValueError(f"{what}: even a batch of one misses the SLO; no device count helps")
    for n in range(1, max_devices + 1):
        p = point(n)
        if p.batch_size >= 1 and p.throughput >= rate:
            return p
    raise ValueError(f"{what}: {rate} requests/s needs more than {max_devices} devices")


def _batch_within(alpha: float, beta: float, budget: float, max_batch: int | None) -> int:
    """Largest b with α·b + β ≤ budget, capped at max_batch, 0 if none."""
    _check_profile(alpha, beta, max_batch)
    if alpha == 0:
        assert max_batch is not None  # _check_profile guarantees it
        return max_batch if beta <= budget else 0
    b = math.floor((budget - beta) / alpha + _FLOOR_TOLERANCE)
    if max_batch is not None:
        b = min(b, max_batch)
    return max(b, 0)


def _check_profile(alpha: float, beta: float, max_batch: int | None) -> None:
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be ≥ 0, got {alpha}, {beta}")
    if alpha == 0 and max_batch is None:
        raise ValueError("with alpha = 0 batches are unbounded; pass max_batch")
    if max_batch is not None and max_batch < 1:
        raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")


def _check_devices(devices: int) -> None:
    if devices < 1:
        raise ValueError(f"devices must be ≥ 1, got {devices}")
