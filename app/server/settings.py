"""Server settings from environment variables (and the CLI, which sets them).

| variable | default | meaning |
|---|---|---|
| MODEL_REPOSITORY | bundled `models/` | model repository root |
| POLICY | symphony | scheduling policy (any of `app.scheduling.policy_names()`) |
| POLICY_OPTIONS | {} | JSON object of policy options, e.g. {"stagger_slack": 2} |
| HOST / PORT | 127.0.0.1 / 8000 | where uvicorn binds (loopback unless told otherwise) |
| CPU_SLICES | auto | CPU executor processes for ONNX models (1 without a GPU, 0 with) |
| THREADS_PER_SLICE | cores / slices | ONNX Runtime intra-op threads per CPU slice |
| EMULATED_DEVICES | 2 | emulated devices for emulated models (0: none) |
| ARENA_SLOTS | 1024 | shared-memory slots per model: requests in flight at once |
| MAX_QUEUE | 0 | per model, requests accepted, not answered (429 queue_full above; 0: off) |
| STUCK_FACTOR | 10 | batch past STUCK_FACTOR·ℓ(b) + STUCK_MARGIN_S: executor hung (0: off) |
| STUCK_MARGIN_S | 1 | see STUCK_FACTOR; a hung executor is killed and respawned |
| RESPAWN | 1 | restart an executor that died or hung (0: leave its device down) |
| DEADLINE_MARGIN_MS | 3 (†: 1.5) | plan to finish this long before each deadline (IPC, answer) |
| TIMER_LEAD_MS | 2 (†: 0.5) | run the core this long before its timers (late under load) |
| REALTIME_PRIORITY | 0 | SCHED_FIFO of the event loop, emulated/GPU executors one below (0: off) |
| SHUTDOWN_GRACE_S | 5 | on SIGTERM, how long in-flight requests may take to finish |
| MAX_BODY_BYTES | 67108864 | largest request body accepted (413 above) |
| ADMIN_TOKEN | none | bearer token for management routes (off on non-loopback hosts without one) |
| PROFILE_BATCH_SIZES | 1,2,4,8,16,32 | batch sizes the profiler measures at load (≤ max batch) |

† with REALTIME_PRIORITY > 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from app.runtime.realtime import check_priority
from app.scheduling.registry import policy_names

BUNDLED_REPOSITORY = Path(__file__).resolve().parent.parent.parent / "models"
# Default (DEADLINE_MARGIN_MS, TIMER_LEAD_MS) at normal and at real-time priority.
NORMAL_SLACK_MS = (3.0, 2.0)
REALTIME_SLACK_MS = (1.5, 0.5)


@dataclass(frozen=True)
class Settings:
    repository: Path = BUNDLED_REPOSITORY
    policy: str = "symphony"
    policy_options: dict[str, object] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8000
    cpu_slices: int | None = None
    threads_per_slice: int | None = None
    emulated_devices: int = 2
    arena_slots: int = 1024
    max_queue: int = 0
    stuck_factor: float = 10.0
    stuck_margin_s: float = 1.0
    respawn: bool = True
    shutdown_grace_s: float = 5.0
    deadline_margin_ms: float = NORMAL_SLACK_MS[0]
    timer_lead_ms: float = NORMAL_SLACK_MS[1]
    realtime_priority: int = 0
    max_body_bytes: int = 64 << 20
    admin_token: str | None = None
    profile_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        policy = env.get("POLICY", "symphony")
        if policy not in policy_names():
            raise ValueError(f"POLICY={policy!r} is not a policy; choose one of {policy_names()}")
        try:
            options = json.loads(env.get("POLICY_OPTIONS", "{}"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"POLICY_OPTIONS is not JSON: {exc}") from None
        if not isinstance(options, dict):
            raise ValueError("POLICY_OPTIONS must be a JSON object")
        sizes = tuple(
            int(s) for s in env.get("PROFILE_BATCH_SIZES", "1,2,4,8,16,32").split(",") if s
        )
        threads = env.get("THREADS_PER_SLICE")
        realtime_priority = _realtime(env)
        # The slack the answer path needs: under SCHED_FIFO its p99 over HTTP
        # is ~1.2–1.5 ms, at normal priority ~2.1–2.6 ms on a busy 2-core box
        # (BENCHMARKS.md, "Live (a): in-process, HTTP and the simulator").
        margin_ms, lead_ms = REALTIME_SLACK_MS if realtime_priority else NORMAL_SLACK_MS
        return cls(
            repository=Path(env.get("MODEL_REPOSITORY", str(BUNDLED_REPOSITORY))),
            policy=policy,
            policy_options=options,
            host=env.get("HOST", "127.0.0.1"),
            port=_int(env, "PORT", 8000, 0),
            cpu_slices=_int(env, "CPU_SLICES", None, 0),
            threads_per_slice=int(threads) if threads else None,
            emulated_devices=_int(env, "EMULATED_DEVICES", 2, 0),
            arena_slots=_int(env, "ARENA_SLOTS", 1024, 1),
            max_queue=_int(env, "MAX_QUEUE", 0, 0),
            stuck_factor=_float(env, "STUCK_FACTOR", 10.0),
            stuck_margin_s=_float(env, "STUCK_MARGIN_S", 1.0),
            respawn=env.get("RESPAWN", "1").strip().lower() not in ("0", "false", "no", "off"),
            shutdown_grace_s=float(env.get("SHUTDOWN_GRACE_S", "5")),
            deadline_margin_ms=_float(env, "DEADLINE_MARGIN_MS", margin_ms),
            timer_lead_ms=_float(env, "TIMER_LEAD_MS", lead_ms),
            realtime_priority=realtime_priority,
            max_body_bytes=_int(env, "MAX_BODY_BYTES", 64 << 20, 1),
            admin_token=env.get("ADMIN_TOKEN") or None,
            profile_batch_sizes=sizes,
        )


def _realtime(env: dict[str, str]) -> int:
    priority = _int(env, "REALTIME_PRIORITY", 0, 0)
    assert priority is not None
    check_priority(priority)
    return priority


def _int(env: dict[str, str], key: str, default: int | None, minimum: int) -> int | None:
    raw = env.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{key} must be ≥ {minimum}, got {value}")
    return value


def _float(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number") from None
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"{key} must be ≥ 0, got {value}")
    return value
