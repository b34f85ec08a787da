"""Does a plan fit this server? (app/server/plans.py, at start-up.) Every
mismatch between the plan and the repository's models and the server's
devices is found — not the first only — and start-up stops with one
message naming each, and the command that makes a plan for this server."""

from __future__ import annotations

import logging
from pathlib import Path

from app.repository.config import ModelConfig
from app.repository.loader import RepositoryIndex
from app.runtime.devices import ExecutorDevice, model_allowed_on
from app.server.core_groups import dealt_devices
from app.server.plans import (
    WHAT,
    PlanInForce,
    PlanMismatch,
    layout_devices,
    listed,
    load_plan,
    log_plan,
    resolve,
    whole_devices,
)
from app.server.settings import Settings
from app.server.startup import StartupFailed

log = logging.getLogger("app.server")


def prepare_plan(settings: Settings, index: RepositoryIndex) -> tuple[Settings, PlanInForce | None]:
    """The plan the settings name (None without one), checked to fit
    (`check_plan`), and the settings it sets (`resolve`); StartupFailed,
    logged in full, when it cannot be served."""
    try:
        plan = load_plan(settings)
        if plan is None:
            return settings, None
        settings = resolve(settings, plan)
        check_plan(plan, settings, index)
    except StartupFailed as exc:
        log.error("start-up stopped: %s", exc)
        raise
    log_plan(settings, plan)
    return settings, plan


def check_plan(plan: PlanInForce, settings: Settings, index: RepositoryIndex) -> None:
    """Raise PlanMismatch naming every way `plan` does not fit."""
    by_model: dict[str, list[ModelConfig]] = {}
    for config in index.models.values():
        by_model.setdefault(config.model_name, []).append(config)
    kind = plan.file.kind
    try:
        if kind == "herd-plan":
            problems = _herd(plan, by_model, index, layout_devices(settings))
        elif kind == "symphony-partition":
            problems = _partition(plan, by_model, index, layout_devices(settings))
        elif kind == "inss-plan":
            problems = _inss(plan, by_model, index, whole_devices(settings))
        else:
            problems = _ppipe(plan, by_model, index)
    except (ValueError, KeyError, TypeError) as exc:  # a malformed plan
        raise PlanMismatch(f"{plan.label()}: {exc}") from None
    if problems:
        devices = whole_devices(settings)
        raise PlanMismatch(_message(plan, problems, sorted(by_model), devices, index.root))


def _message(
    plan: PlanInForce,
    problems: list[str],
    models: list[str],
    devices: list[ExecutorDevice],
    root: Path,
) -> str:
    file = plan.file
    made = file.made_from
    how = f", made by `{made.command}`" if made is not None and made.command else ""
    lines = [
        f"{plan.label()} ({WHAT[file.kind]}{how}) does not fit this server: "
        f"{len(problems)} mismatch{'es' if len(problems) > 1 else ''}",
        *(f"  - {p}" for p in problems),
        f"  this server: models {listed(models)}; devices {listed(d.name for d in devices)}",
        "  make a plan for it: " + _fitting_command(file.planner, root),
    ]
    return "\n".join(lines)


def _fitting_command(planner: str, root: Path) -> str:
    """The command that plans this repository's models on this server's
    devices (docs/architecture.md, Planning)."""
    return (
        f"`python -m app plan {planner} CLUSTER.yaml --repository {root} --out FILE` with this "
        "server's settings in the environment (CLUSTER.yaml gives the rates: "
        f"docs/architecture.md#planning), or `python -m app plan {planner} --from URL --out "
        "FILE` against it serving"
    )


def _unknown(names: list[str], by_model: dict[str, list[ModelConfig]], index: RepositoryIndex):
    """A line per planned model the repository does not serve."""
    out = []
    for name in names:
        if name in by_model:
            continue
        reason = index.errors.get(name)
        if reason is None:
            out.append(f"model {name!r} is not in the repository {index.root}")
        else:
            out.append(f"model {name!r} of the repository did not load: {reason}")
    return out


