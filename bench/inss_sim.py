"""InSS vs Gpulet vs time-sharing, simulated on the paper's setting
(inss.txt §6.3: throughput at < 1 % SLO violations; the paper reports
+28 % over Gpulet, +48 % over GSLICE; our goal is ≥ +20 % over `gpulet`).

    python -m bench.inss_sim            # the full run (minutes)
    python -m bench.inss_sim --quick    # short runs, a coarse search (CI)

Options: --config (default bench/workloads/inss/paper-setting.yaml; also
paper-setting-saturating.yaml, gpulet-small.yaml — small models on
Gpulet's measured curves — and ppipe-large.yaml — large DNNs on PPipe's),
--slo-scale (every SLO × this), --duration, --dwell, --rel-tol, --seed,
--arrivals poisson,moving, --out-dir (default bench/results/inss; writes
sim.json and sim.md).

The setting: GPUs of one or two kinds, models with their rates and SLOs,
the latency model's fits (the config file says where each figure comes
from). Four systems serve it:

* **inss** — InSS as the server runs an InSS plan: the planner's exact
  plan (app/planning/inss/placement.py, `solve_exact`): each model on one
  device at its share, beside its planned co-runners, or a device's models
  in turn on the whole device (the plan's `time_shared` devices: one
  partition, one core), and policy `symphony` forming each share's
  batches (deadline-aware, non-work-conserving; on a time-shared device up
  to the plan's batch, which the planner's duty cycle assumes) — which
  serves more than InSS's own FIFO batching on the same shares on every
  setting measured (`inss-fifo`, BENCHMARKS.md), so it is the default
  policy of an InSS plan. Headroom: BDA only asks throughput ≥ λ, and a plan whose shares
  are all but saturated (ResNet50 at 95 % at the file's rates) misses SLOs
  under Poisson arrivals; so the plan is made for the rates × f, f the
  largest multiple in [1, 2] (to 1 %) at which the planner still serves
  every model — uniform headroom, decided from the latency model alone;
* **inss-fifo** — the same plan with InSS's own batching (§5.3): policy
  `inss` with BDA's planned batches, FIFO per model (app/scheduling/inss.py);
* **gpulet** — every GPU in two equal halves (50 %/50 %); the models,
  heaviest first (the least share of a half's time any half needs for
  them), each onto the half with the most spare predicted capacity after
  it (spare = 1 − Σ λ_i / h_i over the half's models, h_i = b_i / ℓ(b_i)
  alone at 50 %, b_i Gpulet's batch); policy `gpulet` (ℓ(b) ≤ SLO / 2,
  timeout SLO / 2). By load rather than by rate: by rate, ResNet50 (a low
  rate, a heavy model) is left the slower GPU's half;
* **time-sharing** — no shares: the same greedy onto whole GPUs, each GPU
  time-shared by its models (one core per GPU serving all of them, whole-GPU
  profiles, no interference: one model runs at a time); policy `symphony`,
  the project's strongest multi-model time-sharing scheduler (deadline-aware,
  non-work-conserving batching across models), so the gain over it is not
  an artefact of a weak baseline.

Key simplification: in all four systems every model runs on exactly one
device partition (a share, a half, or a whole GPU), so each model's latency
profile in the simulator is the latency model's prediction there — ℓ(b) =
t_inf (app/planning/inss/latency.py, `exec_time`) for b = 1 … 32 at the
partition's share beside the models running concurrently on the same GPU
(inss: its planned co-runners at their shares; gpulet: the models of the
other half at 50 %, all of them if a half holds several, a pessimistic
reading; time-sharing: none) — and the scheduling core needs no per-device
profiles. One simulation per partition (its own core, its own emulated
device of speed 1, its own models), the results summed: partitions share
nothing but the interference already in their profiles. Memory is checked
for every layout at batch 32 (it never binds here).

Load: a common factor s on every model's rate. Each system plans for the
rates it is offered: at each probed s the inss plan and the two greedy
placements are recomputed for the rates × s (InSS re-plans when rates
change; a placement made for other rates would handicap it). A model the
plan cannot serve has all its requests counted as dropped. Capacity: the
highest s with < 1 % of all requests late or dropped (bisection,
app/simulation/capacity_search.py, target 99 % within SLO; `--rel-tol`);
reported with the served requests/s (answered within SLO) there. Gains are
ratios of served requests/s at capacity.

Arrivals, the same sequence for every system at a given s (one seed):

* `poisson` — Poisson at the config's rates × s;
* `moving` — each model's Poisson rate steps between 1.3 and 0.7 of its
  rate (a two-state MMPP cycling with exponential dwells of mean `--dwell`
  seconds; half the models start high, half low), the plans made for the
  mean rates: no system re-plans within a run.

Reading the result: on the paper's setting the running times are
(α·b + β)/ρ, a share ρ doing exactly ρ of the whole GPU's work (the file
calls the line pessimistic where Tables 2–3 saturate), so sharing a GPU
spatially never beats running its models in turn at full speed there —
sharing only adds interference and, at a smaller share, longer batches
within the same SLO; the planner, which may time-share a device itself,
keeps no spatial split there. On real-device curves
(gpulet-small.yaml: o_r(b, ρ) = t₁(b)·max(1, u(b)/ρ) from Gpulet's measured
SM utilisation, app/planning/inss/measured.py) a small model at a small
batch leaves most of a GPU idle, and spatial sharing wins where the SLOs
keep batches small (`--slo-scale` moves them).

Output: a table on stdout; `<out-dir>/sim.json` (options, per arrivals and
system: capacity, served requests/s, violations, the search's probes, the
layout at capacity; the gains) and `sim.md` (the table). Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from app.planning.inss.config import load_problem
from app.planning.inss.latency import CoRunner, exec_time
from app.planning.inss.placement import solve_exact
from app.planning.inss.plan import Plan
from app.planning.inss.problem import Device, DeviceEvaluator, Problem
from app.results import Outcome
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.simulation.capacity_search import find_capacity
from app.simulation.engine import run_simulation
from app.simulation.run import SimResult
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "bench" / "workloads" / "inss" / "paper-setting.yaml"
OUT_DIR = ROOT / "bench" / "results" / "inss"
# system → policy
SYSTEMS = {
    "inss": "symphony",
    "inss-fifo": "inss",
    "gpulet": "gpulet",
    "time-sharing": "symphony",
}
ARRIVALS = ("poisson", "moving")
MAX_BATCH = 32
MOVE = 0.3  # the moving rates' step: × (1 ± MOVE)
TARGET = 0.99
HEADROOM_MAX = 2.0  # inss plans for at most the rates × 2 (utilisation ≥ 1/2 of its shares)
PAPER = {"gain_over_gpulet": 0.28, "gain_over_gslice": 0.48}
GOAL_GAIN_OVER_GPULET = 0.20
FULL = {"duration": 60.0, "dwell": 20.0, "rel_tol": 0.01}
QUICK = {"duration": 3.0, "dwell": 1.0, "rel_tol": 0.1}


@dataclass(frozen=True)
class Partition:
    """One core's piece of a GPU: the share it runs at, its models, their
    batch (the plan's; None: the policy's own rule) and predicted ℓ(b)."""

    device: str
    share: float
    models: tuple[str, ...]
    batch: Mapping[str, int] | None
    profiles: Mapping[str, tuple[float, ...]]  # model → ℓ(b), seconds, b = 1 … MAX_BATCH


@dataclass(frozen=True)
class Layout:
    system: str
    policy: str
    partitions: tuple[Partition, ...]
    unserved: tuple[str, ...]
    headroom: float | None = None  # inss: the rate multiple planned for

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "unserved": list(self.unserved),
            "headroom": self.headroom,
            "partitions": [
                {
                    "device": p.device,
                    "share": p.share,
                    "models": list(p.models),
                    "batch": None if p.batch is None else dict(p.batch),
                    "exec_ms_b1": {m: round(p.profiles[m][0] * 1e3, 3) for m in p.models},
                }
                for p in self.partitions
            ],
        }


# ------------------------------------------------------------------- layouts


def scaled(problem: Problem, scale: float) -> Problem:
    """The problem with every rate × `scale`."""
    return replace(problem, models=tuple(replace(m, rate=m.rate * scale) for m in problem.models))


def with_slos_scaled(problem: Problem, scale: float) -> Problem:
    """The problem with every SLO × `scale`."""
    return replace(problem, models=tuple(replace(m, slo_s=m.slo_s * scale) for m in problem.models))


def profile(
    evaluator: DeviceEvaluator,
    device: Device,
    model: str,
    share: float,
    co_runners: Mapping[str, float],
) -> tuple[float, ...]:
    """ℓ(b) for b = 1 … MAX_BATCH: t_inf of `model` at `share` on `device`
    beside `co_runners` (model → share)."""
    own = evaluator.latency(model, device)
    co = tuple(CoRunner.of(evaluator.latency(v, device), s) for v, s in co_runners.items())
    return tuple(exec_time(own, device.latency, b, share, co) for b in range(1, MAX_BATCH + 1))


def inss_plan(problem: Problem) -> tuple[Plan, float]:
    """The exact plan for the rates × f, f the largest multiple in
    [1, HEADROOM_MAX] (to 1 %) the planner still serves entirely (module
    docstring); at f = 1 when none is served entirely."""
    top = solve_exact(scaled(problem, HEADROOM_MAX))
    if top.feasible:
        return top, HEADROOM_MAX
    best, lo, hi = solve_exact(problem), 1.0, HEADROOM_MAX
    if not best.feasible:
        return best, 1.0
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        plan = solve_exact(scaled(problem, mid))
        if plan.feasible:
            best, lo = plan, mid
        else:
            hi = mid
    return best, lo


def inss_layout(problem: Problem) -> Layout:
    """The exact plan (with headroom): one partition per served model, or
    one per time-shared device holding its models (whole-device profiles)."""
    return plan_layout(problem, *inss_plan(problem))


def plan_layout(problem: Problem, plan: Plan, headroom: float | None = None) -> Layout:
    """`plan` served on `problem`'s devices and latency models (inss_layout)."""
    evaluator = DeviceEvaluator(problem)
    devices = {d.name: d for d in problem.devices}
    parts = []
    time_shared = cast(list[str], plan.details.get("time_shared", []))
    for dp in plan.devices:
        if dp.device in time_shared:
            batches = {m: cast(int, plan.model(m).batch) for m in dp.models}
            ells = {m: profile(evaluator, devices[dp.device], m, 1.0, {}) for m in dp.models}
            parts.append(Partition(dp.device, 1.0, dp.models, batches, ells))
            continue
        shares = {m: plan.model(m).share for m in dp.models}
        for name in dp.models:
            mp = plan.model(name)
            assert mp.share is not None and mp.batch is not None
            co = {v: cast(float, s) for v, s in shares.items() if v != name}
            ell = profile(evaluator, devices[dp.device], name, mp.share, co)
            parts.append(Partition(dp.device, mp.share, (name,), {name: mp.batch}, {name: ell}))
    unserved = tuple(plan.unserved())
    return Layout("inss-fifo", SYSTEMS["inss-fifo"], tuple(parts), unserved, headroom)


