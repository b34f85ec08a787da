"""Loading and unloading a model while serving (Triton's model-repository extension).

`LiveService.load_model` and `unload_model` (the HTTP routes' and the gRPC
RPCs' entry points) call `load` and `unload` here, one at a time.

**Unload.** At once the model takes no new request: it answers 503
`unloaded` (and the index shows it UNAVAILABLE, reason "unloading", then
"unloaded", as Triton does). The requests already accepted keep being
scheduled for up to SHUTDOWN_GRACE_S; then its core drops those still
queued (503 `unloaded`); a batch still running after a second such bound is
cancelled on its executor and its requests answered the same way. So each
accepted request gets exactly one answer. Only when every one of them has
been answered and its slot freed do its executors drop the model and is its
shared-memory arena unlinked.

**Load.** The model's directory is read again through the repository
loader's public entry point, an optional config override applied
(`apply_override`), a new arena created, the model loaded on the executors
whose devices may run it, its latency profile taken (config, cache, or
measured) and the model added to the scheduling core of exactly those
devices (a new core when no core owns any of them). Loading a model that is
loaded unloads it first (Triton reloads it). A model that loads on no device
is refused (400 `load_failed`, the reason also in the index).

Both act on every version the model serves (each a served model of its own,
app/server/live.py): an unload unloads them all, a load reads them all again
(the override applies to each), one after the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import re
import time
from typing import Any

from app.errors import ControlBusy, InvalidInput, LoadFailed, ModelNotFound
from app.repository.config import VERSION_KEY_SEP, ModelConfig, shown_model
from app.repository.loader import load_repository
from app.runtime.arena import compute_layout
from app.runtime.devices import model_allowed_on
from app.scheduling.model import ModelInfo
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.server import startup
from app.server.control_host import ControlHost
from app.server.dispatcher import CoreGroup
from app.server.startup import ModelState

log = logging.getLogger("app.server")

_POLL_S = 0.01
# How long a load waits for a restarting executor it needs before it is
# refused (503 executor_restarting, nothing changed).
RESPAWN_WAIT_S = 10.0
UNLOADED = "unloaded"  # the index's reason for a model unloaded on request

# Bounds of an override's values. max_batch_size: at most MAX_BATCH_SIZE, and
# its arena must fit (`check_arena`); slo_ms: a request's own bound.
MAX_BATCH_SIZE = 65536
MAX_SLO_MS = 3_600_000.0  # 1 hour, a request's own bound (app.api.models.MAX_SLO_MS)
MAX_DESCRIPTION = 4096
MAX_DEVICE_ENTRIES = 64
_DIGITS = re.compile(r"\+?[0-9]{1,12}")
_DECIMAL = re.compile(r"\+?([0-9]{1,12}(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?")

# An arena (shared memory) may take at most this share of the machine's memory.
ARENA_MEMORY_SHARE = 0.25

# Fields of a config override (the body of GET /v2/models/{m}/config, or
# Triton's) that map onto ModelConfig, and those that must keep their value.
_SETTABLE = ("max_batch_size", "slo_ms", "allow_slo_loosening", "description", "devices")
_FIXED = ("name", "backend", "version", "input", "output")


# ------------------------------------------------------------------ the override


def apply_override(config: ModelConfig, text: str) -> ModelConfig:
    """`config` with the override `text` (JSON of a model config) applied.
    Fields that map onto ModelConfig are set; fields that name the model's
    identity or tensors must keep their value; any other is a 400 naming it."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"parameters.config is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("parameters.config must be a JSON object (a model config)")
    doc = dict(doc)
    parameters = doc.pop("parameters", None)
    if parameters is not None:
        doc.update(_triton_parameters(parameters))
    unknown = sorted(set(doc) - set(_SETTABLE) - set(_FIXED))
    if unknown:
        raise InvalidInput(
            f"config override: field {unknown[0]!r} is not supported "
            f"(supported: {', '.join(_SETTABLE)}; {', '.join(_FIXED)} must keep their value)"
        )
    current = _fixed_fields(config)
    for key in _FIXED:
        if key in doc and doc[key] != current[key]:
            raise InvalidInput(
                f"config override: {key!r} cannot change ({current[key]!r} → {doc[key]!r}); "
                "edit the model repository instead"
            )
    changes: dict[str, Any] = {}
    if "max_batch_size" in doc:
        changes["max_batch_size"] = _integer(
            doc["max_batch_size"], "max_batch_size", 1, MAX_BATCH_SIZE
        )
    if "slo_ms" in doc:
        changes["slo_ms"] = _positive(doc["slo_ms"], "slo_ms", MAX_SLO_MS)
    if "allow_slo_loosening" in doc:
        changes["allow_slo_loosening"] = _boolean(doc["allow_slo_loosening"], "allow_slo_loosening")
    if "description" in doc:
        text = doc["description"]
        if not isinstance(text, str) or len(text) > MAX_DESCRIPTION:
            raise InvalidInput(
                f"config override: description must be a string of at most {MAX_DESCRIPTION} "
                f"characters, got {_shown(text)}"
            )
        changes["description"] = text
    if "devices" in doc:
        changes["devices"] = _devices(doc["devices"])
    return dataclasses.replace(config, **changes)


