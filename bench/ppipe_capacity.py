"""The capacity side of bench/ppipe_live.py and bench/ppipe_plan_sim.py:
the bisection both search a capacity with (live and simulated), and the
pipeline simulator run on the live bench's plan and profile — at the stage
times calibrated at no load, at those of the live runs (a log-normal fit,
and drawn from the runs themselves), with the same slack as a live request.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.planning.ppipe.plan import Plan
from app.planning.ppipe.profiles import BlockProfile
from app.simulation.ppipe_run import simulate_plan

TARGET = 0.99  # within SLO: the capacity's threshold (Symphony's goodput)


async def bisect(
    probe: Callable[[float], Awaitable[float]], start: float, max_probes: int
) -> tuple[float, list[tuple[float, float]]]:
    """The highest passing load factor found: from `start`, up by half
    while it passes, down by half while it fails, then bisect the bracket
    to 4 %."""
    probes: list[tuple[float, float]] = []
    best, fail = 0.0, math.inf
    x = start
    while len(probes) < max_probes:
        within = await probe(x)
        probes.append((x, within))
        if within >= TARGET:
            best = x
        else:
            fail = x
        if fail == math.inf:
            x = 1.5 * best
        elif best == 0.0:
            x = 0.5 * fail
        elif (fail - best) / best <= 0.04:
            break
        else:
            x = 0.5 * (best + fail)
    return best, probes


def scaled(profile: BlockProfile, scale: dict[str, float] | None) -> BlockProfile:
    """`profile` with every block of class c taking `scale[c]` times as long."""
    if not scale:
        return profile
    latency = {key: table * scale.get(key[0], 1.0) for key, table in profile.latency.items()}
    return BlockProfile(profile.model, latency, profile.cut_bytes)


@dataclass(frozen=True)
class PlanSimulation:
    """The pipeline simulator on the live runs' plan and profile."""

    plan: Plan
    profile: BlockProfile
    model: str
    handoff_s: float
    sim_s: float

    def run(
        self,
        scale: dict[str, float],
        load: float,
        jitter: float,
        ratios: dict[str, list[float]] | None = None,
    ) -> Any:
        return simulate_plan(
            self.plan,
            {self.model: scaled(self.profile, scale)},
            load,
            duration_s=self.sim_s,
            handoff_s=self.handoff_s,
            jitter=jitter,
            stage_ratios=ratios,
        )

    def capacity(
        self, scale: dict[str, float], jitter: float, ratios: dict[str, list[float]] | None = None
    ) -> tuple[float, list[tuple[float, float]]]:
        async def sim_probe(load: float) -> float:
            return self.run(scale, load, jitter, ratios).within_slo[self.model]

        return asyncio.run(bisect(sim_probe, 1.0, 12))

    def overload(
        self, scale: dict[str, float], capacity: float, jitter: float
    ) -> dict[str, dict[str, Any]]:
        """Late and dropped requests at 1.0 and 1.5 × `capacity`."""
        return overload(lambda load: self.run(scale, load, jitter), capacity, [self.model])


def overload(
    run: Callable[[float], Any], capacity: float, models: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Late and dropped requests of `models`, summed, in `run` (load factor
    → the simulator's result) at 1.0 and 1.5 × `capacity` (at least 0.05)."""
    out = {}
    for factor in (1.0, 1.5):
        result = run(factor * max(capacity, 0.05))
        requests = sum(result.requests[m] for m in models)
        late = sum(result.late[m] for m in models)
        dropped = sum(result.dropped[m] for m in models)
        within = sum(result.within_slo[m] * result.requests[m] for m in models)
        out[f"{factor:.1f}"] = {
            "requests": requests,
            "within_slo": within / requests if requests else 1.0,
            "late": late,
            "dropped": dropped,
            "late_of_answers": late / (requests - dropped) if requests > dropped else 0.0,
        }
    return out


def simulated_part(
    args: argparse.Namespace,
    plan: Plan,
    profile: BlockProfile,
    model: str,
    live: dict[str, Any],
    stage_ratios: dict[str, list[float]],
) -> dict[str, Any]:
    """The simulator on the same plan: its capacity with the stage times at
    no load, with those of the live runs (a fit, and drawn from them), and,
    like the live runs, late and dropped requests at 1.0 and 1.5 × its
    capacity."""
    calibration = live["calibration"]
    idle_scale = calibration["stage_over_profile_idle"] if args.calibrate else {}
    stages = plan.pipelines[0].stages
    loaded_scale = {
        stages[int(key.split(".")[1])].device_class: ms / live["live"]["stage_ms_profiled"][key]
        for key, ms in live["live"]["stage_ms_mean"].items()
    }
    # The simulator's requests lose nothing between their arrival and the
    # core, nor between their last stage and their answer: its SLO is
    # shorter by what live requests lost there at no load (the same slack).
    slo_s = plan.models[0].slo_s - calibration.get("overhead_ms", 0.0) / 1000.0
    same_slack = replace(plan, models=(replace(plan.models[0], slo_s=slo_s),))
    handoff_s = calibration["handoff_ms_planned"] / 1000.0
    sim = PlanSimulation(same_slack, profile, model, handoff_s, args.sim_s)

    idle, idle_probes = sim.capacity(idle_scale, calibration["jitter"])
    # With the stage times of the live runs: their means and their spread.
    loaded_jitter = live["live"]["jitter"] if args.calibrate else 0.0
    loaded, loaded_probes = sim.capacity(loaded_scale, loaded_jitter)
    # Each stage's time drawn from the live capacity runs' own, over what
    # the live core planned (the calibrated profile): their tails too.
    replayed, replayed_probes = sim.capacity(idle_scale, 0.0, stage_ratios)
    throughput = plan.pipelines[0].throughput
    live_capacity = live["live"]["load_factor"]
    return {
        "simulated": {
            "load_factor": idle,
            "rate": idle * throughput,
            "probes": idle_probes,
            "sim_s": args.sim_s,
            "stage_over_profile": idle_scale,
            "overload": sim.overload(idle_scale, idle, calibration["jitter"]),
        },
        "simulated_with_loaded_stage_times": {
            "load_factor": loaded,
            "rate": loaded * throughput,
            "probes": loaded_probes,
            "stage_over_profile": loaded_scale,
            "jitter": loaded_jitter,
        },
        "live_over_simulated": live_capacity / idle if idle else math.nan,
        "live_over_simulated_loaded": live_capacity / loaded if loaded else math.nan,
        "simulated_with_live_stage_times": {
            "load_factor": replayed,
            "rate": replayed * throughput,
            "probes": replayed_probes,
        },
        "live_over_simulated_replayed": live_capacity / replayed if replayed else math.nan,
    }
