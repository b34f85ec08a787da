"""The (max_batch_size, batch_wait_timeout_s) grid a careful Ray Serve user tries.

Ray Serve's ``@serve.batch`` has two knobs and no notion of deadlines. A user
who knows the model's latency profile ℓ(b) and its SLO would try:

- ``max_batch_size`` ∈ {largest b with ℓ(b) ≤ SLO/2, largest b with ℓ(b) ≤ SLO}:
  the first leaves half the SLO for queueing (the rule Nexus and Symphony's
  baselines use), the second is the largest batch that can still meet the SLO at
  all;
- ``batch_wait_timeout_s`` ∈ {0, 1, 2, 5} ms: no waiting (Serve then batches only
  what queued while the previous batch ran) up to a few milliseconds.

That is 8 points per workload (fewer when the two batch sizes coincide). With
several models, every point applies the same rule to each model (each gets its
own SLO/2 or SLO batch size) and the same wait: the cross product would grow as
4ⁿ·… and a user would not tune it either.

`candidate_grid` builds the list; the comparison script runs each point (e.g.
`bench.peers.ray_serve_launcher.start_ray_serve(..., max_batch_size=p.max_batch_size,
batch_wait_timeout_s=p.batch_wait_timeout_s)`) and hands the results to
`pick_best`, which chooses by capacity (highest offered load with ≥ 99 % within
SLO) when the results have it, else by goodput.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.repository.config import ModelConfig
from app.scheduling.profile import LatencyProfile

WAITS_S: tuple[float, ...] = (0.0, 0.001, 0.002, 0.005)
RULES: tuple[str, ...] = ("slo/2", "slo")


@dataclass(frozen=True)
class GridPoint:
    """One Ray Serve configuration: per-model batch size and one wait."""

    rule: str  # "slo/2" or "slo": how the batch sizes were chosen
    max_batch_size: Mapping[str, int]  # model → @serve.batch max_batch_size
    batch_wait_timeout_s: float

    @property
    def label(self) -> str:
        sizes = ",".join(f"{m}={b}" for m, b in sorted(self.max_batch_size.items()))
        return f"max_batch[{self.rule}]:{sizes} wait={self.batch_wait_timeout_s * 1000:g}ms"

    def single_batch_size(self) -> int:
        """The batch size when one model is served (`start_ray_serve` takes an int)."""
        values = set(self.max_batch_size.values())
        if len(values) != 1:
            raise ValueError(f"{self.label}: models differ in batch size; pass the mapping")
        return values.pop()

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "max_batch_size": dict(self.max_batch_size),
            "batch_wait_timeout_s": self.batch_wait_timeout_s,
            "label": self.label,
        }


def batch_size_for(profile: LatencyProfile, slo_s: float, rule: str, max_batch: int) -> int:
    """The largest b ≤ max_batch with ℓ(b) ≤ SLO/2 (rule "slo/2") or ≤ SLO ("slo");
    at least 1 (a model too slow for its SLO still runs batches of one)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    budget = slo_s / 2 if rule == "slo/2" else slo_s
    return max(1, min(max_batch, profile.max_batch_within(budget)))


@dataclass(frozen=True)
class ModelTarget:
    """What the grid needs to know of a model: ℓ(b), SLO, the largest batch."""

    name: str
    profile: LatencyProfile
    slo_s: float
    max_batch: int


def target_from_config(
    config: ModelConfig, *, cpu_threads: int | None = None, slo_ms: float | None = None
) -> ModelTarget:
    """A model of the repository: its config's profile, else (ONNX) the profile
    the daemon measured and cached for ``cpu-{cpu_threads}t``."""
    from app.repository.profiles import latency_profile

    device = "emulated" if config.backend == "emulated" else f"cpu-{cpu_threads or 1}t"
    profile = latency_profile(config, device)
    if profile is None:
        raise ValueError(
            f"model {config.name!r}: no latency profile for {device} (start the daemon once "
            "to measure it, or give the profile in config.yaml)"
        )
    slo = (slo_ms if slo_ms is not None else config.slo_ms) / 1000.0
    return ModelTarget(config.name, profile, slo, config.max_batch_size)


def candidate_grid(
    targets: Sequence[ModelTarget], waits_s: Iterable[float] = WAITS_S
) -> list[GridPoint]:
    """The grid for the models served together, duplicates removed, in order
    (smaller batches first, then shorter waits)."""
    if not targets:
        raise ValueError("no models")
    points: list[GridPoint] = []
    seen: set[tuple[tuple[tuple[str, int], ...], float]] = set()
    for rule in RULES:
        sizes = {t.name: batch_size_for(t.profile, t.slo_s, rule, t.max_batch) for t in targets}
        for wait in waits_s:
            key = (tuple(sorted(sizes.items())), float(wait))
            if key in seen:
                continue
            seen.add(key)
            points.append(GridPoint(rule, dict(sizes), float(wait)))
    return points


def score(result: Mapping[str, Any]) -> tuple[float, float, float]:
    """Sort key of one point's result (higher is better): capacity when present,
    else goodput; then SLO attainment; then lower p99 latency."""
    overall = result.get("overall", result)
    primary = result.get("capacity_rps")
    if primary is None:
        primary = overall.get("goodput_rps", 0.0)
    attainment = overall.get("slo_attainment") or 0.0
    p99 = overall.get("latency_p99_ms")
    return (float(primary or 0.0), float(attainment), -float(p99) if p99 is not None else -1e18)


def pick_best(
    results: Iterable[tuple[GridPoint, Mapping[str, Any]]],
) -> tuple[GridPoint, Mapping[str, Any]]:
    """The best (point, result): results are the load generator's / simulator's
    JSON for a run (``{"overall": {"goodput_rps", "slo_attainment",
    "latency_p99_ms", ...}, ...}``, optionally with ``capacity_rps``) or a flat
    metrics mapping. Ties go to the earlier point (smaller batch, shorter wait).
    """
    best: tuple[GridPoint, Mapping[str, Any]] | None = None
    best_key: tuple[float, float, float] | None = None
    for point, result in results:
        key = score(result)
        if best_key is None or key > best_key:
            best, best_key = (point, result), key
    if best is None:
        raise ValueError("no results to pick from")
    return best


__all__ = [
    "RULES",
    "WAITS_S",
    "GridPoint",
    "ModelTarget",
    "batch_size_for",
    "candidate_grid",
    "pick_best",
    "score",
    "target_from_config",
]