def _triton_parameters(parameters: Any) -> dict[str, Any]:
    """Triton's `parameters` map (`{"slo_ms": {"string_value": "50"}}`)."""
    if not isinstance(parameters, dict):
        raise InvalidInput("config override: parameters must be an object")
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        if key not in ("slo_ms", "allow_slo_loosening"):
            raise InvalidInput(f"config override: parameter {key!r} is not supported")
        text = value.get("string_value") if isinstance(value, dict) else value
        if not isinstance(text, str):
            raise InvalidInput(f"config override: parameters.{key} needs a string_value")
        out[key] = text  # checked as the field itself is
    return out


def machine_memory_bytes() -> int:
    """Physical memory of this machine (0 where it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def check_arena(config: ModelConfig, capacity: int, memory: int | None = None) -> None:
    """InvalidInput naming max_batch_size when the model's arena of
    `capacity` items would take more than ARENA_MEMORY_SHARE of `memory`
    (the machine's)."""
    memory = machine_memory_bytes() if memory is None else memory
    size = compute_layout(config, capacity, "check")["size"]
    if memory and size > ARENA_MEMORY_SHARE * memory:
        raise InvalidInput(
            f"model {shown_model(config.name)}: max_batch_size {config.max_batch_size} needs a "
            f"shared-memory arena of {capacity} items × {size // capacity} bytes = "
            f"{size / 2**30:.1f} GiB, more than {ARENA_MEMORY_SHARE:.0%} of this machine's "
            f"{memory / 2**30:.1f} GiB; lower max_batch_size"
        )


def triton_type(datatype: str) -> str:
    """Triton's data_type name of a v2 datatype (BYTES is TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _fixed_fields(config: ModelConfig) -> dict[str, Any]:
    """The identity and tensors, as GET /v2/models/{m}/config renders them."""

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "data_type": triton_type(s.datatype), "dims": list(s.item_shape)}
            for s in specs
        ]

    return {
        "name": config.model_name,
        "backend": config.backend,
        "version": config.version,
        "input": tensors(config.inputs),
        "output": tensors(config.outputs),
    }


def _shown(value: Any) -> str:
    """A refused value in an answer, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(value: Any, what: str, low: int, high: int) -> int:
    """An integer in [low, high]: a JSON integer, a float with an integral
    value, or (Triton's JSON, as protobuf reads int64) a string of digits."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    if number is None or not low <= number <= high:
        raise InvalidInput(
            f"config override: {what} must be an integer from {low} to {high}, got {_shown(value)}"
        )
    return number


def _positive(value: Any, what: str, high: float) -> float:
    """A finite number in (0, high]: a JSON number or a decimal string."""
    number: float | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int | float):
        number = float(value) if abs(value) < 1e308 else None
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        number = float(value.strip())
    if number is None or not math.isfinite(number) or not 0 < number <= high:
        raise InvalidInput(
            f"config override: {what} must be a finite number > 0 and ≤ {high:.0f}, "
            f"got {_shown(value)}"
        )
    return number


def _boolean(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidInput(f"config override: {what} must be true or false, got {_shown(value)}")


def _devices(value: Any) -> tuple[str, ...] | None:
    """null (any device) or a non-empty list of device kinds or names, as
    the repository's config takes them."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_DEVICE_ENTRIES
        or not all(isinstance(d, str) and 0 < len(d.strip()) <= 128 for d in value)
    ):
        raise InvalidInput(
            "config override: devices must be null or a list of 1 to "
            f'{MAX_DEVICE_ENTRIES} device kinds or names (e.g. ["cpu"]), got {_shown(value)}'
        )
    devices = tuple(d.strip() for d in value)
    if len(set(devices)) != len(devices):
        raise InvalidInput(f"config override: devices has duplicate entries: {list(devices)}")
    return devices


# ------------------------------------------------------------------ unload


