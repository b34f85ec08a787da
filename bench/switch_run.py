"""A daemon run under open-loop load while its configuration is switched
(`POST /v2/plan`, `POST /v2/devices/reshare`): every request accounted for,
and the within-SLO fraction around each switch. What bench.inss_shadow and
bench.ppipe_switch measure with.

`one_run` sends the workload (`bench.loadgen`) and, meanwhile, runs the
switches (`Switching`: a coroutine given the run's start, returning each
switch's answer with `switched_at_s`, seconds from that start). Checked:
requests sent = answered (status 200 or an explicit error: none without an
answer), and the daemon's Triton statistics count each model's successes
exactly as many times as the load generator received an answer with
outputs — none answered twice. Reported: the within-SLO fraction of the
run, of the requests sent within `WINDOW_S` after each switch, and of those
sent from each switch to the next.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.workloads.spec import Workload
from bench.loadgen import prepare_targets, run_load

WINDOW_S = 1.0  # "right after a switch"
# Given the run's start (time.monotonic()), make the switches; their answers.
Switching = Callable[[float], Awaitable[list[dict[str, Any]]]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def plan_posts(
    url: str,
    duration_s: float,
    started: float,
    plans: list[tuple[float, Path]],
    describe: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """Post each plan of `plans` (fraction of the run, file); each answer
    with when it was asked and when it was in force, from `started`;
    `describe` says in a line what the answer reports."""
    done = []
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        for fraction, path in plans:
            wait = started + fraction * duration_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            asked = time.monotonic() - started
            reply = await client.post("/v2/plan", content=path.read_bytes())
            if reply.status_code != 200:
                raise RuntimeError(f"posting {path.name}: {reply.text}")
            answer = reply.json()
            answer["asked_at_s"] = asked
            # In force once answered; a PPipe plan says when its switch was.
            answer["switched_at_s"] = asked + answer.get(
                "started_s", time.monotonic() - started - asked
            )
            done.append(answer)
            log(f"  {path.name}: {describe(answer)}")
    return done


def posting_plans(
    url: str,
    duration_s: float,
    plans: list[tuple[float, Path]],
    describe: Callable[[dict[str, Any]], str],
) -> Switching:
    """The switches of `plan_posts`, for `one_run`."""

    async def run(started: float) -> list[dict[str, Any]]:
        return await plan_posts(url, duration_s, started, plans, describe)

    return run


async def one_run(
    url: str,
    load: Workload,
    switching: Switching | None = None,
    windows_at: list[float] | None = None,
) -> dict[str, Any]:
    """One run (module docstring); the within-SLO windows start at each
    switch, or at `windows_at` (another run's switches, seconds from the
    start) when there are none."""
    names = [m.name for m in load.models]
    targets = await prepare_targets(url, load)  # checks each model with a request
    async with httpx.AsyncClient(base_url=url) as client:
        before = (await client.get("/v2/models/stats")).json()
    started = time.monotonic()
    running = asyncio.create_task(run_load(url, load, targets=targets))
    switches = await switching(started) if switching is not None else []
    result = await running
    async with httpx.AsyncClient(base_url=url) as client:
        after = (await client.get("/v2/models/stats")).json()
    records = result.records
    answered = records.status != 0
    ok = records.status == 200
    slo_ms = np.array([m.slo_ms for m in load.models])[records.model_index]
    slo_ok = ok & (records.latency_ms <= slo_ms)
    successes = {name: _successes(after, name) - _successes(before, name) for name in names}
    received = {name: int((ok & (records.model_index == i)).sum()) for i, name in enumerate(names)}
    starts = [s["switched_at_s"] for s in switches] if switches else (windows_at or [])
    windows = []
    for at in starts:
        near = (records.intended >= at) & (records.intended < at + WINDOW_S)
        windows.append(
            {
                "from_s": at,
                "requests": int(near.sum()),
                "within_slo": float(slo_ok[near].mean()) if near.any() else None,
            }
        )
    errors = records.errors()
    return {
        "sent": int(np.isfinite(records.sent).sum()),
        "answered": int(answered.sum()),
        "unanswered": int((~answered).sum()),
        "ok": int(ok.sum()),
        "errors": errors,
        "within_slo": float(slo_ok.mean()),
        "latency_ms_p50_p99": [
            float(np.nanpercentile(records.latency_ms[ok], q)) for q in (50, 99)
        ],
        "server_successes": successes,
        "client_answers_with_outputs": received,
        "answered_twice": sum(successes[n] - received[n] for n in names),
        "switches": switches,
        "after_switch": windows,
        "between_switches": between(records, slo_ok, starts, load.duration_s),
    }


def _successes(stats: dict[str, Any], name: str) -> int:
    return sum(
        int(m["inference_stats"]["success"]["count"])
        for m in stats["model_stats"]
        if m["name"] == name
    )


def between(records: Any, slo_ok: np.ndarray, starts: list[float], end_s: float) -> list[dict]:
    """Within SLO of the requests sent from each switch to the next (the
    first from the run's start): each configuration's own figure."""
    edges = [0.0, *starts, end_s]
    out = []
    for lo, hi in itertools.pairwise(edges):
        part = (records.intended >= lo) & (records.intended < hi)
        out.append(
            {
                "from_s": lo,
                "to_s": hi,
                "requests": int(part.sum()),
                "within_slo": float(slo_ok[part].mean()) if part.any() else None,
            }
        )
    return out


def render_runs(runs: dict[str, dict[str, Any]]) -> list[str]:
    """The runs' totals, and their within-SLO from each switch to the next."""
    out = [
        "| run | sent | answered | unanswered | answered twice | within SLO | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in runs.items():
        out.append(
            f"| {name} | {r['sent']} | {r['answered']} | {r['unanswered']} | "
            f"{r['answered_twice']} | {r['within_slo']:.2%} | {r['latency_ms_p50_p99'][1]:.1f} |"
        )
    spans = {name: r.get("between_switches", []) for name, r in runs.items()}
    if any(len(v) > 1 for v in spans.values()):
        out += ["", "| run | within SLO from each switch to the next |", "|---|---|"]
        for name, parts in spans.items():
            shown = ", ".join(
                f"{p['from_s']:.1f}–{p['to_s']:.1f} s: "
                + ("—" if p["within_slo"] is None else f"{p['within_slo']:.2%}")
                for p in parts
            )
            out.append(f"| {name} | {shown} |")
    return out


def window_cells(*windows: dict[str, Any]) -> list[str]:
    return ["—" if w.get("within_slo") is None else f"{w['within_slo']:.1%}" for w in windows]
