"""The executor pool's model changes while serving: a model loaded or unloaded.

`ExecutorPool` (app/runtime/pool.py) inherits these. `add_model` sends the
model's `Load` to every running executor whose device may run it and keeps
it in the pool's configs, so that a respawned executor loads it too;
`remove_model` sends `Unload`, waits for every executor to let go of the
model, and only then unlinks its arena. Neither touches batches: the caller
sends none of a model being removed (app/server/model_control.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from app.errors import ExecutorFailed
from app.repository.config import ModelConfig
from app.runtime.arena import Arena
from app.runtime.devices import model_allowed_on
from app.runtime.messages import Load, Unload, config_to_dict

if TYPE_CHECKING:
    from app.runtime.pool import ExecutorPool

log = logging.getLogger("app.runtime.pool")


class ModelChanges:
    """Loading and unloading one model on a running pool."""

    async def add_model(
        self: ExecutorPool, config: ModelConfig, arena: Arena
    ) -> dict[int, str | None]:
        """Load `config` (a model not in the pool) on every running executor
        whose device may run it, with `arena` attached; the pool owns the
        arena from now on, and a respawned executor loads the model too.
        Returns, per device tried, why it failed to load there, or None."""
        name = config.name
        if name in self.configs:
            raise ValueError(f"model {name!r} is in the pool already: remove it first")
        self.configs[name] = config
        self.arenas[name] = arena
        results: dict[int, str | None] = {}
        waiting: list[tuple[Any, asyncio.Future]] = []
        for w in self._workers.values():
            if not model_allowed_on(config, w.device):
                continue
            if w.dead or w.loading or w.stopping or self._stopped:
                results[w.device.id] = f"executor {w.device.name} is not running"
                continue
            req = next(self._req_ids)
            fut = self._expect(req, w)
            try:
                self._send(w, Load(req, [config_to_dict(config)], {name: arena.layout}))
            except ExecutorFailed as exc:
                results[w.device.id] = str(exc)
                continue
            waiting.append((w, fut))
        for w, fut in waiting:
            try:
                errors, info = await asyncio.wait_for(fut, self.load_timeout_s)
            except (ExecutorFailed, TimeoutError) as exc:
                results[w.device.id] = str(exc) or "timed out"
                continue
            error = errors.get(name, "no answer for this model")
            if error is None:
                w.models.append(name)
                w.load_info.update(info)
            else:
                w.load_errors[name] = error
                log.warning("executor %s: model %s failed to load: %s", w.device.name, name, error)
            results[w.device.id] = error
        return results

    async def remove_model(self: ExecutorPool, name: str) -> None:
        """Unload `name` from every executor (after the batches sent to it
        before: the caller sends none after) and forget it; its arena is
        closed and unlinked once every executor has let go of it."""
        self.configs.pop(name, None)
        arena = self.arenas.pop(name, None)
        waiting: list[asyncio.Future] = []
        for w in self._workers.values():
            w.load_errors.pop(name, None)
            w.load_info.pop(name, None)
            if name not in w.models:
                continue
            w.models.remove(name)
            if w.dead or w.loading or w.stopping or self._stopped:
                continue  # a process that is gone holds nothing; a new one loads from configs
            req = next(self._req_ids)
            fut = self._expect(req, w)
            try:
                self._send(w, Unload(req, [name]))
            except ExecutorFailed:
                continue
            waiting.append(fut)
        for fut in waiting:
            with contextlib.suppress(ExecutorFailed, TimeoutError):
                await asyncio.wait_for(fut, self.load_timeout_s)
        if arena is not None:
            arena.close_and_unlink()
