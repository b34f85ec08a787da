"""Orloj live: the bundled dynamic model `earlyexit` (or `earlyexit-wide`,
whose batch has a fixed cost) served by the daemon, beside the simulator on
the same arrivals, and the profiler's overhead.

    python -m bench.orloj_live [--model earlyexit|earlyexit-wide]
                               [--policies orloj,clockwork] [--duration S]
                               [--slo-multiple 3] [--load F]
                               [--sample-rates 0,0.05,0.2] [--quick] [--out DIR]
                               [--deadline-margin-ms M] [--timer-lead-ms L]
                               [--intake-delay-ms D] [--threads N] [--repeats R]

1. **Calibration** (bench/orloj_live_calibration.py), before the daemon
   starts: `earlyexit` timed here with ONNX Runtime under the executor's
   session options and thread count, batches of k ∈ {1, 2, 4, 8} rows of
   s ∈ {1, 4, 8, 16} steps, fitted to orloj.txt's eq. 3, t = c0 + c1·k·s;
   the fit and its residuals are printed (how well the real model follows
   eq. 3), with a second fit that adds the Loop's per-step cost.
2. **Workload** (`build_workload`): one CPU device, `earlyexit`
   (max_batch 8), applications `short` (steps ~ N(3, 0.7)) and `long`
   (N(12, 1.5)), shares ½/½, as a `latency:` block whose ℓ_r is in steps:
   c1 = the fitted cost of a step (ms), c0 the fitted c0, so x_r = c1·steps.
   Poisson arrivals at `--load` × the capacity at the mean, max_batch /
   ℓ(max_batch) with ℓ(b) = c0 + c1·b·E[steps] — what a server planning
   with the mean step count thinks the device carries (as
   bench/workloads/orloj/cases.yaml defines its load; the default 0.5 sits
   a little below the tables' 0.6 to leave the HTTP path its share). Batches
   that mix short and long requests pay for the longest, so a policy
   batching regardless of length carries much less. SLO = `--slo-multiple` × the P99
   of the alone-time. `step_arrivals` rounds each request's ℓ_r to whole
   steps in 1..16 and sets its work to c1·steps, so the simulator and the
   live run see the same steps.
3. **Live.** A temporary repository holding only `earlyexit` — built
   heavier than the bundled one (`BENCH_CHANNELS` channels, a
   `BENCH_SIDE`² input: ~0.6 ms a step per row here instead of ~0.07, so
   that at 3 × P99 the SLO is tens of ms and the HTTP path's few ms do not
   decide the outcome) — is served by the daemon with POLICY=<policy>,
   PROFILE_SAMPLE_RATE=<rate>, one CPU executor with the calibration's
   thread count and no emulated devices.
   Each request sends the native /infer body of its (application, steps)
   pair (`request_bodies`: `early_exit_input(steps)`, `slo_ms`, `app_id`),
   on the workload's arrivals (`run_load(..., variants=...)`). Finish rate
   = within SLO / all requests. GET /metrics after the run gives
   `deadline_serve_alone_seconds_count`: alone-times the profiler measured.
4. **Simulator**, same arrivals (applications and work), same policy, with
   the live path's slack: the daemon's default DEADLINE_MARGIN_MS and
   TIMER_LEAD_MS as the core's `deadline_margin`/`timer_lead`, and
   `--intake-delay-ms` (mean, exponential) between arrival and the core.
   The simulated profiler samples at the live run's rate. The daemon
   measures a dynamic model's ℓ(b) on its slowest input (16 steps,
   app/repository/dynamic_models.py), so the simulated model's `profile` —
   what clockwork and the other one-ℓ(b) policies plan with — is the
   calibration's ℓ(b) at 16 steps, as the daemon's is; orloj plans with the
   alone-time histograms either way. One difference stays: the simulated
   orloj starts from PRIOR_SAMPLES alone-times per application drawn from
   the workload (app/workloads/dynamic.py), the daemon from its probes'
   alone-times (1..16 steps, one prior for every application) until the
   profiler's samples of each application replace them — at rate 0, never.
   `--deadline-margin-ms` and `--timer-lead-ms` set the slack of both
   sides at once.
5. **Profiler overhead.** `orloj` runs once per `--sample-rates` value; the
   other policies plan with one ℓ(b) and never read the histograms, so they
   run with the profiler off (rate 0).

A table (policy, sample rate, live and simulated finish rate, their
difference in points, goodput, alone-times) is printed and written, with
every number behind it, to `--out` (default bench/results/orloj-live/):
results.json and summary.md. Every live run is bounded in time and the
daemon is stopped by its PID on every exit path (SIGTERM included).
`--quick` is a smoke run: a 2-s workload, one calibration repeat on the
corner points, output under bench/results/scratch/.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.repository import BUNDLED_REPOSITORY
from app.repository.dynamic_models import (
    EARLY_EXIT_MAX_STEPS,
    EARLY_EXIT_PROBE_STEPS,
    EARLY_EXIT_WIDE_HEAD,
    build_early_exit,
    early_exit_input,
    probes_bytes,
    serialize,
)
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import policy_names
from app.server.settings import DEFAULT_METRICS_PREFIX, NORMAL_SLACK_MS
from app.simulation.run import simulate
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload, parse_workload
from bench.cli import sanitize
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen import ModelTarget, RequestVariants, run_load
from bench.orloj_live_calibration import (
    CAL_BATCHES,
    CAL_STEPS,
    Calibration,
    calibrate,
)
from bench.orloj_live_report import markdown, print_calibration, print_table

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL = "earlyexit"
# The models it serves: name → head width (0: the one dense layer).
MODELS = {"earlyexit": 0, "earlyexit-wide": EARLY_EXIT_WIDE_HEAD}
MAX_BATCH = 8
# The served earlyexit's size (the bundled one: 32 channels, 16²).
BENCH_CHANNELS = 64
BENCH_SIDE = 32
QUICK_BATCHES = (1, 8)
QUICK_STEPS = (1, 16)
FULL_S = 60.0
QUICK_S = 2.0
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "orloj-live"
QUICK_OUT = REPO_ROOT / "bench" / "results" / "scratch" / "orloj-live-quick"
# Beyond the workload's duration and the longest timeout, what a live run
# may take (connection set-up, the last answers) before it is abandoned.
RUN_GRACE_S = 60.0
ALONE_COUNT = f"{DEFAULT_METRICS_PREFIX}alone_seconds_count"


# -------------------------------------------------------------------- workload


@dataclass(frozen=True)
class AppSteps:
    """An application's loop steps: N(mean, std), clipped and rounded."""

    name: str
    share: float
    mean: float
    std: float


