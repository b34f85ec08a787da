"""Where an admitted request goes: the route of its model.

`LiveService._serve` (app/server/live.py) is the one admission-and-answer
path of every model: shutdown and SLO checks, MAX_QUEUE, the metrics of a
request received, dropped and finished, Triton's statistics, the answer and
the client that goes away. Behind it, a model is served one of two ways,
each a `Route`:

* `DispatcherRoute` — a model of the repository on the executors of its
  devices: its inputs are written into its arena's slots, the dispatcher
  hands it to its scheduling core (app/server/dispatcher.py), and its
  outputs are read from the same slots once its batch ran. The slots are
  freed when the request is answered, never before: an executor may still
  write into them after a client went away.
* `PipelineRoute` — a model of a PPipe plan, served stage by stage over
  pools of executors (app/server/pipeline_driver.py), which keeps its own
  arena.

A route's `submit` either refuses the request at once (an exception: the
arena is full, or the request cannot be served this way) or returns a
future that resolves to a `Served` or fails with the error to answer
(`Dropped`, `ExecutorFailed`, `ShuttingDown`, `Overloaded`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.errors import ExecutorFailed, InvalidInput, ModelNotReady, Overloaded, ServingError
from app.repository.config import ModelConfig, shown_model
from app.server.dispatcher import Dispatcher, Finished, Pending
from app.server.pipeline_driver import PipelineDriver
from app.server.pipeline_types import PipelineAnswer
from app.server.startup import ModelState


@dataclass(frozen=True)
class Served:
    """A request's outputs and where its time went."""

    outputs: dict[str, np.ndarray]
    arrival: float  # when its bytes reached the server (its SLO's start)
    seen_at: float  # when its route handed it to the scheduling core
    started_at: float  # its batch's (first stage's) start
    finished_at: float  # its batch's (last stage's) end
    batch_size: int  # items
    batch: tuple[object, int]  # its batch, as Triton's statistics key it
    device: str  # the device (or each stage's instance: "a>b")
    app: str  # its application, as the core saw it


class Route(Protocol):
    def submit(
        self,
        config: ModelConfig,
        inputs: dict[str, np.ndarray],
        items: int,
        slo_s: float,
        *,
        received_at: float | None,
        app: str,
    ) -> asyncio.Future[Served]: ...


