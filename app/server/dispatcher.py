"""The live driver of the scheduling core — Symphony's RankThread as a coroutine.

The core is sans-IO (app/scheduling/base.py) and decides everything: when a
batch starts, when a request is dropped, what a preemption holds back. This
driver only carries that out, in the shape of aioquic's asyncio protocol over
its sans-IO connection:

* inputs: a request (`submit_request`), the executor pool's typed events
  (`post`: a batch finished or stopped, a device down or up, a request's
  alone-time measured by the executors' profiler), and one timer
  for the cores' next wakeup (a timerfd on Linux: uvloop's own timers fire up
  to a millisecond early or late; app/server/timerfd.py);
* outputs: a Dispatch goes to the executor of its device, a Complete resolves
  its requests' futures with the batch's report, a Drop fails them with the
  reason, a Preempt cancels the batch on its executor. A dispatched batch
  carries its requests sampled for re-running alone (app/server/alone_sampling.py).

Events that arrive while decisions are carried out (an executor that dies
under a submit posts DeviceDown at once) are queued and handled after them,
never re-entrantly. The clock is injected (`time.monotonic` by default, the
CLOCK_MONOTONIC the executor processes report in). The driver keeps no copy
of the cores' state: what it holds is its own — the futures and slots of the
requests it admitted.

Symphony partitions models into sub-clusters of devices that load the same
models (symphony.txt §4.1); likewise one core runs per *device group*: the
devices that host exactly the same set of models.

A new plan swaps the cores at one instant (`switch_groups`, POST /v2/plan):
each old core gives up its models, and the requests it still queues —
dropped by it as `unloaded` — are handed to the new core of their model,
with their arrival and deadline, rather than answered. The old cores'
batches in flight run to their end and are answered by them; until the last
of them on a device ends, the device's new core sees it down. A request of
an old batch that is stopped or whose device fails is handed over the same
way. So every request is answered exactly once, by one core or the next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.errors import ShuttingDown, dropped
from app.runtime.events import (
    AloneTimed,
    BatchFinished,
    BatchStopped,
    DeviceDown,
    DeviceParked,
    DeviceReshared,
    DeviceUnparked,
    DeviceUp,
    ExecutorEvent,
)
from app.runtime.messages import AloneMark
from app.scheduling.driven import ServedCore
from app.scheduling.model import ModelInfo
from app.scheduling.types import (
    Batch,
    Complete,
    Decision,
    Dispatch,
    Drop,
    DropReason,
    Preempt,
    Request,
)
from app.server.alone_sampling import AloneSampler, alone_time_per_request
from app.server.event_driver import EventDriver
from app.server.timerfd import Timer, make_timer
from app.server.wakeup import WakeupTimer

log = logging.getLogger(__name__)


class Executors(Protocol):
    """Where batches run (`app.runtime.pool.ExecutorPool`)."""

    def submit(
        self,
        device_id: int,
        batch_id: int,
        model: str,
        slots: Sequence[int],
        start_at: float,
        alone: Sequence[AloneMark] = (),
    ) -> None:
        """Queue a batch on the device; raises when it cannot take it.
        `alone`, passed only when not empty: requests to re-run alone."""
        ...

    def cancel(self, device_id: int, batch_id: int) -> bool:
        """Stop a batch; an event (stopped or finished) follows if it was in
        flight."""
        ...


@dataclass
class Pending:
    """A request accepted and not yet answered."""

    request: Request
    slots: list[int]  # its rows in the model's arena, one per item
    future: asyncio.Future


@dataclass
class Finished:
    """What the dispatcher tells the service about one request's batch."""

    batch: Batch
    started_at: float
    finished_at: float
    error: str | None


@dataclass(frozen=True)
class CoreGroup:
    """One scheduling core and the devices and models it owns."""

    scheduler: ServedCore
    models: frozenset[str]
    devices: tuple[int, ...]


