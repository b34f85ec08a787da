"""What the core knows about a model: its latency profile, SLO and batch cap,
and for a model whose execution time depends on its input, how a batch's
time follows from its requests' times alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from app.scheduling.profile import LatencyProfile


@dataclass(frozen=True)
class InputDependence:
    """A dynamic model: each request r has its own execution time alone,
    a_r = c0 + x_r, and a batch of k items runs c0 + k·max_r x_r
    (orloj.txt eq. 3–4, ℓ_B = c0 + c1·k·max ℓ_r with c1·ℓ_r written x_r: the
    core only ever sees alone-times, so c1 never appears on its own).

    `c0` is in seconds. `prior` seeds the per-application histograms of
    alone-times (seconds) before any measurement arrives: (application,
    samples) pairs, "" for the model's default application."""

    c0: float
    prior: tuple[tuple[str, tuple[float, ...]], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not (self.c0 >= 0.0 and math.isfinite(self.c0)):
            raise ValueError(f"c0 must be a finite number ≥ 0 (seconds), got {self.c0}")
        for app, samples in self.prior:
            if any(not (a >= self.c0 and math.isfinite(a)) for a in samples):
                raise ValueError(
                    f"application {app!r}: alone-times must be finite and ≥ c0 = {self.c0} s"
                )


@dataclass(frozen=True)
class ModelInfo:
    name: str
    profile: LatencyProfile
    slo: float  # seconds, arrival → answer
    max_batch: int
    # items/s (requests/s when each request has one item), a planning hint (Nexus)
    expected_rate: float | None = None
    # Set for a model whose execution time depends on its input (Orloj); the
    # profile is then the one-ℓ(b) view other policies plan with.
    dynamic: InputDependence | None = None

    def __post_init__(self) -> None:
        if self.slo <= 0:
            raise ValueError(f"model {self.name!r}: slo must be > 0 s, got {self.slo}")
        if self.max_batch < 1:
            raise ValueError(f"model {self.name!r}: max_batch must be ≥ 1, got {self.max_batch}")
        if self.profile.max_batch < self.max_batch:
            raise ValueError(
                f"model {self.name!r}: profile covers batches up to {self.profile.max_batch}, "
                f"max_batch is {self.max_batch}"
            )

    @property
    def slo_batch(self) -> int:
        """Largest batch that can meet the SLO at all: ℓ(b) ≤ SLO."""
        return min(self.max_batch, self.profile.max_batch_within(self.slo))
