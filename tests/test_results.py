"""One results schema (app.results): a simulated trace and a live record set
describing the same outcomes summarise identically, field by field; the live
HTTP answers are classified by the scheduler's own drop reasons."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.errors import Dropped, ExecutorFailed, Overloaded, ShuttingDown
from app.results import (
    DROP_REASONS,
    SUMMARY_KEYS,
    Outcome,
    RequestColumns,
    http_outcomes,
    summarize,
)
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.types import DropReason
from app.simulation.engine import Trace
from app.simulation.metrics import summarize_run
from bench.loadgen.records import Records
from bench.loadgen.results import summarize_live

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["small", "big"]
SLO_MS = [25.0, 100.0]
DURATION_S = 2.0
DEVICES = 2
MODELS = [
    ModelInfo(name, LatencyProfile.linear(1.0, 5.0, 8), slo / 1000.0, 8)
    for name, slo in zip(NAMES, SLO_MS, strict=True)
]

# (model, arrival, outcome, start, finish, batch size, drop reason); times are
# binary fractions of a second, so milliseconds convert back and forth exactly.
NAN = float("nan")
G, L, D = Outcome.GOOD, Outcome.LATE, Outcome.DROPPED
ROWS = [
    (0, 0.0, G, 1 / 128, 1 / 64, 2, None),  # 15.625 ms ≤ 25
    (0, 1 / 128, L, 1 / 64, 3 / 64, 4, None),  # 39.0625 ms > 25
    (0, 1 / 64, D, NAN, 1 / 32, 0, DropReason.DEADLINE),
    (1, 1 / 16, G, 1 / 16 + 1 / 128, 1 / 8, 1, None),  # 62.5 ms ≤ 100
    (1, 1 / 8, D, NAN, 1 / 4, 0, DropReason.DEVICE_FAILED),
    (1, 1 / 8, D, NAN, 1 / 4, 0, DropReason.DEVICE_FAILED),
    (0, 1 / 4, D, NAN, 5 / 16, 0, DropReason.PREEMPTED),
    (1, 1 / 2, L, 17 / 32, 5 / 8, 3, None),  # 125 ms > 100
]


def column(k: int, dtype: type = float) -> np.ndarray:
    return np.array([row[k] for row in ROWS], dtype=dtype)


def simulated_trace() -> Trace:
    model = column(0, np.int64)
    arrival = column(1)
    return Trace(
        arrival=arrival,
        deadline=arrival + np.array(SLO_MS)[model] / 1000.0,
        model_index=model,
        status=column(2, np.int8),
        finish=column(4),
        start=column(3),
        batch_size=column(5, np.int32),
        drop_reason=np.array(
            [DROP_REASONS.index(r) if r is not None else -1 for *_, r in ROWS], dtype=np.int8
        ),
        device_busy=np.array([0.125, 0.0625]),
        batches=4,
        preemptions=1,
        end_time=1.0,
    )


def live_records() -> Records:
    """The same requests as the daemon answers them over HTTP: 200 with its
    timing, or 503 with the drop reason."""
    arrival, start, finish = column(1), column(3), column(4)
    rec = Records.empty(arrival, column(0, np.int32))
    rec.sent[:] = arrival
    served = np.array([row[6] is None for row in ROWS])
    rec.status[:] = np.where(served, 200, Dropped.status)
    rec.latency_ms[:] = (finish - arrival) * 1000.0
    rec.queue_ms[served] = ((start - arrival) * 1000.0)[served]
    rec.exec_ms[served] = ((finish - start) * 1000.0)[served]
    rec.batch_size[:] = column(5, np.int32)
    # Reason codes in first-seen order, as the driver assigns them.
    for i, (*_, reason) in enumerate(ROWS):
        if reason is not None:
            if reason.value not in rec.reasons:
                rec.reasons.append(reason.value)
            rec.reason[i] = rec.reasons.index(reason.value)
    return rec


def test_a_simulated_trace_and_live_records_of_the_same_run_summarise_identically():
    simulated = summarize_run(simulated_trace(), MODELS, DURATION_S, DEVICES)
    live = summarize_live(live_records(), NAMES, SLO_MS, DURATION_S, DEVICES)
    assert list(simulated["models"]) == list(live["models"]) == NAMES
    for name in NAMES:
        assert list(simulated["models"][name]) == list(SUMMARY_KEYS)
        assert simulated["models"][name] == live["models"][name], name
    # Overall, the simulator adds its batch and preemption counts, and takes
    # the busy fraction from the devices' own record (work later preempted
    # included, over the run and its drain).
    sim_overall = dict(simulated["overall"])
    assert sim_overall.pop("batches") == 4 and sim_overall.pop("preemptions") == 1
    assert sim_overall.pop("device_busy_fraction") == pytest.approx(0.1875 / (2.0 * 2))
    live_overall = dict(live["overall"])
    live_overall.pop("device_busy_fraction")
    assert sim_overall == live_overall

    o = live["overall"]
    assert o["requests"] == 8 and o["offered_rps"] == 4.0 and o["goodput_rps"] == 1.0
    assert (o["slo_attainment"], o["late_fraction"], o["drop_fraction"]) == (0.25, 0.25, 0.5)
    assert o["error_fraction"] == 0.0 and o["error_reasons"] == {}
    assert o["drop_reasons"] == {"deadline": 1, "device_failed": 2, "preempted": 1}
    # Served latencies 15.625, 39.0625, 62.5, 125 ms; queueing 7.8125, 7.8125, 7.8125, 31.25.
    assert o["latency_p50_ms"] == pytest.approx((39.0625 + 62.5) / 2)
    assert o["queue_delay_p50_ms"] == pytest.approx(7.8125)
    assert o["mean_batch_size"] == pytest.approx((2 + 4 + 1 + 3) / 4)
    # Each request's share of its batch: 7.8125/2 + 31.25/4 + 54.6875/1 + 93.75/3 ms.
    busy_ms = 7.8125 / 2 + 31.25 / 4 + 54.6875 + 93.75 / 3
    assert o["device_busy_fraction"] == pytest.approx(busy_ms / 1000 / (DURATION_S * DEVICES))
    big = live["models"]["big"]
    assert big["drop_reasons"] == {"device_failed": 2} and big["slo_attainment"] == 0.25


def test_device_failed_is_a_drop_on_both_sides():
    failed = Dropped("its device failed", reason=DropReason.DEVICE_FAILED.value)
    names = ["device_failed"]
    outcome = http_outcomes(
        np.array([failed.status]), np.array([3.0]), np.array([25.0]), np.array([0]), names
    )
    assert outcome.tolist() == [Outcome.DROPPED]

    live = summarize_live(live_records(), NAMES, SLO_MS, DURATION_S, DEVICES)["models"]["big"]
    simulated = summarize_run(simulated_trace(), MODELS, DURATION_S, DEVICES)["models"]["big"]
    for summary in (live, simulated):
        assert summary["drop_reasons"]["device_failed"] == 2
        assert summary["drop_fraction"] == 0.5 and summary["error_fraction"] == 0.0


@pytest.mark.parametrize(
    "status, reason, expected",
    [
        (200, None, Outcome.GOOD),  # within the 25 ms SLO
        (Dropped.status, "deadline", Outcome.DROPPED),
        (Dropped.status, "queue_timeout", Outcome.DROPPED),
        (Overloaded.status, "queue_full", Outcome.DROPPED),  # any 429
        (Overloaded.status, None, Outcome.DROPPED),
        (ExecutorFailed.status, ExecutorFailed.reason, Outcome.ERROR),
        (ShuttingDown.status, ShuttingDown.reason, Outcome.ERROR),
        (503, None, Outcome.ERROR),
        (500, "internal", Outcome.ERROR),
        (0, "timeout", Outcome.ERROR),  # no answer
    ],
)
def test_http_answers_are_classified_by_status_and_reason(status, reason, expected):
    names = [reason] if reason is not None else []
    code = 0 if reason is not None else -1
    outcome = http_outcomes(
        np.array([status]), np.array([10.0]), np.array([25.0]), np.array([code]), names
    )
    assert outcome.tolist() == [expected]


def test_a_live_answer_over_its_slo_is_late_and_errors_are_counted_by_reason():
    names = ["timeout", "executor_failed"]
    status = np.array([200, 200, 0, 503, 0])
    latency_ms = np.array([25.0, 25.5, NAN, 4.0, NAN])
    reason = np.array([-1, -1, 0, 1, 0])
    outcome = http_outcomes(status, latency_ms, np.full(5, 25.0), reason, names)
    assert outcome.tolist() == [Outcome.GOOD, Outcome.LATE] + [Outcome.ERROR] * 3
    columns = RequestColumns(
        model_index=np.zeros(5, dtype=np.int32),
        outcome=outcome,
        latency_s=latency_ms / 1000.0,
        queue_s=np.full(5, NAN),
        exec_s=np.full(5, NAN),
        batch_size=np.zeros(5, dtype=np.int32),
        reason=reason,
        reason_names=names,
    )
    o = summarize(columns, ["m"], 1.0, 1)["overall"]
    assert o["error_fraction"] == 0.6 and o["error_reasons"] == {"timeout": 2, "executor_failed": 1}
    assert o["drop_reasons"] == {} and o["queue_delay_p50_ms"] is None
    assert o["mean_batch_size"] == 0.0 and o["device_busy_fraction"] == 0.0


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="column latency_s has 1 rows, not 2"):
        RequestColumns(
            model_index=np.zeros(2, dtype=np.int32),
            outcome=np.zeros(2, dtype=np.int8),
            latency_s=np.zeros(1),
            queue_s=np.zeros(2),
            exec_s=np.zeros(2),
            batch_size=np.zeros(2, dtype=np.int32),
            reason=np.zeros(2, dtype=np.int16),
            reason_names=[],
        )


@pytest.mark.parametrize("schema", ["simulate_schema.json", "loadgen_schema.json"])
def test_both_json_schemas_require_the_summary_keys(schema):
    metrics = json.loads((ROOT / "bench" / schema).read_text())["$defs"]["metrics"]
    assert sorted(metrics["required"]) == sorted(SUMMARY_KEYS)
    assert set(SUMMARY_KEYS) <= set(metrics["properties"])
