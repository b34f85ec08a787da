"""The BentoML peer's configuration grid and its request bodies.

BentoML's adaptive batching has two knobs per endpoint: ``max_batch_size`` and
``max_latency_ms``. Its dispatcher fits ℓ(b) = a·b + c online, waits for more
requests while it predicts the oldest one still ends within
``max_latency_ms``, and sheds (HTTP 503) the oldest when it predicts it would
not. The prediction counts the wait so far and the batch about to run, but not
the rest of the batch already on the device, nor the HTTP hops; so a user who
knows the SLO tries:

- ``max_latency_ms`` ∈ {SLO, ¾·SLO, ½·SLO}: the SLO itself, and margins of a
  quarter and a half of it for what the prediction leaves out;
- ``max_batch_size`` ∈ {the model's largest batch, the largest b with
  ℓ(b) ≤ SLO/2} (the rule of `bench.peers.ray_grid`): let the dispatcher
  choose, or cap it where half the SLO is left for queueing.

That is 6 points per workload (fewer when the two batch sizes coincide). With
several models every point applies the same rule and the same fraction to each
(its own SLO and ℓ(b)). `bentoml_grid` builds the list (`pick_best` of
`bench.peers.ray_grid` chooses among the results); `bentoml_request` gives the
path and body of one request for the load generator.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.peers.ray_grid import ModelTarget, batch_size_for

LATENCY_FRACTIONS: tuple[float, ...] = (1.0, 0.75, 0.5)
BATCH_RULES: tuple[str, ...] = ("max", "slo/2")


@dataclass(frozen=True)
class BentoGridPoint:
    """One BentoML configuration: per-model batch size and max latency."""

    rule: str  # "max" or "slo/2": how the batch sizes were chosen
    latency_fraction: float  # max_latency_ms = fraction × SLO
    max_batch_size: Mapping[str, int]
    max_latency_ms: Mapping[str, int]

    @property
    def label(self) -> str:
        sizes = ",".join(f"{m}={b}" for m, b in sorted(self.max_batch_size.items()))
        lat = ",".join(f"{m}={v}" for m, v in sorted(self.max_latency_ms.items()))
        return f"max_batch[{self.rule}]:{sizes} max_latency[{self.latency_fraction:g}·slo]:{lat}ms"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "latency_fraction": self.latency_fraction,
            "max_batch_size": dict(self.max_batch_size),
            "max_latency_ms": dict(self.max_latency_ms),
            "label": self.label,
        }

    def start_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `bentoml_launcher.start_bentoml` for this point."""
        return {
            "max_batch_size": dict(self.max_batch_size),
            "max_latency_ms": dict(self.max_latency_ms),
        }


def bentoml_grid(
    targets: Sequence[ModelTarget],
    latency_fractions: Iterable[float] = LATENCY_FRACTIONS,
) -> list[BentoGridPoint]:
    """The grid for the models served together, duplicates removed, in order
    (larger batch first, then longer max latency). Latencies are whole
    milliseconds (BentoML's type), at least 1."""
    if not targets:
        raise ValueError("no models")
    fractions = [float(f) for f in latency_fractions]
    bad = [f for f in fractions if not 0.0 < f <= 1.0]
    if bad:
        raise ValueError(f"latency fractions must be in (0, 1], got {bad}")
    points: list[BentoGridPoint] = []
    seen: set[tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]] = set()
    for rule in BATCH_RULES:
        sizes = {
            t.name: t.max_batch
            if rule == "max"
            else batch_size_for(t.profile, t.slo_s, "slo/2", t.max_batch)
            for t in targets
        }
        for fraction in fractions:
            latency = {t.name: max(1, round(t.slo_s * 1000.0 * fraction)) for t in targets}
            key = (tuple(sorted(sizes.items())), tuple(sorted(latency.items())))
            if key in seen:
                continue
            seen.add(key)
            points.append(BentoGridPoint(rule, fraction, dict(sizes), latency))
    return points


def bentoml_request(
    model: str, inputs_meta: Sequence[Mapping[str, Any]], slo_ms: float, seed: int = 0
) -> tuple[str, bytes]:
    """(POST path, JSON body) of one request of batch 1 to the BentoML peer:
    ``{"<input>": [[...]]}`` with the same random data as the daemon's body
    (`bench.loadgen.targets.build_body`, same seed). `slo_ms` is not sent:
    BentoML has one deadline per endpoint (``max_latency_ms``), none per request.
    The answer is the output array as nested lists, shape [1, ...]."""
    from bench.loadgen.targets import build_body

    if len(inputs_meta) != 1:
        raise ValueError(
            f"model {model!r}: the BentoML peer takes one input, got {len(inputs_meta)}"
        )
    doc = json.loads(build_body(model, inputs_meta, slo_ms, seed))
    body = json.dumps(doc["inputs"], separators=(",", ":")).encode()
    return f"/infer/{model}", body


__all__ = [
    "BATCH_RULES",
    "LATENCY_FRACTIONS",
    "BentoGridPoint",
    "bentoml_grid",
    "bentoml_request",
]
