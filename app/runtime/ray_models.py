"""Ray executors' model changes while serving: a model loaded or unloaded,
as `app.runtime.pool_models` does for local executor processes.

`RayExecutorPool` (app/runtime/ray_pool.py) inherits `ActorModelChanges`.
`add_model` has every serving actor whose device may run the model load it
— on the daemon's arena when the actor shares the daemon's node, on a
scratch arena of its own otherwise — and keeps it in the pool's configs, so
that an actor Ray restarts, or a new one after a park, loads it too.
`remove_model` has every actor unload it (after the batches sent before:
the caller sends none of a model being removed), then unlinks its arena.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from app.repository.config import ModelConfig
from app.runtime.arena import Arena
from app.runtime.devices import model_allowed_on
from app.runtime.messages import config_to_dict

if TYPE_CHECKING:
    from app.runtime.ray_pool import RayExecutorPool

log = logging.getLogger("app.runtime.ray_pool")


class ActorModelChanges:
    """Loading and unloading one model on running actors."""

    async def add_model(
        self: RayExecutorPool, config: ModelConfig, arena: Arena
    ) -> dict[int, str | None]:
        """Load `config` (a model not in the pool) on every serving actor whose
        device may run it; the pool owns `arena` from now on. Returns, per
        device tried, why it failed to load there, or None."""
        name = config.name
        if name in self.configs:
            raise ValueError(f"model {name!r} is in the pool already: remove it first")
        self.configs[name] = config
        self.arenas[name] = arena
        results: dict[int, str | None] = {}
        for a in self._actors.values():
            if not model_allowed_on(config, a.device):
                continue
            if a.dead or a.loading or self._stopped:
                results[a.device.id] = f"executor {a.device.name} is not running"
                continue
            layouts = None if a.remote else {name: arena.layout}
            try:
                loaded = await asyncio.wait_for(
                    a.handle.load.remote([config_to_dict(config)], layouts), self.load_timeout_s
                )
            except Exception as exc:
                results[a.device.id] = (
                    f"executor {a.device.name}: {exc}" if str(exc) else "timed out"
                )
                continue
            error = loaded.errors.get(name, "no answer for this model")
            if error is None:
                a.models.append(name)
                a.load_info.update(loaded.info)
            else:
                a.load_errors[name] = error
                log.warning("executor %s: model %s failed to load: %s", a.device.name, name, error)
            results[a.device.id] = error
        return results

    async def remove_model(self: RayExecutorPool, name: str) -> None:
        """Unload `name` from every actor and forget it; its arena is closed
        and unlinked once every actor has let go of it."""
        self.configs.pop(name, None)
        arena = self.arenas.pop(name, None)
        for a in self._actors.values():
            a.load_errors.pop(name, None)
            a.load_info.pop(name, None)
            if name not in a.models:
                continue
            a.models.remove(name)
            if a.dead or a.loading or self._stopped:
                continue  # an actor that is gone holds nothing; a new one loads from configs
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    a.handle.unload.remote([name], self._sent(a)), self.load_timeout_s
                )
        if arena is not None:
            arena.close_and_unlink()
