"""A live run's results: the simulator's summary of its records
(`app.results`), where the served requests' time went, and how well the
generator kept to its schedule.

How far behind the generator fell is reported (`generator.send_lag_*`), and
the run is flagged (`generator.fell_behind`) when more than 1 % of sends left
over `--lag-threshold-ms` (5 ms) late, or some were never sent: its numbers
then measure the generator as well as the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.results import Outcome, percentile, summarize
from app.runtime.realtime import fifo_priority
from app.workloads.spec import Workload
from bench.loadgen.records import ARRAY_FIELDS, Records

BEHIND_FRACTION_LIMIT = 0.01  # flag the run when more sends than this were late


@dataclass
class LiveResult:
    """One live run: the simulator's summary shape plus the generator's own."""

    url: str
    workload: str
    rate_scale: float
    duration_s: float
    devices: int
    summary: dict[str, Any]  # {"overall": {...}, "models": {name: {...}}}, as SimResult
    generator: dict[str, Any]
    wall_s: float
    model_names: list[str]
    slo_ms: list[float]
    records: Records = field(repr=False)

    @property
    def attainment(self) -> float:
        return self.summary["overall"]["slo_attainment"]

    @property
    def goodput(self) -> float:
        return self.summary["overall"]["goodput_rps"]

    @property
    def fell_behind(self) -> bool:
        return bool(self.generator["fell_behind"])

    def to_dict(self) -> dict[str, Any]:
        """Shaped like a simulator policy entry (rate_scale, overall, models,
        wall_s) plus the target URL and the generator's statistics."""
        return {
            "url": self.url,
            "rate_scale": self.rate_scale,
            "duration_s": self.duration_s,
            **self.summary,
            "generator": self.generator,
            "timing_breakdown": timing_breakdown(self.records, np.asarray(self.slo_ms)),
            "wall_s": self.wall_s,
        }

    def columns(self) -> dict[str, np.ndarray]:
        """Per-request columns (for plots and ad-hoc analysis)."""
        r = self.records
        return {k: getattr(r, k) for k in ARRAY_FIELDS}


def summarize_live(
    records: Records,
    model_names: Sequence[str],
    slo_ms: Sequence[float],
    duration_s: float,
    devices: int,
) -> dict[str, Any]:
    """{"overall", "models"}: the simulator's summary (`app.results.summarize`)
    of the run's records."""
    columns = records.columns(np.asarray(slo_ms, dtype=np.float64))
    return summarize(columns, model_names, duration_s, devices)


TIMING_PARTS = ("send_lag", "intake", "queue", "exec", "answer", "outside")


def timing_breakdown(records: Records, slo_ms: np.ndarray) -> dict[str, Any]:
    """Where the served requests' time went (p50 / p99 ms of each part), for
    all of them and for the late ones: `send_lag` (the generator's), then the
    server's `queue` (arrival → batch start; `intake` is its first part, until
    the scheduler saw the request), `exec` and `answer` (batch end → answer
    ready), and `outside` — the rest of the latency: the sockets and both
    event loops. Parts a server does not report are null."""
    served = records.status == 200
    late = served & (records.outcomes(slo_ms) == Outcome.LATE)
    parts = {
        "send_lag": records.send_lag_ms,
        "intake": records.intake_ms,
        "queue": records.queue_ms,
        "exec": records.exec_ms,
        "answer": records.answer_ms,
        "outside": records.latency_ms
        - records.send_lag_ms
        - records.queue_ms
        - records.exec_ms
        - records.answer_ms,
    }

    def stats(mask: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": int(np.count_nonzero(mask))}
        for name in TIMING_PARTS:
            values = parts[name][mask]
            out[name] = {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}
        return out

    return {"served": stats(served), "late": stats(late)}


def generator_stats(
    records: Records, lag_threshold_ms: float, workers: int, connections: int
) -> dict[str, Any]:
    lag = records.send_lag_ms
    sent = ~np.isnan(lag)
    lag = lag[sent]
    behind = float(np.count_nonzero(lag > lag_threshold_ms)) / lag.size if lag.size else 0.0
    not_sent = int(np.count_nonzero(~sent))
    return {
        "workers": workers,
        "connections_per_worker": connections,
        "sent": int(lag.size),
        "not_sent": not_sent,
        "send_lag_p50_ms": percentile(lag, 50),
        "send_lag_p99_ms": percentile(lag, 99),
        "send_lag_max_ms": float(lag.max()) if lag.size else None,
        "lag_threshold_ms": lag_threshold_ms,
        "behind_fraction": behind,
        "fell_behind": bool(behind > BEHIND_FRACTION_LIMIT or not_sent > 0),
        "realtime_priority": fifo_priority(),
    }


def live_result(
    url: str,
    workload: Workload,
    rate_scale: float,
    records: Records,
    names: list[str],
    slo_ms: list[float],
    devices: int,
    generator: dict[str, Any],
    wall_s: float,
) -> LiveResult:
    """A run's LiveResult: its records summarised as the simulator's metrics."""
    return LiveResult(
        url=url,
        workload=workload.name,
        rate_scale=rate_scale,
        duration_s=workload.duration_s,
        devices=devices,
        summary=summarize_live(records, names, slo_ms, workload.duration_s, devices),
        generator=generator,
        wall_s=wall_s,
        model_names=names,
        slo_ms=slo_ms,
        records=records,
    )
