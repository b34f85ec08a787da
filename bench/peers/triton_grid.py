"""The dynamic-batcher settings a careful Triton user tries, for the real Triton peer.

Triton's dynamic batcher is deadline-unaware; its knobs are the batch size, how
long to hold a batch open (``max_queue_delay_microseconds``) and the queue
policy (``default_queue_policy``: REJECT a request that waited longer than a
timeout). A user who knows each model's latency profile ℓ(b) and SLO would set:

- ``max_batch_size`` = the largest b ≤ the model's maximum with ℓ(b) ≤ SLO (a
  larger batch misses the SLO even when nothing queues; the same rule as the
  simulator's ``triton`` policy default, app/scheduling/triton.py);
- ``max_queue_delay_microseconds`` ∈ {0, 1 ms, 3 ms}: Triton's default of no
  waiting, and two short waits that let batches fill at moderate load;
- the queue timeout ∈ {none, SLO − ℓ(1)}: Triton's default of never timing a
  request out, or rejecting one that has waited so long that even a batch of
  one can no longer finish within its SLO (it is lost either way; rejecting it
  frees the device for requests that can still make it). Rounded down to whole
  microseconds; a model whose ℓ(1) ≥ SLO gets no timeout.

That is 3 × 2 = 6 points per workload ("best of six"). With several models
every point applies the same rule to each model (its own batch size and
timeout) and the same delay. Delays and timeout rules can be narrowed or
widened through `triton_grid`'s arguments.

The comparison starts Triton once per point (`bench.peers.triton_launcher.
start_triton(..., **point.launch_options())`), measures it, and hands the
results to `pick_best` (capacity first, else goodput; `bench.peers.ray_grid.score`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.peers.ray_grid import ModelTarget, batch_size_for, score, target_from_config

DELAYS_US: tuple[int, ...] = (0, 1000, 3000)
TIMEOUT_RULES: tuple[str, ...] = ("none", "slo-l1")


@dataclass(frozen=True)
class TritonGridPoint:
    """One Triton configuration: per-model batch size and timeout, one delay."""

    max_batch_size: Mapping[str, int]  # model → max_batch_size
    max_queue_delay_us: int
    timeout_rule: str  # "none" or "slo-l1"
    queue_timeout_us: Mapping[str, int | None]  # model → REJECT timeout (None: no policy)

    @property
    def label(self) -> str:
        sizes = ",".join(f"{m}={b}" for m, b in sorted(self.max_batch_size.items()))
        timeouts = ",".join(
            f"{m}={'none' if t is None else f'{t / 1000:g}ms'}"
            for m, t in sorted(self.queue_timeout_us.items())
        )
        return (
            f"max_batch:{sizes} delay={self.max_queue_delay_us / 1000:g}ms "
            f"timeout[{self.timeout_rule}]:{timeouts}"
        )

    def launch_options(self) -> dict[str, Any]:
        """The keywords of `start_triton` this point sets."""
        return {
            "max_batch_size": dict(self.max_batch_size),
            "max_queue_delay_us": self.max_queue_delay_us,
            "queue_timeout_us": dict(self.queue_timeout_us),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**self.launch_options(), "timeout_rule": self.timeout_rule, "label": self.label}


def queue_timeout_for(target: ModelTarget, rule: str) -> int | None:
    """The REJECT timeout in µs of `rule` for one model (None: no queue policy)."""
    if rule not in TIMEOUT_RULES:
        raise ValueError(f"timeout rule must be one of {TIMEOUT_RULES}, got {rule!r}")
    if rule == "none":
        return None
    slack_us = math.floor((target.slo_s - target.profile.latency(1)) * 1e6)
    return slack_us if slack_us > 0 else None


def triton_grid(
    targets: Sequence[ModelTarget],
    delays_us: Iterable[int] = DELAYS_US,
    timeout_rules: Iterable[str] = TIMEOUT_RULES,
) -> list[TritonGridPoint]:
    """The grid for the models served together (see the module docstring), in
    order (shorter delays first, no timeout before a timeout), duplicates removed."""
    if not targets:
        raise ValueError("no models")
    sizes = {t.name: batch_size_for(t.profile, t.slo_s, "slo", t.max_batch) for t in targets}
    rules = list(timeout_rules)
    points: list[TritonGridPoint] = []
    seen: set[tuple[int, tuple[tuple[str, int | None], ...]]] = set()
    for delay in delays_us:
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
            raise ValueError(f"a delay must be whole microseconds ≥ 0, got {delay!r}")
        for rule in rules:
            timeouts = {t.name: queue_timeout_for(t, rule) for t in targets}
            key = (delay, tuple(sorted(timeouts.items())))
            if key in seen:
                continue
            seen.add(key)
            points.append(TritonGridPoint(dict(sizes), delay, rule, timeouts))
    return points


def pick_best(
    results: Iterable[tuple[TritonGridPoint, Mapping[str, Any]]],
) -> tuple[TritonGridPoint, Mapping[str, Any]]:
    """The best (point, result) by `bench.peers.ray_grid.score` (capacity, else
    goodput; then SLO attainment; then lower p99); ties go to the earlier point."""
    results = list(results)
    if not results:
        raise ValueError("no results to pick from")
    return max(results, key=lambda item: score(item[1]))


__all__ = [
    "DELAYS_US",
    "TIMEOUT_RULES",
    "ModelTarget",
    "TritonGridPoint",
    "pick_best",
    "queue_timeout_for",
    "target_from_config",
    "triton_grid",
]