def half_slo_batch(ell: Sequence[float], slo_s: float) -> int:
    """Gpulet's batch: the largest b with ℓ(b) ≤ SLO / 2, at least 1."""
    return max(1, sum(1 for t in ell if t <= slo_s / 2))


def greedy_layout(problem: Problem, system: str) -> Layout:
    """`gpulet` (two halves per GPU) or `time-sharing` (whole GPUs): the
    models by rate onto the slot with the most spare capacity after them
    (module docstring), then each model's profile beside what runs with it."""
    share = 0.5 if system == "gpulet" else 1.0
    evaluator = DeviceEvaluator(problem)
    slots = [(d, half) for d in problem.devices for half in range(round(1 / share))]
    # λ_i / h_i of each model in each slot: the share of the slot's time it takes.
    demand = {}
    for spec in problem.models:
        for k, (device, _) in enumerate(slots):
            ell = profile(evaluator, device, spec.name, share, {})
            b = half_slo_batch(ell, spec.slo_s)
            demand[spec.name, k] = spec.rate * ell[b - 1] / b
    load = [0.0] * len(slots)
    members: list[list[str]] = [[] for _ in slots]
    heaviest = sorted(
        problem.models, key=lambda m: (-min(demand[m.name, k] for k in range(len(slots))), m.name)
    )
    for spec in heaviest:
        after, k = min((load[k] + demand[spec.name, k], k) for k in range(len(slots)))
        load[k] = after
        members[k].append(spec.name)
    parts = []
    for k, (device, half) in enumerate(slots):
        if not members[k]:
            continue
        # Running at the same time: the models of the device's other halves.
        others = [
            m for j, (d, h) in enumerate(slots) if d is device and h != half for m in members[j]
        ]
        co = dict.fromkeys(others, share)
        ell = {m: profile(evaluator, device, m, share, co) for m in members[k]}
        parts.append(Partition(device.name, share, tuple(members[k]), None, ell))
    return Layout(system, SYSTEMS[system], tuple(parts), ())


