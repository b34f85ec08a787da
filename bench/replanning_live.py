"""Re-planning while serving, live (REPLAN_S; app/server/replanning.py):
a partition plan in force when the rates shift, kept, re-planned by the
daemon itself, and replaced with hindsight at the shift.

    python -m bench.replanning_live            # 2 phases of 15 s per run, 3 runs (~2 min)
    python -m bench.replanning_live --quick    # phases of 6 s
    python -m bench.replanning_live --herd     # HERD's groups instead of the partition
    python -m bench.replanning_live --inss     # InSS's placement on 2 devices

Four emulated models (`m0` … `m3`: ℓ(b) = 8·b + 8 ms, SLO 100 ms, max batch
16) on 4 emulated devices, policy `symphony`, a partition plan of 2
sub-clusters (2 devices each) made by the planner for phase 1's rates:
m0 and m2 busy (120 r/s each), m1 and m3 quiet (20 r/s) — so m0 and m1
share a sub-cluster, m2 and m3 the other. In phase 2, m1 becomes busy and
m2 quiet: the plan in force puts 240 r/s on one sub-cluster, more than its
two devices serve within the SLO. Poisson arrivals from `bench.loadgen`,
the same for each run:

* **fixed** — `REPLAN_S` unset: the plan stays;
* **re-planned** — `REPLAN_S=2`, `REPLAN_GAIN=0.2`: the daemon re-plans
  from its own measured rates and takes the plan up while serving;
* **hindsight** — at the shift, the plan made for phase 2's rates is
  posted (`POST /v2/plan`).

With `--herd`, the same through Shepherd's HERD (app/server/herd_replanning.py):
the plans are HERD's groups (its ILP, `shared` burst tolerance, groups of
at most 2 devices) for each phase's rates, served under policy `flex`; phase
1's pairs a busy model with a quiet one in each group, and in phase 2 the
group holding m0 and m1 gets both busy models.

With `--inss`, the same through InSS's placement (app/server/inss_replanning.py):
the four models are lighter (ℓ(b) = 4·b + 5 ms at the whole device) and
share 2 emulated devices, policy `inss`; the plans are InSS's exact
placement for each phase's rates — phase 1's puts m1 (quiet then) on a
share too small for its phase-2 rate — taken up while serving with their
reshares, and share executors added and removed when they move models.

Reported per run and phase: within SLO and goodput; the re-planned run's
re-plans (when, from the daemon's log); requests sent and answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.planning.herd.config import config_from_dict as herd_config
from app.planning.herd.ilp import SolveOptions
from app.planning.herd.ilp import solve as herd_solve
from app.planning.partition.config import problem_from_dict
from app.planning.partition.milp import solve
from app.planning.partition.plan import plan_to_dict
from app.results import Outcome
from app.scheduling.profile import LatencyProfile
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen.run import run_load
from bench.progress import say

MODELS = ("m0", "m1", "m2", "m3")
ALPHA_MS, BETA_MS, SLO_MS, MAX_BATCH = 8.0, 8.0, 100.0, 16
DEVICES = 4
PHASE_RATES = ((120.0, 20.0, 120.0, 20.0), (120.0, 120.0, 20.0, 20.0))
RUNS = ("fixed", "re-planned", "hindsight")

CONFIG = """backend: emulated
max_batch_size: {max_batch}
slo_ms: {slo}
profile: {{alpha_ms: {alpha}, beta_ms: {beta}}}
devices: [emulated]
inputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]
outputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]
"""


# --inss: lighter models on fewer devices, so that they share them.
INSS_ALPHA_MS, INSS_BETA_MS, INSS_DEVICES = 4.0, 5.0, 2


def repository(root: Path, alpha_ms: float = ALPHA_MS, beta_ms: float = BETA_MS) -> Path:
    for name in MODELS:
        (root / name).mkdir(parents=True)
        (root / name / "config.yaml").write_text(
            CONFIG.format(max_batch=MAX_BATCH, slo=SLO_MS, alpha=alpha_ms, beta=beta_ms)
        )
    return root


def partition_plan(rates: tuple[float, ...]) -> dict[str, Any]:
    """The planner's partition (2 sub-clusters) for `rates`."""
    models = [{"name": n, "rate": r, "static_mb": 1} for n, r in zip(MODELS, rates, strict=True)]
    body = {"sub_clusters": 2, "r_max": 5000, "s_max_mb": 1000, "models": models}
    return plan_to_dict(solve(problem_from_dict(body, "the bench")))


