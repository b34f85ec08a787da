"""Nexus: per-epoch squishy bin packing, uncoordinated routing, per-device round-robin.

Sources: symphony.txt §4.2 (eq. 1, Figure 3a: with uncoordinated frontends a
request can wait a whole batch, so 2·ℓ(b) ≤ SLO) and §5.2 (Nexus as the
baseline: its batch sizes and queueing delay), and Nexus itself (Shen et al.,
SOSP'19): squishy bin packing, frontends that route without coordination,
backends that execute their sessions round-robin, and the sliding-window
batch policy that drops head requests instead of shrinking the batch.

Rules:

- **Plan** (`app.planning.squishy.plan`): per model a batch size B with
  2·ℓ(B) ≤ SLO, ⌊r·ℓ(B)/B⌋ dedicated devices, the residual load packed
  first-fit-decreasing onto shared devices whose duty cycle keeps every
  session's SLO. The first plan uses `ModelInfo.expected_rate` (models without
  one get an even share of the devices); every `epoch_s` seconds (a timer,
  started at the first request) the plan is redone from the measured arrival
  rates `self.rates[m].rate(now)`. The rate window defaults to `epoch_s`, so
  the plan sees the last epoch's average. An epoch with no arrivals at all
  keeps the plan.
- **Routing** on arrival: each request goes to one of its model's devices by
  smooth weighted round-robin, weights = the rate the plan put on each device
  (equal weights when all are 0). With `frontends=k`, request id mod k picks
  one of k independent routers (uncoordinated frontends, symphony.txt §3.3);
  router f starts f steps into its rotation. There is no central queue: the
  request stays on that device's queue for its model.
- **Device** (work-conserving): when free, it takes the next session in its
  round-robin order (the plan's session order) that has requests, drops
  (DropReason.DEADLINE) head requests that cannot finish in a batch of
  n = min(queue length, planned batch) started now (start = now + delay(n),
  finish = start + ℓ(n)/speed), and runs the n earliest-deadline requests;
  the rest stay queued. The next round-robin turn starts after that session.
- **Drop timers**: per (device, model) queue, a timer at the first instant
  its head can no longer finish alone on that device (`hopeless_at`: just
  after deadline − delay(1) − ℓ(1)/speed). When it fires on a busy device,
  the queued requests of that model that can no longer finish alone are
  dropped at once (DropReason.DEADLINE) rather than when the device frees
  up; on a free device it simply serves.
- **Re-plan**: requests queued on a device that no longer hosts their model
  are routed again under the new plan; batches running are left alone.

Requests with several items (`Request.items`): the planner's batch sizes
and rates are in items (the core's rate meters count items/s). A device's
batch is the head plus the requests behind it that fit whole in the
session's batch, in deadline order (one that does not fit is skipped,
never split); a head larger than the session's batch runs alone. The
sliding window and the drop timers test each request with its own items.

Simplified relative to Nexus: no model loading time when the plan moves a
model (emulated devices); the planner assumes identical devices (the slowest
device's speed is used, so the SLO bound holds everywhere); per-device
dispatch uses the planned session order rather than Nexus's exact duty-cycle
timetable (work-conserving: a session with no requests is skipped); spare
devices, which Nexus would release, are by default (`fill_devices=True`) used
as headroom by scaling the plan's load up until all devices are used; a
model's residual session runs at most its shrunk planned batch. Prefix
batching, query/application latency splitting and GPU multiplexing of Nexus
are out of scope.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from app.scheduling import squishy
from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.queue import DeadlineQueue
from app.scheduling.squishy import Plan, Session
from app.scheduling.types import Batch, DeviceInfo, DropReason, Request

_EPOCH = ("nexus", "epoch")


class _Router:
    """Smooth weighted round-robin (as nginx does) over one model's devices."""

    __slots__ = ("current", "devices", "total", "weights")

    def __init__(self, devices: Sequence[int], weights: Sequence[float], skip: int = 0) -> None:
        if sum(weights) <= 0:
            weights = [1.0] * len(devices)
        self.devices = list(devices)
        self.weights = list(weights)
        self.total = float(sum(weights))
        self.current = [0.0] * len(devices)
        for _ in range(skip):
            self.next()

    def next(self) -> int:
        current, best = self.current, 0
        for i, w in enumerate(self.weights):
            current[i] += w
            if current[i] > current[best]:
                best = i
        current[best] -= self.total
        return self.devices[best]


