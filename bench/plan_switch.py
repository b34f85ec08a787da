"""A plan taken up while serving, under load (POST /v2/plan;
app/server/plan_switch.py): HERD's groups against one FLEX core on the same
devices, switched live, every request counted.

    python -m bench.plan_switch            # 3 phases of 10 s (~1 min)
    python -m bench.plan_switch --quick    # 3 phases of 4 s

README's HERD example (docs/shepherd.md): the six emulated models of
bench/repositories/herd-example on 8 emulated devices, policy `flex`, the
plan `python -m app plan herd bench/workloads/herd/example.yaml` makes.
Poisson arrivals at the example's stream rates × `--rate-scale` (0.2 by
default: 294 r/s, what this 2-core box drives over HTTP beside the daemon)
from `bench.loadgen`. The daemon starts without a plan (one FLEX core over
the 8 devices); at the end of phase 1 the HERD plan is posted, at the end
of phase 2 a one-group plan (every model on every device: one core again).

Reported per phase: requests sent, answered 200, answered 503 (by reason),
not answered (must be 0), within SLO and goodput; per switch its answer
(`switch_ms`, `handed_over`, `total_ms`). An answer given twice cannot reach
an HTTP client; the daemon's `requests_total` against the requests sent
checks it: they must be equal.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.cluster_sources import read_cluster
from app.planning.cli import main as plan_main
from app.planning.herd.plan import HerdPlan, ServingGroup
from app.results import Outcome
from app.server.settings import DEFAULT_METRICS_PREFIX
from app.workloads.spec import load_workload
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen.run import run_load
from bench.loadgen.targets import prepare_targets
from bench.progress import say

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "bench" / "repositories" / "herd-example"
CLUSTER = ROOT / "bench" / "workloads" / "herd" / "example.yaml"
WORKLOAD = ROOT / "bench" / "workloads" / "herd" / "live.yaml"
DEVICES = 8


def herd_plan(out: Path) -> bytes:
    """The HERD plan of README's example (its planner, 10 s at most)."""
    err = io.StringIO()
    argv = ["herd", str(CLUSTER), "--time-limit", "10", "--out", str(out)]
    if plan_main(argv, io.StringIO(), err, cluster_reader=read_cluster) != 0:
        raise SystemExit(f"the HERD planner failed: {err.getvalue()}")
    return out.read_bytes()


def one_group(models: list[str]) -> bytes:
    """A plan of one group: every model on every device (one core)."""
    group = ServingGroup(tuple(range(DEVICES)), tuple(models), (), 1.0)
    return json.dumps(HerdPlan("ilp", "paper", (group,)).to_dict()).encode()


async def _switches(
    url: str, plans: list[bytes], at_s: list[float], started: list[float]
) -> list[dict[str, Any]]:
    """POST each plan at its time from the load's start; their answers."""
    answers = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        while not started:
            await asyncio.sleep(0.01)
        for plan, at in zip(plans, at_s, strict=True):
            await asyncio.sleep(max(0.0, started[0] + at - time.perf_counter()))
            r = await client.post("/v2/plan", content=plan)
            if r.status_code != 200:
                raise SystemExit(f"POST /v2/plan: {r.status_code} {r.text}")
            answers.append({**r.json(), "at_s": round(time.perf_counter() - started[0], 3)})
            say(f"plan {r.json()['kind']} in force: {r.json()['groups']}")
    return answers


async def _requests_total(url: str) -> float:
    """The daemon's count of requests accepted, all models."""
    async with httpx.AsyncClient(base_url=url) as client:
        metrics = (await client.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(f"{DEFAULT_METRICS_PREFIX}requests_total{{")
    )


