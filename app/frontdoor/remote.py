"""The service as an API worker's routes see it: `RemoteService`.

It is the `InferenceService` of app.server.service, so the routes, their
validation and their answers are the single process's own. Its sync
questions (which models, their configs, readiness, the repository and
device indexes) are answered from the scheduler's latest `ServiceView`;
statistics and metrics from what the worker fetched just before the route
ran (app/frontdoor/worker.py); model control is a call to the scheduler.

`infer` writes a request's inputs into this worker's share of the model's
arena (slots [k·share, (k+1)·share) for worker k) and sends a descriptor.
Its slots stay taken until the answer comes, whatever happens to the
client, and the outputs are read from them before they are freed: an
executor may write into them as long as the scheduler has the request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import ModelNotFound, ModelNotReady, Overloaded, ServingError, ShuttingDown
from app.frontdoor.messages import ErrorDescriptor, InferDescriptor, ServiceView
from app.repository.config import ModelConfig, shown_model, version_key
from app.runtime.arena import Arena
from app.server.metrics import Metrics
from app.server.service import InferResult, request_items

Send = Callable[[tuple[Any, ...]], None]


class ForwardedMetrics(Metrics):
    """A worker's metrics: `/metrics` renders the scheduler's registry, as the
    worker fetched it for the request (`rendered`); what the worker counts
    itself (ignored request parameters, refused gRPC calls) is counted there
    too, by a message."""

    rendered: tuple[bytes, str] | None = None

    def __init__(self, prefix: str, send: Send) -> None:
        super().__init__(prefix)
        self._send = send

    def parameter_ignored(self, name: str) -> tuple[str, bool]:
        self._send(("metric", "parameter_ignored", (name,)))
        return super().parameter_ignored(name)

    def grpc_call_refused(self, method: str) -> None:
        self._send(("metric", "grpc_call_refused", (method,)))
        super().grpc_call_refused(method)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        if self.rendered is None:
            return super().render(accept)
        return self.rendered


class _Share:
    """This worker's slots of one arena: the free ones, taken per request."""

    def __init__(self, layout: dict[str, Any], first: int, count: int) -> None:
        self.arena = Arena.attach(layout)
        self.free = list(range(first + count - 1, first - 1, -1))
        self.owned = range(first, first + count)

    def take(self, n: int) -> list[int] | None:
        if len(self.free) < n:
            return None
        return [self.free.pop() for _ in range(n)]

    def give(self, slots: list[int]) -> None:
        """Free `slots` (this worker's only; one already free stays once)."""
        self.arena.spills.drop([slot for slot in slots if slot in self.owned])
        free = set(self.free)
        self.free.extend(slot for slot in slots if slot in self.owned and slot not in free)


@dataclass
class _Pending:
    share: _Share
    slots: list[int]
    future: asyncio.Future[InferResult]


