"""`python -m app profile MODEL [--force]`: measure a model's latency profile.

Loads the repository (MODEL_REPOSITORY, as `serve` does), starts one
executor on the first device that can run the model, and prints the
profile's table and linear fit: the cached one when it is good, else (and
always with `--force`) one measured now and stored in the profile cache
(PROFILE_CACHE_DIR) for the next start. A poor measurement is measured once
more, as at start-up (app/server/profiling.py).
"""

from __future__ import annotations

import logging
from typing import TextIO

from app.runtime.arena import Arena
from app.runtime.devices import model_allowed_on
from app.runtime.pool import ExecutorPool
from app.server import startup
from app.server.profiling import find_or_measure, profile_cache_path_for
from app.server.settings import Settings

log = logging.getLogger("app.server")


class ProfileCommandError(ValueError):
    """The model cannot be profiled (unknown, failed to load, no device)."""


async def profile_model(settings: Settings, model: str, force: bool, out: TextIO) -> None:
    """Print (and, when measured, store) `model`'s profile; raises
    ProfileCommandError naming what is wrong."""
    index = await startup.load_models(settings)
    if model in index.errors:
        raise ProfileCommandError(f"model {model} did not load: {index.errors[model]}")
    config = index.models.get(model)
    if config is None:
        known = ", ".join(sorted(index.models))
        raise ProfileCommandError(f"no model {model!r} in {settings.repository}; models: {known}")
    if config.profile is not None:
        print(f"{model}: its config gives the profile (remove it to use a measured one)", file=out)
        return
    devices = [d for d in startup.device_layout(settings) if model_allowed_on(config, d)]
    if not devices:
        raise ProfileCommandError(f"model {model}: no device of this server can run it")
    device = devices[0]
    arena = Arena.create(config, settings.arena_slots)
    pool = ExecutorPool([device], [config], {model: arena}, lambda _event: None, respawn=False)
    try:
        await pool.start()
        if model not in pool.models_on(device.id):
            raise ProfileCommandError(
                f"model {model} failed to load on {device.name}: "
                f"{pool.load_errors(device.id).get(model, 'unknown error')}"
            )
        found = await find_or_measure(settings, pool, device, config, force=force)
    finally:
        await pool.stop()
        arena.close_and_unlink()
    print(f"{model} on {device.name} ({found.source}):", file=out)
    print("  batch   latency_ms", file=out)
    for b, ms in found.latency_ms.items():
        print(f"  {b:5d}   {ms:10.3f}", file=out)
    print(f"  fit: {found.fit_text()}", file=out)
    if found.problems:
        print(f"  poor: {'; '.join(found.problems)}", file=out)
    print(f"  cache: {profile_cache_path_for(settings, config, device)}", file=out)