async def _run(url: str, rate_scale: float, phase_s: float, plans: list[bytes]) -> dict[str, Any]:
    workload = load_workload(WORKLOAD)
    targets = await prepare_targets(url, workload)  # its probe requests counted before
    before = await _requests_total(url)
    started: list[float] = []

    def progress(sent: int, done: int, total: int) -> None:
        if not started and sent:
            started.append(time.perf_counter())

    load = run_load(
        url, workload, rate_scale, duration_s=3 * phase_s, progress=progress, targets=targets
    )
    result, switches = await asyncio.gather(
        load, _switches(url, plans, [phase_s, 2 * phase_s], started)
    )
    records = result.records
    outcome = records.outcomes(np.asarray(result.slo_ms))
    phases = []
    for k, name in enumerate(("one FLEX core", "HERD groups", "one FLEX core again")):
        rows = (records.intended >= k * phase_s) & (records.intended < (k + 1) * phase_s)
        reasons = Counter(
            records.reasons[r] if r >= 0 else "-"
            for r, s in zip(records.reason[rows], records.status[rows], strict=True)
            if s == 503
        )
        good = int(np.sum(outcome[rows] == Outcome.GOOD))
        phases.append(
            {
                "phase": name,
                "sent": int(np.sum(rows)),
                "answered_200": int(np.sum(records.status[rows] == 200)),
                "answered_503": dict(reasons),
                "other_status": int(np.sum(~np.isin(records.status[rows], (0, 200, 503)))),
                "not_answered": int(np.sum(records.status[rows] == 0)),
                "within_slo": good / max(int(np.sum(rows)), 1),
                "goodput_rps": good / phase_s,
            }
        )
    counted = await _requests_total(url) - before
    return {
        "phases": phases,
        "switches": switches,
        "sent": len(records),
        "daemon_requests_total": counted,
    }


def _table(report: dict[str, Any]) -> str:
    lines = [
        "| phase | sent | 200 | 503 (reason: count) | no answer | within SLO | goodput r/s |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for p in report["phases"]:
        dropped = ", ".join(f"{k}: {v}" for k, v in sorted(p["answered_503"].items())) or "0"
        lines.append(
            f"| {p['phase']} | {p['sent']} | {p['answered_200']} | {dropped} | "
            f"{p['not_answered']} | {p['within_slo']:.1%} | {p['goodput_rps']:.1f} |"
        )
    lines += ["", "| switch at | to | groups | handed over | switch | whole request |"]
    lines.append("|---:|---|---:|---:|---:|---:|")
    for s in report["switches"]:
        lines.append(
            f"| {s['at_s']:.1f} s | {s['kind']} | {len(s['groups'])} | {s['handed_over']} | "
            f"{s['switch_ms']:.2f} ms | {s['total_ms']:.0f} ms |"
        )
    lines.append("")
    lines.append(
        f"sent {report['sent']}, counted by the daemon (requests_total) "
        f"{report['daemon_requests_total']:.0f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_switch", description=__doc__)
    parser.add_argument("--rate-scale", type=float, default=0.2)
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="phases of 4 s")
    parser.add_argument("--json", type=Path, help="write the report here too")
    args = parser.parse_args(argv)
    phase_s = 4.0 if args.quick else args.phase_s
    with tempfile.TemporaryDirectory() as scratch:
        say("planning HERD's groups (bench/workloads/herd/example.yaml, ≤ 10 s)")
        herd = herd_plan(Path(scratch) / "herd.json")
    models = sorted(p.name for p in REPOSITORY.iterdir() if (p / "config.yaml").exists())
    port = free_port()
    say(f"starting the daemon on {DEVICES} emulated devices (policy flex, no plan)")
    handle = start_daemon(REPOSITORY, port, policy="flex", emulated_devices=DEVICES, cpu_slices=0)
    try:
        say(f"3 phases of {phase_s:g} s at {args.rate_scale:g} × the example's rates")
        report = asyncio.run(_run(handle.url, args.rate_scale, phase_s, [herd, one_group(models)]))
    finally:
        stop_daemon(handle)
    report["machine"] = f"{platform.machine()}, {platform.processor() or 'cpu'}"
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(_table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    unanswered = sum(p["not_answered"] for p in report["phases"])
    return 1 if unanswered or report["daemon_requests_total"] != report["sent"] else 0


if __name__ == "__main__":
    sys.exit(main())