def herd_plan(rates: tuple[float, ...]) -> dict[str, Any]:
    """HERD's groups (groups of ≤ 2 of the 4 devices, `shared` objective) for `rates`."""
    body = {
        "cluster": {"devices": DEVICES, "device_memory_mb": 16000, "max_group_size": 2},
        "objective": "shared",
        "max_batch": MAX_BATCH,
        "models": [
            {
                "name": n,
                "profile": {"alpha_ms": ALPHA_MS, "beta_ms": BETA_MS},
                "slo_ms": SLO_MS,
                "memory_mb": 1,
            }
            for n in MODELS
        ],
        "streams": [{"model": n, "rate": r} for n, r in zip(MODELS, rates, strict=True)],
    }
    problem, objective, _ = herd_config(body, "the bench")
    return herd_solve(problem, SolveOptions(objective, 10.0)).to_dict()


def inss_plan(rates: tuple[float, ...]) -> dict[str, Any]:
    """InSS's exact placement of the lighter models on 2 emulated devices for `rates`."""
    from app.planning.inss.config import problem_from_dict as inss_problem
    from app.planning.inss.placement import solve_exact
    from app.planning.inss.plan import plan_to_dict as inss_to_dict

    linear = {"alpha": INSS_ALPHA_MS, "beta": INSS_BETA_MS}
    body = {
        "share_step": 0.1,
        "devices": [
            {
                "name": f"emulated:{i}",
                "kind": "emulated",
                "memory_mb": 16000,
                "bandwidth_gb_per_s": 1000,
            }
            for i in range(INSS_DEVICES)
        ],
        "models": [
            {
                "name": n,
                "rate": r,
                "slo_ms": SLO_MS,
                "memory_mb": {1: 1, MAX_BATCH: 1},
                "latency_per_kind": {"emulated": {"running_time": {"linear_ms": linear}}},
            }
            for n, r in zip(MODELS, rates, strict=True)
        ],
    }
    return inss_to_dict(solve_exact(inss_problem(body, "the bench")))


def groups_of(plan: dict[str, Any]) -> list[list[str]]:
    """The models of each group (HERD), sub-cluster (partition) or device
    (InSS, with their shares) of a plan file."""
    body = plan["plan"]
    if "devices" in body and "models" in body:  # InSS
        share = {m["model"]: m["share"] for m in body["models"]}
        return [[f"{m} {share[m]:g}" for m in d["models"]] for d in body["devices"]]
    return [g["models"] for g in body.get("groups", body.get("sub_clusters", []))]


def workload(rates: tuple[float, ...], duration_s: float, seed: int) -> Workload:
    profile = LatencyProfile.linear(ALPHA_MS, BETA_MS, MAX_BATCH)
    models = [
        ModelSpec(n, profile, SLO_MS, MAX_BATCH, r, ArrivalSpec("poisson", {}))
        for n, r in zip(MODELS, rates, strict=True)
    ]
    devices = [DeviceSpec(f"emulated:{i}") for i in range(DEVICES)]
    return Workload("replanning-live", duration_s, seed, devices, models)


def arrivals(phase_s: float) -> Arrivals:
    """Phase 1's Poisson arrivals, then phase 2's, one schedule."""
    parts = [
        generate_arrivals(workload(rates, phase_s, seed=7 + k))
        for k, rates in enumerate(PHASE_RATES)
    ]
    times = np.concatenate([p.times + k * phase_s for k, p in enumerate(parts)])
    index = np.concatenate([p.model_index for p in parts]).astype(np.int32)
    return Arrivals(times, index)


async def _post_at(url: str, plan: dict[str, Any], at_s: float, started: list[float]) -> None:
    while not started:
        await asyncio.sleep(0.01)
    await asyncio.sleep(max(0.0, started[0] + at_s - time.perf_counter()))
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        r = await client.post("/v2/plan", content=json.dumps(plan).encode())
        if r.status_code != 200:
            raise SystemExit(f"POST /v2/plan: {r.status_code} {r.text}")


