"""What a live run measured: one row per request, in intended-send order.

Per request: intended and actual send time, HTTP status (0: no answer),
latency from the intended send time, the error or drop reason, and the
server's `timing` (queue_ms, exec_ms, intake_ms, answer_ms, batch_size,
device). Outcomes are classified as in the simulator (`app.results`):

- good: 200 with latency ≤ the model's SLO (counts towards goodput),
- late: 200 over the SLO,
- dropped: 503 with a scheduler drop reason (`app.scheduling.types.DropReason`:
  deadline, queue_timeout, preempted, overloaded, not_served, device_failed)
  or 429,
- error: anything else (other statuses, transport errors, timeouts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from app.results import RequestColumns, http_outcomes

# The status recorded for requests without an HTTP answer.
NO_RESPONSE = 0


@dataclass
class Records:
    """One row per request, in intended-send order. Times are seconds since the
    run's t0; NaN where there is no value."""

    model_index: np.ndarray  # int32
    intended: np.ndarray  # float64: scheduled send time
    sent: np.ndarray  # float64: request written to the socket; NaN never sent
    latency_ms: np.ndarray  # float64: response time - intended time; NaN no response
    status: np.ndarray  # int16: HTTP status; 0 no response
    reason: np.ndarray  # int16: index into `reasons` (error/drop reason); -1 none
    queue_ms: np.ndarray  # float64: server timing
    exec_ms: np.ndarray  # float64
    intake_ms: np.ndarray  # float64 (NaN from servers that do not report it)
    answer_ms: np.ndarray  # float64
    batch_size: np.ndarray  # int32; 0 when not served
    device: np.ndarray  # int16: index into `devices`; -1 none
    reasons: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, intended: np.ndarray, model_index: np.ndarray) -> Records:
        n = len(intended)
        nan = np.full(n, np.nan)
        return cls(
            model_index=np.asarray(model_index, dtype=np.int32),
            intended=np.asarray(intended, dtype=np.float64),
            sent=nan.copy(),
            latency_ms=nan.copy(),
            status=np.zeros(n, dtype=np.int16),
            reason=np.full(n, -1, dtype=np.int16),
            queue_ms=nan.copy(),
            exec_ms=nan.copy(),
            intake_ms=nan.copy(),
            answer_ms=nan.copy(),
            batch_size=np.zeros(n, dtype=np.int32),
            device=np.full(n, -1, dtype=np.int16),
        )

    def __len__(self) -> int:
        return len(self.intended)

    def errors(self) -> dict[str, int]:
        """Answers other than 200, counted by "STATUS reason" (`503 deadline`)."""
        failed = (self.status != 0) & (self.status != 200)
        counts: dict[str, int] = {}
        for status, reason in zip(self.status[failed], self.reason[failed], strict=True):
            key = f"{status} {self.reasons[reason] if reason >= 0 else ''}".strip()
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def send_lag_ms(self) -> np.ndarray:
        return (self.sent - self.intended) * 1000.0

    def outcomes(self, slo_ms: np.ndarray) -> np.ndarray:
        """The `app.results.Outcome` of each request; `slo_ms[model]`."""
        slo = np.asarray(slo_ms, dtype=np.float64)[self.model_index]
        return http_outcomes(self.status, self.latency_ms, slo, self.reason, self.reasons)

    def columns(self, slo_ms: np.ndarray) -> RequestColumns:
        """The summariser's columns (`app.results.summarize`); `slo_ms[model]`."""
        return RequestColumns(
            model_index=self.model_index,
            outcome=self.outcomes(slo_ms),
            latency_s=self.latency_ms / 1000.0,
            queue_s=self.queue_ms / 1000.0,
            exec_s=self.exec_ms / 1000.0,
            batch_size=self.batch_size,
            reason=self.reason,
            reason_names=self.reasons,
        )

    @staticmethod
    def merge(parts: Sequence[Records]) -> Records:
        """Concatenate (remapping reason/device codes) and sort by intended time."""
        reasons: list[str] = []
        devices: list[str] = []

        def remap(codes: np.ndarray, names: list[str], into: list[str]) -> np.ndarray:
            table = np.array([code_of(into, n) for n in names] + [-1], dtype=np.int16)
            return table[codes]  # -1 indexes the trailing -1

        cols: dict[str, list[np.ndarray]] = {k: [] for k in ARRAY_FIELDS}
        for p in parts:
            for k in ARRAY_FIELDS:
                cols[k].append(getattr(p, k))
            cols["reason"][-1] = remap(p.reason, p.reasons, reasons)
            cols["device"][-1] = remap(p.device, p.devices, devices)
        merged = {k: np.concatenate(v) for k, v in cols.items()}
        order = np.argsort(merged["intended"], kind="stable")
        return Records(**{k: v[order] for k, v in merged.items()}, reasons=reasons, devices=devices)


# The per-request columns of Records.
ARRAY_FIELDS = (
    "model_index",
    "intended",
    "sent",
    "latency_ms",
    "status",
    "reason",
    "queue_ms",
    "exec_ms",
    "intake_ms",
    "answer_ms",
    "batch_size",
    "device",
)


def code_of(names: list[str], name: str) -> int:
    """The index of `name` in `names`, appended if new."""
    try:
        return names.index(name)
    except ValueError:
        names.append(name)
        return len(names) - 1
