"""Attacks through connections alone: many that never send a byte, and many
that send their headers one byte a second (issue 19, item 3).

Both use raw asyncio connections; the idle one runs the daemon at
`ulimit -n 1024` and, while the connections are open, checks that a new
client is still served and that a SIGKILLed executor is respawned (an
executor needs file descriptors for its pipes and shared memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator

import httpx

from bench.attack.daemon import NORMAL_MODEL, respawns
from bench.attack.net import exchange, hold_open
from bench.attack.payloads import v2_infer_body
from bench.attack.report import Check
from bench.attack.runner import Context
from bench.overload import executor_pids

IDLE_CONNECTIONS = 1100
DAEMON_NOFILE = 1024
PROBES = 10
PROBE_TARGET_MS = 100.0
RESPAWN_TARGET_S = 2.0
VICTIM = "emulated:0"


async def _probe(url: str) -> tuple[str, float]:
    """One normal request on a new connection: (status, seconds; inf if none)."""
    started = time.monotonic()
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            reply = await client.post(
                f"{url}/v2/models/{NORMAL_MODEL}/infer",
                content=v2_infer_body(),
                headers={"Content-Type": "application/json"},
            )
    except httpx.HTTPError as exc:
        return type(exc).__name__, float("inf")
    return str(reply.status_code), time.monotonic() - started


def _open_files(pid: int) -> int | None:
    """How many file descriptors process `pid` has open (None if unreadable)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


async def _respawn_s(ctx: Context, timeout_s: float) -> tuple[float | None, str]:
    """SIGKILL executor `VICTIM`; seconds until the log reports it serving
    again (None: not within `timeout_s`), and what happened."""
    victim = executor_pids(ctx.pid).get(VICTIM)
    if victim is None:
        return None, f"no executor {VICTIM} found"
    log = ctx.handle.log_path
    before = len(respawns(log.read_text(errors="replace")))
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    while time.monotonic() - killed < timeout_s:
        found = respawns(log.read_text(errors="replace"))
        if len(found) > before:
            return time.monotonic() - killed, f"log: down {found[-1][1]:.3f} s"
        await asyncio.sleep(0.05)
    return None, f"not respawned within {timeout_s:g} s"


async def idle_connections_attack(ctx: Context) -> None:
    """`IDLE_CONNECTIONS` connections that send nothing, held `hold_s`; meanwhile
    `PROBES` normal requests on new connections and one executor SIGKILL."""
    hold_s = 8.0 if ctx.quick else 30.0
    started = time.monotonic()
    connected: list[float] = []
    holders = [
        asyncio.create_task(hold_open(ctx.host, ctx.port, started, connected))
        for _ in range(IDLE_CONNECTIONS)
    ]
    ctx.result.sent = IDLE_CONNECTIONS
    await asyncio.sleep(1.0)  # all connected (or queued in the listen backlog)
    ctx.result.details.update(
        connected_before_probes=len(connected), daemon_fds_before_probes=_open_files(ctx.pid)
    )
    probes = [await _probe(ctx.handle.url) for _ in range(PROBES)]
    slowest = max(latency for _, latency in probes)
    respawn_s, respawn_note = await _respawn_s(ctx, timeout_s=10.0)
    ctx.result.details.update(
        probe_statuses=dict(Counter(status for status, _ in probes)),
        probe_ms=[round(latency * 1000, 1) for _, latency in probes],
        respawn=respawn_note,
    )
    ctx.result.checks += [
        Check(
            f"slowest of {PROBES} new-connection requests (inf: not served)",
            slowest * 1000,
            "<",
            PROBE_TARGET_MS,
            "ms",
        ),
        Check(
            "SIGKILLed executor serving again",
            respawn_s,
            "<",
            RESPAWN_TARGET_S,
            "s",
            note=respawn_note,
        ),
    ]
    await asyncio.sleep(max(0.0, started + hold_s - time.monotonic()))
    outcomes: Counter[str] = Counter()
    closed_after: list[float] = []
    for task in holders:
        if not task.done():
            task.cancel()
            outcomes["unanswered"] += 1
            continue
        closed_s, refused = task.result()
        if refused:
            outcomes["refused"] += 1
        elif closed_s is not None:
            outcomes["closed"] += 1
            closed_after.append(closed_s)
    await asyncio.gather(*holders, return_exceptions=True)
    ctx.result.unanswered = outcomes.pop("unanswered", 0)
    ctx.result.statuses = dict(outcomes)
    ctx.result.details.update(
        connected=len(connected),
        hold_s=hold_s,
        first_close_s=round(min(closed_after), 2) if closed_after else None,
        last_close_s=round(max(closed_after), 2) if closed_after else None,
    )


async def _dribble(host: str) -> AsyncIterator[bytes]:
    """A request line and a header block that never ends: one byte a second."""
    yield f"POST /v2/models/{NORMAL_MODEL}/infer HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode()
    while True:
        await asyncio.sleep(1.0)
        yield b"a"


async def slowloris_attack(ctx: Context) -> None:
    """Connections dribbling header bytes one a second; each must be closed
    (or answered) within the header timeout (+ 2 s of slack)."""
    count = 20 if ctx.quick else 100
    limit_s = ctx.options.header_timeout_s + 2.0
    wait_s = limit_s + 3.0 if ctx.quick else max(60.0, limit_s + 3.0)
    host = f"{ctx.host}:{ctx.port}"
    ctx.result.sent = count
    exchanges = await asyncio.gather(
        *(exchange(ctx.host, ctx.port, _dribble(host), timeout_s=wait_s) for _ in range(count))
    )
    statuses = Counter(e.outcome for e in exchanges)
    ctx.result.unanswered = statuses.pop("unanswered", 0)
    ctx.result.statuses = dict(statuses)
    ends = [
        e.answer_s if e.answer_s is not None else e.closed_s
        for e in exchanges
        if e.answer_s is not None or e.closed_s is not None
    ]
    last = max(ends) if len(ends) == count else float("inf")
    ctx.result.details.update(
        waited_s=wait_s,
        header_timeout_s=ctx.options.header_timeout_s,
        first_close_s=round(min(ends), 2) if ends else None,
        last_close_s=round(max(ends), 2) if ends else None,
    )
    with contextlib.suppress(ValueError):
        ctx.result.details["bytes_dribbled_max"] = max(e.sent_bytes for e in exchanges)
    ctx.result.checks.append(
        Check(
            "last connection closed by the server (inf: some stayed open)",
            last,
            "<=",
            limit_s,
            "s",
        )
    )