def check_memory(problem: Problem, layout: Layout) -> None:
    """Every device holds its models at batch MAX_BATCH (the most a core sends)."""
    for device in problem.devices:
        names = [m for p in layout.partitions if p.device == device.name for m in p.models]
        used = sum(problem.model(m).memory.at(MAX_BATCH) for m in names)
        if used > device.memory_bytes:
            raise ValueError(
                f"{layout.system}: models {names} need {used / 1e6:.0f} MB on {device.name} "
                f"({device.memory_bytes / 1e6:.0f} MB)"
            )


def shares_layout(problem: Problem, system: str) -> Layout:
    """The inss plan's placement and shares, batches left to the policy —
    up to the plan's batch on a time-shared device, as the daemon serves a
    plan (app/server/plans.py, `place_inss`)."""
    return as_served(inss_layout(problem), system)


def as_served(layout: Layout, system: str = "inss") -> Layout:
    """An InSS plan's layout under `system`'s policy, which forms its own
    batches on a share (shares_layout)."""
    parts = tuple(p if len(p.models) > 1 else replace(p, batch=None) for p in layout.partitions)
    return replace(layout, system=system, policy=SYSTEMS[system], partitions=parts)


def layout_for(problem: Problem, system: str) -> Layout:
    if system == "inss-fifo":
        layout = inss_layout(problem)
    elif system == "inss":
        layout = shares_layout(problem, system)
    else:
        layout = greedy_layout(problem, system)
    check_memory(problem, layout)
    return layout


