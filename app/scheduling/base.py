"""The sans-IO scheduler interface every policy implements.

The driver (the simulator or the daemon's dispatcher) owns the clock. It calls:

    add_request(request, now)              -> list[Decision]
    batch_finished(device, batch_id, now)  -> list[Decision]   # ran to its end
    batch_stopped(device, batch_id, now)   -> list[Decision]   # a preemption took
    advance(now)                           -> list[Decision]   # fire due timers
    next_wakeup()                          -> float | None     # when to call advance
    device_down(device, now)               -> list[Decision]   # a device failed
    device_up(device, now)                 -> list[Decision]   # it serves again
    add_model(model, now)                  -> list[Decision]   # a model loaded
    remove_model(name, now)                -> list[Decision]   # a model unloaded
    record_alone_time(model, app, seconds, now) -> list[Decision]  # a profiled request

and carries out the decisions: Dispatch (run a batch on a device), Complete
(answer a finished batch's requests with its outputs), Drop (answer requests
with an error and a reason), Preempt (stop the batch running on a device).
Nothing here reads a clock or does I/O.

What this class keeps is what every policy shares: the driver API, the
timers, the batches in flight, the decisions not yet taken, the devices that
are down, and the two kinds of slack of the serving path. Queues belong to
each policy.

**Slack.** Both drivers run the same core with the same options:

* `deadline_margin` (s): every request is planned to finish this long before
  its deadline (`Request.due`); it is still judged at its deadline. Live, a
  finished batch still has to reach the answer: a report across a pipe, the
  outputs read from shared memory, the HTTP answer.
* `timer_lead` (s): a timer due at t fires when the driver's clock reaches
  t − lead (`next_wakeup`), and the policy handles it as of t; the batch it
  forms may start up to the lead early (`Batch.release_at`). Live timers
  fire late under load; a batch decided at `exec_at` must not be pruned for
  lateness the core cannot see, and a formed batch held on an idle device
  would only waste the lead. Inputs that follow are taken at the driver's
  time, not at the handled timer's: a request is never aged by the lead.

The driver's time never goes backwards for the core: an input whose `now`
is earlier than one given before is taken as of that earlier input's time.

**Preemption.** `Preempt` is a request to stop; the executor stops at its
next exit point, or finishes first. Until the driver confirms the stop
(`batch_stopped`, or `batch_finished` if the batch ran to its end), the
batch may still read its requests' inputs and write their outputs, so the
core holds them: none is answered, none runs on another device. A policy
may put held requests into the next batch of the *same* device (which runs
its batches in order, so that batch starts after the stop; `held_on`,
`take_held`). On the confirmation the rest go back to their queue if they
can still finish alone, or are dropped (`DropReason.PREEMPTED`); if the
batch finished first they are answered with its outputs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from app.scheduling.autoscale import AutoscaleMonitor
from app.scheduling.compiled import mypyc_attr
from app.scheduling.model import ModelInfo
from app.scheduling.queue import DeadlineQueue
from app.scheduling.rate import RateMeter
from app.scheduling.timers import Timers, first_instant_after
from app.scheduling.types import (
    AutoscaleSignals,
    Batch,
    Complete,
    Decision,
    DeviceInfo,
    Dispatch,
    Drop,
    DropReason,
    Preempt,
    Request,
)

_INF = math.inf


@dataclass(slots=True)
class Stopping:
    """A preempted batch whose stop is not confirmed yet, and the requests
    of it the core still holds."""

    batch: Batch
    held: list[Request]


@mypyc_attr(allow_interpreted_subclasses=True)
class Scheduler:
    """Shared state and plumbing; policies override the `_on_*` hooks."""

    name: ClassVar[str] = "base"
    # Policies that read a device's speed whenever they plan a batch on it
    # (not from tables made at start) take `set_device_speed`.
    speed_changes: ClassVar[bool] = False

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        d_ctrl: float = 0.0,
        d_data: float = 0.0,
        deadline_margin: float = 0.0,
        timer_lead: float = 0.0,
        rate_window_s: float = 1.0,
        bad_rate_threshold: float = 0.01,
        idle_threshold: float = 0.05,
    ) -> None:
        if not models:
            raise ValueError("a scheduler needs at least one model")
        if not devices:
            raise ValueError("a scheduler needs at least one device")
        ids = [d.id for d in devices]
        if len(set(ids)) != len(ids):
            raise ValueError(f"device ids must be unique, got {ids}")
        for option, value in (
            ("d_ctrl", d_ctrl),
            ("d_data", d_data),
            ("deadline_margin", deadline_margin),
            ("timer_lead", timer_lead),
        ):
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"{option} must be a finite number ≥ 0 (seconds), got {value}")
        self.models: dict[str, ModelInfo] = {m.name: m for m in models}
        self.devices: dict[int, DeviceInfo] = {d.id: d for d in devices}
        self.d_ctrl = d_ctrl
        self.d_data = d_data
        self.deadline_margin = deadline_margin
        self.timer_lead = timer_lead
        self._rate_window_s = rate_window_s
        self.rates: dict[str, RateMeter] = {
            m.name: RateMeter(rate_window_s, m.expected_rate) for m in models
        }
        self.timers = Timers()
        # Batches dispatched and not yet ended or preempted: by id, and per
        # device in the order the device runs them.
        self.in_flight: dict[int, Batch] = {}
        self._on_device: dict[int, list[Batch]] = {d: [] for d in self.devices}
        # Preempted batches whose stop is not confirmed, by id.
        self.stopping: dict[int, Stopping] = {}
        # When each device last fell idle (no batch in flight on it).
        self.idle_since: dict[int, float] = dict.fromkeys(self.devices, -_INF)
        # Devices out of service (crashed or stuck executor); policies never
        # dispatch to them. Every device starts up.
        self.down: set[int] = set()
        self._up: tuple[int, ...] = tuple(self.devices)
        self.clock = -_INF  # the latest `now` a driver input brought
        self.monitor = AutoscaleMonitor(
            ids, bad_rate_threshold=bad_rate_threshold, idle_threshold=idle_threshold
        )
        self._fastest = max(self.devices.values(), key=lambda d: d.speed).id
        # delay(1) + ℓ(1) on the fastest device, per model: asked on every arrival.
        self._alone = {
            m.name: self.delay(1) + self.latency(m, 1, self._fastest) for m in self.models.values()
        }
        self._out: list[Decision] = []
        self._next_batch_id = 1

    # ----------------------------------------------------------------- driver API

    def add_request(self, request: Request, now: float) -> list[Decision]:
        # _tick and _fire_timers' guard written out: this runs once per request.
        if now < self.clock:
            now = self.clock
        else:
            self.clock = now
        request.due = request.deadline - self.deadline_margin
        model = self.models.get(request.model)
        if model is None:
            self._drop([request], DropReason.NOT_SERVED)
        elif request.items > model.max_batch:
            # Never split: a request larger than any batch can never run.
            self._drop([request], DropReason.OVERLOADED)
        else:
            self.rates[request.model].record(now, request.items)
            self._on_arrival(request, model, now)
        if self.timers.due(now, self.timer_lead):
            self._fire_timers(now)
        out = self._out  # _take, written out
        self._out = []
        return out

    def batch_finished(self, device: int, batch_id: int, now: float) -> list[Decision]:
        """Batch `batch_id` ran to its end on `device` at `now` (its outputs
        are ready, or its executor reported an error the driver answers)."""
        now = self._tick(now)
        batch = self.in_flight.get(batch_id)
        if batch is not None and batch.device == device:
            self._forget(batch, now)
            good = sum(1 for r in batch.requests if r.deadline >= now)
            self.monitor.batch_ended(device, batch.start_at, now, good, len(batch.requests) - good)
            self._out.append(Complete(batch, batch.requests))
            self._on_batch_finished(batch, now)
        else:
            stopping = self.stopping.get(batch_id)
            if stopping is not None and stopping.batch.device == device:
                # The stop came too late: what the core still held is answered.
                del self.stopping[batch_id]
                held = stopping.held
                good = sum(1 for r in held if r.deadline >= now)
                self.monitor.batch_ended(
                    device, stopping.batch.start_at, now, good, len(held) - good
                )
                if held:
                    self._out.append(Complete(stopping.batch, held))
                self._mark_idle(device, now)
        # Unknown ids: batches of a device that went down (already recovered).
        self._fire_timers(now)
        return self._take()

    def batch_stopped(self, device: int, batch_id: int, now: float) -> list[Decision]:
        """Batch `batch_id` stopped on `device` at `now` without finishing."""
        now = self._tick(now)
        stopping = self.stopping.get(batch_id)
        if stopping is not None and stopping.batch.device == device:
            del self.stopping[batch_id]
            self.monitor.batch_ended(device, stopping.batch.start_at, now, 0, 0)
            self._mark_idle(device, now)
            self._recover(stopping.held, now, DropReason.PREEMPTED)
        else:
            batch = self.in_flight.get(batch_id)
            if batch is not None and batch.device == device:
                # Stopped though the core never asked: its requests are
                # recovered as after a preemption.
                self._forget(batch, now)
                self.monitor.batch_ended(device, batch.start_at, now, 0, 0)
                self._on_batch_finished(batch, now)
                self._recover(batch.requests, now, DropReason.PREEMPTED)
        self._fire_timers(now)
        return self._take()

    def advance(self, now: float) -> list[Decision]:
        self._fire_timers(self._tick(now))
        return self._take()

    def next_wakeup(self) -> float | None:
        """When the driver should call `advance`: the earliest timer less the
        timer lead."""
        at = self.timers.next_time()
        if at is None or not self.timer_lead:
            return at
        return at - self.timer_lead

    def device_down(self, device: int, now: float) -> list[Decision]:
        """`device` stopped serving (its executor died or hung) at `now`.

        The batches the core had on it are forgotten — the driver must ignore
        their later failure reports — and their requests go back to their
        queue when they can still finish alone (on any device, as after a
        preemption), else they are dropped with DropReason.DEVICE_FAILED. The
        policy stops sending work to the device until `device_up`.
        """
        if device not in self.devices:
            raise ValueError(f"unknown device {device}")
        now = self._tick(now)
        if device not in self.down:
            self.down.add(device)
            self._up = tuple(d for d in self.devices if d not in self.down)
            lost = list(self._on_device[device])
            for batch in lost:
                self._forget(batch, now)
                self.monitor.batch_ended(device, batch.start_at, now, 0, 0)
            stopped = [s for s in self.stopping.values() if s.batch.device == device]
            for stopping in stopped:
                del self.stopping[stopping.batch.id]
                self.monitor.batch_ended(device, stopping.batch.start_at, now, 0, 0)
            # The policy forgets the device first, so that the recovered
            # requests are not planned onto it again.
            self._on_device_down(device, now)
            requests = [r for b in lost for r in b.requests]
            requests += [r for s in stopped for r in s.held]
            self._recover(requests, now, DropReason.DEVICE_FAILED)
        self._fire_timers(now)
        return self._take()

    def device_up(self, device: int, now: float) -> list[Decision]:
        """`device` (marked down before) serves again from `now`: idle, empty."""
        if device not in self.devices:
            raise ValueError(f"unknown device {device}")
        now = self._tick(now)
        if device in self.down:
            self.down.discard(device)
            self._up = tuple(d for d in self.devices if d not in self.down)
            self.idle_since[device] = now
            self._on_device_up(device, now)
        self._fire_timers(now)
        return self._take()

    def set_device_speed(self, device: int, speed: float, now: float) -> list[Decision]:
        """`device` runs batches at `speed` from `now` on (its share of a
        spatially shared device changed: app/runtime's reshare). Batches on
        it keep their planned end: they finish where they started. Refused
        (ValueError) by a policy that plans with speeds fixed at start."""
        if device not in self.devices:
            raise ValueError(f"unknown device {device}")
        if not (speed > 0.0 and math.isfinite(speed)):
            raise ValueError(f"a device's speed is finite and > 0, got {speed}")
        if not self.speed_changes:
            raise ValueError(f"policy {self.name} plans with the devices' speeds fixed at start")
        now = self._tick(now)
        self.devices[device] = replace(self.devices[device], speed=speed)
        self._fastest = max(self.devices.values(), key=lambda d: d.speed).id
        self._alone = {
            m.name: self.delay(1) + self.latency(m, 1, self._fastest) for m in self.models.values()
        }
        self._fire_timers(now)
        return self._take()

    def add_model(self, model: ModelInfo, now: float) -> list[Decision]:
        """Serve `model` from `now` on (a model loaded while serving); its
        name must not be served already."""
        if model.name in self.models:
            raise ValueError(f"model {model.name!r} is served already")
        now = self._tick(now)
        self.models[model.name] = model
        self.rates[model.name] = RateMeter(self._rate_window_s, model.expected_rate)
        self._alone[model.name] = self.delay(1) + self.latency(model, 1, self._fastest)
        self._on_model_added(model, now)
        self._fire_timers(now)
        return self._take()

    def remove_model(self, name: str, now: float) -> list[Decision]:
        """Stop serving `name` at `now` (a model unloaded): its queued
        requests are dropped with DropReason.UNLOADED, a later one with
        NOT_SERVED. Its batches in flight run to their end and are answered
        as usual; their requests are dropped UNLOADED if the batch is stopped
        or its device fails (they cannot be run again)."""
        if name not in self.models:
            raise ValueError(f"unknown model {name!r}")
        now = self._tick(now)
        queued = self._on_model_removed(name, now)
        del self.models[name], self.rates[name], self._alone[name]
        self._drop(queued, DropReason.UNLOADED)
        self._fire_timers(now)
        return self._take()

    def record_alone_time(self, model: str, app: str, seconds: float, now: float) -> list[Decision]:
        """A request of `model` from application `app` ran alone for
        `seconds` (the executors' asynchronous profiler, orloj.txt §3). The
        driver measures; the core only takes the figure in. Policies that
        plan with one ℓ(b) ignore it; one of a model no longer served is
        ignored too."""
        if not (seconds >= 0.0 and math.isfinite(seconds)):
            raise ValueError(f"an alone-time must be a finite number ≥ 0 s, got {seconds}")
        now = self._tick(now)
        if model in self.models:
            self._on_alone_time(self.models[model], app, seconds, now)
        self._fire_timers(now)
        return self._take()

    def devices_up(self) -> tuple[int, ...]:
        return self._up

    def signals(self, now: float) -> AutoscaleSignals:
        running = [(b.device, b.start_at) for b in self.in_flight.values()]
        running += [(s.batch.device, s.batch.start_at) for s in self.stopping.values()]
        return self.monitor.signals(now, running)

    def reset_signals(self, now: float) -> None:
        self.monitor.reset(now)

    def queued(self) -> int:
        """Requests waiting in the policy's queues."""
        raise NotImplementedError

    # ----------------------------------------------------------- policy hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        raise NotImplementedError

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        """`batch` left its device (it is already out of `in_flight`)."""
        raise NotImplementedError

    def _on_timer(self, key: Hashable, now: float) -> None:
        raise NotImplementedError

    def _on_device_down(self, device: int, now: float) -> None:
        """Forget `device` (its batches are already gone from `in_flight`)."""
        raise NotImplementedError

    def _on_device_up(self, device: int, now: float) -> None:
        """Take `device` back into service, idle from `now`."""
        raise NotImplementedError

    def _requeue(self, requests: list[Request], now: float) -> None:
        """Take back requests of a stopped or failed batch (each can still
        finish alone) and schedule them."""
        raise NotImplementedError

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        """Keep per-model state for `model` (already in `self.models`)."""
        raise NotImplementedError

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        """Forget `name` (still in `self.models`): its per-model state and
        timers; return its queued requests (the base drops them)."""
        raise NotImplementedError

    def _on_alone_time(self, model: ModelInfo, app: str, seconds: float, now: float) -> None:
        """Take in a measured alone-time (see `record_alone_time`); by
        default nothing: the policy plans with the profile."""

    # ------------------------------------------------------- helpers for policies

    def delay(self, batch_size: int) -> float:
        """Control plus data-transfer delay before a batch can start (App. C)."""
        return self.d_ctrl + self.d_data * batch_size

    def latency(self, model: ModelInfo, batch_size: int, device: int | None = None) -> float:
        exec_s = model.profile.latency(batch_size)
        if device is not None:
            return exec_s / self.devices[device].speed
        return exec_s

    def alone_cost(self, model: ModelInfo, device: int | None = None, items: int = 1) -> float:
        """How long a request of `model` with `items` items takes alone, from
        now to its end: delay(items) + ℓ(items) on `device` (by default the
        fastest device)."""
        if device is None:
            if items == 1:
                return self._alone[model.name]
            device = self._fastest
        return self.delay(items) + self.latency(model, items, device)

    def can_finish_alone(self, request: Request, now: float, device: int | None = None) -> bool:
        """Whether `request`, started alone now, would finish by its due time."""
        model = self.models[request.model]
        return now + self.alone_cost(model, device, request.items) <= request.due

    def hopeless_at(
        self, due: float, model: ModelInfo, device: int | None = None, items: int = 1
    ) -> float:
        """The first instant at which a request of `items` items due at `due`
        can no longer finish alone: when its drop timer fires."""
        return first_instant_after(due, self.alone_cost(model, device, items))

    def pop_hopeless(
        self, queue: DeadlineQueue, model: ModelInfo, now: float, device: int | None = None
    ) -> list[Request]:
        """Remove from `queue` the requests that cannot finish alone from `now`."""
        return queue.pop_hopeless(now, lambda items: self.alone_cost(model, device, items))

    def queue_hopeless_at(
        self, queue: DeadlineQueue, model: ModelInfo, device: int | None = None
    ) -> float | None:
        """When the first request of `queue` can no longer finish alone (its
        drop timer), None for an empty queue."""
        return queue.first_hopeless(lambda due, items: self.hopeless_at(due, model, device, items))

    def batches_on(self, device: int) -> list[Batch]:
        """Batches in flight on `device`, in the order it runs them."""
        return self._on_device[device]

    def running_on(self, device: int) -> Batch | None:
        batches = self._on_device[device]
        return batches[0] if batches else None

    def idle_devices(self) -> list[int]:
        """Devices up with no batch in flight, idle the longest first (ties
        by id)."""
        idle = [d for d, batches in self._on_device.items() if not batches and d not in self.down]
        idle.sort(key=lambda d: (self.idle_since[d], d))
        return idle

    def held_on(self, device: int) -> list[Request]:
        """Requests the core holds for stopping batches on `device`: the
        next batch of that device may take them (it starts after the stop)."""
        return [r for s in self.stopping.values() if s.batch.device == device for r in s.held]

    def take_held(self, requests: Iterable[Request]) -> None:
        """`requests` (held, see `held_on`) now run in a batch of their
        device; their stopping batch no longer answers for them."""
        taken = {r.id for r in requests}
        if taken:
            for stopping in self.stopping.values():
                stopping.held = [r for r in stopping.held if r.id not in taken]

    def _dispatch(
        self, model: ModelInfo, requests: list[Request], device: int, start_at: float
    ) -> Batch:
        batch = Batch(
            id=self._next_batch_id,
            model=model.name,
            device=device,
            requests=requests,
            start_at=start_at,
            finish_at=start_at + self.latency(model, sum(r.items for r in requests), device),
            release_at=start_at - self.timer_lead,
        )
        self._next_batch_id += 1
        self.in_flight[batch.id] = batch
        self._on_device[device].append(batch)
        self._out.append(Dispatch(batch))
        return batch

    def _drop(self, requests: Iterable[Request], reason: DropReason) -> None:
        dropped = list(requests)
        if dropped:
            self.monitor.requests_dropped(len(dropped))
            self._out.append(Drop(dropped, reason))

    def _preempt(self, batch: Batch, now: float) -> None:
        """Stop `batch` (Shepherd Alg. 1 line 17). Its requests are held
        until the stop is confirmed; then those that can still finish alone
        are re-enqueued (line 19) and the others dropped."""
        self._forget(batch, now)
        self.stopping[batch.id] = Stopping(batch, list(batch.requests))
        self._out.append(Preempt(batch.device, batch.id, batch.model, len(batch.requests)))

    def _recover(self, requests: list[Request], now: float, reason: DropReason) -> None:
        """Requests whose batch will not answer them: back to the policy if
        they can still finish alone, else dropped with `reason`."""
        back: list[Request] = []
        failed: list[Request] = []
        unloaded: list[Request] = []
        for request in requests:
            if request.model not in self.models:
                unloaded.append(request)
            else:
                (back if self.can_finish_alone(request, now) else failed).append(request)
        self._drop(unloaded, DropReason.UNLOADED)
        self._drop(failed, reason)
        if back:
            self._requeue(back, now)

    def _forget(self, batch: Batch, now: float) -> None:
        del self.in_flight[batch.id]
        self._on_device[batch.device].remove(batch)
        self._mark_idle(batch.device, now)

    def _mark_idle(self, device: int, now: float) -> None:
        if not self._on_device[device]:
            self.idle_since[device] = now

    def _tick(self, now: float) -> float:
        """`now`, or the core's clock if that is later; the clock moves to it."""
        if now < self.clock:
            return self.clock
        self.clock = now
        return now

    def _fire_timers(self, now: float) -> None:
        timers = self.timers
        lead = self.timer_lead
        while timers.due(now, lead):
            popped = timers.pop_due(now, lead)
            if popped is None:
                return
            key, at = popped
            # Up to the timer lead early: handled as of its time.
            self._on_timer(key, at if at > now else now)

    def _take(self) -> list[Decision]:
        # Always hand over a list the core will not append to later.
        out = self._out
        self._out = []
        return out

    @classmethod
    def describe(cls) -> dict[str, Any]:
        # getattr: a compiled (native) class's docstring is not a typed attribute.
        doc = getattr(cls, "__doc__", None) or ""
        return {"name": cls.name, "doc": doc.strip().splitlines()[0]}
