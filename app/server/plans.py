"""The plan the daemon serves (`PLAN=FILE`): any planner's plan file
(app/planning/plan_files.py), checked against this server's models and
devices at start-up and turned into what the daemon runs.

* a **partition** or **HERD** plan: one scheduling core per group, each
  group's models on its devices (app/server/core_groups.py; `CORE_GROUPS`
  is the older name of this setting for these two kinds);
* a **PPipe** plan: its models served as pipelines
  (app/server/pipeline_service.py; `PPIPE_PLAN` is its older name);
* an **InSS** plan: each device it names split into one share per model it
  places there (as `DEVICE_SHARES` would), each model on its share (as a
  config's `devices` would), and its batch sizes the policy's batch per
  model — policy `inss`'s `batch`, `triton`'s `max_batch`; the other
  policies form batches by their own rule (a warning says so). Models of
  the repository the plan does not place run on the devices it leaves free.

Nexus's squishy packing has no plan file: policy `nexus` packs in its
scheduling core, epoch by epoch (app/scheduling/nexus.py).

A plan that does not fit — a model the repository lacks, a device the
server lacks, a model on a device its backend cannot use, a batch over a
model's max_batch_size, a repository model left with no device — stops
start-up with one message naming every mismatch and the command that
makes a plan for this server (`PlanMismatch`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.planning.plan_files import PlanFile, read_plan_file
from app.repository.config import ModelConfig
from app.runtime.devices import ExecutorDevice, detect_devices, model_allowed_on
from app.runtime.shares import SHARE_SEP
from app.server.settings import PLAN_POLICIES, Settings
from app.server.startup import StartupFailed

log = logging.getLogger("app.server")

# Each kind as a person reads it.
WHAT = {
    "symphony-partition": "a Symphony partition plan",
    "herd-plan": "a HERD plan",
    "inss-plan": "an InSS plan",
    "ppipe-plan": "a PPipe plan",
}


class PlanMismatch(StartupFailed):
    """The plan does not fit this server: start-up stops."""


@dataclass(frozen=True)
class InssPlacement:
    """What an InSS plan sets: each device's shares, each placed model's
    executor device (a share's name, or the whole device's) and batch."""

    shares: dict[str, tuple[float, ...]]
    device_of: dict[str, str]
    batch: dict[str, int]
    planned_devices: frozenset[str]  # the whole devices the plan names
    unserved: dict[str, str] = dataclasses.field(default_factory=dict)  # model → why


@dataclass(frozen=True)
class PlanInForce:
    """The plan the daemon serves, as `GET /v2/plan` shows it."""

    setting: str  # how it was given: PLAN, CORE_GROUPS or PPIPE_PLAN
    path: Path
    file: PlanFile
    inss: InssPlacement | None = None

    def label(self) -> str:
        """How messages name it: the setting and its file, or "the posted plan"."""
        if self.setting.startswith("POST"):
            return "the posted plan"
        return f"{self.setting}={self.path}"

    def describe(self) -> dict[str, Any]:
        made = self.file.made_from
        return {
            "setting": self.setting,
            "path": str(self.path),
            "kind": self.file.kind,
            "version": self.file.version,
            "planner": self.file.planner,
            "made_from": None if made is None else made.to_dict(),
            "plan": self.file.body,
        }


def given_plan(settings: Settings) -> tuple[str, Path] | None:
    """The plan setting in use and its file (PLAN, or its older names)."""
    for setting, path in (
        ("PLAN", settings.plan),
        ("CORE_GROUPS", settings.core_groups),
        ("PPIPE_PLAN", settings.ppipe_plan),
    ):
        if path is not None:
            return setting, path
    return None


def load_plan(settings: Settings) -> PlanInForce | None:
    """The plan the settings name, read (None without one); StartupFailed
    when it cannot be read or is of a kind its setting does not take."""
    given = given_plan(settings)
    if given is None:
        return None
    setting, path = given
    try:
        file = read_plan_file(path)
    except ValueError as exc:
        raise StartupFailed(f"{setting}={path}: {exc}") from None
    wanted = {
        "CORE_GROUPS": ("herd-plan", "symphony-partition"),
        "PPIPE_PLAN": ("ppipe-plan",),
    }.get(setting)
    if wanted is not None and file.kind not in wanted:
        raise StartupFailed(
            f"{setting}={path}: {WHAT[file.kind]} (kind {file.kind!r}); {setting} takes "
            f"{' or '.join(WHAT[k] for k in wanted)}: serve it with PLAN={path}"
        )
    inss = inss_placement(file) if file.kind == "inss-plan" else None
    return PlanInForce(setting, path, file, inss)


def inss_placement(file: PlanFile) -> InssPlacement:
    """An InSS plan's shares, placement and batches (module docstring): a
    device whose models are each at its whole (one model alone, or several
    time-shared: run in turn) is not split."""
    from app.planning.inss.plan import plan_from_body

    plan = plan_from_body(file.body, "the plan")
    by_name = {m.model: m for m in plan.models}
    shares: dict[str, tuple[float, ...]] = {}
    device_of: dict[str, str] = {}
    batch: dict[str, int] = {}
    for device in plan.devices:
        placed = [by_name[m] for m in device.models if by_name[m].served]
        if not placed:
            continue
        values = tuple(float(m.share or 1.0) for m in placed)
        split = not all(value >= 1.0 for value in values)
        if split:
            shares[device.device] = values
        for i, m in enumerate(placed):
            device_of[m.model] = f"{device.device}{SHARE_SEP}{i}" if split else device.device
            if m.batch is not None:
                batch[m.model] = int(m.batch)
    return InssPlacement(
        shares, device_of, batch, frozenset(d.device for d in plan.devices), plan.unserved()
    )


def resolve(settings: Settings, plan: PlanInForce | None) -> Settings:
    """`settings` as the plan sets them: its file under CORE_GROUPS or
    PPIPE_PLAN, an InSS plan's shares as DEVICE_SHARES and its batches as
    the policy's options. StartupFailed when a setting says otherwise."""
    if plan is None or plan.setting != "PLAN":
        return settings
    kind = plan.file.kind
    if kind in ("herd-plan", "symphony-partition"):
        return dataclasses.replace(settings, core_groups=plan.path)
    if kind == "ppipe-plan":
        return dataclasses.replace(settings, ppipe_plan=plan.path)
    assert plan.inss is not None
    if settings.device_shares is not None:
        raise StartupFailed(
            f"{plan.label()}: an InSS plan sets the devices' shares; DEVICE_SHARES is set too "
            "(unset it, or serve without the plan)"
        )
    return dataclasses.replace(
        settings,
        device_shares=plan.inss.shares or None,
        policy_options={**batch_options(settings, plan.inss.batch), **settings.policy_options},
    )


