"""The messages on an executor's pipes, in one place.

Everything that crosses the pipes is one of these dataclasses, built by the
parent (`ExecutorPool`) or by the executor from ints, floats, strings,
lists and dicts; tensor bytes live in shared-memory arenas and never cross.
Nothing here carries data from the network but application ids (plain
strings the parent copies into `Run.alone`).

Clock: times are `time.monotonic()` seconds — CLOCK_MONOTONIC is
system-wide on Linux, and asyncio's `loop.time()` uses the same clock, so
the parent compares them with its own times.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.repository.config import ModelConfig, ProfileSpec, TensorSpec

# ------------------------------------------------------ parent → executor


@dataclass(frozen=True, slots=True)
class Load:
    """Load these models (plain-dict configs) and attach their arenas."""

    req_id: int
    configs: list[dict[str, Any]]
    layouts: dict[str, Any]  # model → arena layout


@dataclass(frozen=True, slots=True)
class Unload:
    """Drop these models and detach their arenas (after the batches sent
    before). A model loaded again later comes with a fresh `Load`."""

    req_id: int
    models: list[str]


# A request of a batch to re-run alone once the batch has run (the
# asynchronous profiler, app/runtime/alone_profiler.py): (its first row's
# index in `Run.slots`, its rows, its application).
AloneMark = tuple[int, int, str]


@dataclass(frozen=True, slots=True)
class Run:
    """Run a batch of `model` over arena `slots`, not before `start_at`
    (≤ now: at once), after the batches sent before it. `alone`: its
    requests sampled for re-running alone, if it runs to its end."""

    batch_id: int
    model: str
    slots: list[int]
    start_at: float
    alone: tuple[AloneMark, ...] = ()


@dataclass(frozen=True, slots=True)
class Profile:
    """Time batches of synthetic inputs: the median of `repeats` runs per
    batch size, after `warmup` runs. With `inputs`, time those instead (a
    dynamic model's probe; `batch_sizes` is then their batch size)."""

    req_id: int
    model: str
    batch_sizes: list[int]
    warmup: int
    repeats: int
    inputs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish the batches already sent, then exit."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop batch `batch_id`: skip it if it has not started, abort it at its
    next exit point if it runs. Sent on the second, one-way pipe, which a
    thread of the executor reads at once, even mid-batch."""

    batch_id: int


ToExecutor = Load | Unload | Run | Profile | Stop

# ------------------------------------------------------ executor → parent


@dataclass(frozen=True, slots=True)
class Loaded:
    req_id: int
    errors: dict[str, str | None]  # model → why it failed to load, or None
    info: dict[str, str]  # model → backend and providers


@dataclass(frozen=True, slots=True)
class Unloaded:
    req_id: int


@dataclass(frozen=True, slots=True)
class Ran:
    """A batch ran to its end: outputs are in its slots, or `error` says why
    not. `started_at` is taken just before the inputs are gathered,
    `finished_at` just after the outputs are scattered (on an emulated
    device, once it has been held until `started_at` + ℓ(b))."""

    batch_id: int
    started_at: float
    finished_at: float
    error: str | None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """A batch stopped by a Cancel before its end (`started_at` ==
    `stopped_at` when it never started). Its output slots may hold partial
    results."""

    batch_id: int
    started_at: float
    stopped_at: float


@dataclass(frozen=True, slots=True)
class Profiled:
    req_id: int
    result: dict[int, float] | None  # batch size → median ms
    error: str | None


@dataclass(frozen=True, slots=True)
class RanAlone:
    """A sampled request of `model` from application `app`, `items` rows,
    was re-run alone in `seconds` — or, `seconds` None, stopped because a
    message arrived, and its time discarded. `dropped`: samples dropped
    from the executor's full backlog since its previous RanAlone."""

    model: str
    app: str
    items: int
    seconds: float | None
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class Stopped:
    """The executor finished its batches and exits."""


FromExecutor = Loaded | Unloaded | Ran | Cancelled | Profiled | RanAlone | Stopped


# ------------------------------------------------------- config ↔ plain dict
def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """A ModelConfig as plain picklable builtins (sent to executors)."""

    def tensor(s: TensorSpec) -> dict[str, Any]:
        return {
            "name": s.name,
            "datatype": s.datatype,
            "shape": list(s.shape),
            "max_shape": None if s.max_shape is None else list(s.max_shape),
            "pad": list(s.pad),
            "follows": [None if f is None else list(f) for f in s.follows],
            "max_bytes": s.max_bytes,
            "elastic": s.elastic,
        }

    p = config.profile
    return {
        "name": config.name,
        "backend": config.backend,
        "directory": str(config.directory),
        "inputs": [tensor(s) for s in config.inputs],
        "outputs": [tensor(s) for s in config.outputs],
        "max_batch_size": int(config.max_batch_size),
        "slo_ms": float(config.slo_ms),
        "model_file": None if config.model_file is None else str(config.model_file),
        "profile": None
        if p is None
        else {
            "alpha_ms": p.alpha_ms,
            "beta_ms": p.beta_ms,
            "latency_ms": None
            if p.latency_ms is None
            else {int(b): float(ms) for b, ms in p.latency_ms.items()},
            "device": p.device,
        },
        "allow_slo_loosening": bool(config.allow_slo_loosening),
        "devices": None if config.devices is None else list(config.devices),
        "version": config.version,
        "description": config.description,
        # config.yaml `parameters` (plain YAML values): backend options such
        # as an emulated model's preemption delay.
        "extra": dict(config.extra),
    }


def config_from_dict(d: dict[str, Any] | ModelConfig) -> ModelConfig:
    if isinstance(d, ModelConfig):
        return d

    def tensor(t: dict[str, Any]) -> TensorSpec:
        bounds = t.get("max_shape")
        return TensorSpec(
            t["name"],
            t["datatype"],
            tuple(int(x) for x in t["shape"]),
            max_shape=None if bounds is None else tuple(int(x) for x in bounds),
            pad=tuple(bool(x) for x in t.get("pad") or ()),
            follows=tuple(
                None if f is None else (str(f[0]), int(f[1])) for f in t.get("follows") or ()
            ),
            max_bytes=t.get("max_bytes"),
            elastic=bool(t.get("elastic", False)),
        )

    p = d.get("profile")
    return ModelConfig(
        name=d["name"],
        backend=d["backend"],
        directory=Path(d.get("directory") or "."),
        inputs=tuple(tensor(t) for t in d["inputs"]),
        outputs=tuple(tensor(t) for t in d["outputs"]),
        max_batch_size=int(d["max_batch_size"]),
        slo_ms=float(d["slo_ms"]),
        model_file=None if d.get("model_file") is None else Path(d["model_file"]),
        profile=None
        if p is None
        else ProfileSpec(
            alpha_ms=p.get("alpha_ms"),
            beta_ms=p.get("beta_ms"),
            latency_ms=None
            if p.get("latency_ms") is None
            else {int(b): float(ms) for b, ms in p["latency_ms"].items()},
            device=p.get("device"),
        ),
        allow_slo_loosening=bool(d.get("allow_slo_loosening", False)),
        devices=None if d.get("devices") is None else tuple(d["devices"]),
        version=str(d.get("version", "1")),
        description=str(d.get("description", "")),
        extra=dict(d.get("extra") or {}),
    )
