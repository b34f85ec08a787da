"""Start-up of the server: from settings to executors, profiles and cores.

In order: load the model repository (building the bundled models' files on
first start), lay out one executor per device, create each model's
shared-memory arena, start the executors, measure a latency profile for
every model that has none (cached next to the model), and build one
scheduling core per group of devices that host the same models
(symphony.txt §4.1's sub-clusters), with the serving path's slack as the
core's own options.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from app.repository.config import ModelConfig
from app.repository.loader import RepositoryIndex, load_repository
from app.repository.profiles import fit_linear, latency_profile, monotone_table, write_profile_cache
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice, detect_devices
from app.runtime.events import EventSink
from app.runtime.pool import ExecutorPool
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.server.dispatcher import CoreGroup
from app.server.settings import BUNDLED_REPOSITORY, Settings

log = logging.getLogger("app.server")


@dataclass
class ModelState:
    config: ModelConfig
    arena: Arena
    devices: tuple[int, ...]
    profile: LatencyProfile | None = None


async def load_models(settings: Settings) -> RepositoryIndex:
    """The repository's models; the bundled models' files are built first."""
    root = settings.repository
    if root.resolve() == BUNDLED_REPOSITORY.resolve():
        from app.repository.bundled import ensure_bundled_models

        built = await asyncio.to_thread(ensure_bundled_models, root)
        for name in built:
            log.info("built bundled model file %s", name)
    index = load_repository(root)
    for name, error in index.errors.items():
        log.error("model %s unavailable: %s", name, error)
    return index


def device_layout(settings: Settings) -> list[ExecutorDevice]:
    devices = detect_devices(
        settings.cpu_slices, settings.threads_per_slice, settings.emulated_devices
    )
    for device in devices:
        log.info(
            "device %d: %s (%s, %d threads)", device.id, device.name, device.kind, device.threads
        )
    return devices


async def start_executors(
    settings: Settings,
    devices: list[ExecutorDevice],
    index: RepositoryIndex,
    events: EventSink,
) -> tuple[ExecutorPool, dict[str, ModelState], dict[str, str]]:
    """The running executor pool, the models some device loaded, and why
    the others are unavailable."""
    # One slot per item; at least one whole request of max_batch_size items.
    arenas = {
        name: Arena.create(config, max(settings.arena_slots, config.max_batch_size))
        for name, config in index.models.items()
    }
    pool = ExecutorPool(
        devices,
        list(index.models.values()),
        arenas,
        events,
        respawn=settings.respawn,
        stuck_factor=settings.stuck_factor,
        stuck_margin_s=settings.stuck_margin_s,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        realtime_priority=settings.realtime_priority,
    )
    await pool.start()
    models: dict[str, ModelState] = {}
    unavailable: dict[str, str] = {}
    for name, config in index.models.items():
        hosts = tuple(d.id for d in devices if name in pool.models_on(d.id))
        if not hosts:
            unavailable[name] = "no device can run it (check `devices:` and backend)"
            log.error("model %s: no device can run it", name)
            arenas[name].close_and_unlink()
            continue
        models[name] = ModelState(config, arenas[name], hosts)
    return pool, models, unavailable


async def measure_profile(
    settings: Settings, pool: ExecutorPool, device: ExecutorDevice, config: ModelConfig
) -> LatencyProfile:
    """The model's latency profile: from its config or cache, else measured
    on `device` and cached."""
    known = latency_profile(config, device_tag(device))
    if known is not None:
        log.info("model %s: latency profile from config/cache", config.name)
        return known
    sizes = sorted(
        {b for b in settings.profile_batch_sizes if b <= config.max_batch_size}
        | {1, config.max_batch_size}
    )
    measured = await pool.profile(device.id, config.name, sizes)
    alpha, beta, r2 = fit_linear(measured)
    write_profile_cache(
        config, device_tag(device), measured, fit={"alpha_ms": alpha, "beta_ms": beta, "r2": r2}
    )
    log.info(
        "model %s profiled on %s: %s; fit ℓ(b) = %.3f·b + %.3f ms (r² %.3f)",
        config.name,
        device.name,
        ", ".join(f"ℓ({b})={ms:.2f}ms" for b, ms in sorted(measured.items())),
        alpha,
        beta,
        r2,
    )
    # Measurements are noisy: a larger batch may time slightly faster.
    return LatencyProfile.from_table(monotone_table(measured), config.max_batch_size)


def build_groups(
    settings: Settings, models: dict[str, ModelState], devices: list[ExecutorDevice]
) -> list[CoreGroup]:
    """One core per group of devices hosting exactly the same models."""
    by_id = {d.id: d for d in devices}
    by_devices: dict[tuple[int, ...], list[str]] = {}
    for name, state in models.items():
        by_devices.setdefault(state.devices, []).append(name)
    options = core_options(settings)
    groups = []
    for hosts, names in by_devices.items():
        infos = []
        for name in names:
            state = models[name]
            assert state.profile is not None, f"{name}: profile it before building its core"
            infos.append(
                ModelInfo(
                    name, state.profile, state.config.slo_ms / 1000.0, state.config.max_batch_size
                )
            )
        device_infos = [DeviceInfo(d, name=by_id[d].name, kind=by_id[d].kind) for d in hosts]
        scheduler = make_scheduler(settings.policy, infos, device_infos, **options)
        groups.append(CoreGroup(scheduler, frozenset(names), hosts))
    return groups


def core_options(settings: Settings) -> dict[str, object]:
    """The policy's options with the serving path's slack: DEADLINE_MARGIN_MS
    and TIMER_LEAD_MS are the core's own `deadline_margin` and `timer_lead`."""
    return {
        **settings.policy_options,
        "deadline_margin": settings.deadline_margin_ms / 1000.0,
        "timer_lead": settings.timer_lead_ms / 1000.0,
    }


def device_tag(device: ExecutorDevice) -> str:
    if device.kind == "cpu":
        return f"cpu-{device.threads}t"
    return f"{device.kind}-{device.index}"