class RemoteService:
    """Implements app.server.service.InferenceService over the scheduler process."""

    def __init__(self, worker: int, send: Send) -> None:
        self.worker = worker
        self._send = send
        self.view = ServiceView()
        self.lost: str | None = None  # why the scheduler is gone, once it is
        self.statistics: dict[str, Any] | None = None  # fetched for a statistics route
        self._shares: dict[str, _Share] = {}  # by arena (segment) name
        self._pending: dict[int, _Pending] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        # Unique beside a killed predecessor's numbers still in flight.
        self._ids = itertools.count(os.getpid() << 32)

    # --------------------------------------------------------- from the view

    def model_names(self) -> list[str]:
        return list(self.view.model_names)

    def model_config(self, name: str, version: str | None = None) -> ModelConfig:
        """As LiveService.model_config, from the view."""
        config = self._config(name)
        if version is None or version == config.version:
            return config
        key = version_key(name, version)
        if key in self.view.configs or key in self.view.refusals:
            return self._config(key)
        raise ModelNotFound(
            f"model {name!r} has no version {version!r} "
            f"(available: {', '.join(config.served_versions)})"
        )

    def _config(self, key: str) -> ModelConfig:
        config = self.view.configs.get(key)
        if config is not None:
            return config
        refusal = self.view.refusals.get(key)
        if refusal is not None:
            raise refusal.error()
        raise ModelNotFound(f"unknown model {key!r}; models: {', '.join(self.view.model_names)}")

    def model_ready(self, name: str) -> bool:
        return self.lost is None and self.view.ready.get(name, False)

    def server_ready(self) -> bool:
        return self.lost is None and self.view.server_ready

    def capacity(self) -> dict[str, Any]:
        return dict(self.view.capacity)

    def repository_index(self) -> list[dict[str, str]]:
        return [dict(entry) for entry in self.view.repository_index]

    def device_index(self) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self.view.device_index]

    def plan_in_force(self) -> dict[str, Any] | None:
        return None if self.view.plan is None else dict(self.view.plan)

    def model_statistics(
        self, name: str | None = None, version: str | None = None
    ) -> dict[str, Any]:
        """From the report fetched for this route (every model's), as
        Statistics.report chooses."""
        stats = (self.statistics or {}).get("model_stats", [])
        return {
            "model_stats": [
                s
                for s in stats
                if (name is None or s.get("name") == name)
                and (version is None or s.get("version") == version)
            ]
        }

    # --------------------------------------------------- calls to the scheduler

    async def refresh_statistics(self) -> None:
        """Fetch the scheduler's statistics report (every model's) for the
        statistics route about to run (HTTP's and gRPC's)."""
        self.statistics = await self.call("model_statistics")

    async def call(self, method: str, *args: Any) -> Any:
        """The scheduler's `service.<method>(*args)` (awaited there if a coroutine)."""
        if self.lost is not None:
            raise ShuttingDown(self.lost)
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._send(("call", call_id, method, args))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def load_model(self, name: str, config_override: str | None = None) -> None:
        await self.call("load_model", name, config_override)

    async def unload_model(self, name: str) -> None:
        await self.call("unload_model", name)

    async def reshare_device(self, name: str, share: float) -> dict[str, Any]:
        return await self.call("reshare_device", name, share)

    async def apply_plan(self, body: bytes) -> dict[str, Any]:
        return await self.call("apply_plan", body)

    # ------------------------------------------------------------------ infer

    async def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        slo_ms: float | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
        app: str = "",
    ) -> InferResult:
        """Inputs into this worker's slots, a descriptor to the scheduler, and
        the answer once it comes (module docstring)."""
        if self.lost is not None:
            raise ShuttingDown(self.lost)
        received = time.monotonic() if received_at is None else received_at
        try:
            config = self._config(model)
            items = request_items(config, inputs)
            share, slots = self._place(model, items)
            try:
                share.arena.write_rows(slots, inputs)
            except BaseException:
                share.give(slots)
                raise
        except ServingError as exc:  # counted where the others are
            self._send(("refused", model, ErrorDescriptor.of(exc), received))
            raise
        rid = next(self._ids)
        future: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(share, slots, future)
        descriptor = InferDescriptor(
            rid, model, share.arena.name, slots, slo_ms, request_id, received, app
        )
        self._send(("infer", descriptor))
        return await future

    def _place(self, model: str, items: int) -> tuple[_Share, list[int]]:
        layout = self.view.arenas.get(model)
        if layout is None:
            raise ModelNotReady(f"model {shown_model(model)} is not served by API workers")
        share = self._share(model, layout)
        slots = share.take(items)
        if slots is None:
            raise Overloaded(
                f"model {shown_model(model)}: {len(share.owned)} items in flight on this API "
                f"worker (its share of ARENA_SLOTS; this request has {items})"
            )
        return share, slots

    def _share(self, model: str, layout: dict[str, Any]) -> _Share:
        """This worker's share of `model`'s arena (attached at first use)."""
        share = self._shares.get(layout["name"])
        if share is None:
            count = self.view.shares[model]
            share = self._shares[layout["name"]] = _Share(layout, self.worker * count, count)
        return share

    # ---------------------------------------------------- from the scheduler

    def on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "answer":
            self._answered(*message[1:])
        elif kind == "view":
            self._set_view(message[1])
        elif kind == "result":
            _, call_id, value, error = message[:4]
            future = self._calls.get(call_id)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(value)
                else:
                    future.set_exception(error.error())
            if len(message) > 4 and message[4] is not None:
                self._set_view(message[4])
        elif kind == "welcome":
            self._set_view(message[2])
            self._hold(message[1])

    def _answered(
        self,
        rid: int,
        arena: str,
        slots: list[int],
        result: InferResult | None,
        error: ErrorDescriptor | None,
    ) -> None:
        """Read the outputs, free the slots, answer (a killed predecessor's
        request: only free its slots)."""
        pending = self._pending.pop(rid, None)
        if pending is None:
            share = self._shares.get(arena)
            if share is not None:
                share.give(slots)
            return
        try:
            if result is not None and error is None:
                result.outputs = pending.share.arena.read_rows(pending.slots)
        finally:
            pending.share.give(pending.slots)
        future = pending.future
        if future.done():
            return  # the client went away
        if error is not None:
            future.set_exception(error.error())
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def _set_view(self, view: ServiceView) -> None:
        self.view = view
        live = {layout["name"] for layout in view.arenas.values()}
        for name, share in list(self._shares.items()):
            if name not in live and len(share.free) == len(share.owned):
                share.arena.close()
                del self._shares[name]

    def _hold(self, busy: dict[str, list[int]]) -> None:
        """The slots a killed predecessor left in flight: taken until their
        answers come."""
        for model, layout in self.view.arenas.items():
            slots = busy.get(layout["name"])
            if slots:
                share = self._share(model, layout)
                held = set(slots)
                share.free = [slot for slot in share.free if slot not in held]

    def fail_all(self, why: str) -> int:
        """The scheduler is gone: every request and call waiting is answered
        503 (their slots are never freed: the process ends)."""
        self.lost = why
        error = ShuttingDown(why)
        waiting = [p.future for p in self._pending.values()] + list(self._calls.values())
        self._pending.clear()
        for future in waiting:
            if not future.done():
                future.set_exception(error)
        return len(waiting)