# ---------------------------------------------------------------- simulation


@dataclass
class SystemRun:
    """One probe's outcome, with the `summary["overall"]` that
    capacity_search.find_capacity reads (the only part it reads)."""

    summary: dict[str, Any]
    layout: Layout


def workload(problem: Problem, arrivals: str, duration: float, dwell: float, seed: int) -> Workload:
    """The models' arrival processes (their profiles here are unused)."""
    models = []
    for i, m in enumerate(problem.models):
        dummy = LatencyProfile.linear(1.0, 1.0, MAX_BATCH)
        if arrivals == "poisson":
            spec = ArrivalSpec("poisson", {})
            rate: float | None = m.rate
        else:
            states = [{"rate": m.rate * (1 + MOVE), "dwell_s": dwell}]
            states.append({"rate": m.rate * (1 - MOVE), "dwell_s": dwell})
            spec = ArrivalSpec("mmpp", {"states": states, "order": "cycle", "initial": i % 2})
            rate = None
        models.append(ModelSpec(m.name, dummy, m.slo_s * 1e3, MAX_BATCH, rate, spec))
    return Workload("inss-paper-setting", duration, seed, [DeviceSpec("gpu")], models)


def simulate_layout(
    problem: Problem, layout: Layout, arrivals: Arrivals, duration: float
) -> dict[str, Any]:
    """Each partition on its own core and device; outcomes summed."""
    names = [m.name for m in problem.models]
    good = np.zeros(len(names), dtype=np.int64)
    late = np.zeros(len(names), dtype=np.int64)
    offered = arrivals.counts(len(names))
    for part in layout.partitions:
        order = sorted(names.index(m) for m in part.models)
        keep = np.isin(arrivals.model_index, order)
        local = np.searchsorted(np.array(order), arrivals.model_index[keep])  # partition's index
        infos = []
        # The plan's batches: policy inss's `batch`; for another policy
        # (symphony on a time-shared device) each model's max batch.
        planned = dict(part.batch or {})
        caps = {} if layout.policy == "inss" else planned
        for i in order:
            spec = problem.models[i]
            ell = LatencyProfile((0.0, *part.profiles[spec.name]))
            cap = caps.get(spec.name, MAX_BATCH)
            infos.append(ModelInfo(spec.name, ell, spec.slo_s, cap, spec.rate))
        devices = [DeviceInfo(0, f"{part.device}@{part.share:g}", 1.0)]
        params = {"batch": planned} if layout.policy == "inss" and planned else {}
        core = make_scheduler(layout.policy, infos, devices, **params)
        trace = run_simulation(core, infos, devices, arrivals.times[keep], local)
        for j, i in enumerate(order):
            mine = trace.model_index == j
            good[i] += int((trace.status[mine] == Outcome.GOOD).sum())
            late[i] += int((trace.status[mine] == Outcome.LATE).sum())
    total = int(offered.sum())
    served_good = int(good.sum())
    per_model = {
        n: {
            "offered": int(offered[i]),
            "good": int(good[i]),
            "late": int(late[i]),
            "dropped": int(offered[i] - good[i] - late[i]),
        }
        for i, n in enumerate(names)
    }
    overall = {
        "requests": total,
        "offered_rps": total / duration,
        "goodput_rps": served_good / duration,
        "slo_attainment": served_good / total if total else 1.0,
        "violations": 1.0 - served_good / total if total else 0.0,
    }
    return {"overall": overall, "models": per_model}