# The policies that take a plan's batch sizes, and the option that does.
BATCH_OPTION = {"inss": "batch", "triton": "max_batch"}


def batch_options(settings: Settings, batch: Mapping[str, int]) -> dict[str, object]:
    """The plan's batch per model as the policy's option: `inss`'s `batch`,
    `triton`'s `max_batch`; other policies have none (`log_plan` says so)."""
    option = BATCH_OPTION.get(settings.policy)
    return {option: dict(batch)} if batch and option is not None else {}


def log_plan(settings: Settings, plan: PlanInForce) -> None:
    """What of the plan is served, and what is not, once at start-up."""
    log.info("serving %s (%s)", plan.label(), WHAT[plan.file.kind])
    if plan.inss is None:
        return
    for name, reason in sorted(plan.inss.unserved.items()):
        log.warning("plan: model %s is not served by the plan: %s", name, reason)
    if plan.inss.batch and settings.policy not in BATCH_OPTION:
        # Under the plan's own policy (symphony) this is the design, not a
        # field left unread: INFO; under any other, a warning.
        level = logging.INFO if settings.policy == PLAN_POLICIES["inss-plan"] else logging.WARNING
        capped = sorted(time_shared_batches(plan.inss))
        log.log(
            level,
            "the plan's batch sizes (%s) apply under POLICY=inss or triton; policy %s forms "
            "batches by its own rule%s",
            ", ".join(f"{m} {b}" for m, b in sorted(plan.inss.batch.items())),
            settings.policy,
            f", up to the plan's for the time-shared {', '.join(capped)}" if capped else "",
        )


def place_inss(
    plan: PlanInForce,
    configs: dict[str, ModelConfig],
    devices: list[ExecutorDevice],
    policy: str,
) -> dict[str, ModelConfig]:
    """`configs` with each placed model on its share, the others on the
    devices the plan leaves free (checked to fit by plan_checks.py);
    `devices` are the server's whole devices (`whole_devices`).

    Under a `policy` that forms its own batches (not `inss` or `triton`),
    a model on a device the plan time-shares (several models in turn on the
    whole device) has its max batch capped at the plan's batch: the
    planner's duty cycle assumes those batches, and one model's longer
    batch would hold the device past its co-runners' deadlines
    (bench/workloads/inss/ppipe-large.yaml: 1.37 % late or dropped at 1.6×
    the file's rates uncapped, 0.74 % capped, BENCHMARKS.md)."""
    assert plan.inss is not None
    placement = plan.inss
    free = [d for d in devices if d.whole not in placement.planned_devices]
    capped = time_shared_batches(placement) if policy not in BATCH_OPTION else {}
    out = {}
    for key, config in configs.items():
        name = config.model_name
        if name in placement.device_of:
            cap = min(config.max_batch_size, capped.get(name, config.max_batch_size))
            out[key] = dataclasses.replace(
                config, devices=(placement.device_of[name],), max_batch_size=cap
            )
            continue
        allowed = tuple(d.name for d in free if model_allowed_on(config, d))
        out[key] = dataclasses.replace(config, devices=allowed)
    for name, device in sorted(placement.device_of.items()):
        batch = placement.batch.get(name, "-")
        if policy in BATCH_OPTION:
            shown = f"batch {batch}"
        elif name in capped:
            shown = f"batch ≤ {batch} (time-shared)"
        else:
            shown = f"batches by {policy}"
        log.info("plan: model %s on %s, %s", name, device, shown)
    return out


def time_shared_batches(placement: InssPlacement) -> dict[str, int]:
    """The plan's batch of each model that shares a whole device with others."""
    hosted: dict[str, list[str]] = {}
    for name, device in placement.device_of.items():
        hosted.setdefault(device, []).append(name)
    return {
        name: placement.batch[name]
        for device, names in hosted.items()
        if device in placement.planned_devices and len(names) > 1
        for name in names
        if name in placement.batch
    }


def whole_devices(settings: Settings) -> list[ExecutorDevice]:
    """This server's devices before any share split."""
    return detect_devices(
        settings.cpu_slices, settings.threads_per_slice, settings.emulated_devices
    )


def layout_devices(settings: Settings) -> list[ExecutorDevice]:
    """This server's executor devices in order, shares split (the order a
    HERD plan's device indices count in)."""
    return detect_devices(
        settings.cpu_slices,
        settings.threads_per_slice,
        settings.emulated_devices,
        shares=settings.device_shares,
    )


def listed(names: Iterable[str]) -> str:
    names = list(names)
    return ", ".join(names) if names else "none"
