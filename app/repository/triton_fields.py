"""Triton's `dynamic_batching` and `instance_group` mapped onto ours.

Both config formats use this: a config.pbtxt (its messages turned into
plain mappings with protobuf's MessageToDict, field names as in the proto)
and config.yaml (the same keys written in YAML). What maps:

    dynamic_batching.max_queue_delay_microseconds   → BatchingSpec.max_queue_delay_ms
    dynamic_batching.preferred_batch_size           → BatchingSpec.preferred_batch_sizes
    default_queue_policy.default_timeout_microseconds → BatchingSpec.queue_timeout_ms
    default_queue_policy.max_queue_size             → BatchingSpec.max_queue_size
    default_queue_policy.timeout_action: REJECT     (the only action we have)
    instance_group[].kind KIND_CPU                  → devices [cpu]
    instance_group[].kind KIND_GPU (gpus [0, 1])    → devices [cuda] ([cuda:0, cuda:1])
    instance_group[].kind KIND_MODEL / KIND_AUTO    → no restriction

These are the `triton` policy's per-model options (app/server/startup.py
passes them on); the deadline-aware policies plan batches from deadlines
and say so at start-up. A Triton field we do not support is a warning
naming it (`warn`); a key Triton does not have either is an error, as any
unknown key of config.yaml.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.config_fields import FieldReader
from app.repository.config import BatchingSpec

Warn = Callable[[str], None]

_BATCHING_SUPPORTED = frozenset(
    {"max_queue_delay_microseconds", "preferred_batch_size", "default_queue_policy"}
)
_BATCHING_UNSUPPORTED = frozenset(
    {"preserve_ordering", "priority_levels", "default_priority_level", "priority_queue_policy"}
)
_QUEUE_SUPPORTED = frozenset({"default_timeout_microseconds", "max_queue_size", "timeout_action"})
_QUEUE_UNSUPPORTED = frozenset({"allow_timeout_override"})
_GROUP_SUPPORTED = frozenset({"name", "kind", "count", "gpus"})
_GROUP_UNSUPPORTED = frozenset(
    {"rate_limiter", "secondary_devices", "profile", "passive", "host_policy"}
)


def parse_dynamic_batching(ctx: FieldReader, raw: Any, warn: Warn) -> BatchingSpec:
    """`dynamic_batching` → BatchingSpec (an empty mapping: the policy's defaults)."""
    where = "dynamic_batching"
    raw = {} if raw is None else raw
    _check_keys(ctx, raw, where, _BATCHING_SUPPORTED, _BATCHING_UNSUPPORTED, warn)
    delay_ms = None
    if "max_queue_delay_microseconds" in raw:
        us = ctx.number(
            raw,
            "max_queue_delay_microseconds",
            f"{where}.max_queue_delay_microseconds",
            at_least=0,
            integer=True,
        )
        delay_ms = us / 1000.0
    preferred: list[int] = []
    sizes = raw.get("preferred_batch_size") or []
    if not isinstance(sizes, list):
        sizes = [sizes]
    for i, size in enumerate(sizes):
        preferred.append(
            ctx.number({i: size}, i, f"{where}.preferred_batch_size[{i}]", at_least=1, integer=True)
        )
    timeout_ms = None
    queue_size = None
    if "default_queue_policy" in raw:
        qwhere = f"{where}.default_queue_policy"
        queue = raw["default_queue_policy"] or {}
        _check_keys(ctx, queue, qwhere, _QUEUE_SUPPORTED, _QUEUE_UNSUPPORTED, warn)
        action = str(queue.get("timeout_action", "REJECT")).upper()
        if action not in ("REJECT", "DELAY"):
            ctx.fail(f"{qwhere}.timeout_action", f"must be REJECT or DELAY, got {action!r}")
        if action == "DELAY":
            warn(f"{qwhere}.timeout_action DELAY is not supported: timed-out requests are rejected")
        us = ctx.number(
            queue,
            "default_timeout_microseconds",
            f"{qwhere}.default_timeout_microseconds",
            default=0,
            at_least=0,
            integer=True,
        )
        timeout_ms = us / 1000.0 if us else None  # 0: Triton's "none"; ours is the SLO
        size = ctx.number(
            queue, "max_queue_size", f"{qwhere}.max_queue_size", default=0, at_least=0, integer=True
        )
        queue_size = size or None
    return BatchingSpec(delay_ms, tuple(preferred), timeout_ms, queue_size)


def parse_instance_groups(ctx: FieldReader, raw: Any, warn: Warn) -> tuple[str, ...] | None:
    """`instance_group` → the model's `devices` (None: any device its backend runs on)."""
    if not isinstance(raw, list):
        raw = [raw]
    devices: list[str] = []
    unrestricted = False
    for i, group in enumerate(raw):
        where = f"instance_group[{i}]"
        _check_keys(ctx, group, where, _GROUP_SUPPORTED, _GROUP_UNSUPPORTED, warn)
        kind = str(group.get("kind", "KIND_AUTO")).upper()
        count = ctx.number(group, "count", f"{where}.count", default=1, at_least=1, integer=True)
        if count > 1:
            warn(
                f"{where}.count {count}: one instance per device is run "
                "(each device's executor serves every model placed on it)"
            )
        gpus = group.get("gpus") or []
        if not isinstance(gpus, list):
            gpus = [gpus]
        ids = [
            ctx.number({j: g}, j, f"{where}.gpus[{j}]", at_least=0, integer=True)
            for j, g in enumerate(gpus)
        ]
        if ids and kind != "KIND_GPU":
            ctx.fail(f"{where}.gpus", f"only for kind KIND_GPU, the group's kind is {kind}")
        if kind == "KIND_CPU":
            devices.append("cpu")
        elif kind == "KIND_GPU":
            devices += [f"cuda:{g}" for g in ids] if ids else ["cuda"]
        elif kind in ("KIND_MODEL", "KIND_AUTO"):
            unrestricted = True
        else:
            ctx.fail(
                f"{where}.kind",
                f"unknown kind {kind!r}; expected KIND_AUTO, KIND_CPU, KIND_GPU or KIND_MODEL",
            )
    if unrestricted or not devices:
        return None
    return tuple(dict.fromkeys(devices))


def _check_keys(
    ctx: FieldReader,
    raw: Any,
    where: str,
    supported: frozenset[str],
    unsupported: frozenset[str],
    warn: Warn,
) -> None:
    if not isinstance(raw, Mapping):
        ctx.fail(where, f"must be a mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in supported | unsupported)
    if unknown:
        ctx.fail(
            where, f"unknown key(s) {unknown}; Triton's keys: {sorted(supported | unsupported)}"
        )
    for key in sorted(k for k in raw if k in unsupported):
        warn(f"{where}.{key} is not supported and has no effect")
