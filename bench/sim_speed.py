"""Simulator speed: simulated requests per second of wall time.

    python -m bench.sim_speed [--workload FILE] [--policy P] [--repeat N]

Runs the policy on the same arrival sequence N times in this process (one
core) and prints the best and median rate; the machine's speed varies from
run to run, so both are reported. The line says whether the core ran
compiled (python -m app.build_fast) or as pure Python.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from app.build_fast import compiled_modules
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload

DEFAULT_WORKLOAD = Path(__file__).parent / "workloads" / "symphony-table4-resnet50.yaml"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--policy", default="symphony")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    workload = load_workload(args.workload)
    arrivals = generate_arrivals(workload)
    walls = [simulate(workload, args.policy, arrivals=arrivals).wall_s for _ in range(args.repeat)]
    requests = len(arrivals)
    compiled = compiled_modules().values()
    core = "compiled" if all(compiled) else "partly compiled" if any(compiled) else "pure Python"
    print(
        f"{args.policy} on {workload.name}: {requests} requests, "
        f"best {requests / min(walls):,.0f} req/s, "
        f"median {requests / statistics.median(walls):,.0f} req/s "
        f"(wall s: {', '.join(f'{w:.3f}' for w in walls)}; {core} core)"
    )


if __name__ == "__main__":
    main()
