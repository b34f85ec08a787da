"""PPipe live: the `chain` model cut into two partitions, served by a pool of
fast CPU executors and a pool of slow ones, beside the pipeline simulator on
the same plan and block profile.

    python -m bench.ppipe_live [--fast NAME:THREADS[:SLOWDOWN]] [--slow ...]
        [--fast-count 1] [--slow-count 2] [--slo-ms 50] [--margin 0.4]
        [--max-batch 4] [--probe-s 3] [--max-probes 8] [--overload-s 20] [--sim-s 30]
        [--fault-s 4] [--fault-load 0.5] [--repeats 3] [--deadline-margin-ms 0]
        [--handoff-ms MS] [--no-calibrate] [--out-dir DIR]

1. **Model and profile.** `chain` (app/repository/chain_model.py) is cut
   into 10 blocks of roughly equal time on the slow class
   (`prepartition`), the chained blocks are checked against the whole model
   (`verify_chain`), and every block is timed on both classes at batch
   sizes 1..`--max-batch` (`profile_blocks`; an emulated slowdown
   multiplies the measured times, as the executors hold each batch that
   many times its run).
2. **Plan.** A small exhaustive search stands in for the MILP on this
   two-class cluster: every two-stage pipeline (either class first, every
   cut, every batch size) using all instances of both classes, whose
   stages' latencies add up to at most SLO × (1 − margin); the highest
   throughput (its slowest stage: instances × b / ℓ(b)) wins, the smaller
   batch on a tie within 1 %. Transfers are shared memory on this machine:
   the cluster's bandwidth is set so high that they take ~0 s.
3. **Answers.** 16 requests with different inputs through the live
   pipeline; each answer is compared with the uncut model's
   (`np.allclose`, rtol 1e-4, atol 1e-5).
4. **Calibration.** With the 16 answers and 48 more requests, 20 ms apart
   (nothing queued, batches of 1), the mean time from a stage's end to the
   next one's start is the hand-over through this process (the executor's
   report, the driver, the next executor), and each stage's mean time
   against the profile is how much slower (or faster) its class runs in an
   executor than in the profiler (a cold cache between sparse batches, the
   copies in and out of the arena, both multiplied by an emulated
   slowdown). The capacity runs, live and simulated, plan with the
   hand-over (`PoolPipeline.handoff_s`; `--handoff-ms` sets it instead) and
   with the profile scaled per class by that ratio, on fresh executors; the
   simulator also draws each stage's time with the spread the stages showed
   (log-normal jitter, `stage_jitter`), and its SLO is shorter by what a
   live request loses outside the stages: from its arrival until the core
   has it, and from its last stage's end to its answer (the same slack).
   `--no-calibrate`: the profile as measured and no jitter. Reported beside
   it: the simulator once more with the stage times the live capacity runs
   saw, their means and their spread (a busy two-core box slows the
   executors further and unevenly; the emulated slowdown multiplies that
   too).
5. **Capacity**: the highest Poisson rate with ≥ 99 % of requests answered
   within the SLO, by bisection over the load factor (× the plan's
   throughput), live (`--probe-s` per probe) and simulated (the pipeline
   simulator, app/simulation/pipeline_engine.py, on the same plan and
   profile, `--sim-s` simulated seconds per probe); then their ratio.
   The live core may plan with a deadline margin (`--deadline-margin-ms`,
   `PPipeScheduler(deadline_margin=…)`: slack for what the profile leaves
   out, the hand-over between stages through this process and executors
   slower than profiled on a busy machine); the simulator plans without.
   Reported beside it: the stages' mean live time against the profile, and
   the mean time from a stage's end to the next one's start.
   Then `--overload-s` at 1.0 and 1.5 × each capacity: late answers and
   drops.
6. **Device failure.** At `--fault-load` × the live capacity for
   `--fault-s`, one executor of the pool with more than one instance is
   killed (SIGKILL) 40 % into the run and not restarted: the core re-routes
   its batches to the other instances or drops them; every request must be
   answered exactly once.

The default classes keep the executors and this process well within the
box's two cores, which other work shares: `fast` is one thread held 2 × its
compute, `slow` one thread held 6 × (app/runtime/executor.py: the hold
multiplies the batch's CPU time, so time other processes take from it is
not multiplied too). At the plan's throughput the fast executor computes
half of the time and each slow one a sixth.

Output: a summary on stdout and `<out-dir>/live.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from app.planning.ppipe.layout import build_layout
from app.planning.ppipe.plan import Cluster, ModelTarget, Pipeline, Plan, Stage
from app.planning.ppipe.profiles import BlockProfile
from app.repository.block_profile import DeviceClass, prepartition, profile_blocks
from app.repository.chain_model import CHAIN_MODEL, write_chain
from app.repository.partition import run, session, synthetic_inputs, verify_chain
from app.scheduling.ppipe import PPipeScheduler
from app.scheduling.ppipe.batches import PipelineBatch
from app.scheduling.ppipe.sequencer import LIVE_HOLD, LIVE_OVERDUE, live_lead
from app.server.pipeline_setup import LivePipelines, wait_answered
from app.server.pipeline_types import DriverCounts
from app.simulation.ppipe_run import plan_arrivals
from bench.ppipe_capacity import bisect, scaled, simulated_part

OUT_DIR = Path(__file__).resolve().parent / "results" / "ppipe"
CALIBRATION_REQUESTS = 48  # at no load, 20 ms apart, after the 16 answers checked
SHARED_MEMORY_GBPS = 1e6  # transfers through shared memory: ~0 s


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ plan


def search_plan(
    profile: BlockProfile,
    counts: dict[str, int],
    slo_s: float,
    margin: float,
    max_batch: int,
) -> Plan:
    """The best two-stage pipeline over both classes (see the module
    docstring)."""
    fast, slow = list(counts)
    n = profile.blocks
    budget = slo_s * (1.0 - margin)
    best: tuple[float, int, tuple[Stage, Stage]] | None = None
    for first, second in ((fast, slow), (slow, fast)):
        for cut in range(1, n):
            for b in range(1, max_batch + 1):
                l0 = profile.partition_latency(0, cut, b, first)
                l1 = profile.partition_latency(cut, n, b, second)
                if l0 + l1 > budget:
                    continue
                rate = min(counts[first] * b / l0, counts[second] * b / l1)
                stages = (
                    Stage(0, cut, first, 1, counts[first], l0),
                    Stage(cut, n, second, 1, counts[second], l1),
                )
                if best is None or rate > best[0] * 1.01:
                    best = (rate, b, stages)
    if best is None:
        raise SystemExit(f"no two-stage pipeline fits SLO × (1 − margin) = {budget * 1e3:.1f} ms")
    rate, b, stages = best
    return Plan(
        Cluster(dict(counts), SHARED_MEMORY_GBPS, devices_per_node=max(counts.values())),
        (ModelTarget(profile.model, 1.0, slo_s, rate),),
        (Pipeline(profile.model, b, stages, rate),),
        objective=rate,
        details={"search": "two-stage pipelines over both classes, every cut and batch"},
    )


# ------------------------------------------------------------- live runs


async def offer(
    live: LivePipelines,
    model: str,
    times: np.ndarray,
    inputs: list[dict[str, np.ndarray]],
    slo_s: float,
    during: Callable[[float], None] | None = None,
    ratios: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """Submit a request at each of `times` (s from now) and wait for every
    answer; `during(t)` is called once per arrival (fault injection).
    `ratios` collects, per device class, each stage's time over the time the
    core planned it with."""
    driver = live.driver
    last_ends: dict[int, float] = {}  # batch → its last stage's end

    def on_batch(batch: PipelineBatch) -> None:
        last_ends[batch.id] = batch.stages[-1].finish
        if ratios is not None:
            pipeline = driver.layout.pipelines[batch.pipeline]
            for run in batch.stages:
                stage = pipeline.stages[run.stage]
                took = (run.finish - run.start) / stage.latency[batch.size - 1]
                ratios.setdefault(stage.device_class, []).append(took)

    driver.on_batch = on_batch
    start = time.monotonic()
    futures: list[tuple[float, asyncio.Future]] = []
    ingress = 0.0
    for i, t in enumerate(times.tolist()):
        delay = start + t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if during is not None:
            during(t)
        arrival = start + t
        ingress += time.monotonic() - arrival
        futures.append(
            (arrival, driver.submit(model, inputs[i % len(inputs)], received_at=arrival))
        )
    drained = await wait_answered(driver, 30.0)
    driver.on_batch = None
    good = late = 0
    errors: dict[str, int] = {}
    latencies = []
    egress = []
    for arrival, future in futures:
        if not future.done():
            continue
        if future.exception() is not None:
            name = getattr(future.exception(), "reason", type(future.exception()).__name__)
            errors[name] = errors.get(name, 0) + 1
            continue
        answer = future.result()
        latencies.append(answer.finished_at - arrival)
        if answer.batch_id in last_ends:
            egress.append(answer.finished_at - last_ends[answer.batch_id])
        if latencies[-1] <= slo_s:
            good += 1
        else:
            late += 1
    return {
        "requests": len(futures),
        "answered": sum(f.done() for _, f in futures),
        "drained": drained,
        "good": good,
        "late": late,
        "errors": errors,
        "within_slo": good / len(futures) if futures else 1.0,
        # From its arrival until the core has it (the sleep's overshoot and
        # the arena write), and from its last stage's end to its answer: the
        # simulator has neither.
        "ingress_ms_mean": 1e3 * ingress / len(futures) if futures else 0.0,
        "egress_ms_mean": 1e3 * float(np.mean(egress)) if egress else 0.0,
        "latency_ms_p50_p99": [float(1e3 * np.percentile(latencies, q)) for q in (50, 99)]
        if latencies
        else None,
    }


def stage_jitter(counts: DriverCounts) -> float:
    """The log-normal sigma of stage time ÷ planned time, each stage's
    spread about its own mean (sigma² = ln(1 + CV²)), averaged over the
    stages weighted by their batches."""
    total = weighted = 0.0
    for key, n in counts.stage_batches.items():
        mean = counts.stage_ratio_sum[key] / n
        cv2 = max(0.0, counts.stage_ratio_squares[key] / n / (mean * mean) - 1.0)
        weighted += n * math.sqrt(math.log1p(cv2))
        total += n
    return weighted / total if total else 0.0


# ------------------------------------------------------------------ main


async def fault_run(
    live: LivePipelines,
    model: str,
    core: PPipeScheduler,
    capacity_rps: float,
    inputs: list[dict[str, np.ndarray]],
    slo: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """A device failure in the pool with more than one instance, at
    `args.fault_load` × the live capacity: every request answered once."""
    plan_rps = core.layout.pipelines[0].throughput
    layout = core.layout
    pool = max(layout.pipelines[0].stages, key=lambda s: len(s.devices))
    victim = pool.devices[-1]
    load = args.fault_load * max(capacity_rps, 0.1 * plan_rps)
    times, _, _ = plan_arrivals({model: load}, args.fault_s, seed=999)
    killed: list[float] = []

    def kill(t: float) -> None:
        if not killed and t >= 0.4 * args.fault_s:
            pid = live.pool.pid(victim)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            killed.append(t)

    before = asdict(live.driver.counts)
    result = await offer(live, model, times, inputs, slo, during=kill)
    after = asdict(live.driver.counts)
    delta = {
        k: after[k] - before[k]
        for k in ("submitted", "answered", "failed", "rerouted", "dispatched")
    }
    dropped = {
        reason: n - before["dropped"].get(reason, 0)
        for reason, n in after["dropped"].items()
        if n - before["dropped"].get(reason, 0)
    }
    fault = {
        "load_factor": load / plan_rps,
        "rate": load,
        "device": victim,
        "device_class": pool.device_class,
        "killed_at_s": killed[0] if killed else None,
        **result,
        "driver": delta,
        "dropped": dropped,
        "exactly_once": result["answered"] == result["requests"]
        and delta["answered"] == delta["submitted"]
        and not live.driver.pending,
    }
    at = f"{killed[0]:.2f} s" if killed else "(never: too few arrivals)"
    log(
        f"fault: {pool.device_class} instance {victim} killed at {at}; "
        f"{result['requests']} requests, "
        f"{result['answered']} answered, re-routed batches {delta['rerouted']}, "
        f"dropped {dropped}, within SLO {result['within_slo']:.4f}"
    )
    return fault


async def overload_runs(
    live: LivePipelines,
    model: str,
    capacity_rps: float,
    inputs: list[dict[str, np.ndarray]],
    slo: float,
    seconds: float,
) -> dict[str, dict[str, Any]]:
    """At 1.0 and 1.5 × the live capacity: how many answers were late and
    how many requests were dropped (a pipeline sheds what cannot make it)."""
    runs: dict[str, dict[str, Any]] = {}
    for factor in (1.0, 1.5):
        times, _, _ = plan_arrivals({model: factor * capacity_rps}, seconds, seed=int(500 * factor))
        result = await offer(live, model, times, inputs, slo)
        answered = result["good"] + result["late"]
        runs[f"{factor:.1f}"] = {
            **result,
            "late_of_answers": result["late"] / answered if answered else 0.0,
        }
        log(
            f"  {factor:.1f} × live capacity: {result['requests']} requests, "
            f"{result['good']} within SLO, {result['late']} late, errors {result['errors']}"
        )
        await asyncio.sleep(0.2)
    return runs


async def live_part(
    args: argparse.Namespace, setup: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The live runs' figures, and their raw samples (`stage_ratios`)."""
    plan, core, partitioning, classes = (
        setup["plan"],
        setup["core"],
        setup["partitioning"],
        setup["classes"],
    )
    model = partitioning.name
    slo = args.slo_ms / 1000.0
    whole = session(partitioning.model)
    rng_inputs = [
        {"input": synthetic_inputs(partitioning.model, 1, seed=100 + i)["input"]} for i in range(32)
    ]
    out: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ppipe-live-") as tmp:
        live = LivePipelines(
            core, {model: partitioning}, classes, Path(tmp), capacity=args.capacity, respawn=False
        )
        await live.start()
        try:
            # Answers against the uncut model, 20 ms apart (a burst would
            # be partly dropped: the SLO holds only so many queued requests).
            futures = []
            for inp in rng_inputs[:16]:
                futures.append(live.driver.submit(model, inp))
                await asyncio.sleep(0.02)
            await wait_answered(live.driver, 30.0)
            worst = 0.0
            equal = answered = 0
            for inp, future in zip(rng_inputs, futures, strict=False):
                if future.exception() is not None:
                    continue
                answered += 1
                got = future.result().outputs["output"]
                want = run(whole, inp)["output"]
                worst = max(worst, float(np.max(np.abs(got - want))))
                equal += bool(np.allclose(got, want, rtol=1e-4, atol=1e-5))
            out["answers"] = {
                "requests": 16,
                "answered": answered,
                "equal": equal,
                "all_equal": equal == answered == 16,
                "max_abs_diff": worst,
            }
            log(
                f"answers: {answered} of 16 answered, {equal} equal to the uncut model's "
                f"(max |Δ| {worst:.2e})"
            )

            # The hand-over between stages and each class's stage time live
            # against the profile, at no load (requests 20 ms apart, batches
            # of 1): the capacity runs, live and simulated, plan with them.
            calibration = await offer(
                live, model, 0.02 * np.arange(CALIBRATION_REQUESTS), rng_inputs, slo
            )
            counts = live.driver.counts
            measured = counts.handoff_seconds / max(1, counts.handoffs)
            handoff_s = measured if args.handoff_ms is None else args.handoff_ms / 1000.0
            stage_ratio = {}
            for k, stage in enumerate(core.layout.pipelines[0].stages):
                key = f"0.{k}"
                if counts.stage_batches.get(key):
                    mean = counts.stage_seconds[key] / counts.stage_batches[key]
                    stage_ratio[stage.device_class] = mean / stage.latency[0]
            scale = stage_ratio if args.calibrate else {}
            # What the simulator leaves out of the SLO: the same slack.
            overhead_ms = calibration["ingress_ms_mean"] + calibration["egress_ms_mean"]
            out["calibration"] = {
                "requests": CALIBRATION_REQUESTS + 16,
                "ingress_ms_mean": calibration["ingress_ms_mean"],
                "egress_ms_mean": calibration["egress_ms_mean"],
                "overhead_ms": overhead_ms,
                "handoff_ms_idle": 1e3 * measured,
                "handoff_ms_planned": 1e3 * handoff_s,
                "stage_over_profile_idle": stage_ratio,
                "profile_scaled": args.calibrate,
                "jitter": stage_jitter(counts) if args.calibrate else 0.0,
            }
            log(
                f"at no load: hand-over {1e3 * measured:.2f} ms (planned {1e3 * handoff_s:.2f}), "
                "stage time / profile "
                + ", ".join(f"{c} {r:.3f}" for c, r in stage_ratio.items())
                + f", spread (log-normal sigma) {stage_jitter(counts):.3f}"
                + (" (the simulator's profile and jitter)" if args.calibrate else "")
                + f"; arrival to the core {calibration['ingress_ms_mean']:.2f} ms, last stage's "
                f"end to the answer {calibration['egress_ms_mean']:.2f} ms (the simulator's SLO "
                f"is {overhead_ms:.2f} ms shorter)"
            )
            await live.stop()
            core = setup["make_core"](handoff_s, scale)
            live = LivePipelines(
                core,
                {model: partitioning},
                classes,
                Path(tmp),
                capacity=args.capacity,
                respawn=False,
            )
            await live.start()

            throughput = plan.pipelines[0].throughput
            seeds = iter(range(1000))

            async def probe(load: float) -> float:
                rate = load * throughput
                times, _, _ = plan_arrivals({model: rate}, args.probe_s, seed=next(seeds))
                result = await offer(live, model, times, rng_inputs, slo, ratios=stage_ratios)
                log(
                    f"  live load {load:.3f} ({rate:.0f}/s): {result['within_slo']:.4f} within "
                    f"SLO; late {result['late']}, errors {result['errors']}, latency p50/p99 ms "
                    f"{result['latency_ms_p50_p99']}"
                )
                await asyncio.sleep(0.2)
                return result["within_slo"]

            stage_ratios: dict[str, list[float]] = {}
            log("live capacity:")
            capacity, probes = await bisect(probe, 1.0, args.max_probes)
            counts = live.driver.counts
            stage_ms = {
                key: 1e3 * counts.stage_seconds[key] / n for key, n in counts.stage_batches.items()
            }
            planned = {f"0.{k}": 1e3 * s.latency_s for k, s in enumerate(plan.pipelines[0].stages)}
            handoff = 1e3 * counts.handoff_seconds / max(1, counts.handoffs)
            out["live"] = {
                "load_factor": capacity,
                "rate": capacity * throughput,
                "probes": probes,
                "probe_s": args.probe_s,
                "stage_ms_mean": stage_ms,
                "stage_ms_profiled": planned,
                "handoff_ms_mean": handoff,
                "jitter": stage_jitter(counts),
                "stage_over_planned_p50_p90_p99": {
                    cls: np.percentile(r, [50, 90, 99]).round(3).tolist()
                    for cls, r in stage_ratios.items()
                },
            }
            samples["stage_ratios"] = stage_ratios
            log(
                "stage time, ms, live mean (profiled): "
                + ", ".join(f"{k} {v:.2f} ({planned.get(k, 0):.2f})" for k, v in stage_ms.items())
                + f"; hand-over between stages {handoff:.2f} ms; spread (log-normal sigma) "
                f"{stage_jitter(counts):.3f}"
            )

            out["overload"] = await overload_runs(
                live, model, max(capacity, 0.1) * throughput, rng_inputs, slo, args.overload_s
            )
            out["fault"] = await fault_run(
                live, model, core, capacity * throughput, rng_inputs, slo, args
            )
        finally:
            await live.stop()
    return out, samples


