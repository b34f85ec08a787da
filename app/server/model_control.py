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
import time
from typing import TYPE_CHECKING, Any

from app.errors import InvalidInput, LoadFailed, ModelNotFound
from app.repository.config import VERSION_KEY_SEP, ModelConfig, shown_model
from app.repository.loader import load_repository
from app.runtime.arena import Arena
from app.scheduling.model import ModelInfo
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.server import startup
from app.server.dispatcher import CoreGroup
from app.server.startup import ModelState

if TYPE_CHECKING:
    from app.server.live import LiveService

log = logging.getLogger("app.server")

_POLL_S = 0.01
UNLOADED = "unloaded"  # the index's reason for a model unloaded on request

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
        changes["max_batch_size"] = _integer(doc["max_batch_size"], "max_batch_size", 1)
    if "slo_ms" in doc:
        changes["slo_ms"] = _positive(doc["slo_ms"], "slo_ms")
    if "allow_slo_loosening" in doc:
        value = doc["allow_slo_loosening"]
        if not isinstance(value, bool):
            raise InvalidInput(
                f"config override: allow_slo_loosening must be true or false, got {value!r}"
            )
        changes["allow_slo_loosening"] = value
    if "description" in doc:
        if not isinstance(doc["description"], str):
            raise InvalidInput("config override: description must be a string")
        changes["description"] = doc["description"]
    if "devices" in doc:
        devices = doc["devices"]
        if devices is not None and (
            not isinstance(devices, list) or not all(isinstance(d, str) for d in devices)
        ):
            raise InvalidInput("config override: devices must be a list of strings or null")
        changes["devices"] = None if devices is None else tuple(devices)
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
        if key == "slo_ms":
            try:
                out[key] = float(text)
            except ValueError:
                raise InvalidInput(f"config override: parameters.slo_ms: {text!r}") from None
        else:
            if text.lower() not in ("true", "false"):
                raise InvalidInput(f"config override: parameters.{key}: {text!r}")
            out[key] = text.lower() == "true"
    return out


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


def _integer(value: Any, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInput(f"config override: {what} must be an integer ≥ {low}, got {value!r}")
    return value


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInput(f"config override: {what} must be a number > 0, got {value!r}")
    return float(value)


# ------------------------------------------------------------------ unload


def _version_keys(keys: Any, name: str) -> list[str]:
    """Of served-model keys, those of model `name`'s versions."""
    return [k for k in keys if k.partition(VERSION_KEY_SEP)[0] == name]


def _refuse_pipeline(service: LiveService, name: str) -> None:
    """A model served as a pipeline of PPIPE_PLAN is not under model control."""
    if service.pipelines is not None and name in service.pipelines.configs:
        raise InvalidInput(
            f"model {name!r} is served as a pipeline of PPIPE_PLAN; its partitions are loaded "
            "and unloaded with the server, not by model control"
        )


async def unload(service: LiveService, name: str) -> None:
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


async def _unload(service: LiveService, name: str) -> None:
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
        del service.models[name]
        service.statistics.remove_model(name)
        await pool.remove_model(name)  # the executors let go, then the arena is unlinked
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


async def load(service: LiveService, name: str, override: str | None = None) -> None:
    """(Re)load every version of `name` from the repository (see the module
    docstring)."""
    _refuse_pipeline(service, name)
    settings = service.settings
    index = await asyncio.to_thread(load_repository, settings.repository)
    if name not in index.models:
        if name in index.errors:
            raise LoadFailed(f"failed to load model {name!r}: {index.errors[name]}")
        raise ModelNotFound(f"model {name!r} is not in the repository")
    configs = [index.models[key] for key in _version_keys(index.models, name)]
    if override is not None:
        configs = [apply_override(config, override) for config in configs]
    if _version_keys(service.models, name):
        await unload(service, name)
    for key in _version_keys(service.unavailable, name):
        del service.unavailable[key]  # versions the repository no longer selects go
    keys = [config.name for config in configs]
    service.control_state.update(dict.fromkeys(keys, "loading"))
    failure: LoadFailed | None = None
    try:
        for config in configs:
            try:
                await _load(service, config)
            except LoadFailed as exc:  # the other versions still load
                failure = failure or exc
    finally:
        for key in keys:
            service.control_state.pop(key, None)
    if failure is not None:
        raise failure


async def _load(service: LiveService, config: ModelConfig) -> None:
    settings, pool, dispatcher = service.settings, service.pool, service.dispatcher
    assert pool is not None and dispatcher is not None
    name = config.name
    arena = Arena.create(config, settings.arena_slots)
    errors = await pool.add_model(config, arena)  # the pool owns the arena now
    hosts = tuple(sorted(d for d, error in errors.items() if error is None))
    if not hosts:
        reasons = "; ".join(f"{e}" for e in errors.values() if e) or "no device can run it"
        await pool.remove_model(name)
        service.unavailable[name] = reasons
        raise LoadFailed(f"failed to load model {shown_model(name)}: {reasons}")
    state = ModelState(config, arena, hosts)
    try:
        await startup.measure_model(settings, pool, service.device(hosts[0]), state)
        info = state.info()
        if not dispatcher.add_model(info, hosts):
            if any(set(hosts) & set(group.devices) for group in dispatcher.groups):
                raise LoadFailed(
                    f"model {shown_model(name)} would run on devices {list(hosts)}, which other "
                    "models share with a different set of devices; restart the server to serve it"
                )
            dispatcher.add_group(_new_core(service, info, hosts))
    except BaseException:
        await pool.remove_model(name)
        raise
    service.models[name] = state
    service.unavailable.pop(name, None)
    service.statistics.add_model(name, config.version, config.model_name)
    service.versions[name] = config.version
    log.info("loaded model %s on devices %s", name, list(hosts))


def _new_core(service: LiveService, info: ModelInfo, hosts: tuple[int, ...]) -> CoreGroup:
    settings = service.settings
    devices = [service.device(d) for d in hosts]
    infos = [DeviceInfo(d.id, name=d.name, kind=d.kind) for d in devices]
    core = make_scheduler(settings.policy, [info], infos, **startup.core_options(settings))
    return CoreGroup(core, frozenset({info.name}), hosts)
