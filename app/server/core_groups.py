"""Scheduling cores from a plan (`CORE_GROUPS=FILE`): Symphony's sub-clusters
(`python -m app plan partition`, symphony.txt §4.7) or Shepherd's serving
groups (`python -m app plan herd`, shepherd-nsdi23.txt §4), one core each.

The daemon forms one scheduling core per set of devices hosting the same
models (app/server/startup.py, `build_groups`). A plan decides those sets:
each of its groups' models are placed on that group's devices — their
configs' `devices` replaced by the group's device names — so the group gets
its own core over its own devices and models, with the policy of the
server (`POLICY`: `flex` for HERD's groups as Shepherd runs them, `symphony`
for sub-clusters):

* a **HERD plan** names each group's devices by index: the i-th executor
  device of the daemon (`GET /v2/devices`' order, all kinds);
* a **partition plan** names no devices: the daemon's devices are dealt out
  in order, as evenly as they go (the first sub-clusters get one more), as
  the simulator's `simulate_partitioned` does.

A partition plan is dealt the devices one of its models may run on. A
repository model in no group runs on the devices no group names (the CPU
under a plan of the emulated models). Refused at start-up, naming what is
wrong: a plan of another kind, a model of the plan the repository lacks, a
repository model no device outside the groups runs, a device index past the
daemon's devices, fewer devices than sub-clusters.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.planning.plan_files import read_json
from app.repository.config import ModelConfig
from app.runtime.devices import ExecutorDevice, model_allowed_on
from app.server.startup import StartupFailed

log = logging.getLogger("app.server")

HERD_KIND = "herd-plan"
PARTITION_KIND = "symphony-partition"


class CoreGroupsError(StartupFailed):
    """The CORE_GROUPS plan cannot be applied to this server: start-up stops."""


def plan_groups(
    path: Path, devices: list[ExecutorDevice], configs: dict[str, ModelConfig] | None = None
) -> list[tuple[tuple[str, ...], list[str]]]:
    """(models, device names) of each group of the plan at `path`; given the
    repository's `configs`, a partition plan is dealt the devices its models
    may run on (`dealt_devices`)."""
    try:
        body = read_json(path)
    except (ValueError, OSError) as exc:
        raise CoreGroupsError(f"CORE_GROUPS={path}: {exc}") from exc
    kind = body.get("kind") if isinstance(body, dict) else None
    if kind == HERD_KIND:
        from app.planning.herd.plan import read_plan as read_herd

        groups = []
        for j, group in enumerate(_read(read_herd, path).groups):
            if not group.models:
                continue
            past = [i for i in group.devices if i >= len(devices)]
            if past:
                raise CoreGroupsError(
                    f"CORE_GROUPS={path}: group {j} names devices {past}, but this server has "
                    f"{len(devices)} (0 … {len(devices) - 1})"
                )
            groups.append((tuple(group.models), [devices[i].name for i in group.devices]))
        return groups
    if kind == PARTITION_KIND:
        from app.planning.partition.plan import read_plan as read_partition

        clusters = [c for c in _read(read_partition, path).sub_clusters if c.models]
        if configs is not None:
            devices = dealt_devices(devices, configs, {m for c in clusters for m in c.models})
        if len(devices) < len(clusters):
            raise CoreGroupsError(
                f"CORE_GROUPS={path}: {len(clusters)} sub-clusters need at least as many "
                f"devices; this server has {len(devices)}"
            )
        share, extra = divmod(len(devices), len(clusters))
        groups, at = [], 0
        for k, cluster in enumerate(clusters):
            n = share + (1 if k < extra else 0)
            groups.append((tuple(cluster.models), [d.name for d in devices[at : at + n]]))
            at += n
        return groups
    raise CoreGroupsError(
        f"CORE_GROUPS={path}: kind {kind!r} is not a plan of groups "
        f"({HERD_KIND!r} from `plan herd`, {PARTITION_KIND!r} from `plan partition`)"
    )


def dealt_devices(
    devices: list[ExecutorDevice], configs: dict[str, ModelConfig], models: set[str]
) -> list[ExecutorDevice]:
    """The devices a partition plan of `models` is dealt: those one of them
    may run on (the CPU is left to the repository's other models under a
    plan of emulated models)."""
    planned = [c for c in configs.values() if c.model_name in models]
    return [d for d in devices if any(model_allowed_on(c, d) for c in planned)]


def _read(reader: Callable[[Path], Any], path: Path) -> Any:
    try:
        return reader(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise CoreGroupsError(f"CORE_GROUPS={path}: {exc}") from exc


def apply_core_groups(
    path: Path, configs: dict[str, ModelConfig], devices: list[ExecutorDevice]
) -> dict[str, ModelConfig]:
    """`configs` with each planned model on its group's devices (module
    docstring); CoreGroupsError when the plan does not fit."""
    groups = plan_groups(path, devices, configs)
    by_model = {m: names for models, names in groups for m in models}
    planned_names = {c.model_name for c in configs.values()}
    missing = sorted(set(by_model) - planned_names)
    if missing:
        raise CoreGroupsError(f"CORE_GROUPS={path}: models {missing} are not in the repository")
    # A model in no group runs on the devices no group names (none for a
    # partition plan, which deals out every device).
    named = {n for _, names in groups for n in names}
    free = [d for d in devices if d.name not in named]
    out = {}
    for key, config in configs.items():
        names = by_model.get(config.model_name)
        if names is None:
            names = [d.name for d in free if model_allowed_on(config, d)]
            if not names:
                raise CoreGroupsError(
                    f"CORE_GROUPS={path}: model {config.model_name!r} of the repository is in no "
                    "group and no device outside the groups runs it; add it to the plan or "
                    "remove it from the repository"
                )
        out[key] = dataclasses.replace(config, devices=tuple(names))
    for models, names in groups:
        log.info("core group: %s on %s", ", ".join(models), ", ".join(names))
    return out
