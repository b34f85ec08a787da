"""The pipeline simulator on a plan file: the capacity the `ppipe` core
gets from a plan `python -m app plan ppipe` wrote, on the block timings it
was made from — the figure to hold a live run of the same plan against
(docs/ppipe.md, "Serving a plan"; BENCHMARKS.md, "PPipe live: README's
pipeline example against the simulator").

    python -m bench.ppipe_plan_sim PLAN.json --timings DIR [--slo-ms MS]
        [--handoff-ms 0.5] [--jitter 0 0.05] [--sim-s 30] [--json]

* `--slo-ms`: the SLO requests get. A plan made for a tighter SLO than the
  model's config (README's example: 2.5 × the model's time on the fast
  class, so that the planner cuts it) is served with the config's, as the
  daemon serves it; default: the plan's own.
* `--handoff-ms`: the hand-over between stages through the daemon's
  process (bench.ppipe_live measures 0.4–0.9 ms on the 2-core VM).
* Capacity: the highest Poisson load factor (× the plan's throughput) with
  ≥ 99 % of requests within the SLO, by bisection to 4 %
  (bench/ppipe_capacity.py's); then the late and dropped requests at 1.0 and
  1.5 × it. Once per `--jitter` (log-normal sigma of each stage's time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.planning.ppipe.plan import Plan, read_plan
from app.planning.ppipe.profiles import load_profile
from app.simulation.ppipe_run import simulate_plan
from bench.ppipe_capacity import bisect, overload


def with_slo(plan: Plan, slo_s: float | None) -> Plan:
    if slo_s is None:
        return plan
    return replace(plan, models=tuple(replace(m, slo_s=slo_s) for m in plan.models))


def measure(
    plan: Plan, timings: Path, handoff_s: float, jitter: float, sim_s: float
) -> dict[str, Any]:
    profiles = {m.name: load_profile(m.name, directory=timings) for m in plan.models}

    def run(load: float) -> Any:
        return simulate_plan(
            plan, profiles, load, duration_s=sim_s, handoff_s=handoff_s, jitter=jitter
        )

    async def probe(load: float) -> float:
        return min(run(load).within_slo.values())

    capacity, probes = asyncio.run(bisect(probe, 1.0, 12))
    over = overload(run, capacity, [m.name for m in plan.models])
    throughput = sum(p.throughput for p in plan.pipelines)
    return {
        "jitter": jitter,
        "load_factor": capacity,
        "rate": capacity * throughput,
        "probes": probes,
        "overload": over,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ppipe_plan_sim", description=__doc__)
    parser.add_argument("plan", type=Path, help="a plan file of `python -m app plan ppipe`")
    parser.add_argument("--timings", type=Path, required=True, help="the block timings' folder")
    parser.add_argument("--slo-ms", type=float, help="the SLO requests get (default the plan's)")
    parser.add_argument("--handoff-ms", type=float, default=0.5)
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--sim-s", type=float, default=30.0)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.slo_ms is not None and not args.slo_ms > 0.0:
        parser.error(f"--slo-ms must be > 0, got {args.slo_ms}")
    if args.handoff_ms < 0.0 or args.sim_s <= 0.0 or any(j < 0.0 for j in args.jitter):
        parser.error("--handoff-ms and --jitter must be ≥ 0, --sim-s > 0")
    try:
        plan = read_plan(args.plan)
        plan = with_slo(plan, None if args.slo_ms is None else args.slo_ms / 1000.0)
        runs = [
            measure(plan, args.timings, args.handoff_ms / 1000.0, jitter, args.sim_s)
            for jitter in args.jitter
        ]
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.json:
        print(json.dumps({"plan": str(args.plan), "runs": runs}, indent=2))
        return 0
    for pipeline in plan.pipelines:
        stages = " → ".join(
            f"{s.device_class}×{s.devices} [{s.start},{s.end}) {s.latency_s * 1e3:.2f} ms"
            for s in pipeline.stages
        )
        print(f"{pipeline.model}: {stages}, batch {pipeline.batch}, {pipeline.throughput:.0f} r/s")
    for run in runs:
        print(
            f"jitter {run['jitter']}: capacity {run['load_factor']:.3f} × the plan = "
            f"{run['rate']:.0f} r/s"
        )
        for factor, outcome in run["overload"].items():
            print(
                f"  {factor} × capacity: {outcome['requests']} requests, {outcome['late']} late "
                f"({100 * outcome['late_of_answers']:.2f} % of answers), "
                f"{outcome['dropped']} dropped"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
