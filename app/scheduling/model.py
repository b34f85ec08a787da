"""What the core knows about a model: its latency profile, SLO and batch cap."""

from __future__ import annotations

from dataclasses import dataclass

from app.scheduling.profile import LatencyProfile


@dataclass(frozen=True)
class ModelInfo:
    name: str
    profile: LatencyProfile
    slo: float  # seconds, arrival → answer
    max_batch: int
    # items/s (requests/s when each request has one item), a planning hint (Nexus)
    expected_rate: float | None = None

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
