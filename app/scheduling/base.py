"""The sans-IO scheduler interface every policy implements.

The driver (the simulator or the daemon's dispatcher coroutine) owns the
clock. It calls:

    add_request(request, now)            -> list[Decision]
    batch_finished(device, batch_id, now) -> list[Decision]
    advance(now)                         -> list[Decision]   # fire due timers
    next_wakeup()                        -> float | None     # when to call advance
    device_down(device, now)             -> list[Decision]   # a device failed
    device_up(device, now)               -> list[Decision]   # it serves again

and carries out the decisions: Dispatch (run a batch on a device at a start
time), Drop (answer requests with an error and a reason), Preempt (stop the
batch running on a device). Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, ClassVar

from app.scheduling.autoscale import AutoscaleMonitor
from app.scheduling.model import ModelInfo
from app.scheduling.queue import DeadlineQueue
from app.scheduling.rate import RateMeter
from app.scheduling.timers import Timers
from app.scheduling.types import (
    AutoscaleSignals,
    Batch,
    Decision,
    DeviceInfo,
    Dispatch,
    Drop,
    DropReason,
    Preempt,
    Request,
)


class Scheduler:
    """Shared state and plumbing; policies override the `_on_*` hooks."""

    name: ClassVar[str] = "base"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        d_ctrl: float = 0.0,
        d_data: float = 0.0,
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
        self.models: dict[str, ModelInfo] = {m.name: m for m in models}
        self.devices: dict[int, DeviceInfo] = {d.id: d for d in devices}
        self.d_ctrl = d_ctrl
        self.d_data = d_data
        self.queues: dict[str, DeadlineQueue] = {m: DeadlineQueue() for m in self.models}
        self.rates: dict[str, RateMeter] = {
            m.name: RateMeter(rate_window_s, m.expected_rate) for m in models
        }
        self.timers = Timers()
        # Batches dispatched and not yet finished or preempted, by id.
        self.in_flight: dict[int, Batch] = {}
        self.monitor = AutoscaleMonitor(
            ids, bad_rate_threshold=bad_rate_threshold, idle_threshold=idle_threshold
        )
        self._out: list[Decision] = []
        self._next_batch_id = 1
        # Devices out of service (crashed or stuck executor); policies never
        # dispatch to them. Every device starts up.
        self.down: set[int] = set()

    # ----------------------------------------------------------------- driver API

    def add_request(self, request: Request, now: float) -> list[Decision]:
        model = self.models.get(request.model)
        if model is None:
            self._drop([request], DropReason.NOT_SERVED)
        else:
            self.rates[request.model].record(now)
            self._on_arrival(request, model, now)
        # Inlined _fire_timers/_take: this runs once per request.
        heap = self.timers._heap
        if heap and heap[0][0] <= now:
            self._fire_timers(now)
        out = self._out
        self._out = []
        return out

    def batch_finished(self, device: int, batch_id: int, now: float) -> list[Decision]:
        batch = self.in_flight.pop(batch_id, None)
        if batch is not None:  # unknown ids are batches already preempted
            good = sum(1 for r in batch.requests if r.deadline >= now)
            self.monitor.batch_ended(device, batch.start_at, now, good, batch.size - good)
            self._on_batch_finished(batch, now)
        self._fire_timers(now)
        return self._take()

    def advance(self, now: float) -> list[Decision]:
        self._fire_timers(now)
        return self._take()

    def next_wakeup(self) -> float | None:
        return self.timers.next_time()

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
        if device not in self.down:
            self.down.add(device)
            lost = [b for b in self.in_flight.values() if b.device == device]
            for batch in lost:
                del self.in_flight[batch.id]
                self.monitor.batch_ended(device, batch.start_at, now, 0, 0)
            # The policy forgets the device first, so that the re-queued
            # requests are not planned onto it again.
            self._on_device_down(device, now)
            back: list[Request] = []
            failed: list[Request] = []
            for batch in lost:
                model = self.models[batch.model]
                alone = now + self.delay(1) + self.latency(model, 1)
                for request in batch.requests:
                    (back if alone <= request.deadline else failed).append(request)
            self._drop(failed, DropReason.DEVICE_FAILED)
            if back:
                self._requeue(back, now)
        self._fire_timers(now)
        return self._take()

    def device_up(self, device: int, now: float) -> list[Decision]:
        """`device` (marked down before) serves again from `now`: idle, empty."""
        if device not in self.devices:
            raise ValueError(f"unknown device {device}")
        if device in self.down:
            self.down.discard(device)
            self._on_device_up(device, now)
        self._fire_timers(now)
        return self._take()

    def devices_up(self) -> list[int]:
        return [d for d in self.devices if d not in self.down]

    def signals(self, now: float) -> AutoscaleSignals:
        running = [(b.device, b.start_at) for b in self.in_flight.values()]
        return self.monitor.signals(now, running)

    def reset_signals(self, now: float) -> None:
        self.monitor.reset(now)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    # ----------------------------------------------------------- policy hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        raise NotImplementedError

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
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
        """Put back requests of a failed batch (they can still finish alone)
        and schedule them; every policy implements it (`_enqueue` helps)."""
        raise NotImplementedError

    def _enqueue(self, requests: list[Request]) -> list[str]:
        """Add `requests` to their deadline queues; return their models, in
        first-seen order."""
        names: dict[str, None] = {}
        for request in requests:
            self.queues[request.model].add(request)
            names[request.model] = None
        return list(names)

    # ------------------------------------------------------- helpers for policies

    def delay(self, batch_size: int) -> float:
        """Control plus data-transfer delay before a batch can start (App. C)."""
        return self.d_ctrl + self.d_data * batch_size

    def latency(self, model: ModelInfo, batch_size: int, device: int | None = None) -> float:
        exec_s = model.profile.latency(batch_size)
        if device is not None:
            return exec_s / self.devices[device].speed
        return exec_s

    def _dispatch(
        self, model: ModelInfo, requests: list[Request], device: int, start_at: float
    ) -> Batch:
        batch = Batch(
            id=self._next_batch_id,
            model=model.name,
            device=device,
            requests=requests,
            start_at=start_at,
            finish_at=start_at + self.latency(model, len(requests), device),
        )
        self._next_batch_id += 1
        self.in_flight[batch.id] = batch
        self._out.append(Dispatch(batch))
        return batch

    def _drop(self, requests: Iterable[Request], reason: DropReason) -> None:
        dropped = list(requests)
        if dropped:
            self.monitor.requests_dropped(len(dropped))
            self._out.append(Drop(dropped, reason))

    def _preempt(self, batch: Batch, now: float) -> None:
        """Stop `batch`; its requests that can still finish alone go back to
        their queue (Shepherd Alg. 1 line 19), the others are dropped."""
        del self.in_flight[batch.id]
        self.monitor.batch_ended(batch.device, batch.start_at, now, 0, 0)
        self._out.append(Preempt(batch.device, batch.id))
        model = self.models[batch.model]
        queue = self.queues[batch.model]
        alone = now + self.delay(1) + self.latency(model, 1)
        lost = []
        for request in batch.requests:
            if alone <= request.deadline:
                queue.add(request)
            else:
                lost.append(request)
        self._drop(lost, DropReason.PREEMPTED)

    def _running_on(self, device: int) -> Batch | None:
        for batch in self.in_flight.values():
            if batch.device == device:
                return batch
        return None

    def _fire_timers(self, now: float) -> None:
        timers = self.timers
        heap = timers._heap
        # Cheap exit on the hot path: nothing (not even a stale entry) is due.
        while heap and heap[0][0] <= now:
            key = timers.pop_due(now)
            if key is None:
                return
            self._on_timer(key, now)

    def _take(self) -> list[Decision]:
        # Always hand over a list the core will not append to later.
        out = self._out
        self._out = []
        return out

    @classmethod
    def describe(cls) -> dict[str, Any]:
        return {"name": cls.name, "doc": (cls.__doc__ or "").strip().splitlines()[0]}
