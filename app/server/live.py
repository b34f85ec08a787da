"""The running server: admission, `infer`, readiness, events and shutdown.

Start-up (app/server/startup.py) loads the repository, starts one executor
process per device, profiles the models and builds the scheduling cores;
this module admits requests (queue and arena limits, SLO checks), hands
them to the dispatcher, answers them from their shared-memory slots, and
shuts down. The models of a PPipe plan (PPIPE_PLAN) are served by
app/server/pipeline_service.py instead, behind the same API.

Shutdown begins at SIGTERM or SIGINT (app/server/stop_signals.py hooks them
for `begin_shutdown`), or when the app's lifespan ends without one: new
requests are refused with 503 shutting_down at once; the ones accepted —
queued or running — keep being scheduled for SHUTDOWN_GRACE_S; whatever is
left then is answered 503 shutting_down (a second signal, `hurry`, ends the
grace at once). Only then does `stop` cancel the batches still on the
executors (their results have no one left to go to), stop the executors and
free the shared memory. So every accepted request gets exactly one answer,
and the server's own wait for open connections ends with the grace.

Two hooks feed Triton's statistics (app/server/statistics.py): `infer`
counts a request answered with an error, `_serve` one answered with
outputs, `_on_batch` each batch once. Models are loaded and unloaded while
serving by app/server/model_control.py and a device's share reallocated by
app/server/reallocation.py, through the service's `management`
(app/server/management.py; `load_model`, `unload_model` and `reshare_device`
hand over to it); a model in `control_state` takes no requests.

Every version a model serves is a served model of its own here (its own
arena, executor load and scheduling-core entry), keyed as
app/repository/config.py's `version_key` says: the model's name for its
default version. `model_config(name, version)` resolves a name and version
to that key; every answer, statistic and metric names the model and version,
never the key (metrics count a model's versions together, by model name).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from datetime import datetime, timezone
from typing import Any

import numpy as np

from app.errors import (
    Dropped,
    ExecutorFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    ModelUnloaded,
    Overloaded,
    ServingError,
    ShuttingDown,
)
from app.repository.config import ModelConfig, shown_model, version_key
from app.repository.loader import RepositoryIndex
from app.runtime.devices import ExecutorDevice
from app.runtime.events import (
    AloneStopped,
    AloneTimed,
    DeviceDown,
    DeviceUnparked,
    DeviceUp,
    ExecutorEvent,
)
from app.runtime.pool import ExecutorPool
from app.runtime.realtime import SchedState, restore, set_fifo
from app.scheduling.types import Batch, Preempt
from app.server import model_control, startup
from app.server.autoscale_signals import publish_signals
from app.server.autoscaling import DeviceScaling
from app.server.colocation import plan_colocated
from app.server.core_groups import apply_core_groups
from app.server.dispatcher import Dispatcher, Finished
from app.server.heap import freeze_startup_heap, thaw_heap
from app.server.management import Management
from app.server.metrics import ALONE_QUANTILES, Metrics, metric_label
from app.server.pipeline_service import PipelineService, start_pipelines
from app.server.plan_checks import prepare_plan
from app.server.plans import PlanInForce, place_inss, whole_devices
from app.server.preemption_log import PreemptionLog
from app.server.replanning import KINDS as REPLANNED_KINDS
from app.server.replanning import Replanner
from app.server.service import InferResult, placed_items, request_items
from app.server.serving_routes import DispatcherRoute, PlacedRoute, Route, Served
from app.server.settings import Settings
from app.server.startup import ModelState
from app.server.statistics import Statistics, epoch_ms

log = logging.getLogger("app.server")

# At shutdown every request is answered and its batches cancelled: an
# executor that has not exited by then is killed.
_EXECUTOR_STOP_S = 1.0


class LiveService:
    """Implements app.server.service.InferenceService over real executors."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ModelState] = {}
        self.unavailable: dict[str, str] = {}
        # Unavailable bundled models whose optional extra is not installed:
        # listed, but no failure (EXIT_ON_ERROR, STRICT_READINESS).
        self.optional: set[str] = set()
        self.devices: list[ExecutorDevice] = []
        self.pool: ExecutorPool | None = None
        self.dispatcher: Dispatcher | None = None
        # Models served as PPipe pipelines (PPIPE_PLAN; app/server/pipeline_service.py).
        self.pipelines: PipelineService | None = None
        self.retiring_pipelines: list[PipelineService] = []  # replaced by a posted plan
        self.plan: PlanInForce | None = None  # PLAN (app/server/plans.py)
        self._plan_loaded_at = 0.0
        self._preemptions = PreemptionLog()
        self._dispatcher_route: DispatcherRoute | None = None
        self.ready = False
        self.closing = False
        self._signals_task: asyncio.Task | None = None
        self._replanning: asyncio.Task | None = None  # REPLAN_S (app/server/replanning.py)
        self.scaling: DeviceScaling | None = None  # AUTOSCALE (app/server/autoscaling.py)
        self._drain: asyncio.Task | None = None  # the shutdown's grace period
        self._hurried = False
        self._sched_before: SchedState | None = None  # the loop thread's, if changed
        # Per model, requests accepted and not yet answered (MAX_QUEUE).
        self._outstanding: dict[str, int] = {}
        # Triton's statistics extension (app/server/statistics.py).
        self.statistics = Statistics()
        # Model control (app/server/model_control.py): models being loaded or
        # unloaded ("loading", "unloading"), which take no requests.
        self.control_state: dict[str, str] = {}
        # Each served model's version, kept for the index once it is unloaded.
        self.versions: dict[str, str] = {}
        # Each model's devices as its config gives them, before a plan
        # placed it (a plan taken up while serving places it afresh).
        self.own_devices: dict[str, tuple[str, ...] | None] = {}
        # Model control and reallocation (app/server/management.py).
        self.management = Management(self)

    # ------------------------------------------------------------- management
    # The routes' entry points, handed to `management` (app/server/management.py).

    async def load_model(self, name: str, config_override: str | None = None) -> None:
        await self.management.load_model(name, config_override)

    async def unload_model(self, name: str) -> None:
        await self.management.unload_model(name)

    async def reshare_device(self, name: str, share: float) -> dict[str, Any]:
        return await self.management.reshare_device(name, share)

    async def apply_plan(self, body: bytes) -> dict[str, Any]:
        return await self.management.apply_plan(body)

    def device_index(self) -> list[dict[str, Any]]:
        return self.management.device_index()

    def profile_index(self) -> list[dict[str, Any]]:
        return self.management.profile_index()

    def repository_index(self) -> list[dict[str, str]]:
        return self.management.repository_index()

    def public_reason(self, reason: str) -> str:
        return self.management.public_reason(reason)

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        settings = self.settings
        index = await startup.load_models(settings)
        self.unavailable.update(index.errors)
        self.optional = set(index.optional)
        self.own_devices = {key: c.devices for key, c in index.models.items()}
        settings = self._take_plan(index)
        self.pipelines = await start_pipelines(settings, index, self.metrics, self.statistics)
        piped = self.pipelines.configs if self.pipelines is not None else {}
        self._check_loaded({**index.models, **piped})
        # No executor of DEVICES when a plan serves every model.
        self.devices = (
            startup.device_layout(settings, index.models.values()) if index.models else []
        )
        if settings.core_groups is not None and index.models:
            try:
                index.models = apply_core_groups(settings.core_groups, index.models, self.devices)
            except startup.StartupFailed as exc:
                log.error("start-up stopped: %s", exc)
                raise
        if settings.realtime_priority:
            # Before the executors start: they inherit it, then step one below.
            self._sched_before = set_fifo(settings.realtime_priority)
            log.info("event loop at SCHED_FIFO priority %d", settings.realtime_priority)
        self.pool, self.models, unavailable = await startup.start_executors(
            settings, self.devices, index, self._on_event
        )
        self.unavailable.update(unavailable)
        configs = {**{n: s.config for n, s in self.models.items()}, **piped}
        for name, config in configs.items():
            self.statistics.add_model(name, config.version, config.model_name)
            self.versions[name] = config.version
        self._check_loaded(configs)
        unprofiled = await startup.measure_models(settings, self.pool, self.models, self._device)
        if unprofiled:
            for name in unprofiled:
                self.statistics.remove_model(name)
                configs.pop(name, None)
            self.unavailable.update(unprofiled)
            self._check_loaded(configs)
        if settings.colocation_profile:
            await plan_colocated(self.pool, self.models)
        self.dispatcher = Dispatcher(
            startup.build_groups(settings, self.models, self.devices, self.pool),
            self.pool,
            on_batch=self._on_batch,
            on_preempt=self._on_preempt,
            alone_sample_rate=settings.profile_sample_rate,
        )
        self.metrics.watch_devices(self._device_states)
        self.metrics.watch_alone_times(self._alone_quantiles)
        self._dispatcher_route = DispatcherRoute(
            self.dispatcher, self.models, lambda d: self._device(d).name, settings.arena_slots
        )
        # The watchdog judges a batch by the profile the core plans with.
        self.pool.expected_latency = self._expected_latency
        await self._start_control_loops(self.dispatcher, self.pool, settings)
        frozen = freeze_startup_heap()
        log.info("%d start-up objects exempted from garbage collection", frozen)
        self.ready = True
        if self.models or not piped:
            log.info(
                "serving %d models with policy %s: %s",
                len(self.models),
                settings.policy,
                ", ".join(f"{n} on devices {list(s.devices)}" for n, s in self.models.items()),
            )
        if piped:
            log.info(
                "serving %d models as pipelines with policy ppipe: %s", len(piped), ", ".join(piped)
            )

    async def _start_control_loops(
        self, dispatcher: Dispatcher, pool: ExecutorPool, settings: Settings
    ) -> None:
        """AUTOSCALE's autoscalers, the autoscaling signals' metrics, REPLAN_S."""
        self.scaling = DeviceScaling(dispatcher.groups, pool, settings)
        await self.scaling.start()
        self._signals_task = asyncio.create_task(
            publish_signals(
                dispatcher,
                self.metrics,
                lambda d: self._device(d).name,
                autoscaled=self.scaling.drives,
            )
        )
        self._replanning = self._start_replanning(settings)

    def _start_replanning(self, settings: Settings) -> asyncio.Task | None:
        """REPLAN_S's loop, with a plan in force (else a warning)."""
        if not settings.replan_s:
            return None
        if self.plan is None or self.plan.file.kind not in REPLANNED_KINDS:
            log.warning(
                "REPLAN_S=%g is not acted on: it re-plans the plan in force (PLAN=FILE from "
                "`python -m app plan partition`, `herd`, `inss` or `ppipe`), and this server "
                "serves %s",
                settings.replan_s,
                "none" if self.plan is None else f"a {self.plan.file.kind}",
            )
            return None
        replanner = self.replanner(settings.replan_s, settings.replan_gain)
        log.info(
            "re-planning the %s every %g s (taken up when %g better)",
            self.plan.file.kind,
            settings.replan_s,
            settings.replan_gain,
        )
        return asyncio.create_task(replanner.run())

    def replanner(self, every_s: float, gain: float) -> Replanner:
        """REPLAN_S's re-planner of this service: it takes plans up as
        `POST /v2/plan` does, from the profiles and devices the API lists."""
        return Replanner(
            self, self.apply_plan, every_s, gain, self.profile_index, devices=self.device_index
        )

    def _take_plan(self, index: RepositoryIndex) -> Settings:
        """PLAN (or its older names): checked, the settings it sets, and an
        InSS plan's models placed on their shares (app/server/plans.py)."""
        settings, self.plan = prepare_plan(self.settings, index)
        self.settings = settings
        if self.plan is not None:
            self.plan_applied(self.plan)
        if self.plan is not None and self.plan.inss is not None and index.models:
            index.models = place_inss(
                self.plan, index.models, whole_devices(settings), settings.policy
            )
        return settings

    def _on_preempt(self, decision: Preempt) -> None:
        """A FLEX preemption: counted per model, logged (rate-limited)."""
        self.metrics.batch_preempted(metric_label(decision.model), decision.requests)
        self._preemptions.preempted(
            decision.model, self._device(decision.device).name, decision.requests
        )

    def _alone_quantiles(self) -> dict[tuple[str, str], tuple[float, ...]]:
        """What the cores that track alone-times per application (Orloj) plan with."""
        out: dict[tuple[str, str], tuple[float, ...]] = {}
        for group in self.dispatcher.groups if self.dispatcher is not None else ():
            quantiles = getattr(group.scheduler, "alone_time_quantiles", None)
            if quantiles is not None:
                out.update(quantiles(ALONE_QUANTILES))
        return out

    def _device_states(self) -> dict[str, str]:
        """Each device's state for `device_state` (app.runtime.pool_records)."""
        return {d["name"]: d["state"] for d in self.device_index()}

    def plan_applied(self, plan: PlanInForce) -> None:
        """`plan` is in force from now on: GET /v2/plan and the plan metrics."""
        self.plan, self._plan_loaded_at = plan, time.time()
        self.metrics.record_plan(plan.file.kind, str(plan.file.version), self._plan_loaded_at)

    def plan_in_force(self) -> dict[str, object] | None:
        """The plan served (`GET /v2/plan`), None without one."""
        if self.plan is None:
            return None
        loaded = datetime.fromtimestamp(self._plan_loaded_at, timezone.utc).replace(microsecond=0)
        return {**self.plan.describe(), "loaded_at": loaded.isoformat().replace("+00:00", "Z")}

    def _check_loaded(self, models: dict[str, object]) -> None:
        try:
            startup.check_loaded(self.settings, models, self.failed())
        except startup.StartupFailed as exc:
            log.error("start-up stopped: %s", exc)
            raise

    def failed(self) -> dict[str, str]:
        """The models that should be served and are not, with the reason
        (not those unloaded, or being loaded, on request)."""
        return {
            n: r
            for n, r in self.unavailable.items()
            if n not in self.optional
            and r != model_control.UNLOADED
            and n not in self.control_state
        }

    def begin_shutdown(self, why: str = "shutdown") -> None:
        """Refuse new requests from now on; those accepted get the grace
        period to finish, then 503 shutting_down (`stop` waits for that).
        Idempotent; call on the event loop."""
        if self.closing:
            return
        self.closing = True
        self.ready = False
        waiting = len(self.dispatcher.pending) if self.dispatcher is not None else 0
        log.info(
            "%s: refusing new requests; %d accepted get up to %.1f s to finish",
            why,
            waiting,
            self.settings.shutdown_grace_s,
        )
        self._drain = asyncio.get_running_loop().create_task(self._drain_requests())

    def hurry(self, why: str = "shutdown") -> None:
        """End the grace period now: what is left is answered at once."""
        if not self._hurried:
            self._hurried = True
            log.warning("%s again: ending the grace period", why)

    async def _drain_requests(self) -> None:
        dispatcher = self.dispatcher
        if dispatcher is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_grace_s
        pipelines = [*self.retiring_pipelines, *([self.pipelines] if self.pipelines else [])]
        while (
            (dispatcher.pending or any(p.pending for p in pipelines))
            and not self._hurried
            and loop.time() < deadline
        ):
            await asyncio.sleep(0.01)
        error = ShuttingDown("server shut down before this request finished")
        failed = dispatcher.fail_all(error)
        for served in pipelines:
            failed += served.fail_all(error)
        if failed:
            log.warning("shutdown: answered %d unfinished requests with 503 shutting_down", failed)

    async def stop(self) -> None:
        """Graceful shutdown: refuse new work, drain, answer the rest, free all."""
        self.begin_shutdown()
        if self._drain is not None:
            await self._drain
        if self.scaling is not None:
            await self.scaling.stop()
        for task in (self._signals_task, self._replanning):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.pool is not None:
            self._cancel_batches(self.pool)
            await self.pool.stop(timeout=_EXECUTOR_STOP_S)
        for state in self.models.values():
            state.arena.close_and_unlink()
        for served in [*self.retiring_pipelines, *([self.pipelines] if self.pipelines else [])]:
            await served.stop()
        thaw_heap()
        if self._sched_before is not None:
            restore(self._sched_before)
            self._sched_before = None
        log.info("shut down")

    def emergency_stop(self) -> None:
        """The process is about to exit with its event loop wedged (called from
        another thread: app/server/loop_watchdog.py): kill the executor
        processes and unlink the shared-memory arenas, touching nothing the
        loop uses."""
        for child in multiprocessing.active_children():
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGKILL)
        for state in list(self.models.values()):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{state.arena.name}")

    def _cancel_batches(self, pool: ExecutorPool) -> None:
        """Every request is answered: stop the batches still queued or running
        on the executors, so that stopping them does not wait for those."""
        for device in self.devices:
            for batch_id in pool.inflight(device.id):
                pool.cancel(device.id, batch_id)

    def _device(self, device_id: int) -> ExecutorDevice:
        return next(d for d in self.devices if d.id == device_id)

    def device(self, device_id: int) -> ExecutorDevice:
        return self._device(device_id)

    def pending_of(self, name: str, version: str) -> int:
        """Requests accepted and not yet answered for `name`'s `version`
        (Triton's nv_inference_pending_request_count)."""
        for key, state in self.models.items():
            if state.config.model_name == name and state.config.version == version:
                return self.outstanding(key)
        return 0

    def outstanding(self, model: str) -> int:
        """Requests for `model` accepted and not yet answered."""
        return self._outstanding.get(model, 0)

    # ------------------------------------------------------------- service API

    def model_names(self) -> list[str]:
        piped = self.pipelines.configs.values() if self.pipelines is not None else ()
        return sorted({c.model_name for c in (*(s.config for s in self.models.values()), *piped)})

    def model_config(self, name: str, version: str | None = None) -> ModelConfig:
        """The config of `name`'s `version` (None: its default version); its
        `name` is the key `infer`, `model_ready` and the others take."""
        config = self._model_config(name)
        if version is None or version == config.version:
            return config
        key = version_key(name, version)
        if key in self.control_state or key in self.models or key in self.unavailable:
            return self._model_config(key)
        raise ModelNotFound(
            f"model {name!r} has no version {version!r} "
            f"(available: {', '.join(config.served_versions)})"
        )

    def _model_config(self, name: str) -> ModelConfig:
        """The config of the served model `name` (a version key)."""
        shown = shown_model(name)
        if self.pipelines is not None and name in self.pipelines.configs:
            return self.pipelines.configs[name]
        if name in self.control_state:
            raise ModelUnloaded(f"model {shown} is {self.control_state[name]}")
        state = self.models.get(name)
        if state is None:
            if self.unavailable.get(name) == model_control.UNLOADED:
                raise ModelUnloaded(f"model {shown} is unloaded")
            if name in self.unavailable:
                reason = self.public_reason(self.unavailable[name])
                raise ModelNotReady(f"model {shown} is unavailable: {reason}")
            raise ModelNotFound(f"unknown model {name!r}; models: {', '.join(self.model_names())}")
        return state.config

    def model_ready(self, name: str) -> bool:
        if self.pipelines is not None and name in self.pipelines.configs:
            return self.ready and self.pipelines.ready(name)
        state = self.models.get(name)
        if state is None or not self.ready or self.pool is None or name in self.control_state:
            return False
        return any(self.pool.alive(d) for d in state.devices)

    def server_ready(self) -> bool:
        """Serving, and every model has at least one live device (while an
        executor restarts, a model with another device stays ready); under
        STRICT_READINESS also no model of the repository failed to load."""
        piped = list(self.pipelines.configs) if self.pipelines is not None else []
        if not self.ready or self.closing or not (self.models or piped):
            return False
        if self.settings.strict_readiness and self.failed():
            return False
        serving = [name for name in self.models if name not in self.control_state] + piped
        return all(self.model_ready(name) for name in serving)

    def capacity(self) -> dict[str, object]:
        """Devices alive / total and the models left without a live device
        (the body of /v2/health/ready)."""
        pool = self.pool
        alive = [d.id for d in self.devices if pool is not None and pool.alive(d.id)]
        piped = self.pipelines.device_counts() if self.pipelines is not None else (0, 0)
        return {
            "devices_alive": len(alive) + piped[0],
            "devices_total": len(self.devices) + piped[1],
            "models_unavailable": sorted(
                shown_model(n, quote=False)
                for n in (*self.models, *(self.pipelines.configs if self.pipelines else ()))
                if not self.model_ready(n) and n not in self.control_state
            ),
            "models_failed": (
                sorted(shown_model(n, quote=False) for n in self.failed())
                if self.settings.strict_readiness
                else []
            ),
        }

    def relative_to_repository(self, reason: str) -> str:
        """A load error names its files: relative to the repository in an answer."""
        repository = self.settings.repository
        roots = {str(repository.resolve()).rstrip("/") + "/", str(repository).rstrip("/") + "/"}
        for root in sorted(roots, key=len, reverse=True):
            reason = reason.replace(root, "")
        return reason

    def model_statistics(
        self, name: str | None = None, version: str | None = None
    ) -> dict[str, object]:
        """Triton's statistics response (app/server/statistics.py): every
        loaded model's, or `name`'s (the caller checks that it exists)."""
        return self.statistics.report(name, version)

    async def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        slo_ms: float | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
        app: str = "",
        placed: tuple[str, list[int]] | None = None,
    ) -> InferResult:
        """Answer one request (`_serve`). One answered with an error is
        counted in its model's statistics here; one answered with outputs
        where its timings are known (`_serve`). `placed`: (arena, slots)
        where an API worker wrote the inputs already (app/frontdoor/): the
        answer's outputs are left there for it to read."""
        began = time.monotonic()
        try:
            return await self._serve(
                model,
                inputs,
                slo_ms=slo_ms,
                request_id=request_id,
                received_at=received_at,
                app=app,
                placed=placed,
            )
        except ServingError:
            now = time.monotonic()
            arrival = began if received_at is None else min(received_at, began)
            self.statistics.request_failed(model, total_s=now - arrival, at_ms=epoch_ms())
            raise

    async def _serve(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        slo_ms: float | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
        app: str = "",
        placed: tuple[str, list[int]] | None = None,
    ) -> InferResult:
        if self.closing:
            raise ShuttingDown("server is shutting down")
        config = self.model_config(model)
        if not self.ready or self.dispatcher is None:
            raise ModelNotReady("server is starting")
        slo = config.slo_ms
        if slo_ms is not None:
            if slo_ms <= 0:
                raise InvalidInput(f"slo_ms must be > 0, got {slo_ms}")
            if slo_ms > slo and not config.allow_slo_loosening:
                raise InvalidInput(
                    f"slo_ms {slo_ms} is looser than model {shown_model(model)}'s SLO of {slo} ms; "
                    "the model config does not allow loosening"
                )
            slo = slo_ms
        route = self._route(model, placed)
        label = metric_label(model)
        limit = self.settings.max_queue
        outstanding = self._outstanding.get(model, 0)
        if limit and outstanding >= limit:
            self.metrics.request_dropped(label, "queue_full")
            raise Overloaded(
                f"model {shown_model(model)}: queue full ({limit} requests waiting)", "queue_full"
            )
        items = request_items(config, inputs) if placed is None else placed_items(config, placed)
        try:
            future = route.submit(
                config, inputs, items, slo / 1000.0, received_at=received_at, app=app
            )
        except Overloaded as exc:
            self.metrics.request_dropped(label, exc.reason)
            raise
        self.metrics.request_received(label)
        self._outstanding[model] = outstanding + 1
        future.add_done_callback(lambda answered: self._settle(model, answered))
        try:
            served = await asyncio.shield(future)
        except asyncio.CancelledError:
            raise  # the client went away; the request is still answered (`_settle`)
        except (Dropped, Overloaded, ExecutorFailed, ShuttingDown) as exc:
            self.metrics.request_dropped(label, exc.reason)
            raise
        return self._answer(config, items, slo / 1000.0, served, request_id)

    def _answer(
        self,
        config: ModelConfig,
        items: int,
        slo_s: float,
        served: Served,
        request_id: str | None,
    ) -> InferResult:
        """A request served: its metrics and statistics, and its answer."""
        model = config.name
        now = time.monotonic()
        latency = now - served.arrival
        queue = max(0.0, served.started_at - served.arrival)
        exec_s = served.finished_at - served.started_at
        intake = max(0.0, served.seen_at - served.arrival)
        self.metrics.request_finished(
            metric_label(model), latency, queue, served.batch_size, latency <= slo_s
        )
        self.statistics.request_succeeded(
            model,
            items=items,
            total_s=latency,
            queue_s=queue,
            input_s=intake,
            infer_s=exec_s,
            output_s=max(0.0, now - served.finished_at),
            at_ms=epoch_ms(),
            batch=served.batch,
        )
        return InferResult(
            model=config.model_name,
            request_id=request_id,
            outputs=served.outputs,
            queue_ms=queue * 1000.0,
            exec_ms=exec_s * 1000.0,
            batch_size=served.batch_size,
            device=served.device,
            intake_ms=intake * 1000.0,
            answer_ms=max(0.0, now - served.finished_at) * 1000.0,
            app=served.app,  # as the core saw it
        )

    def _route(self, model: str, placed: tuple[str, list[int]] | None = None) -> Route:
        if self.pipelines is not None and model in self.pipelines.configs:
            if placed is not None:
                raise InvalidInput(
                    f"model {shown_model(model)} is a pipeline: not served by API workers"
                )
            return self.pipelines.route
        assert self._dispatcher_route is not None and self.dispatcher is not None
        if placed is not None:
            arena, slots = placed
            device_name = lambda d: self._device(d).name  # noqa: E731
            return PlacedRoute(self.dispatcher, self.models, device_name, slots, arena)
        return self._dispatcher_route

    def _settle(self, model: str, answered: asyncio.Future) -> None:
        """A request is answered: its place in the queue is free. No one
        may await its error any more (a client that went away): retrieve
        it, or asyncio logs it as never retrieved."""
        if not answered.cancelled():
            answered.exception()
        self._outstanding[model] -= 1
        self.metrics.request_answered(metric_label(model))

    # ---------------------------------------------------------------- events

    def _expected_latency(self, model: str, batch_size: int) -> float | None:
        state = self.models.get(model)
        if state is None or state.profile is None:
            return None
        return state.profile.latency(min(max(batch_size, 1), state.config.max_batch_size))

    def _on_event(self, event: ExecutorEvent) -> None:
        """The executor pool's events: logged and counted here, carried out
        by the dispatcher."""
        if isinstance(event, DeviceDown):
            name = self._device(event.device).name
            log.error("device %s out of service: %s", name, event.reason)
            self.metrics.executor_failed(name)
        elif isinstance(event, DeviceUp):
            name = self._device(event.device).name
            log.warning("device %s back in service after %.3f s", name, event.seconds_down)
            self.metrics.executor_restarted(name, event.seconds_down)
        elif isinstance(event, DeviceUnparked) and self.scaling is not None:
            self.scaling.started(event.device)  # logged by the pool
        elif isinstance(event, AloneTimed | AloneStopped):
            seconds = event.seconds if isinstance(event, AloneTimed) else None
            self.metrics.alone_profiled(metric_label(event.model), seconds, event.dropped)
        if self.dispatcher is not None:
            self.dispatcher.post(event)

    def _on_batch(self, batch: Batch, finished: Finished) -> None:
        if finished.error is None:
            device = self._device(batch.device).name
            compute_s = finished.finished_at - finished.started_at
            self.metrics.batch_executed(metric_label(batch.model), device, batch.size, compute_s)
            planned_s = batch.finish_at - batch.start_at
            self.metrics.batch_timed(metric_label(batch.model), planned_s, compute_s)
            self.statistics.batch_executed(
                batch.model,
                batch=(batch.device, batch.id),
                batch_size=batch.size,
                requests=len(batch.requests),
                infer_s=compute_s,
            )