def _without_device(
    planned: set[str],
    by_model: dict[str, list[ModelConfig]],
    free: list[ExecutorDevice],
    where: str,
) -> list[str]:
    """A line naming the repository models the plan leaves out that no
    device the plan leaves free runs."""
    stranded = [
        name
        for name, configs in sorted(by_model.items())
        if name not in planned and not any(model_allowed_on(c, d) for c in configs for d in free)
    ]
    if not stranded:
        return []
    what = f"model {stranded[0]!r}" if len(stranded) == 1 else f"models {stranded}"
    verb, it = ("is", "it") if len(stranded) == 1 else ("are", "them")
    return [
        f"{what} of the repository {verb} {where}, and no device the plan leaves free "
        f"({listed(d.name for d in free)}) runs {it}"
    ]


def _cannot_run(name: str, configs: list[ModelConfig], device: ExecutorDevice, where: str):
    if all(model_allowed_on(c, device) for c in configs):
        return []
    c = configs[0]
    allowed = "any device" if c.devices is None else f"devices {list(c.devices)}"
    return [f"model {name!r} (backend {c.backend}, {allowed}) cannot run on {device.name}{where}"]


def _herd(plan, by_model, index, devices: list[ExecutorDevice]) -> list[str]:
    from app.planning.herd.plan import read_plan

    groups = read_plan(plan.path).groups
    names = [m for g in groups for m in g.models]
    problems = _unknown(names, by_model, index)
    named = {i for g in groups if g.models for i in g.devices}
    free = [d for i, d in enumerate(devices) if i not in named]
    problems += _without_device(set(names), by_model, free, "in no group")
    past = sorted({i for g in groups if g.models for i in g.devices if i >= len(devices)})
    if past:
        have = f"0 … {len(devices) - 1}" if devices else "none"
        problems.append(
            f"the groups name devices {past}, but this server has {len(devices)} ({have}: "
            f"{listed(d.name for d in devices)})"
        )
    for j, group in enumerate(groups):
        for name in group.models:
            for i in group.devices:
                if name in by_model and i < len(devices):
                    problems += _cannot_run(name, by_model[name], devices[i], f" (group {j})")
    return problems


def _partition(plan, by_model, index, devices: list[ExecutorDevice]) -> list[str]:
    from app.planning.partition.plan import read_plan

    clusters = [c for c in read_plan(plan.path).sub_clusters if c.models]
    names = [m for c in clusters for m in c.models]
    problems = _unknown(names, by_model, index)
    configs = {f"{m}/{i}": c for m, cs in by_model.items() for i, c in enumerate(cs)}
    dealt = dealt_devices(devices, configs, set(names))
    free = [d for d in devices if d not in dealt]
    problems += _without_device(set(names), by_model, free, "in no sub-cluster")
    if len(dealt) < len(clusters):
        problems.append(
            f"{len(clusters)} sub-clusters need at least as many devices their models run on; "
            f"this server has {len(dealt)} ({listed(d.name for d in dealt)})"
        )
    return problems


def _inss(plan, by_model, index, devices: list[ExecutorDevice]) -> list[str]:
    assert plan.inss is not None
    placement = plan.inss
    problems = _unknown(sorted(placement.device_of), by_model, index)
    by_name = {d.name: d for d in devices}
    for name in sorted(placement.planned_devices - set(by_name)):
        problems.append(f"device {name!r} is not a device of this server")
    for name, where in sorted(placement.device_of.items()):
        device = by_name.get(where.partition("/")[0])
        if name not in by_model or device is None:
            continue
        problems += _cannot_run(name, by_model[name], device, "")
        batch = placement.batch.get(name)
        largest = min(c.max_batch_size for c in by_model[name])
        if batch is not None and batch > largest:
            problems.append(
                f"model {name!r}: the plan batches {batch}, above its max_batch_size {largest}"
            )
    free = [d for d in devices if d.name not in placement.planned_devices]
    return problems + _without_device(set(placement.device_of), by_model, free, "not in the plan")


def _ppipe(plan, by_model, index) -> list[str]:
    from app.planning.ppipe.plan import read_plan

    return _unknown([m.name for m in read_plan(plan.path).models], by_model, index)
