"""Parent side of the executors: an asyncio-friendly pool of processes.

`ExecutorPool` spawns one executor process per `ExecutorDevice` (spawn
context; `app.runtime.devices` says which), tells each which models to load,
and then only sends small control messages (`app.runtime.messages`).
Replies are read on the event loop with `loop.add_reader` on the pipe's file
descriptor (a reader thread with `call_soon_threadsafe` where the loop has no
`add_reader`), so nothing blocks the loop; each process's record, start and
pipe reading are `app.runtime.pool_worker`'s. What happens to batches and
devices reaches the owner as typed events (`app.runtime.events`), posted on
the loop's thread: BatchFinished or BatchStopped exactly once per submitted
batch, DeviceDown and DeviceUp.

Clock: all times are `time.monotonic()` seconds, the clock of asyncio's
`loop.time()`; pass `start_at = loop.time() + delay` (or ≤ now for "at once").

Models loaded and unloaded while serving (`pool.model_changes`,
app.runtime.model_changes) and parking (`pool.parking`, app.runtime.parking)
are objects the pool owns, written once for executor processes and Ray
actors (app.runtime.ray_pool): each works through the few calls the pool
implements for it (`executor_records`, `serves`, `load_on`, `unload_on`;
`executor_name`, `refuse_park`, `stop_parked`, `start_executor`,
`failed_start`, `serving`, `post`).

Faults. An executor that dies (crash, SIGKILL, OOM kill) is noticed as EOF on
its pipe; one that hangs — silent for `heartbeat_timeout_s`, idle or busy, or
its oldest batch running longer than `stuck_factor`·ℓ(b) + `stuck_margin_s`
by `expected_latency` (app.runtime.watchdog) — is killed by a watchdog on the
event loop. Either way DeviceDown is posted first (so the owner can re-plan
the batches' requests), then a BatchFinished with the reason as its error for
every batch in flight, and the executor is respawned in the background: a
fresh process loads the same models and re-attaches the same arenas; DeviceUp
reports it serving again (until then `alive()` is False).

Reshares (`pool.reshares`). `await pool.reshare(device_id, share)` gives a device's executor a
new share (InSS §5.3; app.runtime.pool_reshare): a shadow executor with the
new share starts beside the old one, loads the same models and runs each
once at batch 1; then, in one step on the event loop, new batches for the
device go to the shadow and `devices[device_id]` is the new share, while the
old executor runs the batches it holds — their events posted exactly once,
`cancel` finding them there — and is stopped once it holds none. The
watchdog watches both; a retiring executor that dies fails its batches
without a DeviceDown (the shadow serves). A shadow that fails to come up
raises ReshareFailed and leaves the old one serving untouched; a bad share,
shares of a device summing past 1 (ValueError), or a reshare while that
device is reshared or respawned (ReshareRefused) are refused before
anything starts. It returns a `Reshared` with the time of each phase.

Executors added and removed (an InSS plan that splits devices otherwise,
app/server/inss_layout.py): `await pool.add_executor(device)` starts one
for a new device id (`next_device_id`) and loads the models its configs
allow there; `await pool.remove_executor(device_id)` stops one for good
after the batches it holds, and its id is never used again.

Parking (app.runtime.parking, the pool's `parking`, over the executor
lifecycle it implements below). `await pool.parking.park(device_id)` stops a
device's executor on purpose (autoscaling) after posting DeviceParked — no
DeviceDown, no respawn; `await pool.parking.unpark(device_id)` starts it again and
posts DeviceUnparked once it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from app.errors import ExecutorFailed
from app.repository.config import ModelConfig
from app.runtime.alone_profiler import alone_event
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.events import (
    BatchFinished,
    BatchStopped,
    DeviceDown,
    DeviceUp,
    EventSink,
    ExecutorEvent,
)
from app.runtime.messages import (
    AloneMark,
    Cancel,
    Cancelled,
    Load,
    Loaded,
    Profile,
    Profiled,
    Ran,
    RanAlone,
    Run,
    Stop,
    Stopped,
    ToExecutor,
    Unload,
    Unloaded,
    config_to_dict,
)
from app.runtime.model_changes import ModelChanges
from app.runtime.mps import GpuSharing
from app.runtime.parking import Parking
from app.runtime.pool_records import (
    DeviceRecords,
    ExecutorRecord,
    check_watchdog_rules,
    pool_inputs,
)
from app.runtime.pool_reshare import Reshared, Reshares
from app.runtime.pool_worker import Worker, attach_reader, detach_reader, drain, start_process
from app.runtime.watchdog import reap, watch_for_hangs

log = logging.getLogger("app.runtime.pool")

# expected_latency(model, batch_size) -> seconds, or None when unknown
LatencyOf = Callable[[str, int], "float | None"]


# --------------------------------------------------------------------- pool
class ExecutorPool(DeviceRecords):
    """Executor processes for `devices`, serving `configs` through `arenas`.

    `configs`: ModelConfigs (a mapping by name or an iterable); `arenas`: one
    parent-created `Arena` per model that will be run (the pool owns them and
    unlinks them in `stop`). `events` receives, on the event loop thread, a
    BatchFinished or a BatchStopped for every submitted batch exactly once —
    BatchFinished with an error when the batch failed, or its executor
    died or stopped first (then started_at == finished_at == the time it was
    noticed) — and DeviceDown / DeviceUp as executors fail and come back.
    """

    def __init__(
        self,
        devices: Sequence[ExecutorDevice],
        configs: Mapping[str, ModelConfig] | Iterable[ModelConfig],
        arenas: Mapping[str, Arena],
        events: EventSink,
        *,
        log_level: int | None = None,
        respawn: bool = True,
        expected_latency: LatencyOf | None = None,
        stuck_factor: float = 10.0,
        stuck_margin_s: float = 1.0,
        heartbeat_timeout_s: float = 0.8,
        load_timeout_s: float = 300.0,
        realtime_priority: int = 0,
    ) -> None:
        check_watchdog_rules(stuck_factor, stuck_margin_s, heartbeat_timeout_s)
        self.devices, self.configs = pool_inputs(devices, configs)
        self.arenas: dict[str, Arena] = dict(arenas)
        self.events = events
        self.log_level = log.getEffectiveLevel() if log_level is None else log_level
        self._workers: dict[int, Worker] = {d.id: Worker(d) for d in devices}  # serving
        # A device's executor replaced by a shadow (app.runtime.pool_reshare).
        self.reshares = Reshares(self)
        self.parking = Parking(self)  # executors stopped on purpose (app.runtime.parking)
        self.model_changes = ModelChanges(self)  # models loaded while serving
        self._waiters: dict[int, tuple[Worker, asyncio.Future]] = {}
        self._req_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopped = False
        self.respawn = respawn
        # Watchdog: a batch running longer than factor·ℓ(b) + margin is a
        # hung executor (0 disables it). `expected_latency` may be set later,
        # once profiles are known.
        self.expected_latency = expected_latency
        self.stuck_factor = stuck_factor
        self.stuck_margin_s = stuck_margin_s
        # ...and an executor silent this long is one too, idle or busy (0: off).
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.load_timeout_s = load_timeout_s
        self.realtime_priority = realtime_priority  # the event loop's; see app.runtime.realtime
        self._tasks: set[asyncio.Task] = set()
        self._gpu_sharing = GpuSharing()  # MPS for GPU shares, while running
        self._retired: set[int] = set()  # ids of executors removed for good

    # ----------------------------------------------------------- placement
    def _records(self) -> Mapping[int, ExecutorRecord]:
        return self._workers

    def alive(self, device_id: int) -> bool:
        w = self._workers[device_id]
        return not w.dead and not w.loading and w.process is not None and w.process.is_alive()

    def parked(self, device_id: int) -> bool:
        return self.parking.parked(device_id)

    def resharing(self, device_id: int) -> bool:
        return self.reshares.in_progress(device_id)

    def pid(self, device_id: int) -> int | None:
        p = self._workers[device_id].process
        return None if p is None else p.pid

    def inflight(self, device_id: int) -> dict[int, str]:
        """Batch id → model of the device's batches in flight (a retiring
        executor's included)."""
        retiring = self.reshares.retiring.get(device_id)
        held = {} if retiring is None else retiring.inflight
        return {**held, **self._workers[device_id].inflight}

    def _processes(self) -> list[Worker]:
        """Every executor process: serving, retiring, shadows starting."""
        reshares = self.reshares
        return [*self._workers.values(), *reshares.retiring.values(), *reshares.shadows.values()]

    # -------------------------------------------------------------- start
    async def start(self, timeout: float = 300.0) -> None:
        """Spawn every executor and load its models (in parallel).

        A model that fails to load on a device is logged and left out of
        `models_on(device)`; see `load_errors`. Raises ExecutorFailed if an
        executor does not come up at all.
        """
        if self._started:
            raise RuntimeError("pool already started")
        self._started = True
        self._loop = asyncio.get_running_loop()
        try:
            self._gpu_sharing = GpuSharing.start(self.devices.values())
            for w in self._workers.values():
                self._spawn(w)
            loads = [self._load(w) for w in self._workers.values()]
            await asyncio.wait_for(asyncio.gather(*loads), timeout)
        except BaseException:
            await self.stop(timeout=2.0)
            raise
        if self.stuck_factor > 0 or self.heartbeat_timeout_s > 0:
            self._background(watch_for_hangs(self, self._hung))
        for w in self._workers.values():
            log.info(
                "executor %s (pid %s): %s",
                w.device.name,
                w.process.pid,
                ", ".join(f"{m} [{w.load_info.get(m, '')}]" for m in w.models) or "no models",
            )

    def _spawn(self, w: Worker) -> None:
        start_process(
            w,
            log_level=self.log_level,
            realtime_priority=self.realtime_priority,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            env=self._gpu_sharing.env_for(w.device),
        )
        assert self._loop is not None
        attach_reader(self._loop, w, self._handle, self._on_eof)

    def _background(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respawn(self, w: Worker) -> None:
        """Start a fresh process for a dead executor until one loads; then
        report the device back (DeviceUp) with the time it was out."""
        backoff = 0.1
        while not self._stopped:
            reap(w.process)
            w.models, w.load_errors, w.load_info = [], {}, {}
            w.loading = True
            try:
                self._spawn(w)
                await asyncio.wait_for(self._load(w), self.load_timeout_s)
            except (ExecutorFailed, TimeoutError, OSError) as exc:
                log.error("respawning executor %s failed: %s", w.device.name, exc)
                if w.process is not None and w.process.is_alive():
                    w.process.kill()
                self._mark_dead(w, f"executor {w.device.name} failed to restart")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            w.loading = False
            if self._stopped:
                return
            down = time.monotonic() - (w.down_since or time.monotonic())
            w.restarts += 1
            w.last_respawn_s = down
            w.down_since = None
            log.warning(
                "executor %s respawned (pid %s, restart %d): serving %s again %.3f s "
                "after it failed",
                w.device.name,
                w.process.pid,
                w.restarts,
                ", ".join(w.models) or "no models",
                down,
            )
            self._post(DeviceUp(w.device.id, down))
            return

    def watched(self) -> list[Worker]:
        """The executors the watchdog judges (app.runtime.watchdog): those
        serving, a retiring one's included."""
        workers = [*self._workers.values(), *self.reshares.retiring.values()]
        return [w for w in workers if not (w.dead or w.loading or w.stopping)]

    def _hung(self, w: Worker, reason: str) -> None:
        log.error("%s; killing it", reason)
        with contextlib.suppress(OSError):
            w.process.kill()
        self._mark_dead(w, reason)

    async def _load(self, w: Worker) -> None:
        names = self.placement(w.device.id)
        configs = [config_to_dict(self.configs[n]) for n in names]
        layouts = {n: self.arenas[n].layout for n in names if n in self.arenas}
        req = next(self._req_ids)
        fut = self._expect(req, w)
        self._send(w, Load(req, configs, layouts))
        errors, info = await fut
        for name, err in errors.items():
            if err is None:
                w.models.append(name)
            else:
                w.load_errors[name] = err
                log.warning("executor %s: model %s failed to load: %s", w.device.name, name, err)
        w.load_info.update(info)
        w.serving_since = time.monotonic()

    # ------------------------------------------------------------- submit
    def submit(
        self,
        device_id: int,
        batch_id: int,
        model: str,
        slots: Sequence[int],
        start_at: float,
        alone: Sequence[AloneMark] = (),
    ) -> None:
        """Queue a batch on the device (non-blocking). Its inputs must already
        be in `slots` of the model's arena; outputs land in the same slots
        before its BatchFinished is posted; `alone` marks requests to re-run
        alone (app/runtime/alone_profiler.py). Raises ExecutorFailed at once
        when the device is dead or lacks the model (then no event follows)."""
        w = self._workers[device_id]
        if w.dead or w.loading or w.stopping or self._stopped:
            raise ExecutorFailed(f"executor {w.device.name} is not running")
        if model not in w.models:
            raise ExecutorFailed(f"model {model!r} is not loaded on {w.device.name}")
        if self._holder(device_id, batch_id) is not None:  # here or on a retiring one
            raise ValueError(f"batch {batch_id} is already in flight on {w.device.name}")
        if not w.inflight:
            w.progress_at = time.monotonic()
        w.inflight[batch_id] = model
        w.sizes[batch_id] = (len(slots), float(start_at))
        try:
            rows = [int(s) for s in slots]
            self._send(w, Run(int(batch_id), model, rows, float(start_at), tuple(alone)))
        except ExecutorFailed:
            w.inflight.pop(batch_id, None)
            w.sizes.pop(batch_id, None)
            raise

    def cancel(self, device_id: int, batch_id: int) -> bool:
        """Best-effort preemption: a queued batch is skipped, a running one is
        terminated (ORT RunOptions.terminate / emulated hold aborted). A
        BatchStopped event follows — or BatchFinished if it finished first.
        Returns False if the batch is not in flight (its event is posted
        already, or its executor is gone)."""
        w = self._holder(device_id, batch_id)
        if w is None or w.dead:
            return False
        try:
            w.cancels.send(Cancel(int(batch_id)))
        except (OSError, ValueError):  # the executor is gone: its EOF reports it
            return False
        return True

    def _holder(self, device_id: int, batch_id: int) -> Worker | None:
        """The executor holding the batch: the serving one or, after a
        reshare, the one it replaced."""
        for w in (self._workers[device_id], self.reshares.retiring.get(device_id)):
            if w is not None and batch_id in w.inflight:
                return w
        return None

    async def profile(
        self,
        device_id: int,
        model: str,
        batch_sizes: Sequence[int],
        warmup: int = 3,
        repeats: int = 10,
        timeout: float | None = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> dict[int, float]:
        """Median ms per batch size of synthetic inputs run on the device
        (after `warmup` runs each), or of `inputs` (arrays of batch size
        `batch_sizes[0]`, e.g. a dynamic model's probe). Queued behind
        batches already submitted."""
        return await self._profile_on(
            self._workers[device_id], model, batch_sizes, warmup, repeats, timeout, inputs
        )

    async def _profile_on(
        self,
        w: Worker,
        model: str,
        batch_sizes: Sequence[int],
        warmup: int,
        repeats: int,
        timeout: float | None,
        inputs: Mapping[str, Any] | None = None,
    ) -> dict[int, float]:
        if w.dead or self._stopped:
            raise ExecutorFailed(f"executor {w.device.name} is not running")
        if model not in w.models:
            raise ExecutorFailed(f"model {model!r} is not loaded on {w.device.name}")
        req = next(self._req_ids)
        fut = self._expect(req, w)
        given = None if inputs is None else dict(inputs)
        sizes = [int(b) for b in batch_sizes]
        self._send(w, Profile(req, model, sizes, int(warmup), int(repeats), given))
        result, error = await asyncio.wait_for(fut, timeout)
        if error is not None:
            raise ExecutorFailed(f"profiling {model} on {w.device.name} failed: {error}")
        return {int(b): float(ms) for b, ms in result.items()}

    # --------------------------------------------------------------- stop
    async def stop(self, timeout: float = 5.0) -> None:
        """Stop every executor: queued batches run first (their events are
        posted), then the process exits; after `timeout` stragglers are
        killed and their in-flight batches fail. Finally the arenas are
        unlinked."""
        if self._stopped:
            return
        self._stopped = True
        for task in list(self._tasks):  # watchdog, respawns
            task.cancel()
        workers = self._processes()
        for w in workers:
            w.stopping = True
            if w.process is not None and not w.dead:
                with contextlib.suppress(OSError, ValueError):
                    w.conn.send(Stop())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            w.process is not None and w.process.is_alive() for w in workers
        ):
            await asyncio.sleep(0.01)
        for w in workers:
            p = w.process
            if p is None:
                continue
            if p.is_alive():
                log.warning(
                    "executor %s did not stop in %.1f s; killing it", w.device.name, timeout
                )
                p.kill()
                p.join(2.0)
            else:
                p.join(0)
            drain(w, self._handle)
            self._mark_dead(w, f"executor {w.device.name} stopped")
        for arena in self.arenas.values():
            try:
                arena.close_and_unlink()
            except Exception:
                log.exception("unlinking arena %s failed", arena.name)
        self._gpu_sharing.stop()

    # ---------------------------------------------------------- internals
    def _expect(self, req: int, w: Worker) -> asyncio.Future:
        assert self._loop is not None
        fut = self._loop.create_future()
        self._waiters[req] = (w, fut)
        return fut

    def _send(self, w: Worker, msg: ToExecutor) -> None:
        try:
            w.conn.send(msg)
        except (OSError, ValueError) as exc:  # broken pipe / closed connection
            self._mark_dead(w, f"executor {w.device.name} is gone: {exc}")
            raise ExecutorFailed(f"executor {w.device.name} is not running") from exc

    def _on_eof(self, w: Worker) -> None:
        if w.stopping:
            self._mark_dead(w, f"executor {w.device.name} stopped")
            return
        code = w.process.exitcode if w.process is not None else None
        log.error("executor %s exited unexpectedly (exit code %s)", w.device.name, code)
        self._mark_dead(w, f"executor {w.device.name} died (exit code {code})")

    def _mark_dead(self, w: Worker, reason: str) -> None:
        detach_reader(self._loop, w)
        first = not w.dead
        if first:
            w.dead = True
            with contextlib.suppress(OSError):
                w.conn.close()
            if w.cancels is not None:
                with contextlib.suppress(OSError):
                    w.cancels.close()
        # A fault (not a stop, not a failed restart or shadow, not an executor
        # a shadow replaced): tell the owner before failing the batches, so it
        # can re-plan their requests, and respawn.
        fault = first and not (w.stopping or self._stopped or w.loading or w.retiring)
        if fault:
            w.down_since = time.monotonic()
            self._post(DeviceDown(w.device.id, reason))
        now = time.monotonic()
        for batch_id in list(w.inflight):
            w.inflight.pop(batch_id, None)
            w.sizes.pop(batch_id, None)
            if w.retiring:
                # The device serves on (its shadow took over): the batch is
                # stopped, not failed, and its requests go back to the queue.
                self._post(BatchStopped(w.device.id, batch_id, now))
            else:
                self._post(BatchFinished(w.device.id, batch_id, now, now, reason))
        for req, (owner, fut) in list(self._waiters.items()):
            if owner is w:
                self._waiters.pop(req, None)
                if not fut.done():
                    fut.set_exception(ExecutorFailed(reason))
        if w.retiring:
            self.reshares.retired(w, reason)
        if fault and self.respawn and self._loop is not None:
            self._background(self._respawn(w))

    # ------------------------------------------------------------- model changes
    # What app.runtime.model_changes works through.

    def executor_records(self) -> Iterable[Worker]:
        return self._workers.values()

    def serves(self, w: Worker) -> bool:
        return not (w.dead or w.loading or w.stopping or self._stopped)

    async def load_on(
        self, w: Worker, config: ModelConfig, arena: Arena
    ) -> tuple[dict[str, str | None], dict[str, Any]]:
        req = next(self._req_ids)
        fut = self._expect(req, w)
        self._send(w, Load(req, [config_to_dict(config)], {config.name: arena.layout}))
        errors, info = await fut
        return errors, info

    async def unload_on(self, w: Worker, name: str) -> None:
        req = next(self._req_ids)
        fut = self._expect(req, w)
        self._send(w, Unload(req, [name]))
        await fut

    # ------------------------------------------------------- executors added
    # An InSS plan that splits devices otherwise, taken up while serving
    # (app/server/inss_layout.py), adds share executors and removes others.

    def next_device_id(self) -> int:
        """An id no executor of this pool has had."""
        return max([*self.devices, *self._retired], default=-1) + 1

    async def add_executor(self, device: ExecutorDevice) -> None:
        """Start an executor for `device` (a new id, `next_device_id`) and
        load the models its configs allow there; ExecutorFailed (or
        TimeoutError) when it does not come up, and then nothing is kept."""
        if not self.running:
            raise ValueError("the pool is not running")
        if device.id < self.next_device_id():
            raise ValueError(f"device id {device.id} is taken; use next_device_id()")
        w = Worker(device)
        w.loading = True  # its death while starting is no fault of a device
        self.devices[device.id] = device
        self._workers[device.id] = w
        if self._gpu_sharing.directory is None:  # the first GPU share: MPS for it
            self._gpu_sharing = GpuSharing.start([device])
        try:
            self._spawn(w)
            await asyncio.wait_for(self._load(w), self.load_timeout_s)
        except BaseException:
            if w.process is not None and w.process.is_alive():
                w.process.kill()
            self._mark_dead(w, f"executor {device.name} failed to start")
            reap(w.process)
            del self._workers[device.id], self.devices[device.id]
            self._retired.add(device.id)
            raise
        w.loading = False
        log.info(
            "executor %s added (pid %s): %s",
            device.name,
            w.process.pid,
            ", ".join(w.models) or "no models",
        )

    async def remove_executor(self, device_id: int, timeout: float = 5.0) -> None:
        """Stop the device's executor for good once it has run the batches
        it holds (their events posted as usual; no DeviceDown), and forget
        the device: its id is not used again."""
        w = self._worker_for(device_id)
        if self.reshares.in_progress(device_id):
            raise ValueError(f"{w.device.name} is being reshared")
        if w.process is not None and not w.dead:
            await self.stop_parked(device_id, timeout)
        self.parking.forget(device_id)
        w.stopping = True
        del self._workers[device_id], self.devices[device_id]
        self._retired.add(device_id)
        log.info("executor %s removed", w.device.name)

    # ------------------------------------------------------------- parking

    # What a reshare works through (app.runtime.pool_reshare's ShadowHost).

    async def reshare(
        self,
        device_id: int,
        share: float,
        *,
        cores: Sequence[int] | None = None,
        timeout: float | None = None,
        stop_timeout_s: float = 5.0,
    ) -> Reshared:
        """Give the device's executor the share `share` (Reshares.reshare)."""
        return await self.reshares.reshare(
            device_id, share, cores=cores, timeout=timeout, stop_timeout_s=stop_timeout_s
        )

    @property
    def workers(self) -> dict[int, Worker]:
        return self._workers

    @property
    def running(self) -> bool:
        return self._started and not self._stopped

    def spawn(self, w: Worker) -> None:
        self._spawn(w)

    async def load(self, w: Worker) -> None:
        await self._load(w)

    async def warm_up(self, w: Worker, model: str, timeout: float) -> None:
        await self._profile_on(w, model, [1], 0, 1, timeout)

    def mark_dead(self, w: Worker, reason: str) -> None:
        self._mark_dead(w, reason)

    # The executor lifecycle parking works through (app.runtime.parking).

    @property
    def stopped(self) -> bool:
        return self._stopped

    def executor_name(self, device_id: int) -> str:
        return self._worker_for(device_id).device.name

    def refuse_park(self, device_id: int) -> str | None:
        w = self._workers[device_id]
        if w.dead or w.loading or self.reshares.in_progress(device_id):
            return "down, starting or being reshared"
        return None

    def post(self, event: ExecutorEvent) -> None:
        self._post(event)

    async def stop_parked(self, device_id: int, timeout: float) -> None:
        """As at shutdown: Stop after the batches it holds; killed if slow."""
        w = self._workers[device_id]
        w.stopping = True
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(Stop())
        deadline = time.monotonic() + timeout
        while w.process.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if w.process.is_alive():
            log.warning("executor %s did not stop in %.1f s; killing it", w.device.name, timeout)
            w.process.kill()
        if not w.dead:  # its EOF may not have been read yet
            await asyncio.sleep(0)
            self._mark_dead(w, f"executor {w.device.name} parked")
        reap(w.process)
        w.down_since = time.monotonic()

    async def start_executor(self, device_id: int) -> None:
        """A fresh process for the device, its models loaded (as a respawn)."""
        w = self._workers[device_id]
        w.models, w.load_errors, w.load_info = [], {}, {}
        w.dead, w.stopping, w.loading = False, False, True
        self._spawn(w)
        await self._load(w)
        w.loading = False

    def failed_start(self, device_id: int, reason: str) -> None:
        w = self._workers[device_id]
        if w.process is not None and w.process.is_alive():
            w.process.kill()
        self._mark_dead(w, reason)
        reap(w.process)

    def serving(self, device_id: int) -> str:
        w = self._workers[device_id]
        w.down_since = None
        return f"pid {w.process.pid}"

    def _worker_for(self, device_id: int) -> Worker:
        if device_id not in self._workers:
            raise ValueError(f"no device {device_id} in this pool")
        if not self._started or self._stopped:
            raise ValueError("the pool is not running")
        return self._workers[device_id]

    def _post(self, event: ExecutorEvent) -> None:
        try:
            self.events(event)
        except Exception:
            log.exception("handling %s failed", event)

    def _handle(self, w: Worker, msg: Any) -> None:
        if isinstance(msg, Ran | Cancelled):
            w.progress_at = time.monotonic()
            w.sizes.pop(msg.batch_id, None)
            if w.inflight.pop(msg.batch_id, None) is None:
                log.warning("executor %s: reply for unknown batch %s", w.device.name, msg.batch_id)
                return
            if isinstance(msg, Ran):
                self._post(
                    BatchFinished(
                        w.device.id, msg.batch_id, msg.started_at, msg.finished_at, msg.error
                    )
                )
            else:
                self._post(BatchStopped(w.device.id, msg.batch_id, msg.stopped_at))
            if w.retiring and not w.inflight:
                self.reshares.drained(w)
        elif isinstance(msg, Loaded):
            self._resolve(msg.req_id, (msg.errors, msg.info))
        elif isinstance(msg, Unloaded):
            self._resolve(msg.req_id, None)
        elif isinstance(msg, Profiled):
            self._resolve(msg.req_id, (msg.result, msg.error))
        elif isinstance(msg, RanAlone):
            self._post(alone_event(w.device.id, msg))
        elif isinstance(msg, Stopped):
            pass
        else:
            log.warning("executor %s: unknown reply %r", w.device.name, type(msg).__name__)

    def _resolve(self, req: int, value: Any) -> None:
        entry = self._waiters.pop(req, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(value)
