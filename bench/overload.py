"""Overload soak (issue 6): the daemon at a multiple of its capacity, then at
normal load; goodput, refusals and memory (RSS) per second.

    python -m bench.overload                       # 30 s at 3× capacity, then 15 s at 0.5×
    python -m bench.overload --overload-s 5 --calm-s 5 --json out.json

It starts the daemon (`python -m app serve`, this checkout) on a small
emulated setup whose capacity is known from its profile: one model with
ℓ(b) = 10·b + 50 ms, batches of ≤ 4, on 2 emulated devices, so at most
2 · 4 / 90 ms ≈ 89 req/s; requests carry a 300 ms SLO. Requests are sent
open loop (fixed intervals) with the load generator's raw client
(`bench.loadgen`: pre-built request bytes on keep-alive connections), so a
slow answer never slows the sender. Every second it samples the resident
memory of the daemon and of its executor processes (from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen.client import RawSender, reply_reason

# ℓ(b) = 10·b + 50 ms, max batch 4: 2 devices serve 2 · 4 / 0.090 ≈ 89 req/s.
MODEL_CONFIG = (
    "backend: emulated\n"
    "max_batch_size: 4\n"
    "slo_ms: 2000\n"
    "profile: {alpha_ms: 10.0, beta_ms: 50.0}\n"
    "devices: [emulated]\n"
    "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
    "outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]\n"
)
MODEL = "slow"
DEVICES = 2
CAPACITY_RPS = DEVICES * 4 / 0.090
SLO_MS = 300.0


@dataclass(slots=True)
class Answer:
    """One request: when it was meant to go (s from the start), its status
    (-1: no answer within the timeout — a hang; -2: connection error), the
    error reason, seconds from sending to the answer, and when it was sent
    (time.monotonic())."""

    at: float
    status: int
    reason: str
    latency: float
    sent: float


def write_repository(root: Path) -> Path:
    (root / MODEL).mkdir(parents=True, exist_ok=True)
    (root / MODEL / "config.yaml").write_text(MODEL_CONFIG)
    return root


def body(slo_ms: float | None = SLO_MS) -> bytes:
    doc: dict[str, Any] = {"model": MODEL, "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}
    if slo_ms is not None:
        doc["slo_ms"] = slo_ms
    return json.dumps(doc, separators=(",", ":")).encode()


async def open_loop(
    url: str,
    phases: list[tuple[float, float]],
    *,
    slo_ms: float | None = SLO_MS,
    connections: int = 256,
    timeout_s: float = 15.0,
) -> list[Answer]:
    """Send at `rate` req/s for `seconds`, phase after phase, open loop."""
    sender = RawSender(url, [body(slo_ms)], connections)
    await sender.warm(min(connections, 64))
    answers: list[Answer] = []

    async def one(at: float) -> None:
        sent = time.monotonic()
        try:
            reply = await asyncio.wait_for(sender.send(0, lambda: None), timeout_s)
            reason = "" if reply.status == 200 else reply_reason(reply.status, bytes(reply.body))
            answers.append(Answer(at, reply.status, reason, time.monotonic() - sent, sent))
        except TimeoutError:
            answers.append(Answer(at, -1, "timeout", time.monotonic() - sent, sent))
        except Exception as exc:  # refused or cut (e.g. after shutdown): not a hang
            answers.append(Answer(at, -2, type(exc).__name__, time.monotonic() - sent, sent))

    tasks = []
    start = time.monotonic()
    offset = 0.0
    for rate, seconds in phases:
        for i in range(int(rate * seconds)):
            at = offset + i / rate
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(at)))
        offset += seconds
    await asyncio.gather(*tasks)
    await sender.aclose()
    answers.sort(key=lambda a: a.at)
    return answers


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident memory (MB) of process `pid` and of its children together."""

    def rss(p: Path) -> float:
        for line in (p / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    own = rss(Path(f"/proc/{pid}"))
    children = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                children += rss(entry)
        except (OSError, ValueError):
            continue
    return own, children


def per_second(answers: list[Answer], samples: list[tuple[float, float, float]], slo_s: float):
    rows = []
    seconds = int(max((a.at for a in answers), default=0)) + 1
    by_second: dict[int, list[Answer]] = {}
    for a in answers:
        by_second.setdefault(int(a.at), []).append(a)
    for s in range(seconds):
        group = by_second.get(s, [])
        codes = Counter(a.status for a in group)
        good = sum(1 for a in group if a.status == 200 and a.latency <= slo_s)
        refused = sorted(a.latency for a in group if a.status in (429, 503))
        rss = [x for x in samples if s <= x[0] < s + 1]
        rows.append(
            {
                "second": s,
                "offered": len(group),
                "goodput": good,
                "ok": codes[200],
                "http_429": codes[429],
                "http_503": codes[503],
                "other": sum(n for c, n in codes.items() if c not in (200, 429, 503)),
                "refusal_p99_ms": round(refused[int(0.99 * (len(refused) - 1))] * 1000, 1)
                if refused
                else None,
                "daemon_rss_mb": round(rss[-1][1], 1) if rss else None,
                "executors_rss_mb": round(rss[-1][2], 1) if rss else None,
            }
        )
    return rows


def executor_pids(pid: int) -> dict[str, int]:
    """Executor processes of daemon `pid` by device name (their process
    title is `dsrv-<device>`)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid and comm.startswith("dsrv-"):
            found[comm.removeprefix("dsrv-")] = int(entry.name)
    return found


async def _soak(
    url: str, pid: int, phases: list[tuple[float, float]], kill_at: float | None = None
):
    samples: list[tuple[float, float, float]] = []
    start = time.monotonic()
    done = asyncio.Event()

    async def kill() -> None:
        assert kill_at is not None
        await asyncio.sleep(kill_at)
        victim = executor_pids(pid).get("emulated:0")
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
            print(f"SIGKILL executor emulated:0 (pid {victim}) at {kill_at:.1f} s", flush=True)

    async def sample() -> None:
        while not done.is_set():
            own, children = rss_mb(pid)
            samples.append((time.monotonic() - start, own, children))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.5)

    sampler = asyncio.create_task(sample())
    killer = asyncio.create_task(kill()) if kill_at is not None else None
    answers = await open_loop(url, phases)
    if killer is not None:
        await killer
    done.set()
    await sampler
    return answers, samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__)
    parser.add_argument("--factor", type=float, default=3.0, help="overload, × capacity")
    parser.add_argument("--overload-s", type=float, default=30.0)
    parser.add_argument("--calm-factor", type=float, default=0.5, help="normal load, × capacity")
    parser.add_argument("--calm-s", type=float, default=15.0)
    parser.add_argument("--max-queue", type=int, default=48, help="MAX_QUEUE of the daemon")
    parser.add_argument("--arena-slots", type=int, default=256, help="ARENA_SLOTS of the daemon")
    parser.add_argument("--policy", default="symphony")
    parser.add_argument(
        "--deadline-margin-ms",
        type=float,
        default=50.0,
        help="DEADLINE_MARGIN_MS of the daemon: HTTP and client overhead on a small "
        "shared machine is 10-30 ms under overload, which the default 3 ms does not cover",
    )
    parser.add_argument(
        "--kill-at", type=float, help="SIGKILL executor emulated:0 this many seconds in"
    )
    parser.add_argument("--json", type=Path, help="write the per-second table here")
    args = parser.parse_args(argv)

    repo = write_repository(Path(tempfile.mkdtemp(prefix="overload-")) / "repo")
    handle = start_daemon(
        repo,
        free_port(),
        policy=args.policy,
        emulated_devices=DEVICES,
        cpu_slices=0,
        extra_env={
            "MAX_QUEUE": str(args.max_queue),
            "ARENA_SLOTS": str(args.arena_slots),
            "DEADLINE_MARGIN_MS": str(args.deadline_margin_ms),
        },
    )
    phases = [
        (args.factor * CAPACITY_RPS, args.overload_s),
        (args.calm_factor * CAPACITY_RPS, args.calm_s),
    ]
    try:
        answers, samples = asyncio.run(_soak(handle.url, handle.process.pid, phases, args.kill_at))
    finally:
        code = stop_daemon(handle)
    respawns = [
        float(x)
        for x in re.findall(r"again ([0-9.]+) s after it failed", handle.log_path.read_text())
    ]
    rows = per_second(answers, samples, SLO_MS / 1000)
    over = [r for r in rows[1 : int(args.overload_s)]]  # skip the first second (ramp)
    calm = [r for r in rows[int(args.overload_s) + 1 :]]
    summary = {
        "capacity_rps": round(CAPACITY_RPS, 1),
        "phases": [{"rate_rps": round(r, 1), "seconds": s} for r, s in phases],
        "overload_goodput_rps": round(float(np.mean([r["goodput"] for r in over])), 1),
        "overload_served_rps": round(float(np.mean([r["ok"] for r in over])), 1),
        "calm_goodput_fraction": round(
            sum(r["goodput"] for r in calm) / max(1, sum(r["offered"] for r in calm)), 4
        ),
        "hangs": sum(1 for a in answers if a.status == -1),
        "statuses": dict(Counter(a.status for a in answers)),
        "reasons": dict(Counter(a.reason for a in answers if a.reason)),
        "daemon_rss_mb": {"min": min(s[1] for s in samples), "max": max(s[1] for s in samples)},
        "executors_rss_mb": {"min": min(s[2] for s in samples), "max": max(s[2] for s in samples)},
        "daemon_exit_code": code,
        "respawn_s": respawns,
    }
    print(json.dumps(summary, indent=2))
    print(
        "second offered served goodput 429 503 other refusal_p99_ms daemon_rss_mb executors_rss_mb"
    )
    for r in rows:
        print(
            f"{r['second']:>6} {r['offered']:>7} {r['ok']:>6} {r['goodput']:>7} {r['http_429']:>4} "
            f"{r['http_503']:>4} {r['other']:>5} {r['refusal_p99_ms']!s:>14} "
            f"{r['daemon_rss_mb']!s:>13} {r['executors_rss_mb']!s:>16}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "per_second": rows, "args": vars(args)}, default=str)
        )
    return 0 if summary["hangs"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
