"""Executors on a Ray cluster: the executor pool whose executors are actors.

`RayExecutorPool` has the interface of `app.runtime.pool.ExecutorPool` that
the dispatcher and the service use, and the same events contract:
BatchFinished or BatchStopped exactly once per submitted batch, DeviceDown
and DeviceUp. One actor (`app.runtime.ray_actor`) runs per `ExecutorDevice`
— `num_gpus=1` for a GPU, `num_cpus=threads` for a CPU slice, no CPU for an
emulated device — on the node `nodes` names for it (node affinity) or where
Ray places it, with the same backends as a local executor. A CPU slice's
threads are fitted to the nodes (`fit_threads`), and a request no live node
meets raises ActorInfeasible at start, before anything waits
(app.runtime.ray_fit); start-up logs each actor's progress. The scheduling
core stays in the daemon; only small batch plans go to the actors. Ray is
the `ray` extra, imported when a pool starts.

Nothing blocks the event loop: a call to an actor returns an ObjectRef at
once, and a task per call awaits it (`await ref`).

Data. Tensor bytes never pass through the scheduler's loop as messages: an
actor on the daemon's node (`ray.get_runtime_context().get_node_id()`)
attaches each model's shared-memory arena and reads and writes slots, and
gets its batch plans on the batch channel, a Unix socket, rather than as
Ray calls (app.runtime.ray_channel; `channel=False`: Ray calls); one
on another node (or every one, with `all_remote`) gets the batch's slots'
input bytes as one numpy array through Ray's object store and returns the
output bytes, which the pool copies into the arena before the batch's
BatchFinished. Clock: the pool's times are its `time.monotonic()`; an actor
on another node has its own, so the offset is measured at start (half a
ping's round trip of error) and start times and replies are converted.

Dispatch delays (d_ctrl, d_data in the core). At start the pool measures,
per actor, the median round trip of an empty call (`dispatch_overhead_s`,
the largest over actors) and of a `PROBE_BYTES` array there and back
(`bytes_per_s`, the smallest over actors); `delays_for(models, devices)`
turns them into the core's d_ctrl and per-item d_data — d_data is 0 for a
group whose actors all share the daemon's arena.

Faults (app.runtime.ray_faults): an actor that dies is DeviceDown, its
batches in flight each a BatchFinished with the reason; Ray restarts it
(`max_restarts`), and once it has loaded its models again, DeviceUp. One
that hangs — its pings unanswered for `heartbeat_timeout_s`, or its oldest
batch running past `stuck_factor`·ℓ(b) + `stuck_margin_s` — is killed and
goes the same way (the rules of local executors, app.runtime.watchdog).

Parking (autoscaling; app.runtime.parking, the pool's `parking`, over the
actor lifecycle it implements): a parked device's actor stops after the
batches sent before it and is killed for good (`ray.kill`, no restart),
giving its resources back to the cluster; a new one is created where Ray
finds the resources (or on the node RAY_NODES names) when the device is
unparked.

Models loaded and unloaded while serving: app.runtime.model_changes (the
pool's `model_changes`, over the actor calls it implements).

Samples re-run alone on an idle actor (the asynchronous profiler):
app.runtime.ray_alone.

Not on Ray: reshares, which raise `NotSupportedOnRay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from app.errors import ExecutorFailed, ServingError
from app.optional import import_ray
from app.repository.config import ModelConfig
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.events import (
    BatchFinished,
    BatchStopped,
    EventSink,
    ExecutorEvent,
)
from app.runtime.messages import AloneMark, Cancelled, Ran, Run, config_to_dict
from app.runtime.model_changes import ModelChanges
from app.runtime.parking import Parking
from app.runtime.pool import LatencyOf
from app.runtime.pool_records import (
    DeviceRecords,
    ExecutorRecord,
    check_watchdog_rules,
    pool_inputs,
)
from app.runtime.ray_alone import AloneReruns
from app.runtime.ray_channel import Channel, ChannelDirectory, connect
from app.runtime.ray_faults import ActorFaults, clock_offset, measure_paths
from app.runtime.ray_fit import (
    ActorInfeasible,
    NodeOffer,
    describe,
    fitted,
    infeasible,
    offers_of,
    request_of,
)
from app.runtime.ray_records import Actor, ActorBeat, inputs_end

log = logging.getLogger("app.runtime.ray_pool")

# While an actor waits for Ray to place it, a line says so this often.
PLACE_REPORT_S = 5.0


class NotSupportedOnRay(ServingError):
    """A pool operation that executors on Ray do not have: a model load or
    unload, a reshare asked of a daemon on Ray gets 501 naming it."""

    status = 501
    reason = "not_supported"


def _unsupported(method: str) -> NotSupportedOnRay:
    return NotSupportedOnRay(
        f"ExecutorPool.{method} is not supported on Ray executors (RAY_ADDRESS)"
    )


class RayExecutorPool(DeviceRecords):
    """Ray actors for `devices`, serving `configs` through `arenas` (see the
    module docstring; the arguments are `ExecutorPool`'s). `nodes`: a node
    id per device id to pin its actor to; `all_remote`: every actor takes
    the remote data path, wherever it runs; `max_restarts`: Ray's, per
    actor (-1: without limit); `fit_threads`: a CPU slice's threads are
    cut to the CPUs of the largest node it may run on (app.runtime.ray_fit;
    False: it asks for exactly its threads); `channel`: batches go to an
    actor on the daemon's node through a socket (app.runtime.ray_channel)
    rather than Ray calls."""

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
        max_restarts: int = -1,
        nodes: Mapping[int, str] | None = None,
        all_remote: bool = False,
        fit_threads: bool = True,
        channel: bool = True,
    ) -> None:
        check_watchdog_rules(stuck_factor, stuck_margin_s, heartbeat_timeout_s)
        self.devices, self.configs = pool_inputs(devices, configs)
        self.arenas: dict[str, Arena] = dict(arenas)
        self.events = events
        self.log_level = log.getEffectiveLevel() if log_level is None else log_level
        self.respawn = respawn
        self.expected_latency = expected_latency  # the service sets it for the watchdog
        self.stuck_factor = stuck_factor
        self.stuck_margin_s = stuck_margin_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.load_timeout_s = load_timeout_s
        self.max_restarts = max_restarts
        self.nodes = dict(nodes or {})
        unknown = sorted(set(self.nodes) - set(self.devices))
        if unknown:
            raise ValueError(f"nodes names devices {unknown} that are not in the pool")
        self.all_remote = all_remote
        self.fit_threads = fit_threads
        self.use_channel = channel
        self._channels: ChannelDirectory | None = None
        self.dispatch_overhead_s = 0.0
        self.bytes_per_s = float("inf")
        self._actors: dict[int, Actor] = {d.id: Actor(d) for d in devices}
        self.parking = Parking(self)  # actors stopped on purpose (app.runtime.parking)
        self.model_changes = ModelChanges(self)  # models loaded while serving
        self.faults = ActorFaults(self)  # deaths and hangs (app.runtime.ray_faults)
        self.reruns = AloneReruns(self)  # samples re-run alone (app.runtime.ray_alone)
        self._node = ""
        self._ray: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._started = False
        self._stopped = False

    # ----------------------------------------------------------- placement
    def _records(self) -> Mapping[int, ExecutorRecord]:
        return self._actors

    def alive(self, device_id: int) -> bool:
        a = self._actors[device_id]
        return self._started and not self._stopped and not a.dead and not a.loading

    def parked(self, device_id: int) -> bool:
        return self.parking.parked(device_id)

    def pid(self, device_id: int) -> int | None:
        """The actor's worker process id (on its node)."""
        return self._actors[device_id].pid

    def node_of(self, device_id: int) -> str:
        return self._actors[device_id].node_id

    def remote(self, device_id: int) -> bool:
        """Whether the device's batches take the object-store data path."""
        return self._actors[device_id].remote

    def channelled(self, device_id: int) -> bool:
        """Whether the device's batches go through its batch channel."""
        channel = self._actors[device_id].channel
        return channel is not None and not channel.closed

    def request(self, device_id: int) -> dict[str, float]:
        """What the device's actor asks Ray for (after fitting)."""
        return dict(self._actors[device_id].request)

    def inflight(self, device_id: int) -> dict[int, str]:
        return dict(self._actors[device_id].inflight)

    def actor(self, device_id: int) -> Any:
        """The device's Ray actor handle."""
        return self._actors[device_id].handle

    def delays_for(self, models: Iterable[str], devices: Iterable[int]) -> tuple[float, float]:
        """The core's (d_ctrl, d_data) for a group: the slowest actor's
        control round trip, and per item a slot's bytes over the slowest
        data path when some actor of the group takes it (else 0)."""
        actors = [self._actors[d] for d in devices]
        d_ctrl = max((a.overhead_s for a in actors), default=0.0)
        remote = [a for a in actors if a.remote]
        if not remote:
            return d_ctrl, 0.0
        slot = max((int(self.arenas[m].layout["slot_nbytes"]) for m in models), default=0)
        return d_ctrl, slot / min(a.bytes_per_s for a in remote)

    # ------------------------------------------------------------- start
    async def start(self, timeout: float = 300.0) -> None:
        """Create every actor, load its models, measure the dispatch delays.
        Ray must be initialised (`ray.init`) by the caller. Raises
        ActorInfeasible at once when no live node has what an actor asks
        for, ExecutorFailed when an actor does not come up in `timeout`."""
        if self._started:
            raise RuntimeError("pool already started")
        self._started = True
        self._ray = ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeError("RayExecutorPool.start: call ray.init(address=...) first")
        self._loop = asyncio.get_running_loop()
        self._node = ray.get_runtime_context().get_node_id()
        if self.use_channel and not self.all_remote:
            self._channels = ChannelDirectory()
        began = time.monotonic()
        try:
            self._fit(offers_of(ray.nodes()))
            for a in self._actors.values():
                self.create(a)
            bring_up = asyncio.gather(*(self.bring_up(a) for a in self._actors.values()))
            try:
                await asyncio.wait_for(bring_up, timeout)
            except TimeoutError:
                raise ExecutorFailed(self._not_up(timeout)) from None
            for a in self._actors.values():
                a.overhead_s, a.bytes_per_s = await measure_paths(a.handle)
                if a.channel is not None:
                    a.overhead_s = await a.channel.round_trip(timeout)
        except BaseException:
            await self.stop(timeout=2.0)
            raise
        self.dispatch_overhead_s = max(a.overhead_s for a in self._actors.values())
        self.bytes_per_s = min(a.bytes_per_s for a in self._actors.values())
        for a in self._actors.values():
            log.info(
                "executor %s: Ray actor pid %s on node %s (%s; round trip %.3f ms, %.0f MB/s): %s",
                a.device.name,
                a.pid,
                a.node_id[:12],
                self._path_of(a),
                a.overhead_s * 1e3,
                a.bytes_per_s / 1e6,
                ", ".join(a.models) or "no models",
            )
        log.info(
            "%d Ray executors serving after %.1f s", len(self._actors), time.monotonic() - began
        )
        if self.stuck_factor > 0 or self.heartbeat_timeout_s > 0:
            self.background(self.faults.watchdog())

    @staticmethod
    def _path_of(a: Actor) -> str:
        if a.remote:
            return "object-store data path"
        if a.channel is not None:
            return "shared-memory arena, batch channel"
        return "shared-memory arena, Ray calls"

    def _fit(self, offers: list[NodeOffer]) -> None:
        """Fit each actor's request to the live nodes; raise ActorInfeasible
        naming every actor no node can run (app.runtime.ray_fit)."""
        problems = []
        for a in self._actors.values():
            node = self.nodes.get(a.device.id)
            if self.fit_threads:
                device = fitted(a.device, offers, node)
                if device is not a.device:
                    log.info(
                        "executor %s: %d threads fitted to %d (the CPUs of the largest Ray node "
                        "it may run on; THREADS_PER_SLICE sets them)",
                        a.device.name,
                        a.device.threads,
                        device.threads,
                    )
                    a.device = self.devices[device.id] = device
            a.request = request_of(a.device)
            problem = infeasible(a.device, a.request, offers, node, fitted_threads=self.fit_threads)
            if problem is not None:
                problems.append(problem)
            else:
                log.info("executor %s: Ray actor asks for %s", a.device.name, describe(a.request))
        if problems:
            raise ActorInfeasible("; ".join(problems))

    def _not_up(self, timeout: float) -> str:
        """Which actors did not come up in `timeout`, and where each stood."""
        late = [a for a in self._actors.values() if a.loading or a.dead]
        parts = []
        for a in late:
            stage = "loading its models" if a.pid is not None else "not placed by Ray"
            parts.append(f"executor {a.device.name} ({describe(a.request)}): {stage}")
        return f"Ray executors not up after {timeout:.0f} s: " + "; ".join(parts)

    def create(self, a: Actor) -> None:
        from app.runtime.ray_actor import actor_class

        device = a.device
        options: dict[str, Any] = {
            "max_restarts": self.max_restarts,
            "max_task_retries": 0,  # a batch lost with its actor is reported, not re-run
        }
        if not a.request:
            a.request = request_of(device)
        if device.kind == "cuda":
            options["num_gpus"] = 1
        else:
            options["num_cpus"] = a.request.get("CPU", 0.0)
        node = self.nodes.get(device.id)
        if node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        spec = device.to_dict()
        spec["cpus"] = None  # this machine's cores mean nothing where Ray places it
        if device.kind == "cuda":
            spec["index"] = 0  # Ray sets CUDA_VISIBLE_DEVICES to the GPU it gave
        a.handle = actor_class().options(**options).remote(spec, self.log_level)

    async def bring_up(self, a: Actor) -> None:
        """Wait for the actor to answer, have it load its models, watch it."""
        a.loading = True
        a.models, a.load_errors, a.load_info = [], {}, {}
        self._close_channel(a)
        began = time.monotonic()
        node_id, pid = await self._placed(a, began)
        a.node_id, a.pid = node_id, pid
        a.remote = self.all_remote or node_id != self._node
        a.clock_offset = await clock_offset(a.handle) if node_id != self._node else 0.0
        names = self.placement(a.device.id)
        log.info(
            "executor %s: Ray actor pid %s on node %s after %.1f s; loading %s",
            a.device.name,
            pid,
            node_id[:12],
            time.monotonic() - began,
            ", ".join(names) or "no models",
        )
        configs = [config_to_dict(self.configs[n]) for n in names]
        layouts = None if a.remote else {n: self.arenas[n].layout for n in names}
        loaded = await a.handle.load.remote(configs, layouts)
        if not a.remote and self._channels is not None:
            self._open_channel(a, await connect(a.handle, self._channels.socket_path(), 30.0))
        for name, err in loaded.errors.items():
            if err is None:
                a.models.append(name)
            else:
                a.load_errors[name] = err
                log.warning("executor %s: model %s failed to load: %s", a.device.name, name, err)
        a.load_info.update(loaded.info)
        log.info(
            "executor %s: models loaded after %.1f s (%s)",
            a.device.name,
            time.monotonic() - began,
            self._path_of(a),
        )
        a.dead = a.loading = False
        a.serving_since = a.progress_at = time.monotonic()
        a.sizes.clear()
        if self.heartbeat_timeout_s > 0:
            a.heartbeat = ActorBeat(a.serving_since)
        self.faults.watch(a)

    async def _placed(self, a: Actor, began: float) -> tuple[str, int]:
        """The actor's node and pid once Ray has placed it; while it waits,
        a line every PLACE_REPORT_S, and ActorInfeasible should its request
        become one no live node meets (its node gone)."""
        where = asyncio.ensure_future(a.handle.where.remote())
        try:
            while True:
                done, _ = await asyncio.wait({where}, timeout=PLACE_REPORT_S)
                if done:
                    return where.result()
                offers = offers_of(self._ray.nodes())
                node = self.nodes.get(a.device.id)
                problem = infeasible(
                    a.device, a.request, offers, node, fitted_threads=self.fit_threads
                )
                if problem is not None:
                    raise ActorInfeasible(problem)
                free = self._ray.available_resources()
                log.warning(
                    "executor %s: waiting %.0f s for Ray to place its actor (asks for %s; "
                    "free in the cluster now: %s)",
                    a.device.name,
                    time.monotonic() - began,
                    describe(a.request),
                    describe({k: free.get(k, 0.0) for k in ("CPU", "GPU")}),
                )
        finally:
            where.cancel()

    def _open_channel(self, a: Actor, conn: Any) -> None:
        generation = a.generation
        assert self._loop is not None

        def on_reply(reply: Any) -> None:
            self._ended(a, generation, reply.batch_id, reply)

        def on_closed() -> None:
            self.faults.fault(
                a, generation, f"executor {a.device.name} (Ray actor) died: its channel closed"
            )

        a.channel = Channel(conn, self._loop, on_reply, on_closed)

    def _close_channel(self, a: Actor) -> None:
        channel, a.channel = a.channel, None
        if channel is not None:
            channel.on_closed = lambda: None
            channel.close()

    def _sent(self, a: Actor) -> int:
        """Batches sent on the actor's channel (what `stop` and `unload` wait for)."""
        return a.channel.sent if a.channel is not None else 0

    # ------------------------------------------------------------ submit
    def submit(
        self,
        device_id: int,
        batch_id: int,
        model: str,
        slots: Sequence[int],
        start_at: float,
        alone: Sequence[AloneMark] = (),
    ) -> None:
        """Send a batch to the device's actor (non-blocking); as
        `ExecutorPool.submit`."""
        a = self._actors[device_id]
        if a.dead or a.loading or self._stopped or not self._started:
            raise ExecutorFailed(f"executor {a.device.name} is not running")
        if model not in a.models:
            raise ExecutorFailed(f"model {model!r} is not loaded on {a.device.name}")
        if batch_id in a.inflight:
            raise ValueError(f"batch {batch_id} is already in flight on {a.device.name}")
        rows = [int(s) for s in slots]
        marks = tuple(alone)
        self.reruns.interrupt(a)
        ref = None
        try:
            if a.remote:
                arena = self.arenas[model]
                cut = inputs_end(arena.layout)
                inputs = arena.slot_bytes()[np.asarray(rows, dtype=np.intp), :cut]
                spilled = arena.spills.items("inputs", rows)
                at = float(start_at) + a.clock_offset
                ref = a.handle.run_rows.remote(int(batch_id), model, inputs, at, marks, spilled)
            elif a.channel is not None:
                a.channel.run(Run(int(batch_id), model, rows, float(start_at), marks))
            else:
                ref = a.handle.run.remote(int(batch_id), model, rows, float(start_at), marks)
        except Exception as exc:
            raise ExecutorFailed(f"executor {a.device.name} is not running: {exc}") from exc
        if not a.inflight:
            a.progress_at = time.monotonic()
        a.inflight[batch_id] = model
        a.sizes[batch_id] = (len(rows), float(start_at))
        if marks:
            self.reruns.sent(a)
        if ref is not None:
            self.background(self._finish(a, a.generation, batch_id, model, rows, ref))

    async def _finish(
        self, a: Actor, generation: int, batch_id: int, model: str, rows: list[int], ref: Any
    ) -> None:
        try:
            result = await ref
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.faults.fault(a, generation, f"executor {a.device.name} (Ray actor) died: {exc}")
            return
        if a.generation != generation or batch_id not in a.inflight:
            return  # failed already, with its actor
        if a.remote:
            reply, outputs, spilled = result
            if outputs is not None:
                arena = self.arenas[model]
                arena.slot_bytes()[np.asarray(rows, dtype=np.intp), inputs_end(arena.layout) :] = (
                    outputs
                )
                arena.spills.place("outputs", rows, spilled)
        else:
            reply = result
        self._ended(a, generation, batch_id, reply)

    def _ended(self, a: Actor, generation: int, batch_id: int, reply: Any) -> None:
        """The actor's reply to a batch: its one event."""
        if a.generation != generation or batch_id not in a.inflight:
            return  # failed already, with its actor
        a.inflight.pop(batch_id, None)
        a.sizes.pop(batch_id, None)
        a.progress_at = time.monotonic()
        if not a.inflight:
            self.reruns.idle(a)
        offset = a.clock_offset
        if isinstance(reply, Cancelled):
            self._post(BatchStopped(a.device.id, batch_id, reply.stopped_at - offset))
        elif isinstance(reply, Ran):
            started, finished = reply.started_at - offset, reply.finished_at - offset
            self._post(BatchFinished(a.device.id, batch_id, started, finished, reply.error))
        else:
            now = time.monotonic()
            error = f"executor {a.device.name}: unexpected reply {type(reply).__name__}"
            self._post(BatchFinished(a.device.id, batch_id, now, now, error))

    def cancel(self, device_id: int, batch_id: int) -> bool:
        """Best-effort preemption, as `ExecutorPool.cancel`: the actor's
        control group sets the batch's stop flag."""
        a = self._actors[device_id]
        if a.dead or batch_id not in a.inflight:
            return False
        try:
            a.handle.cancel.remote(int(batch_id))
        except Exception:  # the actor is gone: its watch reports it
            return False
        return True

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
        """Median ms per batch size on the device, as `ExecutorPool.profile`."""
        a = self._actors[device_id]
        if a.dead or self._stopped:
            raise ExecutorFailed(f"executor {a.device.name} is not running")
        if model not in a.models:
            raise ExecutorFailed(f"model {model!r} is not loaded on {a.device.name}")
        sizes = [int(b) for b in batch_sizes]
        given = None if inputs is None else dict(inputs)
        ref = a.handle.profile.remote(model, sizes, int(warmup), int(repeats), given)
        try:
            profiled = await asyncio.wait_for(ref, timeout)
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise ExecutorFailed(f"profiling {model} on {a.device.name} failed: {exc}") from exc
        if profiled.error is not None:
            raise ExecutorFailed(f"profiling {model} on {a.device.name} failed: {profiled.error}")
        return {int(b): float(ms) for b, ms in profiled.result.items()}

    # ------------------------------------------------- not on Ray
    async def reshare(self, device_id: int, share: float) -> Any:
        raise _unsupported("reshare")

    # -------------------------------------------------------------- stop
    async def stop(self, timeout: float = 5.0) -> None:
        """Stop every actor after the batches sent to it (their events are
        posted); after `timeout` the rest fail; the actors are killed and
        the arenas unlinked."""
        if self._stopped:
            return
        self._stopped = True
        stops = []
        for a in self._actors.values():
            if a.handle is not None and not a.dead:
                try:
                    stops.append(a.handle.stop.remote(self._sent(a)))
                except Exception:
                    log.exception("stopping executor %s failed", a.device.name)
        if stops:
            done = asyncio.gather(*(self._await_quietly(r) for r in stops))
            try:
                await asyncio.wait_for(done, timeout)
            except TimeoutError:
                log.warning("Ray executors did not stop in %.1f s; killing them", timeout)
        for _ in range(100):  # let the replies already in hand be handled
            if not any(a.inflight for a in self._actors.values()):
                break
            await asyncio.sleep(0.01)
        for task in list(self._tasks):
            task.cancel()
        now = time.monotonic()
        for a in self._actors.values():
            a.dead = True
            a.generation += 1
            for batch_id in list(a.inflight):
                a.inflight.pop(batch_id, None)
                self._post(
                    BatchFinished(
                        a.device.id, batch_id, now, now, f"executor {a.device.name} stopped"
                    )
                )
            self._close_channel(a)
            self.kill(a, restart=False)
        if self._channels is not None:
            self._channels.remove()
        for arena in self.arenas.values():
            try:
                arena.close_and_unlink()
            except Exception:
                log.exception("unlinking arena %s failed", arena.name)

    @staticmethod
    async def _await_quietly(ref: Any) -> None:
        try:
            await ref
        except Exception:
            log.debug("an actor's stop failed", exc_info=True)

    def background(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------- model changes
    # What app.runtime.model_changes works through: on the daemon's arena
    # when the actor shares the daemon's node, on a scratch arena of its own
    # otherwise.

    def executor_records(self) -> Iterable[Actor]:
        return self._actors.values()

    def watched(self) -> list[Actor]:
        """The actors the watchdog judges (app.runtime.watchdog): those serving."""
        return [a for a in self._actors.values() if not (a.dead or a.loading)]

    def serves(self, a: Actor) -> bool:
        return not (a.dead or a.loading or self._stopped)

    async def load_on(
        self, a: Actor, config: ModelConfig, arena: Arena
    ) -> tuple[dict[str, str | None], dict[str, Any]]:
        layouts = None if a.remote else {config.name: arena.layout}
        try:
            loaded = await a.handle.load.remote([config_to_dict(config)], layouts)
        except Exception as exc:
            raise RuntimeError(f"executor {a.device.name}: {exc}" if str(exc) else "") from exc
        return loaded.errors, loaded.info

    async def unload_on(self, a: Actor, name: str) -> None:
        await a.handle.unload.remote([name], self._sent(a))

    # ------------------------------------------------------------- parking

    # The actor lifecycle parking works through (app.runtime.parking).

    @property
    def stopped(self) -> bool:
        return self._stopped

    def executor_name(self, device_id: int) -> str:
        return self._actor_for(device_id).device.name

    def refuse_park(self, device_id: int) -> str | None:
        a = self._actors[device_id]
        return "down or starting" if a.dead or a.loading else None

    def post(self, event: ExecutorEvent) -> None:
        self._post(event)

    async def stop_parked(self, device_id: int, timeout: float) -> None:
        """The actor's `stop` after the batches sent before it (their
        replies handled as usual), then killed for good."""
        a = self._actors[device_id]
        try:
            await asyncio.wait_for(a.handle.stop.remote(self._sent(a)), timeout)
        except Exception as exc:
            log.warning("executor %s did not stop cleanly (%s); killing it", a.device.name, exc)
        for _ in range(100):  # replies already in hand are handled first
            if not a.inflight:
                break
            await asyncio.sleep(0.01)
        self._retire(a, f"executor {a.device.name} parked")

    async def start_executor(self, device_id: int) -> None:
        a = self._actors[device_id]
        self.create(a)
        await self.bring_up(a)

    def failed_start(self, device_id: int, reason: str) -> None:
        self._retire(self._actors[device_id], reason)

    def serving(self, device_id: int) -> str:
        a = self._actors[device_id]
        a.down_since = None
        return f"Ray actor pid {a.pid}"

    def _retire(self, a: Actor, reason: str) -> None:
        """The actor is gone on purpose: replies of its life are stale, its
        batches still in flight fail with `reason`, and it is killed."""
        a.dead = True
        a.loading = False
        a.generation += 1
        a.heartbeat = None
        a.down_since = time.monotonic()
        self.fail_inflight(a, reason)
        self.kill(a, restart=False)

    def fail_inflight(self, a: Actor, reason: str) -> None:
        """The actor's life ended: its batches in flight each fail with
        `reason`, and what it kept (sizes, samples) is gone with it."""
        now = time.monotonic()
        for batch_id in list(a.inflight):
            a.inflight.pop(batch_id, None)
            self._post(BatchFinished(a.device.id, batch_id, now, now, reason))
        a.sizes.clear()
        a.samples_left, a.rerunning = 0, False  # a new process keeps no samples

    def kill(self, a: Actor, *, restart: bool) -> None:
        """End the actor's process: for good, or (`restart`, a hung one) for
        Ray to restart it."""
        if restart and a.node_id == self._node and a.pid:
            # On this node: SIGKILL at once (a stopped process gets it too);
            # Ray sees the worker die and restarts the actor.
            with contextlib.suppress(OSError):
                os.kill(a.pid, signal.SIGKILL)
            return
        if a.handle is None or self._ray is None:
            return
        try:
            self._ray.kill(a.handle, no_restart=not restart)
        except Exception:
            log.debug("killing executor %s failed", a.device.name, exc_info=True)

    def _actor_for(self, device_id: int) -> Actor:
        if device_id not in self._actors:
            raise ValueError(f"no device {device_id} in this pool")
        if not self._started or self._stopped:
            raise ValueError("the pool is not running")
        return self._actors[device_id]

    def _post(self, event: ExecutorEvent) -> None:
        try:
            self.events(event)
        except Exception:
            log.exception("handling %s failed", event)
