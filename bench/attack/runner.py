"""Running one attack: a fresh daemon, a memory sampler and a normal client
around it, an overall time budget, and the result filled in however far it got.

Timeline of one attack: start the daemon (its settings: the base ones, the
attack's own, then the user's), sample the front-end's RSS for
`BASELINE_S` (the baseline), start the normal client, let it run for
`WARMUP_S`, then the attack itself (at most its budget; whatever it had not
finished is reported as timed out), then stop the client and the daemon.
The RSS peak and the client's statistics cover the attack itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.attack.daemon import BASE_ENV, NORMAL_MODEL, launch, traceback_count, write_repository
from bench.attack.net import NormalClient
from bench.attack.proc import RssSampler
from bench.attack.report import AttackResult, Check
from bench.daemon_launcher import DaemonHandle, stop_daemon

BASELINE_S = 0.5
WARMUP_S = 1.0
CLIENT_P99_TARGET_MS = 50.0
# The normal client and the RSS sampler watch at least this long from the
# attack's start, so an attack the server stops at once is still measured.
MIN_WINDOW_S = 3.0


@dataclass(frozen=True)
class Options:
    """What the user chose for every attack."""

    quick: bool = False
    client_rate_rps: float = 50.0
    settings: dict[str, str] = field(default_factory=dict)  # extra daemon environment
    header_timeout_s: float = 10.0  # the daemon's header timeout the slowloris target uses
    grace_s: float = 2.0  # SHUTDOWN_GRACE_S of the SIGTERM attack
    command: str = "serve"  # how the daemon is started: "serve" or "uvicorn" (app.main:app)


@dataclass
class Context:
    """What an attack's coroutine gets: the daemon, the result to fill in."""

    handle: DaemonHandle
    options: Options
    result: AttackResult
    sampler: RssSampler
    client: NormalClient | None = None
    began: float = 0.0  # when the attack started (monotonic)
    window_end: float | None = None  # set by an attack whose tail is not the attack itself

    def hold_window(self) -> Awaitable[None]:
        """Sleep until MIN_WINDOW_S after the attack began."""
        return asyncio.sleep(max(0.0, self.began + MIN_WINDOW_S - time.monotonic()))

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self.handle.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self.handle.process.pid

    @property
    def quick(self) -> bool:
        return self.options.quick


AttackFn = Callable[[Context], Awaitable[None]]


@dataclass(frozen=True)
class AttackSpec:
    """One attack: its name (the `--only` key), what it does, how long it
    may take (full, quick), the daemon settings it needs, an open-file limit
    for the daemon, whether the normal client runs beside it, and the target
    for the front-end's RSS growth, if it has one."""

    name: str
    description: str
    run: AttackFn
    budget_s: tuple[float, float]
    env: dict[str, str] = field(default_factory=dict)
    nofile: int | None = None
    normal_client: bool = True
    rss_target_mb: float | None = None  # a target for the front-end's RSS growth

    def settings(self, options: Options) -> dict[str, str]:
        env = {**BASE_ENV, **self.env, **options.settings}
        if self.name == "sigterm":
            env.setdefault("SHUTDOWN_GRACE_S", f"{options.grace_s:g}")
        return env


async def _drive(spec: AttackSpec, ctx: Context) -> None:
    result = ctx.result
    ctx.sampler.start()
    await asyncio.sleep(BASELINE_S)
    if spec.normal_client:
        ctx.client = NormalClient(ctx.handle.url, NORMAL_MODEL, ctx.options.client_rate_rps)
        ctx.client.start()
        await asyncio.sleep(WARMUP_S)
    began = ctx.began = time.monotonic()
    budget = spec.budget_s[1] if ctx.quick else spec.budget_s[0]
    try:
        await asyncio.wait_for(spec.run(ctx), budget)
    except TimeoutError:
        result.timed_out.append(f"the attack, within its {budget:g} s budget")
    if ctx.window_end is None:
        await ctx.hold_window()
    ended = ctx.window_end or time.monotonic()
    if ctx.client is not None:
        await ctx.client.stop()
        result.client = ctx.client.stats(since=began, until=ended)
        result.checks.append(
            Check(
                "normal client p99 during the attack",
                result.client.p99_ms,
                "<",
                CLIENT_P99_TARGET_MS,
                "ms",
                note="no requests",
            )
        )
    await ctx.sampler.stop()
    result.rss_baseline_mb = ctx.sampler.baseline_mb(began)
    result.rss_peak_mb = ctx.sampler.peak_mb(began)
    if spec.rss_target_mb is not None:
        growth = result.rss_growth_mb
        result.checks.append(
            Check("front-end RSS growth", growth, "<", spec.rss_target_mb, "MB", "not sampled")
        )


def run_attack(spec: AttackSpec, options: Options) -> AttackResult:
    """Run `spec` against a fresh daemon; never raises for what the daemon does."""
    result = AttackResult(name=spec.name, description=spec.description, sent=0)
    started = time.monotonic()
    repo = write_repository(Path(tempfile.mkdtemp(prefix="attack-")) / "repo")
    env = spec.settings(options)
    result.details["daemon_settings"] = env
    if spec.nofile is not None:
        result.details["daemon_nofile"] = spec.nofile
    try:
        handle = launch(repo, env, nofile=spec.nofile, command=options.command)
    except RuntimeError as exc:
        result.timed_out.append(f"daemon start ({str(exc).splitlines()[0]})")
        return result
    ctx = Context(handle, options, result, RssSampler(handle.process.pid))
    try:
        asyncio.run(_drive(spec, ctx))
    finally:
        stop_daemon(handle, timeout_s=15.0)
        log = handle.log_path.read_text(errors="replace")
        result.details["daemon_log"] = str(handle.log_path)
        result.details["log_tracebacks"] = traceback_count(log)
        result.wall_s = round(time.monotonic() - started, 1)
    return result


async def ready_status(url: str, timeout_s: float = 1.0) -> int | None:
    """/v2/health/ready's status; None when it does not answer in time."""
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return (await client.get(f"{url}/v2/health/ready")).status_code
    return None
