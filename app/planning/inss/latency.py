"""InSS's latency prediction (inss.txt §4.1–4.2): a batch's execution time on
a shared device, and a task's latency through the FIFO batch queue (eq. 2).

Execution (§4.1), for model i at batch b and share ρ on device k:

    t_inf = t_d + t_c + t_f                       (upload, compute, download)
    t_d   = p_d·b / B,   t_f = p_f·b / B          (bytes per item, PCIe bandwidth)
    t_c   = t_s + t_r
    t_s   = (o_sch + int)·n_kernels(b)            (scheduling)
    int   = 0                    if n ≤ 1
          = α_s·n + β_s          if n > 1          (n: models on the device)
    t_r   = o_r(b, ρ)·(1 + α_cache·Σ_v l_v(ρ_v))  (running; v: the co-runners)
    l(ρ)  = α_u·ρ + β_u                           (L2 cache use, alone)
    h     = b / t_inf                             (throughput)

o_r is the alone running time from locally weighted regression (lwr.py)
or any `RunningTime` (a closed form, problem.py).
The coefficients are fitted by fit.py.

Task latency (§4.2, eq. 2), for a task that finds W tasks queued (itself
included), the device busy for exec more seconds, batch size b, rate λ:

    T = exec + ⌈W/b⌉·t_inf                 if W ≥ b
    T = max(exec, (b − W)/λ) + t_inf       if W < b

Deviations and readings, each for a reason:

* n in int is Σ_i y_{i,k}, the number of models placed on the device, the
  model itself included (as printed): one model alone has int = 0.
* The printed running-time term sums "l_{i,k} y_{i,k} over v ∈ I \\ i", an
  index slip: the sum is over the co-runners v, of their L2 use l_v at their
  own shares. We read it so (the text: "Higher L2 Cache utilization means
  more competition").
* L2 use is whatever unit the caller fits it in (Gpulet's utilisation per
  cent / 100 is a fraction); α_cache is per that unit.
* eq. 2 is implemented exactly as printed, with two approximations it
  carries: for W < b, wait = (b − W)/λ is the *mean* time for b − W more
  arrivals, and max(exec, mean wait) is not the mean of max(exec, wait); for
  W ≥ b, the ⌈W/b⌉ batches run back to back, so a task whose own batch is
  still partial (W not a multiple of b) is assumed to see it fill in time
  (the true latency is then ≥ eq. 2's). tests/test_inss_latency.py checks
  both against a simulated FIFO queue: exact when W is a multiple of b, the
  mean within 0.3–2.2 % at loads 0.3–0.76.

Units: seconds, bytes, bytes/s; shares are fractions in (0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class RunningTime(Protocol):
    """o_r(b, ρ), seconds alone: LWR (lwr.py) or a closed form
    (problem.py's LinearRunningTime)."""

    def predict(self, batch: float, share: float) -> float: ...


@dataclass(frozen=True)
class L2Use:
    """l(ρ) = α_u·ρ + β_u: a model's L2 cache use alone at share ρ."""

    alpha_u: float
    beta_u: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha_u) and math.isfinite(self.beta_u)):
            raise ValueError(f"L2 use coefficients must be finite, got {self}")

    def at(self, share: float) -> float:
        _check_share(share)
        return self.alpha_u * share + self.beta_u


