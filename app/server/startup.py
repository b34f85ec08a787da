"""Start-up of the server: from settings to executors, profiles and cores.

In order: load the model repository (building the bundled models' files on
first start), lay out one executor per device, create each model's
shared-memory arena, start the executors, check what loaded, measure a
latency profile for every model that has none (app/server/profiling.py,
cached outside the repository) and a dynamic model's alone-times on its
probes, and build one scheduling core per group of
devices that host the same models (symphony.txt §4.1's sub-clusters), with
the serving path's slack as the core's own options.

What loaded is checked as Triton does: a repository in which no model loads
is an error, and so, under EXIT_ON_ERROR (the default), is any model that
failed to load or that no device could load; start-up stops with
StartupFailed naming each model and its reason (uvicorn then exits
non-zero). A model's reason is the real one: its config error, or each
device's load error, not just "no device".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from app.optional import import_ray
from app.repository.config import ModelConfig, shown_model
from app.repository.loader import RepositoryIndex, load_repository
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice, detect_devices, model_allowed_on
from app.runtime.events import EventSink
from app.runtime.pool import ExecutorPool
from app.runtime.ray_fit import ActorInfeasible
from app.runtime.ray_nodes import NodeNotFound, resolve_nodes
from app.runtime.ray_pool import RayExecutorPool
from app.scheduling.model import InputDependence, ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.server.dispatcher import CoreGroup
from app.server.profiling import device_tag, measure_dynamic, measure_profile
from app.server.settings import BUNDLED_REPOSITORY, Settings

log = logging.getLogger("app.server")

__all__ = ["StartupFailed", "check_loaded", "device_tag", "measure_model", "measure_profile"]

# The policy whose options a model's dynamic_batching sets (per model).
BATCHING_POLICY = "triton"


class StartupFailed(RuntimeError):
    """Start-up stops: no model loaded, or (EXIT_ON_ERROR) one failed."""


@dataclass
class ModelState:
    config: ModelConfig
    arena: Arena
    devices: tuple[int, ...]
    profile: LatencyProfile | None = None
    dynamic: InputDependence | None = None  # a dynamic model's, once measured

    def info(self) -> ModelInfo:
        """What the core knows of the model (profile measured first)."""
        assert self.profile is not None, f"{self.config.name}: profile it first"
        config = self.config
        return ModelInfo(
            config.name,
            self.profile,
            config.slo_ms / 1000.0,
            config.max_batch_size,
            dynamic=self.dynamic,
        )


async def measure_model(
    settings: Settings,
    pool: ExecutorPool,
    device: ExecutorDevice,
    state: ModelState,
    *,
    serving: bool = False,
) -> None:
    """Set the model's latency profile (`measure_profile`; `serving`: the
    device serves other models meanwhile) and, for a dynamic model, its
    input dependence (`measure_dynamic`), on `device`."""
    state.profile = await measure_profile(settings, pool, device, state.config, serving=serving)
    state.dynamic = await measure_dynamic(pool, device, state.config, state.profile)


# The longest reason kept for a model that failed to profile (one log line).
MAX_REASON_CHARS = 500


def one_line(exc: BaseException) -> str:
    """`exc`'s text on one line (an executor's error may span several),
    cut to MAX_REASON_CHARS."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


async def measure_models(
    settings: Settings,
    pool: ExecutorPool | RayExecutorPool,
    models: dict[str, ModelState],
    device_of: Callable[[int], ExecutorDevice],
) -> dict[str, str]:
    """Measure each model (`measure_model`, on its first device). A model
    that fails to is let go of (removed from `models` and from the
    executors) and returned with its reason, logged in one ERROR line: the
    others are served (EXIT_ON_ERROR=0) or start-up stops (`check_loaded`)."""
    failed: dict[str, str] = {}
    for name, state in list(models.items()):
        try:
            await measure_model(settings, pool, device_of(state.devices[0]), state)  # type: ignore[arg-type]
        except Exception as exc:
            reason = f"failed to profile: {one_line(exc)}"
            log.error("model %s %s", shown_model(name), reason)
            del models[name]
            failed[name] = reason
            with contextlib.suppress(Exception):  # the executors let go of it
                await pool.model_changes.remove_model(name)
    return failed