def _version_keys(keys: Any, name: str) -> list[str]:
    """Of served-model keys, those of model `name`'s versions."""
    return [k for k in keys if k.partition(VERSION_KEY_SEP)[0] == name]


def _refuse_pipeline(service: ControlHost, name: str) -> None:
    """A model served as a pipeline of PPIPE_PLAN is not under model control."""
    if service.pipelines is not None and name in service.pipelines.configs:
        raise InvalidInput(
            f"model {name!r} is served as a pipeline of PPIPE_PLAN; its partitions are loaded "
            "and unloaded with the server, not by model control"
        )


async def unload(service: ControlHost, name: str) -> None:
    """Unload every version of `name` (see the module docstring); returns
    once they are gone."""
    _refuse_pipeline(service, name)
    keys = _version_keys(service.models, name)
    failed = _version_keys(service.unavailable, name)
    if not keys and not failed:
        raise ModelNotFound(f"unknown model {name!r}")
    for key in failed:
        service.unavailable[key] = UNLOADED
    # All versions take no new request from now on, then go one by one.
    service.control_state.update(dict.fromkeys(keys, "unloading"))
    try:
        for key in keys:
            await _unload(service, key)
    finally:
        for key in keys:
            service.control_state.pop(key, None)


async def _unload(service: ControlHost, name: str) -> None:
    """Unload the served model `name` (a version key)."""
    state = service.models[name]
    service.control_state[name] = "unloading"
    dispatcher, pool = service.dispatcher, service.pool
    assert dispatcher is not None and pool is not None
    grace = service.settings.shutdown_grace_s
    log.info(
        "unloading model %s: its %d accepted requests get up to %.1f s",
        name,
        service.outstanding(name),
        grace,
    )
    try:
        await _wait(lambda: service.outstanding(name) == 0, grace)
        dispatcher.remove_model(name)  # what is still queued: 503 unloaded
        if not await _wait(lambda: service.outstanding(name) == 0, grace):
            for device in state.devices:
                for batch_id, model in pool.inflight(device).items():
                    if model == name:
                        pool.cancel(device, batch_id)
            if not await _wait(lambda: service.outstanding(name) == 0, grace + 1.0):
                raise RuntimeError(
                    f"model {shown_model(name)}: requests still unanswered after unloading"
                )
        service.unavailable[name] = "unloading"  # listed until it is unloaded
        del service.models[name]
        service.statistics.remove_model(name)
        await pool.model_changes.remove_model(
            name
        )  # the executors let go, then the arena is unlinked
    finally:
        service.control_state.pop(name, None)
    service.unavailable[name] = UNLOADED
    log.info("unloaded model %s", name)