@dataclass(frozen=True)
class ModelLatency:
    """What is fitted per model and device (§4.1, "Prediction Overhead").

    `kernels` is n_{i,k}: one count for every batch size, or a count per
    profiled batch size (a batch size missing from it is an error)."""

    name: str
    input_bytes: float  # p_d, per item
    output_bytes: float  # p_f, per item
    sched_per_kernel_s: float  # o_sch
    kernels: int | Mapping[int, int]
    running_time: RunningTime  # o_r(b, ρ) alone
    l2: L2Use
    alpha_cache: float
    _kernels: dict[int, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (
            ("input bytes", self.input_bytes),
            ("output bytes", self.output_bytes),
            ("scheduling time per kernel", self.sched_per_kernel_s),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"model {self.name!r}: {label} must be finite and ≥ 0")
        if not math.isfinite(self.alpha_cache):
            raise ValueError(f"model {self.name!r}: α_cache must be finite")
        if isinstance(self.kernels, Mapping):
            table = {int(b): int(n) for b, n in self.kernels.items()}
            if not table or any(b < 1 or n < 0 for b, n in table.items()):
                raise ValueError(
                    f"model {self.name!r}: kernel counts need batch sizes ≥ 1 and counts ≥ 0"
                )
            object.__setattr__(self, "_kernels", table)
        else:
            if self.kernels < 0:
                raise ValueError(f"model {self.name!r}: kernel count must be ≥ 0")
            object.__setattr__(self, "_kernels", None)

    def kernels_at(self, batch: int) -> int:
        if self._kernels is None:
            return int(self.kernels)  # type: ignore[arg-type]
        if batch not in self._kernels:
            raise KeyError(
                f"model {self.name!r}: no kernel count for batch {batch} "
                f"(profiled: {sorted(self._kernels)})"
            )
        return self._kernels[batch]


@dataclass(frozen=True)
class DeviceLatency:
    """What is fitted per device: host link bandwidth B (bytes/s) and the
    scheduling interference coefficients α_s, β_s (seconds per kernel)."""

    name: str
    bandwidth_bytes_per_s: float
    alpha_s: float
    beta_s: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise ValueError(f"device {self.name!r}: bandwidth must be finite and > 0")
        if not (math.isfinite(self.alpha_s) and math.isfinite(self.beta_s)):
            raise ValueError(f"device {self.name!r}: α_s, β_s must be finite")

    def sched_interference(self, models_on_device: int) -> float:
        """int: extra scheduling seconds per kernel with n models placed."""
        if models_on_device < 1:
            raise ValueError(f"models on a device must be ≥ 1, got {models_on_device}")
        if models_on_device <= 1:
            return 0.0
        return self.alpha_s * models_on_device + self.beta_s


@dataclass(frozen=True)
class CoRunner:
    """A model sharing the device, as the running-time term sees it: its L2
    use line and its share."""

    l2: L2Use
    share: float

    def __post_init__(self) -> None:
        _check_share(self.share)

    @classmethod
    def of(cls, model: ModelLatency, share: float) -> CoRunner:
        return cls(model.l2, share)


@dataclass(frozen=True)
class ExecBreakdown:
    """t_inf's terms, seconds."""

    upload: float
    scheduling: float
    running: float
    download: float

    @property
    def total(self) -> float:
        return self.upload + self.scheduling + self.running + self.download


def exec_breakdown(
    model: ModelLatency,
    device: DeviceLatency,
    batch: int,
    share: float,
    co_runners: Sequence[CoRunner] = (),
) -> ExecBreakdown:
    """t_inf of one batch and its terms (§4.1)."""
    if batch < 1:
        raise ValueError(f"batch size must be ≥ 1, got {batch}")
    _check_share(share)
    total_share = share + sum(c.share for c in co_runners)
    if total_share > 1 + 1e-9:
        raise ValueError(f"shares on one device sum to {total_share:g} > 1 (constraint 1a)")
    upload = model.input_bytes * batch / device.bandwidth_bytes_per_s
    download = model.output_bytes * batch / device.bandwidth_bytes_per_s
    interference = device.sched_interference(1 + len(co_runners))
    scheduling = (model.sched_per_kernel_s + interference) * model.kernels_at(batch)
    cache = sum(c.l2.at(c.share) for c in co_runners)
    running = model.running_time.predict(batch, share) * (1.0 + model.alpha_cache * cache)
    return ExecBreakdown(upload, scheduling, running, download)


def exec_time(
    model: ModelLatency,
    device: DeviceLatency,
    batch: int,
    share: float,
    co_runners: Sequence[CoRunner] = (),
) -> float:
    """t_inf, seconds: one batch of `model` at `share` beside `co_runners`."""
    return exec_breakdown(model, device, batch, share, co_runners).total


def throughput(
    model: ModelLatency,
    device: DeviceLatency,
    batch: int,
    share: float,
    co_runners: Sequence[CoRunner] = (),
) -> float:
    """h = b / t_inf, items per second."""
    return batch / exec_time(model, device, batch, share, co_runners)


def task_latency(
    exec_remaining: float, queued: int, batch: int, rate: float, t_inf: float
) -> float:
    """eq. 2, seconds: `queued` is W (the tasks waiting, this one included),
    `exec_remaining` the rest of the batch running now (0 when idle), `rate`
    λ in tasks/s (used only when W < b)."""
    if not (math.isfinite(exec_remaining) and exec_remaining >= 0):
        raise ValueError(f"remaining execution time must be finite and ≥ 0, got {exec_remaining}")
    if queued < 1:
        raise ValueError(f"queued workload W includes the task itself: must be ≥ 1, got {queued}")
    if batch < 1:
        raise ValueError(f"batch size must be ≥ 1, got {batch}")
    if not (math.isfinite(t_inf) and t_inf > 0):
        raise ValueError(f"t_inf must be finite and > 0, got {t_inf}")
    if queued >= batch:
        return exec_remaining + math.ceil(queued / batch) * t_inf
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"arrival rate must be finite and > 0 when W < b, got {rate}")
    return max(exec_remaining, (batch - queued) / rate) + t_inf


def _check_share(share: float) -> None:
    if not (math.isfinite(share) and 0 < share <= 1):
        raise ValueError(f"a share must be a fraction in (0, 1], got {share}")