class Dispatcher(EventDriver):
    """Drives the cores of `groups` on the running event loop.

    `on_batch(batch, finished)`, when given, hears of every batch that ran
    to its end (the service counts it in its metrics); `on_preempt(decision)`
    of every batch a core preempts. `alone_sample_rate`:
    the fraction of dynamic models' requests re-run alone (PROFILE_SAMPLE_RATE),
    drawn with `rng`."""

    def __init__(
        self,
        groups: Sequence[CoreGroup],
        executors: Executors,
        *,
        clock: Callable[[], float] = time.monotonic,
        timer_factory: Callable[[], Timer] | None = None,
        on_batch: Callable[[Batch, Finished], None] | None = None,
        on_preempt: Callable[[Preempt], None] | None = None,
        alone_sample_rate: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__()
        self.groups = list(groups)
        self._by_model = {model: group for group in groups for model in group.models}
        self._by_device = {device: group for group in groups for device in group.devices}
        self._executors = executors
        self._clock = clock
        self._wakeup = WakeupTimer(
            timer_factory or (lambda: make_timer(asyncio.get_running_loop())), self._on_wakeup
        )
        self._on_batch = on_batch
        self._on_preempt = on_preempt
        self._sampler = AloneSampler(alone_sample_rate, rng)
        self._ids = itertools.count()
        self.pending: dict[int, Pending] = {}
        # The core of each batch in flight, by (device, batch id): events
        # of a batch go to the core that sent it, across a plan switch.
        self._running: dict[tuple[int, int], CoreGroup] = {}
        # Cores a switch retired, while batches of theirs run; the devices
        # the current cores see down until those end (those whose executor
        # failed meanwhile stay down until it is back).
        self.retiring: list[CoreGroup] = []
        self._held: set[int] = set()
        self._held_down: set[int] = set()
        self._handing: list[Request] | None = None  # a switch collecting requests

    @property
    def timer(self) -> Timer | None:
        """The timer of the cores' wakeups, once it has been armed."""
        return self._wakeup.timer

    @property
    def wake_at(self) -> float | None:
        """What the timer is armed for."""
        return self._wakeup.wake_at

    def group_of(self, model: str) -> CoreGroup | None:
        return self._by_model.get(model)

    # ---------------------------------------------------------------- inputs

    def submit_request(
        self,
        model: str,
        slots: int | Sequence[int],
        slo_s: float,
        *,
        received_at: float | None = None,
        app: str = "",
    ) -> Pending:
        """Hand a request (inputs already in its arena `slots`, one per item;
        an int: one item) to its core; the caller awaits `pending.future`
        for a `Finished` or an error. Its arrival, and so its deadline, is
        `received_at` when given: the time its bytes reached the server,
        before parsing (app/api/received.py). `app` is its application ("":
        the model's default), which the core may track per application."""
        if self.closing:
            raise ShuttingDown("server is shutting down")
        group = self._by_model[model]
        now = self._clock()
        arrival = now if received_at is None else min(received_at, now)
        rows = [slots] if isinstance(slots, int) else list(slots)
        request = Request(next(self._ids), model, arrival, arrival + slo_s, len(rows), app)
        pending = Pending(request, rows, asyncio.get_running_loop().create_future())
        self.pending[request.id] = pending
        self._run(lambda: self._apply(group, group.scheduler.add_request(request, now)))
        return pending

    # ---------------------------------------------------------------- driving

    def _handle(self, event: ExecutorEvent) -> None:
        if isinstance(event, BatchFinished | BatchStopped):
            self._batch_ended(event)
            return
        if event.device in self._held and self._held_event(event):
            return
        group = self._by_device.get(event.device)
        if group is None:
            log.warning("event for device %d, which no core owns: %s", event.device, event)
            return
        core = group.scheduler
        now = self._clock()
        if isinstance(event, DeviceDown | DeviceParked):
            self._apply(group, core.device_down(event.device, now))
        elif isinstance(event, DeviceUp | DeviceUnparked):
            self._apply(group, core.device_up(event.device, now))
        elif isinstance(event, DeviceReshared):
            speed = core.devices[event.device].speed * event.speed_ratio
            self._apply(group, core.set_device_speed(event.device, speed, now))
        elif isinstance(event, AloneTimed):
            info = core.models.get(event.model)
            seconds = alone_time_per_request(event.seconds, event.items, info)
            self._apply(group, core.record_alone_time(event.model, event.app, seconds, now))

    def _batch_ended(self, event: BatchFinished | BatchStopped) -> None:
        """A batch's end goes to the core that sent it."""
        key = (event.device, event.batch_id)
        group = self._running.pop(key, None) or self._by_device.get(event.device)
        if group is None:
            log.warning("event for device %d, which no core owns: %s", event.device, event)
            return
        now = self._clock()
        if isinstance(event, BatchFinished):
            # Its Complete answers the requests with this report.
            self._apply(
                group, group.scheduler.batch_finished(event.device, event.batch_id, now), event
            )
        else:
            self._apply(group, group.scheduler.batch_stopped(event.device, event.batch_id, now))
        if self.retiring:
            self._release(event.device)

    def _apply(
        self, group: CoreGroup, decisions: list[Decision], report: BatchFinished | None = None
    ) -> None:
        """Carry out the decisions of `group`'s core; `report` is the
        executor's report of the batch whose end they answer."""
        for decision in decisions:
            if isinstance(decision, Dispatch):
                self._dispatch(group, decision.batch)
            elif isinstance(decision, Complete):
                self._complete(decision.batch, decision.requests, report)
            elif isinstance(decision, Drop):
                if decision.reason is DropReason.UNLOADED and self.retiring:
                    self._hand_over(decision.requests)
                else:
                    self._fail(decision.requests, dropped(decision.reason.value))
            elif isinstance(decision, Preempt):
                if self._on_preempt is not None:
                    self._on_preempt(decision)
                try:
                    self._executors.cancel(decision.device, decision.batch_id)
                except Exception as exc:  # its executor is gone: its events say so
                    log.warning(
                        "cancel of batch %d on device %d failed: %s",
                        decision.batch_id,
                        decision.device,
                        exc,
                    )

    def _dispatch(self, group: CoreGroup, batch: Batch) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "dispatch batch %d: %s ×%d on device %d at %+.1f ms",
                batch.id,
                batch.model,
                batch.size,
                batch.device,
                (batch.release_at - self._clock()) * 1000,
            )
        # The batch's rows: each request's items, in the batch's order.
        slots = [s for r in batch.requests for s in self.pending[r.id].slots]
        info = group.scheduler.models.get(batch.model)
        alone = self._sampler.marks(batch, info)
        self._running[(batch.device, batch.id)] = group
        try:
            if alone:
                self._executors.submit(
                    batch.device, batch.id, batch.model, slots, batch.release_at, alone
                )
            else:
                self._executors.submit(batch.device, batch.id, batch.model, slots, batch.release_at)
        except Exception as exc:  # the executor cannot take it: the core hears it failed
            log.error("submit to device %d failed: %s", batch.device, exc)
            now = self._clock()
            self._events.append(BatchFinished(batch.device, batch.id, now, now, str(exc)))

    def _complete(
        self, batch: Batch, requests: list[Request], report: BatchFinished | None
    ) -> None:
        if report is None or (report.device, report.batch_id) != (batch.device, batch.id):
            # Only a batch's own report completes it: a core bug, answered
            # rather than left hanging.
            log.error("batch %d completed without its report", batch.id)
            now = self._clock()
            report = BatchFinished(batch.device, batch.id, now, now, "no report of this batch")
        finished = Finished(batch, report.started_at, report.finished_at, report.error)
        for request in requests:
            pending = self.pending.pop(request.id, None)
            if pending is not None and not pending.future.done():
                pending.future.set_result(finished)
        if self._on_batch is not None:
            self._on_batch(batch, finished)

    def _fail(self, requests: list[Request], error: Exception) -> None:
        for request in requests:
            pending = self.pending.pop(request.id, None)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(error)

    # ------------------------------------------------------------------ timer

    def _rearm(self) -> None:
        cores = [*self.groups, *self.retiring]
        wakeups = [w for g in cores if (w := g.scheduler.next_wakeup()) is not None]
        wake_at = min(wakeups) if wakeups else None
        if not self.closing:
            self._wakeup.arm(wake_at)

    def _on_wakeup(self) -> None:
        now = self._wakeup.fired(self._clock())

        def advance_due_cores() -> None:
            for group in [*self.groups, *self.retiring]:
                wake = group.scheduler.next_wakeup()
                if wake is not None and wake <= now:
                    self._apply(group, group.scheduler.advance(now))

        self._run(advance_due_cores)

    # --------------------------------------------------------- model control

    def add_model(self, model: ModelInfo, devices: tuple[int, ...]) -> bool:
        """Serve `model` (loaded while serving) on the core of exactly
        `devices`; False when no core has that set of devices."""
        index = next((i for i, g in enumerate(self.groups) if g.devices == devices), None)
        if index is None:
            return False
        group = self.groups[index]
        self._replace(index, dataclasses.replace(group, models=group.models | {model.name}))
        self._run(lambda: self._apply(group, group.scheduler.add_model(model, self._clock())))
        return True

    def add_group(self, group: CoreGroup) -> None:
        """A new core, on devices no other core has."""
        taken = {d for g in self.groups for d in g.devices} & set(group.devices)
        if taken:
            raise ValueError(f"devices {sorted(taken)} belong to another core")
        self.groups.append(group)
        self._replace(len(self.groups) - 1, group)

    def remove_model(self, model: str) -> None:
        """Stop serving `model`: its core drops what it still queues (503
        unloaded); its batches in flight are answered as usual."""
        index = next(i for i, g in enumerate(self.groups) if model in g.models)
        group = self.groups[index]
        self._replace(index, dataclasses.replace(group, models=group.models - {model}))
        self._run(lambda: self._apply(group, group.scheduler.remove_model(model, self._clock())))

    # ------------------------------------------------------------ plan switch

    def device_speeds(self) -> dict[int, float]:
        """Each device's speed as its core plans with it now (a reshared
        device's share counted): what new cores start from."""
        return {
            device: info.speed
            for group in self.groups
            for device, info in group.scheduler.devices.items()
        }

    def switch_groups(self, groups: Sequence[CoreGroup], down: Iterable[int] = ()) -> int:
        """Serve from `groups`' cores from now on (the module docstring):
        the old cores give up their models, their queued requests go to the
        new cores, their batches in flight end on them. `down`: devices
        whose executor is not serving now (the new cores hear when they
        are). Returns how many requests were handed over."""
        if self.closing:
            raise ShuttingDown("server is shutting down")
        handed: list[Request] = []
        now = self._clock()

        def switch() -> None:
            old = self.groups
            self.retiring.extend(old)
            self._handing = handed
            try:
                for group in old:
                    for model in sorted(group.models):
                        self._apply(group, group.scheduler.remove_model(model, now))
            finally:
                self._handing = None
            self.groups = list(groups)
            self._replace_all()
            busy = {device for device, _ in self._running if device in self._by_device}
            self._held |= busy
            for device in sorted(busy | (set(down) & set(self._by_device))):
                owner = self._by_device[device]
                self._apply(owner, owner.scheduler.device_down(device, now))
            self._hand_over(handed)
            for device in sorted(busy):
                self._release(device)
            self._let_go_of_idle_cores()

        self._run(switch)
        return len(handed)

    def _hand_over(self, requests: list[Request]) -> None:
        """Requests an old core gave up: to their model's core now (while a
        switch is collecting them, into its list)."""
        if self._handing is not None:
            self._handing.extend(requests)
            return
        now = self._clock()
        for request in sorted(requests, key=lambda r: (r.arrival, r.id)):
            group = self._by_model.get(request.model)
            if group is None:  # unloaded meanwhile
                self._fail([request], dropped(DropReason.UNLOADED.value))
            else:
                self._apply(group, group.scheduler.add_request(request, now))

    def _held_event(self, event: ExecutorEvent) -> bool:
        """An event of a device held down for a retired core's batches:
        whether it is taken care of here (the current core already sees
        the device down)."""
        device = event.device
        if isinstance(event, DeviceDown | DeviceParked):
            self._held_down.add(device)
            return True
        if isinstance(event, DeviceUp | DeviceUnparked):
            self._held_down.discard(device)
            self._release(device)
            return True
        return False

    def _release(self, device: int) -> None:
        """Once no retired core has a batch on `device`, its current core
        sees it up (unless its executor is down), and a retired core with
        nothing left in flight is let go."""
        if device in self._held:
            retired = {id(g.scheduler) for g in self.retiring}
            running = self._running.items()
            if not any(d == device and id(g.scheduler) in retired for (d, _), g in running):
                self._held.discard(device)
                owner = self._by_device.get(device)
                if owner is not None and device not in self._held_down:
                    self._apply(owner, owner.scheduler.device_up(device, self._clock()))
                self._held_down.discard(device)
        self._let_go_of_idle_cores()

    def _let_go_of_idle_cores(self) -> None:
        """Retired cores with no batch left in flight are done."""
        busy = {id(g.scheduler) for g in self._running.values()}
        self.retiring = [g for g in self.retiring if id(g.scheduler) in busy]

    def _replace_all(self) -> None:
        self._by_model = {m: g for g in self.groups for m in g.models}
        self._by_device = {d: g for g in self.groups for d in g.devices}

    def _replace(self, index: int, group: CoreGroup) -> None:
        self.groups[index] = group
        self._replace_all()

    # -------------------------------------------------------------- shutdown
