"""What happened to each request of a run, and its summary: one schema for
the simulator and the live load generators, so that a simulated and a live
run of one workload compare field by field.

Outcomes. A request is *good* when answered within its SLO (it counts towards
goodput), *late* when answered after it, *dropped* when the scheduler refused
it (a `DropReason`), and an *error* otherwise — only a live run has errors
(other HTTP statuses, transport errors, timeouts). The simulator also has
*pending*, for requests not answered yet while it runs.

A live HTTP answer is classified by `http_outcomes`: 200 is good or late by
its latency against the SLO; 503 with a `DropReason` as its reason, or 429
(refused at admission), is dropped; anything else, no answer included, is an
error. The drop reasons are `DropReason`'s own, so a request the scheduler
dropped because its device failed is a drop on both sides.

Summary (`summarize`): per model and overall — requests, offered and goodput
rates, SLO attainment, drop, late and error fractions, latency and queueing
percentiles, the request-weighted mean batch size, the device time the
requests used, and the drop and error reasons with their counts. Each side
adds its own extras beside these keys (the simulator its batch and preemption
counts, the load generator its own statistics).

Requests with several items (a batch dimension n > 1): the request is the
unit of every count, rate and fraction — goodput is good *requests* per
second, whatever their items, as the SLO is per request. Batch sizes count
items (what ℓ(b) and the batch cap count); a served request of n items
accounts for n/b of its batch's execution time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from app.scheduling.types import DropReason


class Outcome(IntEnum):
    """What happened to a request (its code in per-request columns)."""

    PENDING = 0  # not answered yet (while a simulation runs)
    GOOD = 1  # answered within its SLO
    LATE = 2  # answered after its SLO
    DROPPED = 3  # refused by the scheduler, for a DropReason
    ERROR = 4  # anything else (live runs only)


# Drop reasons in code order: a code in per-request columns indexes this.
DROP_REASONS: tuple[DropReason, ...] = tuple(DropReason)
DROP_REASON_NAMES: frozenset[str] = frozenset(reason.value for reason in DROP_REASONS)

# HTTP statuses of answers a live run classifies specially.
HTTP_OK = 200
HTTP_DROPPED = 503  # with a DropReason as its reason
HTTP_REFUSED = 429  # refused at admission: a drop, whatever its reason

SUMMARY_KEYS = (
    "requests",
    "offered_rps",
    "goodput_rps",
    "slo_attainment",
    "drop_fraction",
    "late_fraction",
    "error_fraction",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_p999_ms",
    "queue_delay_p50_ms",
    "queue_delay_p99_ms",
    "mean_batch_size",
    "device_busy_fraction",
    "drop_reasons",
    "error_reasons",
)


def http_outcomes(
    status: np.ndarray,
    latency_ms: np.ndarray,
    slo_ms: np.ndarray,
    reason: np.ndarray,
    reason_names: Sequence[str],
) -> np.ndarray:
    """The Outcome of each live answer: `status` its HTTP status (0: no
    answer), `latency_ms` from its intended send time, `slo_ms` its model's
    SLO, `reason` an index into `reason_names` (-1: none)."""
    out = np.full(len(status), Outcome.ERROR, dtype=np.int8)
    ok = status == HTTP_OK
    within = latency_ms <= slo_ms
    out[ok & within] = Outcome.GOOD
    out[ok & ~within] = Outcome.LATE
    drop_codes = [code for code, name in enumerate(reason_names) if name in DROP_REASON_NAMES]
    dropped = (status == HTTP_REFUSED) | ((status == HTTP_DROPPED) & np.isin(reason, drop_codes))
    out[dropped] = Outcome.DROPPED
    return out


@dataclass(frozen=True)
class RequestColumns:
    """One row per request of a run, the input of `summarize`. Times are
    seconds; NaN where there is no value (the request was not served, or the
    server did not report it)."""

    model_index: np.ndarray  # int: index into the run's models
    outcome: np.ndarray  # int: Outcome
    latency_s: np.ndarray  # arrival (live: intended send time) → answer
    queue_s: np.ndarray  # arrival → start of the batch it ran in
    exec_s: np.ndarray  # execution time of that batch
    batch_size: np.ndarray  # int: size of that batch; 0 none or unknown
    reason: np.ndarray  # int: index into `reason_names` (drop or error reason); -1 none
    reason_names: Sequence[str]
    items: np.ndarray | None = None  # int: each request's items; None: one each

    def __post_init__(self) -> None:
        n = len(self.model_index)
        for name in ("outcome", "latency_s", "queue_s", "exec_s", "batch_size", "reason", "items"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"column {name} has {len(getattr(self, name))} rows, not {n}")

    def __len__(self) -> int:
        return len(self.model_index)


def summarize(
    columns: RequestColumns, model_names: Sequence[str], duration_s: float, devices: int
) -> dict[str, Any]:
    """{"overall": metrics, "models": {name: metrics}} over a run of
    `duration_s` seconds on `devices` devices; `model_names[k]` is the model
    of `model_index` k."""
    overall = summarize_requests(columns, np.ones(len(columns), bool), duration_s, devices)
    models = {
        name: summarize_requests(columns, columns.model_index == k, duration_s, devices)
        for k, name in enumerate(model_names)
    }
    return {"overall": overall, "models": models}


def summarize_requests(
    columns: RequestColumns, mask: np.ndarray, duration_s: float, devices: int
) -> dict[str, Any]:
    """The metrics (SUMMARY_KEYS) of the requests selected by `mask`."""
    outcome = columns.outcome
    counts = np.bincount(outcome[mask], minlength=len(Outcome))
    total = int(np.count_nonzero(mask))
    served = mask & ((outcome == Outcome.GOOD) | (outcome == Outcome.LATE))
    sizes = columns.batch_size[served]
    # Each served request accounts for n/b of its batch's execution time
    # (n its items, b the batch's).
    share = 1.0 if columns.items is None else columns.items[served]
    busy_s = float(np.nansum(columns.exec_s[served] * share / np.maximum(sizes, 1)))
    sizes = sizes[sizes > 0]

    def fraction(kind: Outcome) -> float:
        return int(counts[kind]) / total if total else 0.0

    def reasons(kind: Outcome) -> dict[str, int]:
        """Counts by reason, in reason code order."""
        codes, found = np.unique(columns.reason[mask & (outcome == kind)], return_counts=True)
        named: dict[str, int] = {}
        for code, count in zip(codes, found, strict=True):
            name = columns.reason_names[code] if code >= 0 else "unknown"
            named[name] = named.get(name, 0) + int(count)
        return named

    latency_ms = columns.latency_s[served] * 1000.0
    queue_ms = columns.queue_s[served] * 1000.0
    return {
        "requests": total,
        "offered_rps": total / duration_s,
        "goodput_rps": int(counts[Outcome.GOOD]) / duration_s,
        "slo_attainment": fraction(Outcome.GOOD),
        "drop_fraction": fraction(Outcome.DROPPED),
        "late_fraction": fraction(Outcome.LATE),
        "error_fraction": fraction(Outcome.ERROR),
        "latency_p50_ms": percentile(latency_ms, 50),
        "latency_p99_ms": percentile(latency_ms, 99),
        "latency_p999_ms": percentile(latency_ms, 99.9),
        "queue_delay_p50_ms": percentile(queue_ms, 50),
        "queue_delay_p99_ms": percentile(queue_ms, 99),
        # Request-weighted: the batch size a typical request ran in (Symphony Fig. 8).
        "mean_batch_size": float(sizes.mean()) if sizes.size else 0.0,
        "device_busy_fraction": busy_s / (duration_s * max(devices, 1)),
        "drop_reasons": reasons(Outcome.DROPPED),
        "error_reasons": reasons(Outcome.ERROR),
    }


def percentile(values: np.ndarray, q: float) -> float | None:
    """The `q`-th percentile of the values that are not NaN; None if none."""
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    return float(np.percentile(values, q))
