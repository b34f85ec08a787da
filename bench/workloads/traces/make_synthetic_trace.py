"""Write azure-functions-synthetic.csv: a small, deterministic stand-in for
the Azure Functions 2019 per-minute invocation trace.

Same format as the published files (HashOwner,HashApp,HashFunction,Trigger,
1..N: invocations per function per minute) so the trace loader is exercised
exactly as on the real data, without shipping hundreds of megabytes. Rows
mimic the shapes the real trace is known for: diurnal, steady, timer-driven,
bursty and ramping functions. Counts are sized so that the 4-model sample
(trace-synthetic.yaml, 40 minutes compressed to 0.25 s each) offers about
2,000 requests/s in total, enough to load 4 ResNet-like devices.

    python bench/workloads/traces/make_synthetic_trace.py
"""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np

N_MINUTES = 40
OUT = Path(__file__).with_name("azure-functions-synthetic.csv")

# (kind, trigger, mean invocations per minute)
FUNCTIONS = [
    ("diurnal", "http", 60),
    ("steady", "http", 45),
    ("bursty", "http", 30),
    ("timer", "timer", 40),
    ("diurnal", "queue", 50),
    ("ramp", "http", 40),
    ("bursty", "event", 25),
    ("steady", "queue", 35),
    ("diurnal", "http", 55),
    ("timer", "timer", 30),
    ("bursty", "http", 35),
    ("ramp", "orchestration", 45),
]


def _counts(kind: str, mean: float, rng: np.random.Generator) -> np.ndarray:
    minutes = np.arange(N_MINUTES)
    if kind == "diurnal":
        # One "day" squeezed into the trace: a sine with a random phase.
        level = mean * (1.0 + 0.6 * np.sin(2 * np.pi * minutes / N_MINUTES + rng.uniform(0, 6)))
        return rng.poisson(level)
    if kind == "steady":
        return rng.poisson(np.full(N_MINUTES, mean))
    if kind == "timer":
        # Timers fire a fixed number of times a minute.
        return np.full(N_MINUTES, int(mean))
    if kind == "bursty":
        # Mostly quiet, with a few minutes of heavy spikes.
        base = rng.poisson(mean * 0.3, N_MINUTES)
        spikes = rng.random(N_MINUTES) < 0.15
        return base + spikes * rng.poisson(mean * 5, N_MINUTES)
    if kind == "ramp":
        return rng.poisson(mean * (0.2 + 1.6 * minutes / (N_MINUTES - 1)))
    raise ValueError(kind)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def main() -> None:
    rng = np.random.default_rng(2019)
    with OUT.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        header = ["HashOwner", "HashApp", "HashFunction", "Trigger"]
        writer.writerow(header + [str(m) for m in range(1, N_MINUTES + 1)])
        for i, (kind, trigger, mean) in enumerate(FUNCTIONS):
            owner, app = _hash(f"owner{i // 4}"), _hash(f"app{i // 2}")
            row = [owner, app, _hash(f"function{i}"), trigger]
            writer.writerow(row + [str(int(c)) for c in _counts(kind, mean, rng)])


if __name__ == "__main__":
    main()
