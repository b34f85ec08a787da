"""Summaries of a simulated run, in the schema shared with the live load
generator: per model and overall — offered and goodput rates, SLO attainment,
drop and late fractions, latency percentiles, batch size, device busy time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.scheduling.model import ModelInfo
from app.simulation.engine import DROP_REASONS, DROPPED, GOOD, LATE, Trace


def summarize(trace: Trace, mask: np.ndarray, duration_s: float, devices: int) -> dict[str, Any]:
    """Metrics over the requests selected by `mask`."""
    status = trace.status[mask]
    total = int(status.size)
    good = int(np.count_nonzero(status == GOOD))
    late = int(np.count_nonzero(status == LATE))
    dropped = int(np.count_nonzero(status == DROPPED))
    served = (status == GOOD) | (status == LATE)
    latency_ms = (trace.finish[mask][served] - trace.arrival[mask][served]) * 1000.0
    queue_ms = (trace.start[mask][served] - trace.arrival[mask][served]) * 1000.0
    sizes = trace.batch_size[mask][served]
    # Each served request accounts for 1/b of its batch's execution time.
    exec_s = (trace.finish[mask][served] - trace.start[mask][served]) / np.maximum(sizes, 1)
    reasons = trace.drop_reason[mask]
    drop_reasons = {
        reason.value: int(np.count_nonzero(reasons == code))
        for code, reason in enumerate(DROP_REASONS)
        if np.any(reasons == code)
    }
    return {
        "requests": total,
        "offered_rps": total / duration_s,
        "goodput_rps": good / duration_s,
        "slo_attainment": good / total if total else 0.0,
        "drop_fraction": dropped / total if total else 0.0,
        "late_fraction": late / total if total else 0.0,
        "latency_p50_ms": _percentile(latency_ms, 50),
        "latency_p99_ms": _percentile(latency_ms, 99),
        "queue_delay_p50_ms": _percentile(queue_ms, 50),
        "queue_delay_p99_ms": _percentile(queue_ms, 99),
        # Request-weighted: the batch size a typical request ran in (Symphony Fig. 8).
        "mean_batch_size": float(sizes.mean()) if sizes.size else 0.0,
        "device_busy_fraction": float(exec_s.sum()) / (duration_s * devices),
        "drop_reasons": drop_reasons,
    }


def summarize_run(
    trace: Trace, models: Sequence[ModelInfo], duration_s: float, devices: int
) -> dict[str, Any]:
    overall = summarize(trace, np.ones(trace.status.size, dtype=bool), duration_s, devices)
    # Overall busy time also counts work later preempted (it used the device),
    # over the whole run including the drain after the last arrival.
    elapsed = max(duration_s, trace.end_time)
    overall["device_busy_fraction"] = float(trace.device_busy.sum()) / (elapsed * devices)
    overall["batches"] = trace.batches
    overall["preemptions"] = trace.preemptions
    per_model = {
        model.name: summarize(trace, trace.model_index == index, duration_s, devices)
        for index, model in enumerate(models)
    }
    return {"overall": overall, "models": per_model}


def _percentile(values: np.ndarray, q: float) -> float | None:
    if values.size == 0:
        return None
    return float(np.percentile(values, q))
