"""Models moved by a plan taken up while serving (`POST /v2/plan`), the step
a HERD or partition plan (app/server/plan_switch.py) and an InSS plan that
places models otherwise (app/server/inss_layout.py) share: each model is
loaded where its new config newly allows it before the switch — so the
switch itself waits for nothing — and unloaded, after it, where the config
no longer does."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from app.errors import ServingError
from app.repository.config import ModelConfig
from app.server.control_host import ControlHost
from app.server.startup import ModelState

log = logging.getLogger("app.server")


class PlanRefused(ServingError):
    """The plan does not fit this server, or cannot be taken up now."""

    status = 409
    reason = "plan_refused"


class PlanUnavailable(ServingError):
    """An executor the plan needs did not come up; the plan in force stays."""

    status = 503
    reason = "plan_failed"


class PlanNotSwitchable(ServingError):
    """A plan that is taken up only at start-up."""

    status = 501
    reason = "not_supported"


async def load_where_moved(
    service: ControlHost, states: Mapping[str, ModelState]
) -> dict[str, list[str]]:
    """Each model loaded on the executors its new config (`states`) newly
    allows: model → those executors' names. PlanRefused, the configs as
    they were, when an executor is restarting or a load fails."""
    pool = service.pool
    assert pool is not None
    names = {d.id: d.name for d in service.devices}
    loaded: dict[str, list[str]] = {}
    changed: list[ModelConfig] = []
    for key, state in states.items():
        # A parked executor loads the model when it is started (the pool's
        # configs); one restarting might come back without it.
        down = [names[d] for d in state.devices if not pool.alive(d) and not pool.parking.parked(d)]
        if down:
            await _put_back(service, changed)
            raise PlanRefused(
                f"model {state.config.model_name!r}: the executors of {', '.join(down)} are "
                "restarting; retry once they serve"
            )
        old = service.models[key].config
        results = await pool.model_changes.replace_config(state.config, on=state.devices)
        changed.append(old)
        failed = {names[d]: e for d, e in results.items() if e is not None}
        if failed:
            await _put_back(service, changed)
            reasons = "; ".join(f"{n}: {e}" for n, e in failed.items())
            raise PlanRefused(f"model {state.config.model_name!r} did not load: {reasons}")
        if results:
            loaded[state.config.model_name] = sorted(names[d] for d in results)
    return loaded


async def _put_back(service: ControlHost, configs: list[ModelConfig]) -> None:
    pool = service.pool
    assert pool is not None
    for config in configs:  # back to the configs in force
        await pool.model_changes.replace_config(config)
        await pool.model_changes.trim(config.name)


def unload_where_moved_off(service: ControlHost, models: Iterable[str]) -> None:
    """In the background, unload each model from the executors its config
    no longer allows (after the batches sent to them before)."""
    pool = service.pool
    assert pool is not None
    trims = asyncio.gather(*(pool.model_changes.trim(name) for name in models))
    asyncio.ensure_future(trims).add_done_callback(_log_failure)


def _log_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("unloading models the plan moved failed: %s", task.exception())