DEFAULT_APPS = (AppSteps("short", 0.5, 3.0, 0.7), AppSteps("long", 0.5, 12.0, 1.5))


def build_workload(
    cal: Calibration,
    *,
    load: float,
    slo_multiple: float,
    duration_s: float,
    seed: int = 1,
    apps: Sequence[AppSteps] = DEFAULT_APPS,
    sample_rate: float = 0.0,
    model: str = MODEL,
) -> Workload:
    """The live workload (see the module docstring), ℓ_r in steps."""
    if not (load > 0 and math.isfinite(load)):
        raise ValueError(f"load must be a positive number, got {load}")

    def doc(rate: float) -> dict[str, Any]:
        return {
            "name": "orloj-live",
            "duration_s": duration_s,
            "seed": seed,
            "devices": [{"name": "cpu:0", "kind": "cpu"}],
            "profile_sample_rate": sample_rate,
            "models": [
                {
                    "name": model,
                    "max_batch": MAX_BATCH,
                    "rate": rate,
                    "slo_p99_multiple": slo_multiple,
                    "latency": {
                        "batch": {"c0_ms": cal.c0_ms, "c1": cal.c1_ms},
                        "floor_ms": 1.0,  # one step
                        "apps": [
                            {
                                "name": a.name,
                                "share": a.share,
                                "modes": [{"mean_ms": a.mean, "std_ms": a.std, "weight": 1.0}],
                            }
                            for a in apps
                        ],
                    },
                }
            ],
        }

    probe = parse_workload(doc(1.0), REPO_ROOT, source="<orloj-live>")
    capacity = MAX_BATCH / probe.models[0].profile.latency(MAX_BATCH)
    workload = parse_workload(doc(load * capacity), REPO_ROOT, source="<orloj-live>")
    # The one-ℓ(b) policies plan with the daemon's profile, measured on the
    # slowest input (module docstring, 4).
    slowest = LatencyProfile.linear(cal.c1_ms * EARLY_EXIT_MAX_STEPS, cal.c0_ms, MAX_BATCH)
    served = dataclasses.replace(workload.models[0], profile=slowest)
    return dataclasses.replace(workload, models=[served])