def print_summary(summary: dict[str, Any]) -> None:
    plan, live, simulated = summary["plan"], summary["live"], summary["simulated"]
    throughput = plan["throughput"]
    loaded = summary["simulated_with_loaded_stage_times"]
    print(
        f"plan {throughput:.0f} requests/s (batch {plan['batch']}); capacity live "
        f"{live['load_factor']:.3f} ({live['rate']:.0f}/s), simulated "
        f"{simulated['load_factor']:.3f} ({simulated['rate']:.0f}/s): live/simulated "
        f"{summary['live_over_simulated']:.3f}; simulated with the stage times of the live "
        f"runs ({', '.join(f'{c} ×{r:.3f}' for c, r in loaded['stage_over_profile'].items())}, "
        f"sigma {loaded['jitter']:.3f}) "
        f"{loaded['load_factor']:.3f}: live/simulated {summary['live_over_simulated_loaded']:.3f}; "
        f"simulated drawing each stage's time from the live runs' "
        f"{summary['simulated_with_live_stage_times']['load_factor']:.3f}: live/simulated "
        f"{summary['live_over_simulated_replayed']:.3f}"
    )
    for factor, measured in summary["overload"].items():
        sim = simulated["overload"][factor]
        print(
            f"at {factor} × capacity: live {measured['requests']} requests, "
            f"{measured['late']} late ({100 * measured['late_of_answers']:.2f} % of answers), "
            f"dropped {measured['errors']}; "
            f"simulated {sim['requests']} requests, {sim['late']} late "
            f"({100 * sim['late_of_answers']:.2f} %), {sim['dropped']} dropped"
        )
    fault = summary["fault"]
    print(
        f"answers equal to the uncut model's: {summary['answers']['all_equal']}; fault run: "
        f"exactly once {fault['exactly_once']}, re-routed "
        f"{fault['driver']['rerouted']}, dropped {fault['dropped']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ppipe_live", description=__doc__)
    parser.add_argument("--fast", default="fast:1:2", metavar="NAME:THREADS[:SLOWDOWN]")
    parser.add_argument("--slow", default="slow:1:6", metavar="NAME:THREADS[:SLOWDOWN]")
    parser.add_argument("--fast-count", type=int, default=1)
    parser.add_argument("--slow-count", type=int, default=2)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--margin", type=float, default=0.4)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--probe-s", type=float, default=3.0)
    parser.add_argument("--max-probes", type=int, default=8)
    parser.add_argument(
        "--overload-s",
        type=float,
        default=20.0,
        help="seconds of each run at 1.0 and 1.5 × the live capacity",
    )
    parser.add_argument("--sim-s", type=float, default=30.0)
    parser.add_argument("--fault-s", type=float, default=4.0)
    parser.add_argument("--fault-load", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deadline-margin-ms", type=float, default=0.0)
    parser.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="plan the capacity runs with the block profile as measured, not scaled per class "
        "by the stage times seen at no load",
    )
    parser.add_argument(
        "--handoff-ms",
        type=float,
        help="hand-over between stages both sides plan with (default: measured at no load)",
    )
    parser.add_argument("--capacity", type=int, default=128, help="arena slots")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    fast, slow = DeviceClass.parse(args.fast), DeviceClass.parse(args.slow)
    if fast.name == slow.name:
        parser.error("the two classes need different names")
    classes = {fast.name: fast, slow.name: slow}
    counts = {fast.name: args.fast_count, slow.name: args.slow_count}
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="ppipe-chain-") as tmp:
        path = write_chain(Path(tmp) / CHAIN_MODEL)
        partitioning = prepartition(path, CHAIN_MODEL, reference=slow, repeats=args.repeats)
        verify_chain(partitioning)
        profile = profile_blocks(
            partitioning, [fast, slow], max_batch=args.max_batch, repeats=args.repeats
        )
    log(
        f"profile ({partitioning.blocks} blocks), batch 1, ms: "
        + "; ".join(f"{cls} {profile.whole_latency(1, cls) * 1e3:.2f} whole" for cls in classes)
    )
    slo = args.slo_ms / 1000.0
    plan = search_plan(profile, counts, slo, args.margin, args.max_batch)
    pipeline = plan.pipelines[0]
    log(
        "plan: "
        + " → ".join(
            f"{s.device_class}×{s.devices} [{s.start},{s.end}) {s.latency_s * 1e3:.2f} ms"
            for s in pipeline.stages
        )
        + f", batch {pipeline.batch}, {pipeline.throughput:.0f} requests/s"
    )

    def make_core(handoff_s: float, scale: dict[str, float] | None = None) -> PPipeScheduler:
        layout = build_layout(
            plan, {partitioning.name: scaled(profile, scale)}, handoff_s=handoff_s
        )
        return PPipeScheduler(
            layout,
            deadline_margin=args.deadline_margin_ms / 1000.0,
            lead=live_lead(layout),
            hold=LIVE_HOLD,
            overdue=LIVE_OVERDUE,
        )

    setup = {
        "plan": plan,
        "core": make_core(0.0),
        "make_core": make_core,
        "partitioning": partitioning,
        "classes": classes,
    }
    live, samples = asyncio.run(live_part(args, setup))
    simulated = simulated_part(
        args, plan, profile, partitioning.name, live, samples["stage_ratios"]
    )
    throughput = pipeline.throughput
    summary = {
        "classes": {n: asdict(c) for n, c in classes.items()},
        "counts": counts,
        "slo_ms": args.slo_ms,
        "deadline_margin_ms": args.deadline_margin_ms,
        "plan": {
            "batch": pipeline.batch,
            "throughput": throughput,
            "stages": [asdict(s) for s in pipeline.stages],
        },
        "profile_ms_batch1": {
            cls: (profile.latency[(cls, 1)][:, 0] * 1e3).round(3).tolist() for cls in classes
        },
        **live,
        **simulated,
        "within_15_percent": abs(simulated["live_over_simulated"] - 1.0) <= 0.15,
        "wall_s": time.monotonic() - started,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "live.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary)
    print(f"wrote {args.out_dir / 'live.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
