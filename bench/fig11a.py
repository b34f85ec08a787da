"""Shepherd Figure 11(a) per burst: how many of each burst of stream A
(ResNet18, 1024 requests every 120 ms) each policy answers within the SLO.

    python -m bench.fig11a [--policy flex --policy flex-np ...] [--slo 90 --slo 250]

Prints one JSON document: per policy and SLO, the goodput, the preemptions,
the counts of the first five bursts, the range of the others and the mean.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from app.results import Outcome
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload

WORKLOADS = Path(__file__).resolve().parent / "workloads"
BURST_PERIOD_S = 0.120
FIRST_BURST_S = 0.005


def per_burst(policy: str, slo_ms: int) -> dict[str, object]:
    workload = load_workload(WORKLOADS / f"shepherd-fig11a-slo{slo_ms}.yaml")
    arrivals = generate_arrivals(workload)
    stream_a = [m.name for m in workload.models].index("resnet18")
    result = simulate(workload, policy, arrivals=arrivals)
    trace = result.trace
    good = (trace.status == Outcome.GOOD) & (trace.model_index == stream_a)
    burst = np.floor((trace.arrival - FIRST_BURST_S) / BURST_PERIOD_S + 1e-9).astype(int)
    bursts = int(workload.duration_s / BURST_PERIOD_S)
    counts = [int(np.count_nonzero(good & (burst == k))) for k in range(bursts)]
    return {
        "goodput_rps": round(result.goodput, 2),
        "preemptions": int(trace.preemptions),
        "first5": counts[:5],
        "others_min": min(counts[5:]),
        "others_max": max(counts[5:]),
        "mean": round(float(np.mean(counts)), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fig11a", description=__doc__)
    parser.add_argument("--policy", action="append", help="default: flex, flex-np, clockwork")
    parser.add_argument("--slo", action="append", type=int, choices=(90, 250))
    args = parser.parse_args(argv)
    doc = {
        f"{policy}@{slo}": per_burst(policy, slo)
        for slo in args.slo or (90, 250)
        for policy in args.policy or ("flex", "flex-np", "clockwork")
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
