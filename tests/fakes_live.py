"""Fakes for the live dispatcher's tests: a core that records what it is
asked, a fake clock and timer, executors that finish batches on command or
on an emulated timeline, and a harness wiring them to a Dispatcher."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from app.errors import ExecutorFailed
from app.runtime.events import (
    BatchFinished,
    BatchStopped,
    DeviceDown,
    DeviceUp,
    ExecutorEvent,
)
from app.scheduling import DeviceInfo, ModelInfo
from app.scheduling.types import Complete, Decision, Dispatch, Drop, Preempt
from app.server.dispatcher import Pending

# ---------------------------------------------------------- the live driver


def summarize_decisions(decisions: list[Decision]) -> list[tuple]:
    """Decisions as plain tuples: what two drivers must agree on."""
    out: list[tuple] = []
    for d in decisions:
        if isinstance(d, Dispatch):
            b = d.batch
            ids = [r.id for r in b.requests]
            out.append(("dispatch", b.id, b.device, b.model, ids, b.start_at, b.release_at))
        elif isinstance(d, Complete):
            out.append(("complete", d.batch.id, [r.id for r in d.requests]))
        elif isinstance(d, Drop):
            out.append(("drop", d.reason.value, [r.id for r in d.requests]))
        elif isinstance(d, Preempt):
            out.append(("preempt", d.device, d.batch_id))
    return out


class RecordingCore:
    """A scheduling core that logs every driver call, its time and its
    decisions; everything else is the wrapped core's."""

    _CALLS = ("add_request", "batch_finished", "batch_stopped", "advance")
    _CALLS += ("device_down", "device_up")

    def __init__(self, core: Any) -> None:
        self.core = core
        self.log: list[tuple] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.core, name)
        if name not in self._CALLS:
            return attr

        def call(*args: Any) -> list[Decision]:
            decisions = attr(*args)
            now = args[-1]
            what = args[0].id if name == "add_request" else args[:-1]
            self.log.append((name, what, now, summarize_decisions(decisions)))
            return decisions

        return call


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTimer:
    """The dispatcher's timer, fired by the test (`fire`)."""

    precise = True

    def __init__(self) -> None:
        self.when: float | None = None
        self._callback: Any = None

    def call_at(self, when: float, callback: Any, *args: Any) -> None:
        self.when, self._callback = when, (callback, args)

    def cancel(self) -> None:
        self.when = self._callback = None

    def close(self) -> None:
        self.cancel()

    def fire(self) -> None:
        callback, args = self._callback
        self.when = self._callback = None
        callback(*args)


class FakeExecutors:
    """Records what the dispatcher sends; `refuse` makes a device's submits
    raise, as a dead executor's do."""

    def __init__(self) -> None:
        self.submits: list[tuple[int, int, str, list[int], float]] = []
        self.cancels: list[tuple[int, int]] = []
        self.refuse: set[int] = set()
        self.on_submit: Any = None  # called before a refused submit raises

    def submit(
        self, device_id: int, batch_id: int, model: str, slots: list[int], start_at: float
    ) -> None:
        if device_id in self.refuse:
            if self.on_submit is not None:
                self.on_submit(device_id, batch_id)
            raise ExecutorFailed(f"executor emulated:{device_id} is not running")
        self.submits.append((device_id, batch_id, model, list(slots), start_at))

    def cancel(self, device_id: int, batch_id: int) -> bool:
        self.cancels.append((device_id, batch_id))
        return True


@dataclass
class _FakeDevice:
    speed: float
    waiting: list[tuple[int, str, int, float]] = field(default_factory=list)
    running: tuple[int, float, float] | None = None  # (batch id, begin, end)
    stop_at: float | None = None
    cancelled: set[int] = field(default_factory=set)


