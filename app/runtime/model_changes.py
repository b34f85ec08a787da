"""A model loaded or unloaded while serving, written once for executor
processes (app/runtime/pool.py) and Ray actors (app/runtime/ray_pool.py).
Each pool owns a `ModelChanges` over the narrow `ModelHost` it implements.

`add_model` has every serving executor whose device may run the model load
it (all at once), and keeps it in the pool's configs, so that a respawned
executor — or a new one after a park — loads it too. `remove_model` has
every executor unload it (after the batches sent to it before: the caller
sends none of a model being removed, app/server/model_control.py), waits
for all of them to let go, and only then unlinks its arena. Neither touches
batches. A plan switch moves a served model onto other devices:
`replace_config` loads it where its new config newly allows it (its arena
stays), `trim` unloads it, later, where the config no longer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from app.repository.config import ModelConfig
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice, model_allowed_on

log = logging.getLogger("app.runtime.pool")


class ExecutorModels(Protocol):
    """What an executor's record keeps of its models."""

    device: ExecutorDevice
    models: list[str]
    load_errors: dict[str, str]
    load_info: dict[str, Any]


class ModelHost(Protocol):
    """What model changes need of a pool."""

    configs: dict[str, ModelConfig]
    arenas: dict[str, Arena]
    load_timeout_s: float

    def executor_records(self) -> Iterable[ExecutorModels]:
        """Every device's executor record."""
        ...

    def serves(self, executor: Any) -> bool:
        """The executor runs and may be sent a model change."""
        ...

    async def load_on(
        self, executor: Any, config: ModelConfig, arena: Arena
    ) -> tuple[dict[str, str | None], dict[str, Any]]:
        """Load `config` there: (error or None per model, load info); raises
        (its message says why) when the executor cannot answer."""
        ...

    async def unload_on(self, executor: Any, name: str) -> None:
        """Unload model `name` there, after the batches sent before."""
        ...


class ModelChanges:
    """Loading and unloading one model on a running pool (module docstring)."""

    def __init__(self, host: ModelHost) -> None:
        self._host = host

    async def add_model(self, config: ModelConfig, arena: Arena) -> dict[int, str | None]:
        """Load `config` (a model not in the pool) on every serving executor
        whose device may run it, with `arena`; the pool owns the arena from
        now on. Returns, per device tried, why it failed there, or None."""
        host = self._host
        name = config.name
        if name in host.configs:
            raise ValueError(f"model {name!r} is in the pool already: remove it first")
        host.configs[name] = config
        host.arenas[name] = arena
        results: dict[int, str | None] = {}
        tries = []
        for executor in host.executor_records():
            if not model_allowed_on(config, executor.device):
                continue
            if not host.serves(executor):
                results[executor.device.id] = f"executor {executor.device.name} is not running"
                continue
            tries.append(executor)
        errors = await asyncio.gather(*(self._load(e, config, arena) for e in tries))
        for executor, error in zip(tries, errors, strict=True):
            results[executor.device.id] = error
        return results

    async def _load(
        self, executor: ExecutorModels, config: ModelConfig, arena: Arena
    ) -> str | None:
        name = config.name
        try:
            errors, info = await asyncio.wait_for(
                self._host.load_on(executor, config, arena), self._host.load_timeout_s
            )
        except Exception as exc:
            return str(exc) or "timed out"
        error = errors.get(name, "no answer for this model")
        if error is None:
            executor.models.append(name)
            executor.load_info.update(info)
        else:
            executor.load_errors[name] = error
            device = executor.device.name
            log.warning("executor %s: model %s failed to load: %s", device, name, error)
        return error

    async def replace_config(
        self, config: ModelConfig, on: Iterable[int] | None = None
    ) -> dict[int, str | None]:
        """Serve model `config.name` (in the pool) by `config` from now on:
        loaded on each serving executor that its config now allows and that
        does not hold it yet (of the devices `on`, when given). Per device
        tried, why it failed there, or None; where it fails, the old config
        is back."""
        host = self._host
        name = config.name
        if name not in host.configs:
            raise ValueError(f"model {name!r} is not in the pool")
        old, host.configs[name] = host.configs[name], config
        wanted = None if on is None else set(on)
        tries = [
            e
            for e in host.executor_records()
            if model_allowed_on(config, e.device)
            and name not in e.models
            and host.serves(e)
            and (wanted is None or e.device.id in wanted)
        ]
        arena = host.arenas[name]
        errors = await asyncio.gather(*(self._load(e, config, arena) for e in tries))
        results = {e.device.id: error for e, error in zip(tries, errors, strict=True)}
        if any(error is not None for error in results.values()):
            host.configs[name] = old
        return results

    async def trim(self, name: str) -> None:
        """Unload model `name` from the executors its config no longer
        allows (after the batches sent to them before)."""
        host = self._host
        config = host.configs.get(name)
        if config is None:
            return
        holding = []
        for executor in host.executor_records():
            if name in executor.models and not model_allowed_on(config, executor.device):
                executor.models.remove(name)
                executor.load_info.pop(name, None)
                if host.serves(executor):
                    holding.append(executor)
        await asyncio.gather(*(self._unload(e, name) for e in holding))

    async def remove_model(self, name: str) -> None:
        """Unload `name` from every executor and forget it; its arena is
        closed and unlinked once every executor has let go of it."""
        host = self._host
        host.configs.pop(name, None)
        arena = host.arenas.pop(name, None)
        holding = []
        for executor in host.executor_records():
            executor.load_errors.pop(name, None)
            executor.load_info.pop(name, None)
            if name not in executor.models:
                continue
            executor.models.remove(name)
            if host.serves(executor):  # one that is gone holds nothing
                holding.append(executor)
        await asyncio.gather(*(self._unload(e, name) for e in holding))
        if arena is not None:
            arena.close_and_unlink()

    async def _unload(self, executor: ExecutorModels, name: str) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._host.unload_on(executor, name), self._host.load_timeout_s)
