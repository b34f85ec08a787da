"""Calibration of the simulator's latency model for `earlyexit` (bench.orloj_live).

Batches of k rows that all take s loop steps are timed in-process with ONNX
Runtime under the executor's own session options
(`OnnxBackend.session_options_and_providers`, the same thread count), the
median of a few runs each after CAL_WARMUP, and fitted by least squares to
orloj.txt's eq. 3, t = c0 + c1·k·s (c0 ≥ 0: refitted through the origin
when the free fit's intercept is negative). `Calibration.to_dict` reports
every point's residual — how well the real model follows eq. 3 — and a
second fit, t = c0 + c_step·s + c1·k·s, shows what eq. 3 leaves out: the
Loop's per-step cost that does not grow with the batch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.repository.dynamic_models import early_exit_input

CAL_BATCHES = (1, 2, 4, 8)
CAL_STEPS = (1, 4, 8, 16)
CAL_WARMUP = 2


@dataclass(frozen=True)
class CalPoint:
    batch: int
    steps: int
    measured_ms: float


@dataclass(frozen=True)
class Calibration:
    """eq. 3 fitted to measured batches: t = c0 + c1·k·s (ms)."""

    c0_ms: float
    c1_ms: float  # one row's step
    points: tuple[CalPoint, ...]
    threads: int

    def predicted_ms(self, batch: int, steps: int) -> float:
        return self.c0_ms + self.c1_ms * batch * steps

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for p in self.points:
            fitted = self.predicted_ms(p.batch, p.steps)
            rows.append(
                {
                    "batch": p.batch,
                    "steps": p.steps,
                    "measured_ms": p.measured_ms,
                    "fitted_ms": fitted,
                    "residual_ms": p.measured_ms - fitted,
                    "residual_pct": 100.0 * (p.measured_ms - fitted) / p.measured_ms,
                }
            )
        measured = np.array([p.measured_ms for p in self.points])
        residual = np.array([r["residual_ms"] for r in rows])
        total = float(np.sum((measured - measured.mean()) ** 2))
        return {
            "model": "t = c0 + c1·k·s",
            "c0_ms": self.c0_ms,
            "c1_ms_per_row_step": self.c1_ms,
            "r2": 1.0 - float(np.sum(residual**2)) / total if total > 0 else None,
            "max_abs_residual_pct": float(max(abs(r["residual_pct"]) for r in rows)),
            "per_step_fit": per_step_fit(self.points),
            "threads": self.threads,
            "points": rows,
        }


def fit_eq3(points: Sequence[CalPoint], threads: int = 1) -> Calibration:
    """Least squares of the relative residuals, (t − c0 − c1·k·s) / t, with
    c0 ≥ 0 (through the origin when the free intercept comes out
    negative). Relative, because the points span 30× or more: an absolute
    fit lets the largest batch decide and can lose a c0 that the smallest
    ones show plainly (earlyexit-wide: ~8 ms at k = s = 1)."""
    if len({p.batch * p.steps for p in points}) < 2:
        raise ValueError("calibration needs points at two or more values of k·s")
    x = np.array([p.batch * p.steps for p in points], dtype=float)
    t = np.array([p.measured_ms for p in points])
    w = 1.0 / t
    design = np.column_stack([np.ones_like(x), x]) * w[:, None]
    (c0, c1), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if c0 < 0.0:
        xw = x * w
        c0, c1 = 0.0, float(xw @ (t * w) / (xw @ xw))
    if c1 <= 0.0:
        raise ValueError(f"calibration: time does not grow with k·s (c1 = {c1:.4g} ms)")
    return Calibration(float(c0), float(c1), tuple(points), threads)


def per_step_fit(points: Sequence[CalPoint]) -> dict[str, float] | None:
    """t = c0 + c_step·s + c1·k·s, unconstrained: the Loop's per-step cost
    that eq. 3 folds into c1 (None when the points cannot separate them)."""
    a = np.array([[1.0, p.steps, p.batch * p.steps] for p in points])
    if np.linalg.matrix_rank(a) < 3:
        return None
    t = np.array([p.measured_ms for p in points])
    (c0, c_step, c1), *_ = np.linalg.lstsq(a, t, rcond=None)
    worst = float(np.max(np.abs(t - a @ np.array([c0, c_step, c1])) / t))
    return {
        "c0_ms": float(c0),
        "c_step_ms": float(c_step),
        "c1_ms": float(c1),
        "max_abs_residual_pct": 100.0 * worst,
    }


def calibrate(
    model_file: Path,
    threads: int,
    *,
    batches: Sequence[int] = CAL_BATCHES,
    steps: Sequence[int] = CAL_STEPS,
    repeats: int = 7,
    side: int = 16,
) -> Calibration:
    """Time `model_file` (its input [3, side, side]) in-process with the
    executor's session options."""
    import onnxruntime as ort

    from app.runtime.onnx_backend import OnnxBackend

    opts, providers = OnnxBackend("cpu", 0, threads).session_options_and_providers()
    session = ort.InferenceSession(str(model_file), opts, providers=providers)
    points = []
    for s in steps:
        for k in batches:
            x = np.concatenate([early_exit_input(s, seed=i, side=side) for i in range(k)])
            for _ in range(CAL_WARMUP):
                session.run(None, {"input": x})
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                session.run(None, {"input": x})
                times.append((time.perf_counter() - t0) * 1000.0)
            points.append(CalPoint(k, s, statistics.median(times)))
    return fit_eq3(points, threads)
