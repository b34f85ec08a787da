"""What client connections may hold, and how many may be open: the numbers.

The HTTP protocol (app/api/connection.py) enforces these limits; this module
chooses them from the settings and the process's open-file limit.

**File descriptors.** Every open client connection is a file descriptor, and
so is everything the server needs to keep serving: the executors' pipes and
process handles, a respawned executor's new ones (a spawn briefly needs about
eight), each model's shared-memory arena, the event loop's own. Once clients
hold them all, `accept()` fails with "Too many open files" and so does the
respawn of a crashed executor. So client connections are capped below
`RLIMIT_NOFILE` (its soft limit) less

- a reserve: `FD_RESERVE_BASE` for the server's own files, plus
  `FD_RESERVE_PER_DEVICE` per executor and one per model;
- the accept backlog: asyncio accepts up to `backlog` connections in one go
  before the protocol can close any that are over the cap, so the backlog is
  part of the budget too. It is uvicorn's 2048 where the limit allows, else
  an eighth of what the reserve leaves (at least 16).

What is left is the ceiling; `MAX_CONNECTIONS` picks a number at or below it
(by default the ceiling, at most `DEFAULT_MAX_CONNECTIONS`: an idle
connection costs ~10 KB of Python objects, and a deployment with more clients
than that puts a proxy in front). At `ulimit -n 1024`, with three executors
and five models: reserve 93, backlog 116, at most 815 connections.
"""

from __future__ import annotations

import contextlib
import logging
import resource
from dataclasses import dataclass
from pathlib import Path

from app.server.settings import Settings

log = logging.getLogger("app.server")

FD_RESERVE_BASE = 64
FD_RESERVE_PER_DEVICE = 8
UVICORN_BACKLOG = 2048  # uvicorn's default listen backlog
MIN_BACKLOG = 16
DEFAULT_MAX_CONNECTIONS = 4096
UNLIMITED_NOFILE = 1 << 20  # stands for RLIM_INFINITY in the arithmetic


@dataclass(frozen=True)
class FdPlan:
    """How the open-file limit is shared out (see the module docstring)."""

    nofile: int  # the soft RLIMIT_NOFILE
    reserve: int  # for executors, their respawn, arenas and the server's own files
    backlog: int  # the listen backlog: connections accepted before any can be refused
    ceiling: int  # the most client connections that leave the rest untouched


def fd_plan(nofile: int, devices: int, models: int = 0) -> FdPlan:
    """Share `nofile` file descriptors out; ValueError when nothing is left
    for client connections."""
    if devices < 0 or models < 0:
        raise ValueError(f"devices and models must be ≥ 0, got {devices} and {models}")
    reserve = FD_RESERVE_BASE + FD_RESERVE_PER_DEVICE * devices + models
    spare = nofile - reserve
    backlog = max(MIN_BACKLOG, min(UVICORN_BACKLOG, spare // 8))
    ceiling = spare - backlog
    if ceiling < 1:
        raise ValueError(
            f"the open-file limit (ulimit -n) {nofile} leaves no file descriptors for client "
            f"connections: {reserve} are reserved for {devices} executors, {models} models and "
            f"the server's own files, and {backlog} for the accept backlog; raise `ulimit -n`"
        )
    return FdPlan(nofile, reserve, backlog, ceiling)


def open_file_limit() -> int:
    """The process's soft RLIMIT_NOFILE (`UNLIMITED_NOFILE` for unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED_NOFILE if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class ConnectionLimits:
    """What the HTTP protocol enforces per connection and over all of them
    (the settings of the same names; app/api/connection.py says how)."""

    header_timeout_s: float = 10.0  # 0: off
    body_timeout_s: float = 30.0  # 0: off
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 64 << 10
    max_body_bytes: int = 64 << 20
    max_buffered_bytes: int = 256 << 20
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    backlog: int = UVICORN_BACKLOG


def choose_max_connections(requested: int | None, plan: FdPlan) -> tuple[int, str]:
    """`MAX_CONNECTIONS` (None: auto) under the plan's ceiling, and why."""
    if requested is None:
        if plan.ceiling > DEFAULT_MAX_CONNECTIONS:
            return DEFAULT_MAX_CONNECTIONS, "MAX_CONNECTIONS auto: its upper bound"
        return plan.ceiling, "MAX_CONNECTIONS auto: the file-descriptor ceiling"
    if requested > plan.ceiling:
        return plan.ceiling, f"MAX_CONNECTIONS {requested} capped to the file-descriptor ceiling"
    return requested, "MAX_CONNECTIONS"


def connection_limits(
    settings: Settings,
    *,
    devices: int | None = None,
    models: int | None = None,
    nofile: int | None = None,
) -> ConnectionLimits:
    """The limits `settings` ask for, with the connection cap and backlog
    fitted to this process's open-file limit (logged). `devices` and
    `models` default to what the settings will start (detected)."""
    if devices is None:
        devices = _executors(settings)
    if models is None:
        models = _models(settings.repository)
    plan = fd_plan(open_file_limit() if nofile is None else nofile, devices, models)
    max_connections, why = choose_max_connections(settings.max_connections, plan)
    log.log(
        logging.WARNING if "capped" in why else logging.INFO,
        "connections: at most %d open (%s; RLIMIT_NOFILE %d less %d file descriptors reserved "
        "for %d executors, %d models and the server's own, less an accept backlog of %d)",
        max_connections,
        why,
        plan.nofile,
        plan.reserve,
        devices,
        models,
        plan.backlog,
    )
    return ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        keep_alive_timeout_s=settings.keep_alive_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_body_bytes=settings.max_body_bytes,
        max_buffered_bytes=settings.max_buffered_bytes,
        max_connections=max_connections,
        backlog=plan.backlog,
    )


def _executors(settings: Settings) -> int:
    """The executors the settings start: one per device, plus one per stage
    instance of a PPipe plan (PPIPE_PLAN), whose executors are its own;
    PLAN's shares and pipelines counted (a plan that does not fit is
    counted without: start-up says why it does not)."""
    from app.server.plans import load_plan, resolve
    from app.server.startup import StartupFailed

    with contextlib.suppress(StartupFailed, ValueError):
        planned = resolve(settings, load_plan(settings))
        return _devices(planned) + plan_executors(planned.ppipe_plan)
    return _devices(settings) + plan_executors(settings.ppipe_plan)


def _devices(settings: Settings) -> int:
    from app.runtime.devices import detect_devices

    return len(
        detect_devices(
            settings.cpu_slices,
            settings.threads_per_slice,
            settings.emulated_devices,
            shares=settings.device_shares,
        )
    )


def plan_executors(path: Path | None) -> int:
    """The executor processes a PPipe plan runs: one per stage instance (0
    without a plan, or one that cannot be read: start-up says why)."""
    if path is None:
        return 0
    from app.planning.ppipe.plan import read_plan

    try:
        plan = read_plan(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0
    return sum(stage.devices for pipeline in plan.pipelines for stage in pipeline.stages)


def _models(repository: Path) -> int:
    """The model directories of the repository (an upper bound on arenas)."""
    try:
        return sum(1 for _ in repository.glob("*/config.yaml"))
    except OSError:
        return 0