async def _load(url: str, phase_s: float, hindsight: dict[str, Any] | None) -> dict[str, Any]:
    schedule = arrivals(phase_s)
    spec = workload(PHASE_RATES[0], 2 * phase_s, seed=7)
    started: list[float] = []

    def progress(sent: int, done: int, total: int) -> None:
        if not started and sent:
            started.append(time.perf_counter())

    load = run_load(url, spec, arrivals=schedule, progress=progress)
    if hindsight is None:
        result = await load
    else:
        result, _ = await asyncio.gather(load, _post_at(url, hindsight, phase_s, started))
    records = result.records
    outcome = records.outcomes(np.asarray(result.slo_ms))
    phases = []
    for k in range(2):
        rows = (records.intended >= k * phase_s) & (records.intended < (k + 1) * phase_s)
        good = int(np.sum(outcome[rows] == Outcome.GOOD))
        phases.append(
            {
                "sent": int(np.sum(rows)),
                "answered": int(np.sum(records.status[rows] != 0)),
                "within_slo": good / max(int(np.sum(rows)), 1),
                "goodput_rps": good / phase_s,
            }
        )
    return {"phases": phases}


def _run(
    name: str,
    phase_s: float,
    root: Path,
    plans: list[dict[str, Any]],
    policy: str,
    devices: int = DEVICES,
) -> dict[str, Any]:
    plan_path = root / "plan.json"
    plan_path.write_text(json.dumps(plans[0]))
    env = {"PLAN": str(plan_path), "CPU_SLICES": "0"}
    if name == "re-planned":
        env.update(REPLAN_S="2", REPLAN_GAIN="0.2")
    handle = start_daemon(
        root / "models",
        free_port(),
        policy=policy,
        emulated_devices=devices,
        extra_env=env,
        log_level="info",
    )
    try:
        report = asyncio.run(_load(handle.url, phase_s, plans[1] if name == "hindsight" else None))
    finally:
        stop_daemon(handle)
    log = handle.log_path.read_text()
    lines = log.splitlines()
    report["replans"] = [
        line.split(" INFO ")[-1]
        for line in lines
        if "re-plan on rates" in line and "taken up" in line
    ]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replanning_live", description=__doc__)
    parser.add_argument("--phase-s", type=float, default=15.0)
    parser.add_argument("--quick", action="store_true", help="phases of 6 s")
    parser.add_argument("--json", type=Path, help="write the report here too")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--herd", action="store_true", help="HERD's groups, policy flex")
    mode.add_argument("--inss", action="store_true", help="InSS's placement, policy inss")
    args = parser.parse_args(argv)
    phase_s = 6.0 if args.quick else args.phase_s
    make = herd_plan if args.herd else inss_plan if args.inss else partition_plan
    policy = "flex" if args.herd else "inss" if args.inss else "symphony"
    devices = INSS_DEVICES if args.inss else DEVICES
    plans = [make(rates) for rates in PHASE_RATES]
    for k, plan in enumerate(plans):
        say(f"phase {k + 1}'s plan: {groups_of(plan)}")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        if args.inss:
            repository(root / "models", INSS_ALPHA_MS, INSS_BETA_MS)
        else:
            repository(root / "models")
        for name in RUNS:
            say(f"{name}: 2 phases of {phase_s:g} s")
            report[name] = _run(name, phase_s, root, plans, policy, devices)
    print(
        "| run | phase 1 within SLO | phase 2 within SLO | phase 2 goodput r/s | answered / sent |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in RUNS:
        p1, p2 = report[name]["phases"]
        answered = p1["answered"] + p2["answered"]
        sent = p1["sent"] + p2["sent"]
        print(
            f"| {name} | {p1['within_slo']:.1%} | {p2['within_slo']:.1%} | "
            f"{p2['goodput_rps']:.1f} | {answered} / {sent} |"
        )
    for line in report["re-planned"]["replans"]:
        print(f"re-planned: {line}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