def capacity(
    problem: Problem, system: str, arrivals: str, args: argparse.Namespace
) -> dict[str, Any]:
    runs: dict[float, SystemRun] = {}

    def run(scale: float) -> SimResult:
        at = scaled(problem, scale)
        layout = layout_for(at, system)
        load = workload(problem, arrivals, args.duration, args.dwell, args.seed)
        summary = simulate_layout(at, layout, generate_arrivals(load, scale), args.duration)
        runs[scale] = SystemRun(summary, layout)
        print(
            f"  {arrivals:8} {system:13} × {scale:6.3f}: "
            f"{summary['overall']['violations']:7.2%} late or dropped",
            file=sys.stderr,
        )
        return cast(SimResult, runs[scale])  # find_capacity reads .summary only

    result = find_capacity(run, target=TARGET, lo=0.5, hi=1.0, rel_tol=args.rel_tol)
    best = runs.get(result.rate_scale) if result.rate_scale is not None else None
    return {
        "policy": SYSTEMS[system],
        "capacity_scale": result.rate_scale or 0.0,
        "offered_rps": result.capacity_rps,
        "served_rps": best.summary["overall"]["goodput_rps"] if best else 0.0,
        "violations": best.summary["overall"]["violations"] if best else None,
        "status": result.status,
        "models": best.summary["models"] if best else {},
        "layout": best.layout.to_dict() if best else None,
        "probes": [asdict(p) for p in result.probes],
    }


