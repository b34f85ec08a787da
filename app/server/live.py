"""The running server: repository, executors, scheduling cores, and `infer`.

Start-up: load the model repository (building the bundled models' files on
first start), start one executor process per device, measure a latency
profile for every model that has none (cached next to the model), build one
scheduling core per group of devices that host the same models, and serve.
Shutdown: refuse new requests, let in-flight ones finish for a grace period,
answer the rest with an explicit error, stop executors, free shared memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from app.errors import (
    Dropped,
    ExecutorFailed,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    ShuttingDown,
)
from app.repository.config import ModelConfig
from app.repository.loader import (
    fit_linear,
    latency_profile,
    load_repository,
    monotone_table,
    write_profile_cache,
)
from app.runtime.arena import Arena
from app.runtime.pool import ExecutorDevice, ExecutorPool, detect_devices
from app.runtime.realtime import SchedState, restore, set_fifo
from app.scheduling.autoscale import advised_device_change
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.server.dispatcher import CoreGroup, Dispatcher, Finished
from app.server.heap import freeze_startup_heap, thaw_heap
from app.server.metrics import Metrics
from app.server.service import InferResult
from app.server.settings import BUNDLED_REPOSITORY, Settings

log = logging.getLogger("app.server")


@dataclass
class ModelState:
    config: ModelConfig
    arena: Arena
    devices: tuple[int, ...]
    profile: LatencyProfile | None = None


class LiveService:
    """Implements app.server.service.InferenceService over real executors."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ModelState] = {}
        self.unavailable: dict[str, str] = {}
        self.devices: list[ExecutorDevice] = []
        self.pool: ExecutorPool | None = None
        self.dispatcher: Dispatcher | None = None
        self.ready = False
        self.closing = False
        self._signals_task: asyncio.Task | None = None
        self._sched_before: SchedState | None = None  # the loop thread's, if changed
        # Per model, requests accepted and not yet answered (MAX_QUEUE).
        self._outstanding: dict[str, int] = {}

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        settings = self.settings
        root = settings.repository
        if root.resolve() == BUNDLED_REPOSITORY.resolve():
            from app.repository.bundled import ensure_bundled_models

            built = await asyncio.to_thread(ensure_bundled_models, root)
            for name in built:
                log.info("built bundled model file %s", name)
        index = load_repository(root)
        self.unavailable.update(index.errors)
        for name, error in index.errors.items():
            log.error("model %s unavailable: %s", name, error)
        self.devices = detect_devices(
            settings.cpu_slices, settings.threads_per_slice, settings.emulated_devices
        )
        if settings.realtime_priority:
            # Before the executors start: they inherit it, then step one below.
            self._sched_before = set_fifo(settings.realtime_priority)
            log.info("event loop at SCHED_FIFO priority %d", settings.realtime_priority)
        for device in self.devices:
            log.info(
                "device %d: %s (%s, %d threads)",
                device.id,
                device.name,
                device.kind,
                device.threads,
            )
        arenas = {
            name: Arena.create(config, settings.arena_slots)
            for name, config in index.models.items()
        }
        self.pool = ExecutorPool(
            self.devices,
            list(index.models.values()),
            arenas,
            self._on_done,
            on_down=self._on_device_down,
            on_up=self._on_device_up,
            respawn=settings.respawn,
            stuck_factor=settings.stuck_factor,
            stuck_margin_s=settings.stuck_margin_s,
            realtime_priority=settings.realtime_priority,
        )
        await self.pool.start()
        for name, config in index.models.items():
            devices = tuple(d.id for d in self.devices if name in self.pool.models_on(d.id))
            state = ModelState(config, arenas[name], devices)
            if not devices:
                self.unavailable[name] = "no device can run it (check `devices:` and backend)"
                log.error("model %s: no device can run it", name)
                arenas[name].close_and_unlink()
                continue
            self.models[name] = state
        for state in self.models.values():
            state.profile = await self._profile(state)
        self.dispatcher = Dispatcher(
            self._build_groups(),
            self.pool.submit,
            settings.deadline_margin_ms / 1000.0,
            timer_lead_s=settings.timer_lead_ms / 1000.0,
            cancel=self.pool.cancel,
        )
        # The watchdog judges a batch by the profile the core plans with.
        self.pool.expected_latency = self._expected_latency
        self._signals_task = asyncio.create_task(self._publish_signals())
        frozen = freeze_startup_heap()
        log.info("%d start-up objects exempted from garbage collection", frozen)
        self.ready = True
        log.info(
            "serving %d models with policy %s: %s",
            len(self.models),
            settings.policy,
            ", ".join(f"{n} on devices {list(s.devices)}" for n, s in self.models.items()),
        )

    async def stop(self) -> None:
        """Graceful shutdown: refuse new work, drain, fail the rest, free all."""
        self.closing = True
        self.ready = False
        dispatcher = self.dispatcher
        if dispatcher is not None:
            deadline = asyncio.get_running_loop().time() + self.settings.shutdown_grace_s
            while dispatcher.pending and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            failed = dispatcher.fail_all(ShuttingDown("server shut down before this request ran"))
            if failed:
                log.warning("shutdown: answered %d waiting requests with an error", failed)
        if self._signals_task is not None:
            self._signals_task.cancel()
        if self.pool is not None:
            await self.pool.stop(timeout=5.0)
        for state in self.models.values():
            state.arena.close_and_unlink()
        thaw_heap()
        if self._sched_before is not None:
            restore(self._sched_before)
            self._sched_before = None
        log.info("shut down")

    # -------------------------------------------------------------- profiles

    async def _profile(self, state: ModelState) -> LatencyProfile:
        config = state.config
        device = next(d for d in self.devices if d.id == state.devices[0])
        known = latency_profile(config, _device_tag(device))
        if known is not None:
            log.info("model %s: latency profile from config/cache", config.name)
            return known
        sizes = sorted(
            {b for b in self.settings.profile_batch_sizes if b <= config.max_batch_size}
            | {1, config.max_batch_size}
        )
        assert self.pool is not None
        measured = await self.pool.profile(device.id, config.name, sizes)
        alpha, beta, r2 = fit_linear(measured)
        write_profile_cache(
            config,
            _device_tag(device),
            measured,
            fit={"alpha_ms": alpha, "beta_ms": beta, "r2": r2},
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

    def _build_groups(self) -> list[CoreGroup]:
        by_devices: dict[tuple[int, ...], list[str]] = {}
        for name, state in self.models.items():
            by_devices.setdefault(state.devices, []).append(name)
        # Devices hosting exactly the same models form one group and one core.
        groups = []
        for devices, names in by_devices.items():
            infos = [
                ModelInfo(
                    name,
                    self.models[name].profile,  # type: ignore[arg-type]
                    self.models[name].config.slo_ms / 1000.0,
                    self.models[name].config.max_batch_size,
                )
                for name in names
            ]
            device_infos = [
                DeviceInfo(d, name=self._device(d).name, kind=self._device(d).kind) for d in devices
            ]
            scheduler = make_scheduler(
                self.settings.policy, infos, device_infos, **self.settings.policy_options
            )
            groups.append(CoreGroup(scheduler, frozenset(names), devices))
        return groups

    def _device(self, device_id: int) -> ExecutorDevice:
        return next(d for d in self.devices if d.id == device_id)

    # ------------------------------------------------------------- service API

    def model_names(self) -> list[str]:
        return sorted(self.models)

    def model_config(self, name: str) -> ModelConfig:
        state = self.models.get(name)
        if state is None:
            if name in self.unavailable:
                raise ModelNotReady(f"model {name!r} is unavailable: {self.unavailable[name]}")
            raise ModelNotFound(f"unknown model {name!r}; models: {', '.join(self.model_names())}")
        return state.config

    def model_ready(self, name: str) -> bool:
        state = self.models.get(name)
        if state is None or not self.ready or self.pool is None:
            return False
        return any(self.pool.alive(d) for d in state.devices)

    def server_ready(self) -> bool:
        """Serving, and every model has at least one live device (while an
        executor restarts, a model with another device stays ready)."""
        if not self.ready or self.closing:
            return False
        return all(self.model_ready(name) for name in self.models)

    def capacity(self) -> dict[str, object]:
        """Devices alive / total and the models left without a live device
        (the body of /v2/health/ready)."""
        pool = self.pool
        alive = [d.id for d in self.devices if pool is not None and pool.alive(d.id)]
        return {
            "devices_alive": len(alive),
            "devices_total": len(self.devices),
            "models_unavailable": sorted(n for n in self.models if not self.model_ready(n)),
        }

    def repository_index(self) -> list[dict[str, str]]:
        index = [
            {
                "name": name,
                "version": state.config.version,
                "state": "READY" if self.model_ready(name) else "UNAVAILABLE",
                "reason": "",
            }
            for name, state in self.models.items()
        ]
        index += [
            {"name": name, "version": "1", "state": "UNAVAILABLE", "reason": reason}
            for name, reason in self.unavailable.items()
        ]
        return sorted(index, key=lambda entry: entry["name"])

    async def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        slo_ms: float | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
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
                    f"slo_ms {slo_ms} is looser than model {model!r}'s SLO of {slo} ms; "
                    "the model config does not allow loosening"
                )
            slo = slo_ms
        state = self.models[model]
        limit = self.settings.max_queue
        outstanding = self._outstanding.get(model, 0)
        if limit and outstanding >= limit:
            self.metrics.request_dropped(model, "queue_full")
            raise Overloaded(
                f"model {model!r}: queue full ({limit} requests waiting)", "queue_full"
            )
        slot = state.arena.acquire()
        if slot is None:
            self.metrics.request_dropped(model, "overloaded")
            raise Overloaded(f"model {model!r}: {self.settings.arena_slots} requests in flight")
        self.metrics.request_received(model)
        self._outstanding[model] = outstanding + 1
        release = True
        try:
            state.arena.write_inputs(slot, inputs)
            seen_at = time.monotonic()
            pending = self.dispatcher.submit_request(
                model, slot, slo / 1000.0, received_at=received_at
            )
            try:
                finished: Finished = await asyncio.shield(pending.future)
            except asyncio.CancelledError:
                # The client went away; the executor may still write into
                # the slot, so free it only once the request is answered.
                release = False
                pending.future.add_done_callback(lambda _f: self._settle(model, state, slot))
                raise
            except Dropped as exc:
                self.metrics.request_dropped(model, exc.reason)
                raise
            except ShuttingDown:
                self.metrics.request_dropped(model, "shutting_down")
                raise
            if finished.error is not None:
                self.metrics.request_dropped(model, "executor_failed")
                raise ExecutorFailed(f"executor failed: {finished.error}")
            outputs = state.arena.read_outputs(slot)
            now = time.monotonic()
            request = pending.request
            latency = now - request.arrival
            queue = max(0.0, finished.started_at - request.arrival)
            self.metrics.request_finished(
                model, latency, queue, finished.batch.size, latency <= slo / 1000.0
            )
            return InferResult(
                model=model,
                request_id=request_id,
                outputs=outputs,
                queue_ms=queue * 1000.0,
                exec_ms=(finished.finished_at - finished.started_at) * 1000.0,
                batch_size=finished.batch.size,
                device=self._device(finished.batch.device).name,
                intake_ms=max(0.0, seen_at - request.arrival) * 1000.0,
                answer_ms=max(0.0, now - finished.finished_at) * 1000.0,
            )
        finally:
            if release:
                self._settle(model, state, slot)

    def _settle(self, model: str, state: ModelState, slot: int) -> None:
        """A request is answered: its slot and its place in the queue are free."""
        self._outstanding[model] -= 1
        state.arena.release(slot)

    # ---------------------------------------------------------------- events

    def _expected_latency(self, model: str, batch_size: int) -> float | None:
        state = self.models.get(model)
        if state is None or state.profile is None:
            return None
        return state.profile.latency(min(max(batch_size, 1), state.config.max_batch_size))

    def _on_device_down(self, device: int, reason: str) -> None:
        log.error("device %s out of service: %s", self._device(device).name, reason)
        self.metrics.executor_failed(self._device(device).name)
        if self.dispatcher is not None:
            self.dispatcher.device_down(device)

    def _on_device_up(self, device: int, seconds_down: float) -> None:
        name = self._device(device).name
        log.warning("device %s back in service after %.3f s", name, seconds_down)
        self.metrics.executor_restarted(name, seconds_down)
        if self.dispatcher is not None:
            self.dispatcher.device_up(device)

    def _on_done(
        self, device: int, batch_id: int, started_at: float, finished_at: float, error: str | None
    ) -> None:
        if self.dispatcher is None:
            return
        batch = self.dispatcher.batch_done(device, batch_id, started_at, finished_at, error)
        if batch is not None and error is None:
            self.metrics.batch_executed(batch.model, self._device(device).name, batch.size)

    async def _publish_signals(self, period_s: float = 5.0) -> None:
        """Symphony's autoscaling signals (§4.4) to /metrics, every period."""
        assert self.dispatcher is not None
        while True:
            await asyncio.sleep(period_s)
            now = time.monotonic()
            total = bad = 0.0
            idle = []
            for group in self.dispatcher.groups:
                signals = group.scheduler.signals(now)
                requests = signals.finished_good + signals.finished_late + signals.dropped
                total += requests
                bad += signals.finished_late + signals.dropped
                idle.append((signals.idle_fraction, len(group.devices)))
                for device, busy in signals.per_device_busy.items():
                    self.metrics.set_device_busy(self._device(device).name, busy)
                group.scheduler.reset_signals(now)
            devices = sum(n for _, n in idle)
            idle_fraction = sum(f * n for f, n in idle) / devices if devices else 0.0
            bad_rate = bad / total if total else 0.0
            self.metrics.set_autoscale(
                bad_rate, idle_fraction, advised_device_change(devices, bad_rate, idle_fraction)
            )


def _device_tag(device: ExecutorDevice) -> str:
    if device.kind == "cpu":
        return f"cpu-{device.threads}t"
    return f"{device.kind}-{device.index}"
