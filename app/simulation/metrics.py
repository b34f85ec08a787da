"""Summaries of a simulated run, in the schema shared with the live load
generators (`app.results`): the trace's requests as columns, summarised per
model and overall, plus what only the simulator knows — batches completed,
preemptions, and the devices' busy time from their own record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.results import DROP_REASONS, RequestColumns, summarize
from app.scheduling.model import ModelInfo
from app.simulation.engine import Trace

_REASON_NAMES = tuple(reason.value for reason in DROP_REASONS)


def trace_columns(trace: Trace) -> RequestColumns:
    """The trace's requests as the summariser's columns (its status codes are
    `app.results.Outcome`, its drop reasons indices into DROP_REASONS)."""
    return RequestColumns(
        model_index=trace.model_index,
        outcome=trace.status,
        latency_s=trace.finish - trace.arrival,
        queue_s=trace.start - trace.arrival,
        exec_s=trace.finish - trace.start,
        batch_size=trace.batch_size,
        reason=trace.drop_reason,
        reason_names=_REASON_NAMES,
        items=trace.items,
    )


def summarize_run(
    trace: Trace, models: Sequence[ModelInfo], duration_s: float, devices: int
) -> dict[str, Any]:
    summary = summarize(trace_columns(trace), [m.name for m in models], duration_s, devices)
    overall = summary["overall"]
    # Overall busy time also counts work later preempted (it used the device),
    # over the whole run including the drain after the last arrival.
    elapsed = max(duration_s, trace.end_time)
    overall["device_busy_fraction"] = float(trace.device_busy.sum()) / (elapsed * devices)
    overall["batches"] = trace.batches
    overall["preemptions"] = trace.preemptions
    return summary