def step_arrivals(workload: Workload, arrivals: Arrivals) -> tuple[Arrivals, np.ndarray]:
    """The arrivals with each request's ℓ_r rounded to whole steps in
    1..EARLY_EXIT_MAX_STEPS and its work set to c1·steps; and the steps."""
    latency = workload.models[0].latency
    assert latency is not None and arrivals.work is not None
    raw = np.asarray(arrivals.work) * 1000.0 / latency.c1
    steps = np.clip(np.rint(raw), 1, EARLY_EXIT_MAX_STEPS).astype(np.int64)
    work = latency.c1 * steps / 1000.0
    return dataclasses.replace(arrivals, work=work), steps


def request_bodies(
    apps: np.ndarray, steps: np.ndarray, slo_ms: float, model: str = MODEL
) -> tuple[list[tuple[str, int]], RequestVariants]:
    """One native /infer body per (application, steps) pair that occurs, and
    which one each request sends."""
    pairs = sorted({(str(a), int(s)) for a, s in zip(apps, steps, strict=True)})
    index = {pair: i for i, pair in enumerate(pairs)}
    bodies = []
    for app, s in pairs:
        x = early_exit_input(s, side=BENCH_SIDE)
        doc = {
            "model": model,
            "inputs": {"input": x.tolist()},
            "slo_ms": float(slo_ms),
            "app_id": app,
        }
        bodies.append(json.dumps(doc, separators=(",", ":")).encode())
    body_index = np.array(
        [index[(str(a), int(s))] for a, s in zip(apps, steps, strict=True)], dtype=np.int64
    )
    return pairs, RequestVariants(bodies, body_index)


# ------------------------------------------------------------------------ runs


@dataclass(frozen=True)
class Slack:
    """The live path's slack, given to the daemon and to the simulator alike:
    the core's margin and timer lead (ms; the daemon's defaults at normal
    priority) and the simulated intake delay (mean, ms)."""

    deadline_margin_ms: float = NORMAL_SLACK_MS[0]
    timer_lead_ms: float = NORMAL_SLACK_MS[1]
    intake_delay_ms: float = 0.1

    def daemon_env(self) -> dict[str, str]:
        return {
            "DEADLINE_MARGIN_MS": str(self.deadline_margin_ms),
            "TIMER_LEAD_MS": str(self.timer_lead_ms),
        }

    def core_options(self) -> dict[str, float]:
        return {
            "deadline_margin": self.deadline_margin_ms / 1000.0,
            "timer_lead": self.timer_lead_ms / 1000.0,
        }


def one_model_repository(root: Path, name: str = MODEL) -> Path:
    """A repository under `root` serving only `name` (`earlyexit` or
    `earlyexit-wide`), built with `BENCH_CHANNELS` channels on a
    `BENCH_SIDE`² input: the bundled model's config with that input shape,
    and its probes (1..16 steps) at that size."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {list(MODELS)}, got {name!r}")
    repo = root / "models"
    directory = repo / name
    directory.mkdir(parents=True)
    model = build_early_exit(channels=BENCH_CHANNELS, side=BENCH_SIDE, head_width=MODELS[name])
    (directory / "model.onnx").write_bytes(serialize(model))
    config = (BUNDLED_REPOSITORY / name / "config.yaml").read_text()
    bundled_shape = "[-1, 3, 16, 16]"
    if bundled_shape not in config:
        raise RuntimeError(f"the bundled {name} config no longer declares {bundled_shape}")
    config = config.replace(bundled_shape, f"[-1, 3, {BENCH_SIDE}, {BENCH_SIDE}]")
    (directory / "config.yaml").write_text(config)
    probes = [
        {"input": early_exit_input(s, seed=s, side=BENCH_SIDE)} for s in EARLY_EXIT_PROBE_STEPS
    ]
    (directory / "probes.npz").write_bytes(probes_bytes(probes))
    return repo


def alone_count(metrics_text: str) -> float:
    """Sum of the alone-time histogram's counts in a /metrics page."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(ALONE_COUNT):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_live(
    repo: Path,
    workload: Workload,
    arrivals: Arrivals,
    variants: RequestVariants,
    *,
    policy: str,
    sample_rate: float,
    threads: int,
    slack: Slack,
) -> dict[str, Any]:
    """One live run; the daemon is stopped whatever happens."""
    handle = start_daemon(
        repo,
        free_port(),
        policy=policy,
        emulated_devices=0,
        cpu_slices=1,
        threads_per_slice=threads,
        extra_env={"PROFILE_SAMPLE_RATE": str(sample_rate), **slack.daemon_env()},
        startup_timeout_s=300.0,
    )
    print(f"  daemon pid {handle.process.pid} ({policy}, rate {sample_rate:g})", file=sys.stderr)
    try:
        slo_ms = workload.models[0].slo_ms
        target = ModelTarget(workload.models[0].name, slo_ms, variants.bodies[0])
        bound = workload.duration_s + slo_ms / 1000.0 + RUN_GRACE_S
        result = asyncio.run(
            asyncio.wait_for(
                run_load(
                    handle.url, workload, targets=[target], arrivals=arrivals, variants=variants
                ),
                timeout=bound,
            )
        )
        metrics = httpx.get(f"{handle.url}/metrics", timeout=10.0).text
    finally:
        stop_daemon(handle)
    overall = result.summary["overall"]
    return {
        "finish_rate": overall["slo_attainment"],
        "goodput_rps": overall["goodput_rps"],
        "alone_times": alone_count(metrics),
        "startup_s": handle.startup_s,
        "summary": result.summary,
        "generator": result.generator,
    }


