"""The scheduler process's side of the API workers: `Receiver`.

Each infer descriptor becomes one `LiveService.infer` call with `placed`
(the arena and slots the worker wrote), so admission, limits, shutdown,
metrics and statistics are the single process's own, and its answer goes
back as a descriptor (the worker reads the outputs). What each worker has
in flight is kept until answered: a worker killed and started again learns
its predecessor's slots that are still taken (`hello` → `welcome`), and an
answer to a worker that is gone is dropped by ZeroMQ, its entry removed all
the same, so nothing is left behind for a dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from app.errors import Overloaded, ServingError
from app.frontdoor.channel import scheduler_socket, waiting
from app.frontdoor.messages import (
    VIEW_PERIOD_S,
    ErrorDescriptor,
    InferDescriptor,
    ServiceView,
    dump,
    load,
)
from app.server import startup
from app.server.live import LiveService
from app.server.metrics import metric_label
from app.server.statistics import epoch_ms

log = logging.getLogger("app.frontdoor")

# The service calls a worker may make (`("call", …)`), beside "metrics".
CALLS = frozenset(
    {"model_statistics", "load_model", "unload_model", "reshare_device", "apply_plan"}
)
# What a worker counts itself, counted here too (`("metric", name, args)`).
WORKER_METRICS = frozenset({"parameter_ignored", "grpc_call_refused"})


def view_of(service: LiveService) -> ServiceView:
    """What a worker's sync routes read (app/frontdoor/messages.py)."""
    view = ServiceView(closing=service.closing)
    piped = service.pipelines.configs if service.pipelines is not None else {}
    keys = {*service.models, *service.control_state, *service.unavailable, *piped}
    for key in keys:
        try:
            view.configs[key] = service.model_config(key)
        except ServingError as exc:
            view.refusals[key] = ErrorDescriptor.of(exc)
    view.model_names = service.model_names()
    view.ready = {key: service.model_ready(key) for key in view.configs}
    view.server_ready = service.server_ready()
    if service.ready:
        view.capacity = service.capacity()
        view.repository_index = service.repository_index()
        view.device_index = service.device_index()
        view.plan = service.plan_in_force()
    for key, state in service.models.items():
        if not state.arena.closed:
            view.arenas[key] = state.arena.layout
            view.shares[key] = startup.worker_slots(service.settings, state.config)
    return view


class Receiver:
    """Descriptors in, answers and views out (module docstring)."""

    def __init__(self, service: LiveService, address: str) -> None:
        self.service = service
        self._context = zmq.asyncio.Context()
        self._socket = scheduler_socket(self._context, address)
        self._inflight: dict[bytes, dict[int, tuple[str, list[int]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._workers: set[bytes] = set()  # those that said hello

    def start(self) -> None:
        self._loops = [asyncio.create_task(self._read()), asyncio.create_task(self._publish())]

    async def stop(self) -> None:
        for task in self._loops:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._socket.close(linger=0)
        self._context.term()

    def in_flight(self) -> int:
        return sum(len(entries) for entries in self._inflight.values())

    def _send(self, identity: bytes, message: tuple[Any, ...]) -> None:
        self._socket.send_multipart([identity, dump(message)])

    async def _read(self) -> None:
        while True:
            first = await self._socket.recv_multipart()
            for identity, frame in (first, *waiting(self._socket)):
                try:
                    self._on(identity, load(frame))
                except Exception:
                    log.exception("a message of API worker %r could not be handled", identity)

    async def _publish(self) -> None:
        """The service's view to every worker, every VIEW_PERIOD_S."""
        while True:
            await asyncio.sleep(VIEW_PERIOD_S)
            self._broadcast()

    def _broadcast(self) -> None:
        if self._workers:
            frame = dump(("view", view_of(self.service)))
            for identity in self._workers:
                self._socket.send_multipart([identity, frame])

    def _on(self, identity: bytes, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "infer":
            descriptor: InferDescriptor = message[1]
            entries = self._inflight.setdefault(identity, {})
            entries[descriptor.rid] = (descriptor.arena, descriptor.slots)
            self._spawn(self._serve(identity, descriptor))
        elif kind == "refused":
            self._refused(*message[1:])
        elif kind == "call":
            self._spawn(self._call(identity, *message[1:]))
        elif kind == "metric" and message[1] in WORKER_METRICS:
            getattr(self.service.metrics, message[1])(*message[2])
        elif kind == "hello":
            busy: dict[str, list[int]] = {}
            for arena, slots in self._inflight.get(identity, {}).values():
                busy.setdefault(arena, []).extend(slots)
            self._workers.add(identity)
            self._send(identity, ("welcome", busy, view_of(self.service)))

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, identity: bytes, d: InferDescriptor) -> None:
        result, error = None, None
        try:
            result = await self.service.infer(
                d.model,
                {},
                slo_ms=d.slo_ms,
                request_id=d.request_id,
                received_at=d.received_at,
                app=d.app,
                placed=(d.arena, d.slots),
            )
        except ServingError as exc:
            error = ErrorDescriptor.of(exc)
        except Exception as exc:  # answered all the same, as the API answers it
            log.exception("request %s of API worker %r failed", d.request_id, identity)
            error = ErrorDescriptor("ServingError", f"internal error: {exc}", "internal", 500)
        finally:
            self._inflight.get(identity, {}).pop(d.rid, None)
        self._send(identity, ("answer", d.rid, d.arena, d.slots, result, error))

    def _refused(self, model: str, error: ErrorDescriptor, received_at: float) -> None:
        """A request a worker refused before sending it: counted as the single
        process counts one refused in `infer`."""
        service = self.service
        if error.kind == Overloaded.__name__ and model in service.models:
            service.metrics.request_dropped(metric_label(model), error.reason)
        total = max(0.0, time.monotonic() - received_at)
        service.statistics.request_failed(model, total_s=total, at_ms=epoch_ms())

    async def _call(
        self, identity: bytes, call_id: int, method: str, args: tuple[Any, ...]
    ) -> None:
        value, error = None, None
        try:
            if method == "metrics":
                value = self.service.metrics.render(*args)
            elif method in CALLS:
                value = getattr(self.service, method)(*args)
                if inspect.isawaitable(value):
                    value = await value
            else:
                raise ServingError(f"no such call: {method}")
        except ServingError as exc:
            error = ErrorDescriptor.of(exc)
        except Exception as exc:
            log.exception("call %s of API worker %r failed", method, identity)
            error = ErrorDescriptor("ServingError", f"internal error: {exc}", "internal", 500)
        changed = method in CALLS - {"model_statistics"}  # model control: every worker learns it
        view = view_of(self.service) if changed else None
        self._send(identity, ("result", call_id, value, error, view))
        if changed:
            self._broadcast()