class EmulatedExecutors:
    """Executors of emulated devices for the live dispatcher, on a virtual
    clock: each runs its batches in order from max(start_at, free) for
    ℓ(b)/speed, stops a preempted batch `preemption_delay` later (or lets it
    finish first), and skips a cancelled batch that has not started. What
    they report reaches the dispatcher through `post` at the time it
    happens (`LiveHarness` runs the clock)."""

    def __init__(
        self,
        models: dict[str, ModelInfo],
        devices: list[DeviceInfo],
        preemption_delay: float,
    ) -> None:
        self.models = models
        self.preemption_delay = preemption_delay
        self.devices = {d.id: _FakeDevice(d.speed) for d in devices}
        self.events: list[tuple[float, int, int, int]] = []  # (time, batch, device, kind)
        self.now = 0.0

    def submit(
        self, device_id: int, batch_id: int, model: str, slots: list[int], start_at: float
    ) -> None:
        device = self.devices[device_id]
        device.waiting.append((batch_id, model, len(slots), start_at))
        if device.running is None:
            self._begin_next(device_id, self.now)

    def cancel(self, device_id: int, batch_id: int) -> bool:
        device = self.devices[device_id]
        if device.running is not None and device.running[0] == batch_id:
            _, _, end = device.running
            stop_at = self.now + self.preemption_delay
            if stop_at < end:
                device.stop_at = stop_at
                heapq.heappush(self.events, (stop_at, batch_id, device_id, 1))
            return True
        if any(w[0] == batch_id for w in device.waiting):
            device.cancelled.add(batch_id)
            return True
        return False

    def fail(self, device_id: int) -> None:
        """The device's executor dies: everything on it is lost."""
        self.devices[device_id] = _FakeDevice(self.devices[device_id].speed)

    def _begin_next(self, device_id: int, now: float) -> None:
        device = self.devices[device_id]
        while device.waiting:
            batch_id, model, size, start_at = device.waiting.pop(0)
            if batch_id in device.cancelled:
                device.cancelled.discard(batch_id)
                heapq.heappush(self.events, (now, batch_id, device_id, 1))
                continue
            begin = max(start_at, now)
            end = begin + self.models[model].profile.latency(size) / device.speed
            device.running, device.stop_at = (batch_id, begin, end), None
            heapq.heappush(self.events, (end, batch_id, device_id, 0))
            return

    def pop_event(self) -> ExecutorEvent | None:
        """The next event (at `self.events[0][0]`), or None for a stale one."""
        at, batch_id, device_id, kind = heapq.heappop(self.events)
        device = self.devices[device_id]
        running = device.running
        if kind == 1 and (running is None or running[0] != batch_id):
            return BatchStopped(device_id, batch_id, at)  # skipped while waiting
        if running is None or running[0] != batch_id:
            return None
        if kind == 0 and device.stop_at is not None:
            return None
        device.running = None
        self._begin_next(device_id, at)
        if kind == 0:
            return BatchFinished(device_id, batch_id, running[1], at)
        return BatchStopped(device_id, batch_id, at)


class LiveHarness:
    """Runs the live dispatcher over `EmulatedExecutors` on a fake clock, in
    the simulator's order of events at equal times: device events, then
    faults, then the core's timer, then arrivals."""

    def __init__(self, dispatcher: Any, executors: EmulatedExecutors, clock: FakeClock,
                 timer: FakeTimer) -> None:  # fmt: skip
        self.dispatcher = dispatcher
        self.executors = executors
        self.clock = clock
        self.timer = timer

    def run(
        self,
        arrivals: list[tuple[float, str, float]],  # (time, model, slo_s)
        faults: list[tuple[float, int, bool]] = (),  # (time, device, up)
    ) -> list[Pending]:
        inf = float("inf")
        arrivals = sorted(arrivals, key=lambda a: a[0])
        faults = sorted(faults, key=lambda f: f[0])
        pending = []
        i = j = 0
        while True:
            t_event = self.executors.events[0][0] if self.executors.events else inf
            t_fault = faults[j][0] if j < len(faults) else inf
            t_timer = self.timer.when if self.timer.when is not None else inf
            t_arrival = arrivals[i][0] if i < len(arrivals) else inf
            now = min(t_event, t_fault, t_timer, t_arrival)
            idle = t_event == t_fault == t_arrival == inf and not self.dispatcher.pending
            if now == inf or idle:  # idle: only periodic timers (Nexus's epochs) remain
                return pending
            self.clock.now = self.executors.now = now
            if t_event == now:
                event = self.executors.pop_event()
                if event is not None:
                    self.dispatcher.post(event)
            elif t_fault == now:
                _, device, up = faults[j]
                j += 1
                if not up:
                    self.executors.fail(device)
                event = DeviceUp(device, 0.0) if up else DeviceDown(device, "killed")
                self.dispatcher.post(event)
            elif t_timer == now:
                self.timer.fire()
            else:
                _, model_name, slo_s = arrivals[i]
                i += 1
                pending.append(self.dispatcher.submit_request(model_name, i - 1, slo_s))
