"""Policies by name: `make_scheduler("symphony", models, devices, **params)`."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from typing import Any

from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.types import DeviceInfo

# name → (module, class name, fixed keyword arguments)
_POLICIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "symphony": ("app.scheduling.symphony", "SymphonyScheduler", {}),
    "symphony-wc": (
        "app.scheduling.symphony",
        "WorkConservingSymphonyScheduler",
        {"work_conserving": True},
    ),
    "flex": ("app.scheduling.flex", "FlexScheduler", {}),
    "flex-np": ("app.scheduling.flex", "FlexScheduler", {"preemption": False}),
    "clockwork": ("app.scheduling.clockwork", "ClockworkScheduler", {}),
    "nexus": ("app.scheduling.nexus", "NexusScheduler", {}),
    "triton": ("app.scheduling.triton", "TritonScheduler", {}),
    "gpulet": ("app.scheduling.gpulet", "GpuletScheduler", {}),
    "inss": ("app.scheduling.inss", "InssScheduler", {}),
    "clipper": ("app.scheduling.clipper", "ClipperScheduler", {}),
    "orloj": ("app.scheduling.orloj", "OrlojScheduler", {}),
}


def policy_names() -> list[str]:
    return list(_POLICIES)


def scheduler_class(name: str) -> type[Scheduler]:
    try:
        module_name, class_name, _ = _POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose one of: {', '.join(_POLICIES)}"
        ) from None
    return getattr(importlib.import_module(module_name), class_name)


def policy_options(name: str) -> list[str]:
    """The keyword options policy `name` accepts (its own and the core's)."""
    cls = scheduler_class(name)
    options: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or "__init__" not in klass.__dict__:
            continue
        # Every __init__ takes (models, devices, *, options...). The class's
        # signature, not its __init__'s: a compiled class's __init__ is a slot
        # wrapper with none; and its signature may show the options as
        # positional-only (the core's, compiled), hence "after the first two".
        parameters = list(inspect.signature(klass).parameters.values())[2:]
        options.update(
            p.name
            for p in parameters
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        )
    return sorted(options - set(_POLICIES[name][2]))


def make_scheduler(
    name: str,
    models: Sequence[ModelInfo],
    devices: Sequence[DeviceInfo],
    **params: Any,
) -> Scheduler:
    """Build policy `name`; `params` are that policy's keyword options."""
    cls = scheduler_class(name)
    fixed = _POLICIES[name][2]
    clash = set(fixed) & set(params)
    if clash:
        raise ValueError(f"policy {name!r} fixes {sorted(clash)}; do not pass them")
    try:
        return cls(models, devices, **fixed, **params)
    except TypeError as exc:
        raise ValueError(f"bad option for policy {name!r}: {exc}") from None