class DispatcherRoute:
    """A repository model on its devices' executors (see the module docstring)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        models: Mapping[str, ModelState],
        device_name: Callable[[int], str],
        arena_slots: int,
    ) -> None:
        self._dispatcher = dispatcher
        self._models = models  # the service's: model control replaces entries
        self._device_name = device_name
        self._arena_slots = arena_slots

    def submit(
        self,
        config: ModelConfig,
        inputs: dict[str, np.ndarray],
        items: int,
        slo_s: float,
        *,
        received_at: float | None,
        app: str,
    ) -> asyncio.Future[Served]:
        model = config.name
        state = self._models[model]
        slots = state.arena.acquire_rows(items)
        if slots is None:
            raise Overloaded(
                f"model {shown_model(model)}: {self._arena_slots} items in flight "
                f"(ARENA_SLOTS; this request has {items})"
            )
        try:
            state.arena.write_rows(slots, inputs)
            pending = self._dispatcher.submit_request(
                model, slots, slo_s, received_at=received_at, app=app
            )
        except BaseException:
            state.arena.release_rows(slots)
            raise
        seen_at = time.monotonic()
        served: asyncio.Future[Served] = asyncio.get_running_loop().create_future()
        pending.future.add_done_callback(
            lambda future: self._answered(future, pending, state, seen_at, served)
        )
        return served

    def _answered(
        self,
        future: asyncio.Future,
        pending: Pending,
        state: ModelState,
        seen_at: float,
        served: asyncio.Future[Served],
    ) -> None:
        """The dispatcher answered: read the outputs, then free the slots."""

        def served_of(finished: Finished) -> Served:
            if finished.error is not None:
                raise ExecutorFailed(f"executor failed: {finished.error}")
            batch = finished.batch
            request = pending.request
            return Served(
                outputs=state.arena.read_rows(pending.slots),
                arrival=request.arrival,
                seen_at=seen_at,
                started_at=finished.started_at,
                finished_at=finished.finished_at,
                batch_size=batch.size,
                batch=(batch.device, batch.id),
                device=self._device_name(batch.device),
                app=request.app,
            )

        try:
            _forward(future, served, served_of)
        finally:
            state.arena.release_rows(pending.slots)


class PlacedRoute:
    """A request whose inputs an API worker process wrote into its model's
    arena already (app/frontdoor/): its `slots` go to the dispatcher as they
    are; the worker reads the outputs and frees the slots once answered, so
    the answer's `outputs` are empty and no tensor byte passes here."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        models: Mapping[str, ModelState],
        device_name: Callable[[int], str],
        slots: list[int],
        arena: str,
    ) -> None:
        self._dispatcher = dispatcher
        self._models = models
        self._device_name = device_name
        self._slots = slots
        self._arena = arena  # the segment the worker wrote into

    def submit(
        self,
        config: ModelConfig,
        inputs: dict[str, np.ndarray],
        items: int,
        slo_s: float,
        *,
        received_at: float | None,
        app: str,
    ) -> asyncio.Future[Served]:
        state = self._models[config.name]
        if state.arena.name != self._arena:
            # The model was reloaded (a new arena) after the worker wrote.
            raise ModelNotReady(f"model {shown_model(config.name)} was reloaded; retry")
        pending = self._dispatcher.submit_request(
            config.name, self._slots, slo_s, received_at=received_at, app=app
        )
        seen_at = time.monotonic()
        served: asyncio.Future[Served] = asyncio.get_running_loop().create_future()

        def served_of(finished: Finished) -> Served:
            if finished.error is not None:
                raise ExecutorFailed(f"executor failed: {finished.error}")
            batch = finished.batch
            return Served(
                outputs={},
                arrival=pending.request.arrival,
                seen_at=seen_at,
                started_at=finished.started_at,
                finished_at=finished.finished_at,
                batch_size=batch.size,
                batch=(batch.device, batch.id),
                device=self._device_name(batch.device),
                app=pending.request.app,
            )

        pending.future.add_done_callback(lambda future: _forward(future, served, served_of))
        return served


class PipelineRoute:
    """A model of a PPipe plan, served stage by stage (see the module docstring)."""

    def __init__(
        self, driver: PipelineDriver, max_items: Mapping[str, int], names: Mapping[int, str]
    ) -> None:
        self._driver = driver
        self._max_items = max_items  # the largest batch its block profile covers
        self._names = names  # instance id → its name

    def submit(
        self,
        config: ModelConfig,
        inputs: dict[str, np.ndarray],
        items: int,
        slo_s: float,
        *,
        received_at: float | None,
        app: str,
    ) -> asyncio.Future[Served]:
        model = config.name
        if items > self._max_items[model]:
            raise InvalidInput(
                f"model {shown_model(model)} is served as a pipeline whose block profile covers "
                f"batches of up to {self._max_items[model]} items; this request has {items}"
            )
        future = self._driver.submit(model, inputs, slo_s=slo_s, received_at=received_at, app=app)
        seen_at = time.monotonic()
        arrival = seen_at if received_at is None else min(received_at, seen_at)
        served: asyncio.Future[Served] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: self._answered(f, arrival, seen_at, app, served))
        return served

    def _answered(
        self,
        future: asyncio.Future,
        arrival: float,
        seen_at: float,
        app: str,
        served: asyncio.Future[Served],
    ) -> None:
        def served_of(answer: PipelineAnswer) -> Served:
            return Served(
                outputs=answer.outputs,
                arrival=arrival,
                seen_at=seen_at,
                started_at=answer.started_at,
                finished_at=answer.finished_at,
                batch_size=answer.batch_size,
                batch=("pipeline", answer.batch_id),
                device=">".join(self._names[d] for d in answer.devices),
                app=app,
            )

        _forward(future, served, served_of)


def _forward(
    future: asyncio.Future, served: asyncio.Future[Served], served_of: Callable[[Any], Served]
) -> None:
    """Resolve `served` as the route's own `future` ended: cancelled, failed,
    or `served_of` its result (which may raise the error to answer)."""
    if future.cancelled():
        served.cancel()
        return
    error = future.exception()
    if error is not None:
        served.set_exception(error)
        return
    try:
        result = served_of(future.result())
    except ServingError as exc:
        served.set_exception(exc)
        return
    served.set_result(result)