async def load_models(settings: Settings) -> RepositoryIndex:
    """The repository's models; the bundled models' files are built first."""
    root = settings.repository
    if root.resolve() == BUNDLED_REPOSITORY.resolve():
        from app.repository.bundled import ensure_bundled_models

        await asyncio.to_thread(ensure_bundled_models, root)  # it logs each build
    index = load_repository(root)
    if root.resolve() == BUNDLED_REPOSITORY.resolve():
        from app.repository.bundled import GENERATED

        index.optional = {
            gen.model for gen in GENERATED if gen.model in index.errors and not gen.available()
        }
    for name, error in index.errors.items():
        if name in index.optional:
            log.warning("model %s not served: its optional extra is not installed", name)
        else:
            log_unavailable(settings, name, error)
    return index


def arena_capacity(settings: Settings, config: ModelConfig) -> int:
    """A model's arena slots, at start-up and on every (re)load alike: one
    per item, ARENA_SLOTS, and at least one whole request of max_batch_size.
    With API_WORKERS the slots are cut into one equal share per worker
    (`worker_slots`), each at least one whole request."""
    if settings.api_workers:
        return settings.api_workers * worker_slots(settings, config)
    return max(settings.arena_slots, config.max_batch_size)


def create_arena(settings: Settings, config: ModelConfig) -> Arena:
    """A model's new arena (`arena_capacity`); with API_WORKERS every slot
    is a worker's: this process never takes one (it serves no request itself)."""
    arena = Arena.create(config, arena_capacity(settings, config))
    if settings.api_workers:
        arena.set_aside(range(settings.api_workers * worker_slots(settings, config)))
    return arena


