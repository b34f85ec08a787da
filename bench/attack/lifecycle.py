"""Attacks on the daemon's life rather than its input: SIGTERM under load
and hung executors (issue 19, items 4 and 8).

SIGTERM: a steady client (the normal one, with a longer timeout) and two
`long` requests (6 s batches) in flight; SIGTERM once the long ones run.
Every request that was accepted must get an answer (no 500, no cut
connection); a request refused at connect (the listener closed) is fine.
The daemon must exit within `SHUTDOWN_GRACE_S` + 2 s.

Hung executors: every executor SIGSTOPped while idle; readiness must stop
saying 200 within about a second. They are SIGCONTed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections import Counter

import httpx

from bench.attack.daemon import LONG_MODEL, NORMAL_MODEL, traceback_count
from bench.attack.net import NormalClient
from bench.attack.payloads import v2_infer_body
from bench.attack.report import Check
from bench.attack.runner import Context
from bench.overload import executor_pids

EXIT_SLACK_S = 2.0
EXIT_WAIT_S = 40.0  # give up waiting for the exit after this (then it is killed)
READY_TARGET_S = 1.0
LONG_REQUESTS = 2
# Answers that mean "accepted, but no HTTP answer": the connection was cut
# (error) or nothing came before the timeout (unanswered).
_NO_ANSWER = ("error", "unanswered")


async def _long_request(url: str) -> tuple[str, str]:
    """A `long` request: (status, the error body's reason if any)."""
    try:
        async with httpx.AsyncClient(timeout=30.0) as client:
            reply = await client.post(
                f"{url}/v2/models/{LONG_MODEL}/infer",
                content=v2_infer_body(),
                headers={"Content-Type": "application/json"},
            )
    except httpx.ConnectError:
        return "refused", ""
    except httpx.TimeoutException:
        return "unanswered", ""
    except httpx.HTTPError as exc:
        return "error", type(exc).__name__
    reason = ""
    if reply.status_code != 200:
        try:
            reason = str(reply.json().get("reason", ""))
        except ValueError:
            reason = f"not JSON ({reply.headers.get('content-type', '?')})"
    return str(reply.status_code), reason


def _wait_exit(process: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


async def sigterm_attack(ctx: Context) -> None:
    grace_s = float(ctx.result.details["daemon_settings"]["SHUTDOWN_GRACE_S"])
    client = NormalClient(ctx.handle.url, NORMAL_MODEL, ctx.options.client_rate_rps, 30.0)
    client.start()
    await asyncio.sleep(1.0 if ctx.quick else 3.0)
    longs = [asyncio.create_task(_long_request(ctx.handle.url)) for _ in range(LONG_REQUESTS)]
    await asyncio.sleep(0.5)  # the long batches are running
    process = ctx.handle.process
    terminated = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(_wait_exit, process, EXIT_WAIT_S)
    exit_s = time.monotonic() - terminated if code is not None else None
    await asyncio.sleep(0.5)  # the client meets a closed listener
    stats = await client.stop()
    long_answers = await asyncio.gather(*longs)
    statuses = Counter(stats.statuses)
    statuses.update(status for status, _ in long_answers)
    # The client's own columns: while the daemon was in service (after
    # SIGTERM a refused connect is expected; the answers above count them).
    ctx.result.client = client.stats(until=terminated)
    ctx.result.sent = stats.sent + LONG_REQUESTS
    ctx.result.unanswered = sum(statuses.pop(k, 0) for k in _NO_ANSWER)
    ctx.result.statuses = dict(statuses)
    log = ctx.handle.log_path.read_text(errors="replace")
    ctx.result.details.update(
        grace_s=grace_s,
        exit_code=code,
        exit_s=None if exit_s is None else round(exit_s, 2),
        long_answers=[f"{s} {r}".strip() for s, r in long_answers],
        normal_sent_after_sigterm=sum(1 for a in client.answers if a.sent >= terminated),
    )
    ctx.result.checks += [
        Check("500 answers", statuses.get("500", 0), "==", 0),
        Check("accepted requests without an answer", ctx.result.unanswered, "==", 0),
        Check(
            "exit after SIGTERM",
            exit_s,
            "<=",
            grace_s + EXIT_SLACK_S,
            "s",
            note=f"still running after {EXIT_WAIT_S:g} s",
        ),
        Check("tracebacks in the log", traceback_count(log), "==", 0),
    ]


async def hung_executors_attack(ctx: Context) -> None:
    timeout_s = 5.0 if ctx.quick else 10.0
    pids = executor_pids(ctx.pid)
    ctx.result.details["executors"] = sorted(pids)
    polls: Counter[str] = Counter()
    seen_s: float | None = None
    for pid in pids.values():
        os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=1.0) as client:
            while time.monotonic() - stopped < timeout_s:
                try:
                    reply = await client.get(f"{ctx.handle.url}/v2/health/ready")
                    polls[str(reply.status_code)] += 1
                    if reply.status_code != 200:
                        seen_s = time.monotonic() - stopped
                        break
                except httpx.TimeoutException:
                    polls["unanswered"] += 1
                except httpx.HTTPError:
                    polls["error"] += 1
                await asyncio.sleep(0.02)
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    ctx.result.sent = sum(polls.values())
    ctx.result.unanswered = polls.pop("unanswered", 0)
    ctx.result.statuses = dict(polls)
    ctx.result.checks.append(
        Check(
            "readiness stops saying 200 after SIGSTOP",
            seen_s,
            "<=",
            READY_TARGET_S,
            "s",
            note=f"still 200 after {timeout_s:g} s",
        )
    )