def gains(systems: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    inss = systems["inss"]["served_rps"]
    out: dict[str, float | None] = {}
    for other in ("inss-fifo", "gpulet", "time-sharing"):
        base = systems[other]["served_rps"]
        out[f"inss_over_{other}"] = inss / base - 1.0 if base > 0 else None
    return out


# ------------------------------------------------------------------- report


def render(body: dict[str, Any]) -> str:
    lines = [
        f"InSS vs Gpulet vs time-sharing on {Path(body['options']['config']).name}, SLOs × "
        f"{body['options']['slo_scale']:g} ({body['options']['duration']:g} s runs; "
        "capacity: < 1 % late or dropped)",
        "",
        "| arrivals | system | policy | load factor | offered r/s | served r/s | violations |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for arrivals, cell in body["arrivals"].items():
        for system, r in cell["systems"].items():
            v = r["violations"]
            lines.append(
                f"| {arrivals} | {system} | {r['policy']} | {r['capacity_scale']:.3f} | "
                f"{r['offered_rps']:.0f} | {r['served_rps']:.0f} | "
                f"{'—' if v is None else f'{v:.2%}'} |"
            )
    others = ("inss-fifo", "gpulet", "time-sharing")
    lines += ["", "| arrivals | " + " | ".join(f"inss over {o}" for o in others) + " |"]
    lines.append("|---|" + "---:|" * len(others))
    for arrivals, cell in body["arrivals"].items():
        g = cell["gains"]
        gain = [g[f"inss_over_{o}"] for o in others]
        cols = ["—" if x is None else f"{x:+.1%}" for x in gain]
        lines.append(f"| {arrivals} | " + " | ".join(cols) + " |")
    lines += [
        "",
        f"Paper: +{PAPER['gain_over_gpulet']:.0%} over Gpulet; "
        f"goal ≥ +{GOAL_GAIN_OVER_GPULET:.0%} over `gpulet`.",
        f"Command: `{body['command']}`",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.inss_sim", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short runs and a coarse search (CI)")
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--duration", type=float, help="simulated seconds per run (default 60; 6)")
    p.add_argument("--dwell", type=float, help="moving rates: mean seconds per step (20; 2)")
    p.add_argument("--rel-tol", type=float, help="capacity search tolerance (0.01; 0.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--slo-scale", type=float, default=1.0, help="every model's SLO × this (default 1)"
    )
    p.add_argument("--arrivals", default=",".join(ARRIVALS), help="poisson,moving")
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not (args.duration > 0 and args.dwell > 0 and args.rel_tol > 0):
        raise SystemExit("--duration, --dwell and --rel-tol must be > 0")
    chosen = [a for a in args.arrivals.split(",") if a]
    unknown = sorted(set(chosen) - set(ARRIVALS))
    if unknown or not chosen:
        raise SystemExit(f"--arrivals: unknown {unknown}; choose from {', '.join(ARRIVALS)}")
    if not (math.isfinite(args.slo_scale) and args.slo_scale > 0):
        raise SystemExit("--slo-scale must be a finite number > 0")
    problem = with_slos_scaled(load_problem(args.config), args.slo_scale)
    started = time.perf_counter()
    cells: dict[str, Any] = {}
    for arrivals in chosen:
        systems = {}
        for system in SYSTEMS:
            print(f"{arrivals} {system}", file=sys.stderr)
            systems[system] = capacity(problem, system, arrivals, args)
        cells[arrivals] = {"systems": systems, "gains": gains(systems)}
    argv_text = sys.argv[1:] if argv is None else list(argv)
    body = {
        "command": shlex.join(["python", "-m", "bench.inss_sim", *argv_text]),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "config_rates": {m.name: m.rate for m in problem.models},
        "paper": PAPER,
        "goal_gain_over_gpulet": GOAL_GAIN_OVER_GPULET,
        "target_within_slo": TARGET,
        "arrivals": cells,
        "wall_s": time.perf_counter() - started,
    }
    table = render(body)
    print(table)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "sim.json").write_text(json.dumps(body, indent=2) + "\n")
    (args.out_dir / "sim.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