def run_simulated(
    workload: Workload, arrivals: Arrivals, policy: str, sample_rate: float, slack: Slack
) -> dict[str, Any]:
    """The simulator on the same arrivals, with the live path's slack."""
    params = slack.core_options()
    sampled = dataclasses.replace(workload, profile_sample_rate=sample_rate)
    result = simulate(
        sampled, policy, params, arrivals=arrivals, intake_delay_ms=slack.intake_delay_ms
    )
    return {
        "finish_rate": result.attainment,
        "goodput_rps": result.goodput,
        "params": params,
        "summary": result.summary,
    }


def plan_runs(policies: Sequence[str], sample_rates: Sequence[float]) -> list[tuple[str, float]]:
    """(policy, sample rate) pairs: orloj at every rate, the others at 0."""
    return [(p, r) for p in policies for r in (sample_rates if p == "orloj" else (0.0,))]


# ------------------------------------------------------------------------- CLI


def _fraction_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"sample rates must be fractions in [0, 1], got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.orloj_live", description=__doc__.split("\n")[0]
    )
    p.add_argument("--policies", default="orloj,clockwork", help="comma-separated policies")
    p.add_argument(
        "--model",
        choices=list(MODELS),
        default=MODEL,
        help="earlyexit (c0 ≈ 0 on a CPU) or earlyexit-wide (a 64 MiB head: c0 > 0) [%(default)s]",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds per run [{FULL_S:g}; quick {QUICK_S:g}]",
    )
    p.add_argument("--slo-multiple", type=float, default=3.0, help="SLO in P99s of the alone-time")
    p.add_argument("--load", type=float, default=0.5, help="fraction of the capacity at the mean")
    p.add_argument("--sample-rates", type=_fraction_list, default=[0.0, 0.05, 0.2])
    p.add_argument("--repeats", type=int, default=7, help="calibration runs per point")
    p.add_argument(
        "--deadline-margin-ms",
        type=float,
        default=Slack.deadline_margin_ms,
        help="DEADLINE_MARGIN_MS of the daemon, and the simulated core's [its default]",
    )
    p.add_argument(
        "--timer-lead-ms",
        type=float,
        default=Slack.timer_lead_ms,
        help="TIMER_LEAD_MS of the daemon, and the simulated core's [its default]",
    )
    p.add_argument(
        "--intake-delay-ms",
        type=float,
        default=Slack.intake_delay_ms,
        help="simulated mean delay from arrival to the core [%(default)s]",
    )
    p.add_argument("--threads", type=int, default=None, help="ONNX threads [all visible cores]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="smoke run: 2 s, one repeat, scratch out")
    p.add_argument("--out", type=Path, default=None, help=f"output folder [{DEFAULT_OUT}]")
    return p


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_live's finally: the daemon stops


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    known = policy_names()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in known]
    if unknown or not policies:
        print(f"error: unknown policies {unknown}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    duration = args.duration if args.duration is not None else (QUICK_S if args.quick else FULL_S)
    numbers = {
        "--duration": duration,
        "--load": args.load,
        "--slo-multiple": args.slo_multiple,
        "--repeats": args.repeats,
    }
    for flag, value in numbers.items():
        if not (value > 0 and math.isfinite(value)):
            print(f"error: {flag} must be a positive number, got {value}", file=sys.stderr)
            return 2
    slack = Slack(args.deadline_margin_ms, args.timer_lead_ms, args.intake_delay_ms)
    if any(not (v >= 0 and math.isfinite(v)) for v in dataclasses.astuple(slack)):
        print(f"error: slack must be finite and ≥ 0 ms, got {slack}", file=sys.stderr)
        return 2
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    threads = args.threads or len(os.sched_getaffinity(0))
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        doc = run_all(args, policies, duration, threads, slack)
    finally:
        signal.signal(signal.SIGTERM, previous)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(sanitize(doc), indent=1) + "\n")
    (out / "summary.md").write_text(markdown(doc))
    print_table(doc["runs"])
    print(f"written: {out / 'results.json'}, {out / 'summary.md'}", file=sys.stderr)
    return 0