async def _wait(done: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


# ------------------------------------------------------------------ load


async def load(service: ControlHost, name: str, override: str | None = None) -> None:
    """(Re)load every version of `name` from the repository (see the module
    docstring): everything that can be checked is checked before the
    version served is touched; a failure after that leaves the model
    `failed` with its reason in the index, never gone."""
    _refuse_pipeline(service, name)
    settings = service.settings
    index = await asyncio.to_thread(load_repository, settings.repository)
    served = _version_keys(service.models, name)
    if name not in index.models:
        if name in index.errors:
            if not served:  # failed, with its reason (a served one serves on)
                service.unavailable[name] = index.errors[name]
            raise LoadFailed(f"failed to load model {name!r}: {index.errors[name]}")
        raise ModelNotFound(f"model {name!r} is not in the repository")
    configs = [index.models[key] for key in _version_keys(index.models, name)]
    if override is not None:
        configs = [apply_override(config, override) for config in configs]
    plans = [(config, await _preflight(service, config)) for config in configs]
    if served:
        await unload(service, name)
    keys = [config.name for config in configs]
    for key in _version_keys(service.unavailable, name):
        del service.unavailable[key]  # versions the repository no longer selects go
    service.control_state.update(dict.fromkeys(keys, "loading"))
    service.unavailable.update(dict.fromkeys(keys, "loading"))  # listed while loading
    failure: LoadFailed | None = None
    try:
        for config, hosts in plans:
            try:
                await _load(service, config, hosts)
            except Exception as exc:  # the other versions still load
                reason = exc.message if isinstance(exc, LoadFailed) else _reason(exc)
                service.unavailable[config.name] = reason
                log.error("model %s failed to load: %s", config.name, reason)
                if failure is None:
                    failure = exc if isinstance(exc, LoadFailed) else LoadFailed(reason)
    finally:
        for key in keys:
            service.control_state.pop(key, None)
    if failure is not None:
        raise failure


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _preflight(service: ControlHost, config: ModelConfig) -> tuple[int, ...]:
    """The devices `config` will load on, once everything that can refuse
    the load before anything changes has been checked: its arena fits, a
    device of this server may run it, those devices' executors are up
    (waited for, at most RESPAWN_WAIT_S, while one restarts), and their
    set is one a core can take."""
    pool, dispatcher = service.pool, service.dispatcher
    assert pool is not None and dispatcher is not None
    shown = shown_model(config.name)
    check_arena(config, startup.arena_capacity(service.settings, config))
    allowed = [d for d in service.devices if model_allowed_on(config, d)]
    if not allowed:
        names = ", ".join(f"{d.name} ({d.kind})" for d in service.devices) or "none"
        which = "any device" if config.devices is None else f"devices {list(config.devices)}"
        raise LoadFailed(
            f"model {shown}: no device of this server can run it (backend {config.backend} "
            f"on {which}; devices here: {names})"
        )
    hosts = tuple(sorted(d.id for d in allowed if not pool.parking.parked(d.id)))
    if not hosts:
        raise ControlBusy(f"model {shown}: every device that may run it is parked (AUTOSCALE)")
    if not await _wait(lambda: all(pool.alive(d) for d in hosts), RESPAWN_WAIT_S):
        down = ", ".join(service.device(d).name for d in hosts if not pool.alive(d))
        raise ControlBusy(
            f"model {shown}: the executor of {down} is restarting and did not come back within "
            f"{RESPAWN_WAIT_S:.0f} s; nothing was changed, retry the load"
        )
    groups = dispatcher.groups
    if not any(g.devices == hosts for g in groups) and any(
        set(hosts) & set(g.devices) for g in groups
    ):
        raise LoadFailed(
            f"model {shown} would run on devices {[service.device(d).name for d in hosts]}, "
            "which other models share with a different set of devices; set its devices to "
            "those of a group (GET /v2/devices) or restart the server to serve it"
        )
    return hosts


async def _load(service: ControlHost, config: ModelConfig, planned: tuple[int, ...]) -> None:
    """Load `config` on the devices `_preflight` planned (those of them where it loads)."""
    settings, pool, dispatcher = service.settings, service.pool, service.dispatcher
    assert pool is not None and dispatcher is not None
    name = config.name
    if name in pool.configs:  # left in the pool by a load that failed (at start-up)
        await pool.model_changes.remove_model(name)
    arena = startup.create_arena(settings, config)
    errors = await pool.model_changes.add_model(config, arena)  # the pool owns the arena now
    hosts = tuple(sorted(d for d, error in errors.items() if error is None))
    if not hosts:
        reasons = "; ".join(f"{e}" for e in errors.values() if e) or "no device can run it"
        await pool.model_changes.remove_model(name)
        raise LoadFailed(f"failed to load model {shown_model(name)}: {reasons}")
    if hosts != planned:
        log.warning(
            "model %s loaded on devices %s of %s: %s",
            name,
            list(hosts),
            list(planned),
            "; ".join(f"{e}" for e in errors.values() if e),
        )
    state = ModelState(config, arena, hosts)
    try:
        device = service.device(hosts[0])
        serving = any(device.id in group.devices and group.models for group in dispatcher.groups)
        await startup.measure_model(settings, pool, device, state, serving=serving)
        info = state.info()
        if not dispatcher.add_model(info, hosts):
            if any(set(hosts) & set(group.devices) for group in dispatcher.groups):
                raise LoadFailed(
                    f"model {shown_model(name)} would run on devices {list(hosts)}, which other "
                    "models share with a different set of devices; restart the server to serve it"
                )
            # A new core is no one's yet: built off the event loop (a policy
            # may plan for a while, e.g. nexus ~2 s at max_batch_size 65536).
            dispatcher.add_group(await asyncio.to_thread(_new_core, service, info, hosts))
    except BaseException:
        await pool.model_changes.remove_model(name)
        raise
    service.models[name] = state
    service.unavailable.pop(name, None)
    service.statistics.add_model(name, config.version, config.model_name)
    service.versions[name] = config.version
    service.own_devices[name] = config.devices
    log.info("loaded model %s on devices %s", name, list(hosts))


def _new_core(service: ControlHost, info: ModelInfo, hosts: tuple[int, ...]) -> CoreGroup:
    settings = service.settings
    devices = [service.device(d) for d in hosts]
    infos = [DeviceInfo(d.id, name=d.name, kind=d.kind) for d in devices]
    core = make_scheduler(settings.policy, [info], infos, **startup.core_options(settings))
    return CoreGroup(core, frozenset({info.name}), hosts)