def worker_slots(settings: Settings, config: ModelConfig) -> int:
    """The arena slots of one API worker (API_WORKERS ≥ 1): an equal share
    of ARENA_SLOTS, at least one whole request of max_batch_size. Worker k
    owns slots [k·share, (k+1)·share)."""
    workers = max(settings.api_workers, 1)
    return max(-(-settings.arena_slots // workers), config.max_batch_size)


def log_unavailable(settings: Settings, name: str, reason: str) -> None:
    """One line for a model that failed to load. Under EXIT_ON_ERROR the
    start-up stops with one line naming every such model and its reason
    (`check_loaded`), so the model's own line is a debug one."""
    level = logging.DEBUG if settings.exit_on_error else logging.ERROR
    log.log(level, "model %s unavailable: %s", name, reason)


def device_layout(
    settings: Settings, configs: Iterable[ModelConfig] | None = None
) -> list[ExecutorDevice]:
    """This machine's executor devices. Given the repository's models
    (`configs`), only the devices one of them may run on: no executor for a
    device no model uses (numbered again, in order). Not with CORE_GROUPS or
    RAY_NODES, whose plans name devices by their place in the whole layout."""
    devices = detect_devices(
        settings.cpu_slices,
        settings.threads_per_slice,
        settings.emulated_devices,
        shares=settings.device_shares,
    )
    if configs is not None and settings.core_groups is None and settings.ray_nodes is None:
        configs = list(configs)
        used = [d for d in devices if any(model_allowed_on(c, d) for c in configs)]
        idle = [d.name for d in devices if d not in used]
        if idle:
            log.info("no executor for %s: no model of the repository runs there", ", ".join(idle))
        devices = [replace(d, id=i) for i, d in enumerate(used)]
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
) -> tuple[ExecutorPool | RayExecutorPool, dict[str, ModelState], dict[str, str]]:
    """The running executor pool, the models some device loaded, and why
    the others are unavailable."""
    # One slot per item; at least one whole request of max_batch_size items.
    pool: ExecutorPool | RayExecutorPool
    arenas = {name: create_arena(settings, config) for name, config in index.models.items()}
    if settings.ray_address is not None:
        pool = ray_pool(settings, devices, index, arenas, events)
    elif settings.ray_nodes is not None:
        for arena in arenas.values():
            arena.close_and_unlink()
        raise StartupFailed("RAY_NODES places Ray executors: it needs RAY_ADDRESS")
    else:
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
    try:
        await pool.start()
    except ActorInfeasible as exc:  # named at once, not after the start timeout
        raise StartupFailed(str(exc)) from None
    models: dict[str, ModelState] = {}
    unavailable: dict[str, str] = {}
    for name, config in index.models.items():
        hosts = tuple(d.id for d in devices if name in pool.models_on(d.id))
        if not hosts:
            unavailable[name] = why_not_loaded(pool, devices, config)
            log.error("model %s unavailable: %s", name, unavailable[name])
            await pool.model_changes.remove_model(name)  # and its arena: a later load starts afresh
            log_unavailable(settings, name, unavailable[name])
            arenas[name].close_and_unlink()
            continue
        models[name] = ModelState(config, arenas[name], hosts)
    return pool, models, unavailable


def ray_pool(
    settings: Settings,
    devices: list[ExecutorDevice],
    index: RepositoryIndex,
    arenas: dict[str, Arena],
    events: EventSink,
) -> RayExecutorPool:
    """Executors as actors on the Ray cluster at RAY_ADDRESS (joined here
    unless this process joined one already); RAY_NODES places them."""
    try:
        ray = import_ray()
    except BaseException as exc:
        for arena in arenas.values():
            arena.close_and_unlink()
        raise StartupFailed(str(exc)) from exc
    if not ray.is_initialized():
        # ray.init (in the main thread) replaces the SIGTERM handler with
        # sys.exit: the server's own (graceful shutdown: drain, stop the
        # pool, unlink the arenas) is put back.
        previous = signal.getsignal(signal.SIGTERM)
        ray.init(address=settings.ray_address, log_to_driver=False)
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    nodes: dict[int, str] = {}
    if settings.ray_nodes is not None:
        try:
            here = ray.get_runtime_context().get_node_id()
            nodes = resolve_nodes(settings.ray_nodes, ray.nodes(), (d.id for d in devices), here)
        except NodeNotFound as exc:
            for arena in arenas.values():
                arena.close_and_unlink()
            raise StartupFailed(str(exc)) from None
    return RayExecutorPool(
        devices,
        list(index.models.values()),
        arenas,
        events,
        respawn=settings.respawn,
        stuck_factor=settings.stuck_factor,
        stuck_margin_s=settings.stuck_margin_s,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        nodes=nodes,
        fit_threads=settings.threads_per_slice is None,  # else it says how many
    )


def why_not_loaded(
    pool: ExecutorPool | RayExecutorPool, devices: list[ExecutorDevice], config: ModelConfig
) -> str:
    """The reason a model is on no device: each device's load error, or that
    none may run it."""
    errors: dict[str, list[str]] = {}
    for device in devices:
        error = pool.load_errors(device.id).get(config.name)
        if error is not None:
            errors.setdefault(error, []).append(device.name)
    if errors:
        return "; ".join(
            f"failed to load on {', '.join(names)}: {error}" for error, names in errors.items()
        )
    allowed = "any device" if config.devices is None else f"devices {list(config.devices)}"
    return (
        f"no device can run it: backend {config.backend} on {allowed}, and this server has "
        f"{', '.join(d.name for d in devices) or 'no devices'}"
    )


def check_loaded(
    settings: Settings, models: Mapping[str, object], unavailable: Mapping[str, str]
) -> None:
    """Raise StartupFailed when no model loaded, or when one failed under
    EXIT_ON_ERROR; the message names each model and its reason.
    `unavailable` holds the failures (not the optional bundled models)."""
    failed = "; ".join(f"{name}: {reason}" for name, reason in sorted(unavailable.items()))
    if not models:
        where = settings.repository
        raise StartupFailed(
            f"no model loaded from the repository {where}"
            + (f" ({failed})" if failed else " (it holds no model directory)")
        )
    if unavailable and settings.exit_on_error:
        raise StartupFailed(
            f"failed to load {len(unavailable)} model(s) ({failed}); "
            "EXIT_ON_ERROR=0 (--exit-on-error 0) serves the others"
        )


def build_groups(
    settings: Settings,
    models: dict[str, ModelState],
    devices: list[ExecutorDevice],
    pool: object = None,
    speeds: Mapping[int, float] | None = None,
) -> list[CoreGroup]:
    """One core per group of devices hosting exactly the same models; with
    Ray executors (`pool` a RayExecutorPool), each core's d_ctrl and d_data
    are the dispatch delays measured to its devices' actors. `speeds`: the
    devices' speeds the cores in force plan with (a plan taken up while
    serving keeps a reshared device's); 1 otherwise."""
    by_id = {d.id: d for d in devices}
    by_devices: dict[tuple[int, ...], list[str]] = {}
    for name, state in models.items():
        by_devices.setdefault(state.devices, []).append(name)
    options = core_options(settings)
    unserved_options(options, models)
    groups = []
    for hosts, names in by_devices.items():
        infos = [models[name].info() for name in names]
        device_infos = [
            DeviceInfo(d, name=by_id[d].name, speed=(speeds or {}).get(d, 1.0), kind=by_id[d].kind)
            for d in hosts
        ]
        group_options = {
            **per_model_options(options, names),
            **batching_options(settings, {n: models[n].config for n in names}),
        }
        if isinstance(pool, RayExecutorPool):
            d_ctrl, d_data = pool.delays_for(names, hosts)
            group_options.update(d_ctrl=d_ctrl, d_data=d_data)
            log.info(
                "core of %s: d_ctrl %.3f ms, d_data %.4f ms per item (measured to Ray actors)",
                ", ".join(names),
                d_ctrl * 1e3,
                d_data * 1e3,
            )
        scheduler = make_scheduler(settings.policy, infos, device_infos, **group_options)
        groups.append(CoreGroup(scheduler, frozenset(names), hosts))
    return groups


# Options that may be a {model: value} mapping (a plan's batch sizes).
PER_MODEL_OPTIONS = ("batch", "max_batch")


def per_model_options(options: Mapping[str, object], names: Iterable[str]) -> dict[str, object]:
    """`options` for the core of `names`: a per-model mapping keeps the
    core's models (`unserved_options` names the others no core serves)."""
    names = set(names)
    out = dict(options)
    for key in PER_MODEL_OPTIONS:
        value = out.get(key)
        if isinstance(value, Mapping):
            out[key] = {m: v for m, v in value.items() if m in names}
    return out


def unserved_options(options: Mapping[str, object], served: Iterable[str]) -> None:
    """Say once which models a per-model option names that no core serves
    (not loaded, or misspelt): they are left out."""
    served = set(served)
    for key in PER_MODEL_OPTIONS:
        value = options.get(key)
        if isinstance(value, Mapping) and set(value) - served:
            log.warning(
                "policy option %r names models not served, left out: %s",
                key,
                ", ".join(sorted(set(value) - served)),
            )


def batching_options(settings: Settings, configs: Mapping[str, ModelConfig]) -> dict[str, object]:
    """The models' own dynamic_batching as the `triton` policy's per-model
    options (`model_options`, over POLICY_OPTIONS); under another policy
    they have no effect, which is said once per model."""
    per_model = {
        name: config.batching.policy_options()
        for name, config in configs.items()
        if config.batching is not None and config.batching.policy_options()
    }
    if not per_model:
        return {}
    if settings.policy != BATCHING_POLICY:
        for name, options in per_model.items():
            log.warning(
                "model %s: dynamic_batching (%s) applies under POLICY=%s only; policy %s "
                "forms batches by deadlines",
                name,
                ", ".join(sorted(options)),
                BATCHING_POLICY,
                settings.policy,
            )
        return {}
    return {"model_options": per_model}


def core_options(settings: Settings) -> dict[str, object]:
    """The policy's options with the serving path's slack: DEADLINE_MARGIN_MS
    and TIMER_LEAD_MS are the core's own `deadline_margin` and `timer_lead`."""
    return {
        **settings.policy_options,
        "deadline_margin": settings.deadline_margin_ms / 1000.0,
        "timer_lead": settings.timer_lead_ms / 1000.0,
    }