def run_all(
    args: argparse.Namespace, policies: list[str], duration: float, threads: int, slack: Slack
) -> dict[str, Any]:
    """Calibrate, build the workload, run every (policy, rate) live and
    simulated; the results document."""
    with tempfile.TemporaryDirectory(prefix="orloj-live-") as tmp:
        repo = one_model_repository(Path(tmp), args.model)
        cal = calibrate(
            repo / args.model / "model.onnx",
            threads,
            batches=QUICK_BATCHES if args.quick else CAL_BATCHES,
            steps=QUICK_STEPS if args.quick else CAL_STEPS,
            repeats=1 if args.quick else args.repeats,
            side=BENCH_SIDE,
        )
        cal_doc = cal.to_dict()
        print_calibration(cal_doc)
        workload = build_workload(
            cal,
            load=args.load,
            slo_multiple=args.slo_multiple,
            duration_s=duration,
            seed=args.seed,
            model=args.model,
        )
        model = workload.models[0]
        arrivals, steps = step_arrivals(workload, generate_arrivals(workload))
        pairs, variants = request_bodies(arrivals.apps, steps, model.slo_ms, args.model)
        print(
            f"workload: {len(arrivals)} requests at {model.rate:.1f} r/s over {duration:g} s, "
            f"SLO {model.slo_ms:.2f} ms, {len(pairs)} distinct (app, steps) bodies",
            file=sys.stderr,
        )
        runs = []
        for policy, rate in plan_runs(policies, args.sample_rates):
            started = time.monotonic()
            live = run_live(
                repo,
                workload,
                arrivals,
                variants,
                policy=policy,
                sample_rate=rate,
                threads=threads,
                slack=slack,
            )
            sim = run_simulated(workload, arrivals, policy, rate, slack)
            runs.append({"policy": policy, "sample_rate": rate, "live": live, "simulated": sim})
            print(
                f"  {policy} @ {rate:g}: live {live['finish_rate']:.3f}, "
                f"sim {sim['finish_rate']:.3f} ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
    apps, counts = np.unique(arrivals.apps.astype(str), return_counts=True)
    return {
        "calibration": cal_doc,
        "workload": {
            "model": args.model,
            "duration_s": duration,
            "seed": args.seed,
            "load": args.load,
            "capacity_rps": model.rate / args.load,
            "rate_rps": model.rate,
            "slo_ms": model.slo_ms,
            "slo_multiple": args.slo_multiple,
            "alone_p99_ms": model.alone_p99_ms,
            "requests": len(arrivals),
            "apps": [dataclasses.asdict(a) for a in DEFAULT_APPS],
            "requests_per_app": dict(zip(apps.tolist(), counts.tolist(), strict=True)),
            "steps_histogram": np.bincount(steps, minlength=EARLY_EXIT_MAX_STEPS + 1)[1:].tolist(),
            "bodies": [list(p) for p in pairs],
            "simulated_profile_steps": EARLY_EXIT_MAX_STEPS,
        },
        "slack": dataclasses.asdict(slack),
        "runs": runs,
    }


if __name__ == "__main__":
    raise SystemExit(main())
