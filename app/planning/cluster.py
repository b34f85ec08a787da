"""The cluster every planner plans for: the server's devices and the
repository's models (docs/architecture.md, "Planning").

Made from a model repository and the daemon's settings (`python -m app plan
SYSTEM --repository DIR`), from a running daemon (`--from URL`), or declared
in a cluster file (app/planning/cluster_file.py), which adds rates and each
planner's own section; each planner turns it into its problem
(`*/from_cluster.py`). Model names are the repository's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.scheduling.profile import LatencyProfile

MB = 1e6

#: Memory of a device whose memory is not known (an emulated or CPU device):
#: an NVIDIA 1080Ti's 11 GiB, the device of the bundled profiles (Symphony
#: Table 5).
DEFAULT_DEVICE_MEMORY_MB = 11264.0


@dataclass(frozen=True)
class ClusterDevice:
    """One executor device of the server, in `GET /v2/devices` order.

    `kind` is the executor kind (cpu, cuda, emulated: what a model's
    `devices` and profiles name); `device_class` a PPipe device class
    (PPIPE_CLASSES); `share` the fraction of a device split into shares;
    `node` its Ray node, when it runs on one."""

    name: str
    kind: str
    share: float = 1.0
    device_class: str | None = None
    node: str | None = None
    memory_mb: float | None = None

    @property
    def whole(self) -> str:
        """The device this is a share of (its own name when whole)."""
        return self.name.partition("/")[0]


@dataclass(frozen=True)
class ClusterModel:
    """A model of the repository as the planners see it.

    `profiles` holds ℓ(b) per device kind (measured or declared); `devices`
    the kinds or names it may run on (None: any device with a profile);
    `memory_bytes` its weights, `input_bytes` and `output_bytes` one
    request's tensors; `rate` requests/s, declared or measured (None: not
    known)."""

    name: str
    slo_s: float
    max_batch: int
    profiles: Mapping[str, LatencyProfile]
    memory_bytes: float = 0.0
    input_bytes: float = 0.0
    output_bytes: float = 0.0
    devices: tuple[str, ...] | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError(f"model {self.name!r}: no latency profile")
        if not self.slo_s > 0:
            raise ValueError(f"model {self.name!r}: SLO must be > 0")

    def may_run_on(self, device: ClusterDevice) -> bool:
        """Whether this model may run on `device` (its devices allow it
        and it has a profile for the device's kind)."""
        if device.kind not in self.profiles:
            return False
        if self.devices is None:
            return True
        return any(n in self.devices for n in (device.kind, device.name, device.whole))

    @property
    def item_bytes(self) -> float:
        """What one request adds to a batch's memory: its tensors."""
        return self.input_bytes + self.output_bytes

    def profile(self, kind: str | None = None) -> LatencyProfile:
        """ℓ(b) on `kind`, else on the first kind profiled."""
        if kind is not None and kind in self.profiles:
            return self.profiles[kind]
        return next(iter(self.profiles.values()))


@dataclass(frozen=True)
class ClusterDescription:
    """Devices, models and each planner's section (`inss`, `herd`,
    `ppipe`, `partition`: what differs in substance) of one cluster;
    `source` says where it was read from (a repository, a URL, a file)."""

    devices: tuple[ClusterDevice, ...]
    models: tuple[ClusterModel, ...]
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    source: str = ""
    notes: tuple[str, ...] = ()  # what a person should know (models left out, …)

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.sections.get(name, {}))

    def rate(self, model: ClusterModel, default: float | None = None) -> float:
        """The model's rate; without one, `default`, else a ValueError
        saying how to give it."""
        if model.rate:
            return model.rate
        if model.rate == 0.0 and default is None:
            raise ValueError(
                f"model {model.name!r} had no requests while its rate was measured: declare "
                f"its rate (`rates: {{{model.name}: R}}` in the cluster file) or measure over "
                "a longer --window"
            )
        if default is not None:
            return default
        raise ValueError(
            f"model {model.name!r} has no rate: declare it (`rates: {{{model.name}: R}}` in "
            "the cluster file) or measure it (`--from URL` of a serving daemon)"
        )

    def device_memory_mb(self, device: ClusterDevice, section: str) -> float:
        """The device's memory: its own, else the section's
        `device_memory_mb`, else DEFAULT_DEVICE_MEMORY_MB."""
        if device.memory_mb is not None:
            return device.memory_mb
        value = self.sections.get(section, {}).get("device_memory_mb", DEFAULT_DEVICE_MEMORY_MB)
        return float(value)


@dataclass(frozen=True)
class Pool:
    """The devices a planner of one pool plans over (their indices in the
    cluster's devices, which are the server's) and the models that may run
    on every one of them; `left_out` says which models may not, and why."""

    devices: tuple[int, ...]
    models: tuple[ClusterModel, ...]
    left_out: tuple[str, ...] = ()


def device_pool(cluster: ClusterDescription, section: str) -> Pool:
    """The pool of the `section` planner: the devices its section's
    `devices` names (kinds or names), else the devices of the kind on which
    the most models may run; the models that may run on all of them."""
    devices = cluster.devices
    chosen = cluster.sections.get(section, {}).get("devices")
    if chosen is not None:
        names = [chosen] if isinstance(chosen, str) else [str(n) for n in chosen]
        indices = [i for i, d in enumerate(devices) if {d.kind, d.name, d.whole} & set(names)]
        if not indices:
            have = ", ".join(f"{d.name} ({d.kind})" for d in devices) or "none"
            raise ValueError(f"{section}.devices {names} names no device (devices: {have})")
    else:
        kinds = list(dict.fromkeys(d.kind for d in devices))
        if not kinds:
            raise ValueError("the cluster has no devices")

        def served(kind: str) -> int:
            pool = [d for d in devices if d.kind == kind]
            return sum(all(m.may_run_on(d) for d in pool) for m in cluster.models)

        best = max(kinds, key=served)  # the first of the best, in device order
        indices = [i for i, d in enumerate(devices) if d.kind == best]
    models = tuple(m for m in cluster.models if all(m.may_run_on(devices[i]) for i in indices))
    kept = {m.name for m in models}
    pool_names = ", ".join(devices[i].name for i in indices)
    left_out = tuple(
        f"{m.name}: may not run on every device of the pool ({pool_names}); "
        f"choose the pool with `{section}: {{devices: [KIND or NAME, …]}}`"
        for m in cluster.models
        if m.name not in kept
    )
    if not models:
        raise ValueError(f"no model may run on every device of the pool ({pool_names})")
    return Pool(tuple(indices), models, left_out)