class NexusScheduler(Scheduler):
    """Nexus: static per-epoch squishy bin packing, per-device round-robin, 2·ℓ(b) ≤ SLO."""

    name = "nexus"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        epoch_s: float = 10.0,
        fill_devices: bool = True,
        frontends: int = 1,
        **kwargs: Any,
    ) -> None:
        if epoch_s <= 0:
            raise ValueError(f"epoch_s must be > 0, got {epoch_s}")
        if frontends < 1:
            raise ValueError(f"frontends must be ≥ 1, got {frontends}")
        kwargs.setdefault("rate_window_s", epoch_s)
        super().__init__(models, devices, **kwargs)
        self.epoch_s = float(epoch_s)
        self.fill_devices = fill_devices
        self.frontends = frontends
        # Devices the plan uses: those up (all, until one fails).
        self._device_ids: list[int] = list(self.devices)
        self._speed = min(d.speed for d in self.devices.values())
        self._sessions: dict[int, tuple[Session, ...]] = {d: () for d in self._device_ids}
        self._dq: dict[int, dict[str, DeadlineQueue]] = {d: {} for d in self._device_ids}
        self._rr: dict[int, int] = dict.fromkeys(self._device_ids, 0)
        self._routers: list[dict[str, _Router]] = []
        self._next_epoch: float | None = None
        self.epochs = 0  # re-plans done
        hints = {m.name: m.expected_rate for m in self.models.values()}
        self.plan: Plan = self._make_plan(hints)
        self._apply(self.plan, None)

    # ------------------------------------------------------------- inspection

    def sessions_on(self, device: int) -> tuple[Session, ...]:
        return self._sessions[device]

    def devices_of(self, model: str) -> tuple[int, ...]:
        return tuple(self._device_ids[i] for i in self.plan.placement[model])

    def queued(self) -> int:
        return sum(len(q) for queues in self._dq.values() for q in queues.values())

    def queued_on(self, device: int, model: str | None = None) -> int:
        queues = self._dq[device]
        if model is not None:
            q = queues.get(model)
            return len(q) if q is not None else 0
        return sum(len(q) for q in queues.values())

    # ------------------------------------------------------------------ hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        if self._next_epoch is None:
            self._next_epoch = now + self.epoch_s
            self.timers.set(_EPOCH, self._next_epoch)
        device = self._route(request)
        if device is not None and not self.batches_on(device):
            self._serve(device, now)

    def _on_device_down(self, device: int, now: float) -> None:
        # Its queued requests were routed to it by the plan: route them again
        # under a plan made for the devices still up.
        orphans: list[Request] = []
        for name, queue in self._dq[device].items():
            orphans.extend(queue)
            self.timers.cancel(("nexus", device, name))
        self._dq[device] = {}
        self._sessions[device] = ()
        self._rr[device] = 0
        self._replan_devices(now)
        self._requeue(orphans, now)

    def _on_device_up(self, device: int, now: float) -> None:
        self._replan_devices(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        for request in requests:
            device = self._route(request)
            if device is not None and not self.batches_on(device):
                self._serve(device, now)

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        self._replan_devices(now)

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        queued: list[Request] = []
        for device, queues in self._dq.items():
            queue = queues.pop(name, None)
            if queue is not None:
                queued.extend(queue)
                self.timers.cancel(("nexus", device, name))
        # the plan without it: the base forgets the model once this returns
        model = self.models.pop(name)
        try:
            self._replan_devices(now)
        finally:
            self.models[name] = model
        return queued

    def _replan_devices(self, now: float) -> None:
        """Re-plan over the devices up now (the epoch's rates, else the hints)."""
        self._device_ids = list(self.devices_up())
        if not self._device_ids or not self.models:
            self._routers = []
            return
        rates: dict[str, float | None] = {m: self.rates[m].rate(now) for m in self.models}
        if not any(rates.values()):
            rates = {m.name: m.expected_rate for m in self.models.values()}
        self.plan = self._make_plan(rates)
        self._apply(self.plan, now)

    def _on_batch_finished(self, batch: Batch, now: float) -> None:
        if batch.device not in self.down:
            self._serve(batch.device, now)

    def _on_timer(self, key: Hashable, now: float) -> None:
        if key == _EPOCH:
            self._replan(now)
            assert self._next_epoch is not None
            at = self._next_epoch + self.epoch_s
            while at <= now:
                at += self.epoch_s
            self._next_epoch = at
            self.timers.set(_EPOCH, at)
            return
        _, device, name = key  # type: ignore[misc]
        if not self.batches_on(device):
            self._serve(device, now)
            self._arm(device, name)
            return
        queue = self._dq[device].get(name)
        if not queue:
            return
        self._drop(self.pop_hopeless(queue, self.models[name], now, device), DropReason.DEADLINE)
        self._arm(device, name)

    # -------------------------------------------------------------- internals

    def _make_plan(self, rates: dict[str, float | None]) -> Plan:
        return squishy.plan(
            list(self.models.values()),
            rates,
            len(self._device_ids),
            speed=self._speed,
            fill=self.fill_devices,
        )

    def _replan(self, now: float) -> None:
        rates: dict[str, float | None] = {m: self.rates[m].rate(now) for m in self.models}
        if not any(rates.values()) or not self._device_ids:
            return
        self.epochs += 1
        self.plan = self._make_plan(rates)
        self._apply(self.plan, now)

    def _apply(self, plan: Plan, now: float | None) -> None:
        """Install `plan`: sessions per device, routers; re-route orphans."""
        orphans: list[Request] = []
        for index, device in enumerate(self._device_ids):
            sessions = plan.devices[index].sessions
            if sessions != self._sessions[device]:
                if [s.model for s in sessions] != [s.model for s in self._sessions[device]]:
                    self._rr[device] = 0
                self._sessions[device] = sessions
            hosted = {s.model for s in sessions}
            queues = self._dq[device]
            for name in list(queues):
                if name not in hosted:
                    orphans.extend(queues.pop(name))
                    self.timers.cancel(("nexus", device, name))
            for name in hosted:
                queues.setdefault(name, DeadlineQueue())
        self._routers = []
        for f in range(self.frontends):
            routers = {}
            for name, indices in plan.placement.items():
                devices = [self._device_ids[i] for i in indices]
                weights = [
                    next(s.rate for s in plan.devices[i].sessions if s.model == name)
                    for i in indices
                ]
                routers[name] = _Router(devices, weights, skip=f)
            self._routers.append(routers)
        for request in orphans:
            self._route(request)
        if now is not None:
            for device in self._device_ids:
                if not self.batches_on(device):
                    self._serve(device, now)

    def _route(self, request: Request) -> int | None:
        """Put `request` on the queue of the device its router picks."""
        if not self._routers:  # every device is down
            self._drop([request], DropReason.NOT_SERVED)
            return None
        router = self._routers[request.id % self.frontends][request.model]
        device = router.next()
        self._dq[device][request.model].add(request)
        self._arm(device, request.model)
        return device

    def _arm(self, device: int, name: str) -> None:
        """Drop timer of a (device, model) queue: at its head's latest start."""
        key = ("nexus", device, name)
        queue = self._dq[device].get(name)
        if not queue:
            self.timers.cancel(key)
            return
        at = self.queue_hopeless_at(queue, self.models[name], device)
        if at is not None:
            self.timers.reset(key, at)

    def _serve(self, device: int, now: float) -> None:
        """Work-conserving round-robin: run the next session that has requests."""
        if self.batches_on(device):
            return
        sessions = self._sessions[device]
        count = len(sessions)
        start = self._rr[device]
        queues = self._dq[device]
        for k in range(count):
            index = (start + k) % count
            session = sessions[index]
            queue = queues[session.model]
            if not queue:
                continue
            model = self.models[session.model]
            # Sliding window: the head must finish in a batch of min(len, b).
            lost = []
            while queue:
                positions = queue.batch(session.batch)
                size = queue.items_of(positions)
                finish = now + self.delay(size) + self.latency(model, size, device)
                if queue.deadline_at(0) >= finish:
                    break
                lost.extend(queue.pop_front(1))
            self._drop(lost, DropReason.DEADLINE)
            if not queue:
                self._arm(device, session.model)
                continue
            self._dispatch(model, queue.pop_positions(positions), device, now + self.delay(size))
            self._rr[device] = (index + 1) % count
            self._arm(device, session.model)
            return
