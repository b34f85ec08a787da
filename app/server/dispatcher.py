"""The live driver of the scheduling core — Symphony's RankThread as a coroutine.

The core is sans-IO: this module feeds it the monotonic clock
(`time.monotonic()`, the same CLOCK_MONOTONIC the executor processes report in),
arms one timer for the core's next wakeup (a timerfd on Linux: uvloop's own
timers fire up to a millisecond early or late; app/server/timerfd.py), and
carries out its decisions: a Dispatch goes to the executor of that device
(which runs it as soon as the device is free; see `timer_lead_s`), a Drop
fails the requests' futures with the reason, and a finished batch resolves its requests' futures
with their outputs, read from their shared-memory slots.

Symphony partitions models into sub-clusters of devices that load the same
models (symphony.txt §4.1); likewise one core runs per *device group*: the
devices that host exactly the same set of models.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.errors import Dropped, ExecutorFailed, ShuttingDown
from app.scheduling.base import Scheduler
from app.scheduling.types import Batch, Dispatch, Drop, DropReason, Preempt, Request
from app.server.timerfd import Timer, make_timer

log = logging.getLogger(__name__)

# submit(device_id, batch_id, model, slots, start_at)
Submit = Callable[[int, int, str, list[int], float], None]
# cancel(device_id, batch_id) -> False when the batch is not in flight there
# (it already reported, or its executor is gone): nothing more will touch its
# slots. Anything else means "a done report will follow".
Cancel = Callable[[int, int], "bool | None"]


@dataclass
class Pending:
    """A request accepted and not yet answered."""

    request: Request
    slot: int
    future: asyncio.Future
    batch: Batch | None = None


@dataclass
class Finished:
    """What the dispatcher tells the service about one request's batch."""

    batch: Batch
    started_at: float
    finished_at: float
    error: str | None


@dataclass
class Stopping:
    """A preempted batch whose executor has not confirmed the stop yet.

    Until it reports, the executor may still gather from or scatter into its
    requests' slots. `parked`: later batches holding some of those requests
    that must wait for the report; `drops`: drop answers held back for it."""

    batch: Batch
    parked: list[tuple[CoreGroup, Batch]] = field(default_factory=list)
    drops: list[tuple[Request, Exception]] = field(default_factory=list)


@dataclass
class CoreGroup:
    """One scheduling core and the devices and models it owns."""

    scheduler: Scheduler
    models: frozenset[str]
    devices: tuple[int, ...]
    wakeup: Timer | None = None  # made on first use, on the running loop
    wake_at: float | None = None  # what `wakeup` is armed for (None: disarmed)
    batches: dict[int, Batch] = field(default_factory=dict)


class Dispatcher:
    """`deadline_margin_s`: the core plans to finish this much before each
    request's real deadline. Live timers fire late (event-loop latency), a
    batch crosses a pipe and is gathered from shared memory; Symphony's
    frontrun rule leaves only ℓ(b+1) − ℓ(b) = α of slack, less than that
    jitter for small models, so without a margin on-time requests would be
    pruned at the last moment."""

    def __init__(
        self,
        groups: list[CoreGroup],
        submit: Submit,
        deadline_margin_s: float = 0.0,
        timer_lead_s: float = 0.002,
        cancel: Cancel | None = None,
    ) -> None:
        self.deadline_margin_s = deadline_margin_s
        # Wake `timer_lead_s` before the core's next timer and advance the
        # core to that timer's time: a timer fires late by up to a few ms
        # under load, and a batch decided at `exec_at` must not be pruned for
        # lateness the core cannot see. Its start time is then up to the lead
        # in the future. The batch is formed already, so holding it on an
        # idle device would only waste the lead: the executor is told it may
        # start that much earlier, and the batch finishes up to the lead
        # before the core's plan — slack for the answer's way back. (Live,
        # at 800 r/s on workload (a), late or dropped 1.6–1.8 % → 0.8 %.)
        # Forming batches this early costs batch size: the simulator models
        # it with `--dispatch-lead-ms` (app/simulation/run.py ServingPath).
        self.timer_lead_s = timer_lead_s
        self._clock = float("-inf")  # the core's time: never goes backwards
        self.groups = groups
        self._by_model = {model: group for group in groups for model in group.models}
        self._submit = submit
        # None: batches cannot be stopped; a preempted one runs to its end.
        self._cancel = cancel
        # Preempted batches not yet confirmed stopped, by (device, batch id):
        # batch ids are per core, so only unique per device.
        self.stopping: dict[tuple[int, int], Stopping] = {}
        # Request id → the stopping batch that may still touch its slot.
        self._held: dict[int, tuple[int, int]] = {}
        # Parked batches (not submitted yet) → the stopping batches they wait for.
        self._parked: dict[tuple[int, int], set[tuple[int, int]]] = {}
        self._ids = itertools.count(1)
        self.pending: dict[int, Pending] = {}
        self.closing = False
        # Batches of failed devices: the core re-planned their requests, so
        # the executor pool's failure report for them is expected and ignored.
        self._forgotten: set[tuple[int, int]] = set()

    def group_of(self, model: str) -> CoreGroup | None:
        return self._by_model.get(model)

    # ---------------------------------------------------------------- intake

    def submit_request(
        self, model: str, slot: int, slo_s: float, *, received_at: float | None = None
    ) -> Pending:
        """Hand a request (inputs already in `slot`) to its core; the caller
        awaits `pending.future` for a `Finished` or an error. Its arrival, and
        so its deadline, is `received_at` (monotonic) when given: the time
        its bytes reached the server, before parsing (app/api/received.py)."""
        if self.closing:
            raise ShuttingDown("server is shutting down")
        loop = asyncio.get_running_loop()
        group = self._by_model[model]
        now = self._now()
        arrival = now if received_at is None else min(received_at, now)
        request = Request(next(self._ids), model, arrival, arrival + slo_s - self.deadline_margin_s)
        pending = Pending(request, slot, loop.create_future())
        self.pending[request.id] = pending
        self._apply(group, group.scheduler.add_request(request, now))
        self._rearm(group)
        return pending

    # ------------------------------------------------------ executor replies

    def batch_done(
        self, device: int, batch_id: int, started_at: float, finished_at: float, error: str | None
    ) -> Batch | None:
        """Called on the event loop when an executor reports a batch; returns
        the batch, or None for one the core no longer tracks (preempted)."""
        if (device, batch_id) in self.stopping:
            # The report of a preempted batch ("cancelled", or done if the
            # stop lost the race): its requests were re-queued or dropped by
            # the core already, so it answers nobody and the core is not told.
            self._stop_confirmed((device, batch_id))
            return None
        # Batch ids are numbered per core: look in the core that owns the device.
        group = self._group_of_device(device)
        batch = group.batches.pop(batch_id, None) if group is not None else None
        if group is None or batch is None:
            if (device, batch_id) in self._forgotten:
                self._forgotten.discard((device, batch_id))
            else:
                log.warning("device %d reported unknown batch %d", device, batch_id)
            return None
        finished = Finished(batch, started_at, finished_at, error)
        for request in batch.requests:
            pending = self.pending.pop(request.id, None)
            if pending is not None and not pending.future.done():
                pending.future.set_result(finished)
        now = self._now()
        self._apply(group, group.scheduler.batch_finished(device, batch_id, now))
        self._rearm(group)
        return batch

    # ---------------------------------------------------------- device faults

    def device_down(self, device: int) -> None:
        """The executor of `device` died or hung: its core re-queues or drops
        the requests of the batches it had there (answered exactly once, by
        their next batch or a Drop), and sends it nothing until `device_up`."""
        group = self._group_of_device(device)
        if group is None:
            return
        for batch_id, batch in list(group.batches.items()):
            if batch.device == device:
                del group.batches[batch_id]
                self._forgotten.add((device, batch_id))
        self._apply(group, group.scheduler.device_down(device, self._now()))
        self._rearm(group)

    def device_up(self, device: int) -> None:
        group = self._group_of_device(device)
        if group is None:
            return
        self._apply(group, group.scheduler.device_up(device, self._now()))
        self._rearm(group)

    def _group_of_device(self, device: int) -> CoreGroup | None:
        return next((g for g in self.groups if device in g.devices), None)

    # ------------------------------------------------------------- decisions

    def _apply(self, group: CoreGroup, decisions: list) -> None:
        for decision in decisions:
            if isinstance(decision, Dispatch):
                batch = decision.batch
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "dispatch batch %d: %s ×%d on device %d at %+.1f ms",
                        batch.id,
                        batch.model,
                        batch.size,
                        batch.device,
                        (batch.start_at - time.monotonic()) * 1000,
                    )
                if batch.id not in group.scheduler.in_flight:
                    # Its device failed while these decisions were carried
                    # out (device_down, re-entered from a failed submit): the
                    # core has re-planned the requests already.
                    continue
                group.batches[batch.id] = batch
                if self._park(group, batch):
                    continue
                slots = []
                for request in batch.requests:
                    pending = self.pending[request.id]
                    pending.batch = batch
                    slots.append(pending.slot)
                try:
                    start_at = batch.start_at - self.timer_lead_s
                    self._submit(batch.device, batch.id, batch.model, slots, start_at)
                except Exception as exc:  # the executor is gone: answer, do not hang
                    log.error("submit to device %d failed: %s", batch.device, exc)
                    if group.batches.pop(batch.id, None) is None:
                        continue  # device_down ran meanwhile and re-planned them
                    self._fail(batch.requests, ExecutorFailed(f"device {batch.device}: {exc}"))
            elif isinstance(decision, Drop):
                if log.isEnabledFor(logging.DEBUG):
                    now = time.monotonic()
                    log.debug(
                        "drop %d (%s): deadlines in %s ms",
                        len(decision.requests),
                        decision.reason.value,
                        [round((r.deadline - now) * 1000, 1) for r in decision.requests[:5]],
                    )
                error_reason = decision.reason.value
                message = _DROP_MESSAGES.get(decision.reason, "request dropped")
                error = Dropped(message, error_reason)
                self._fail(self._hold_back(decision.requests, error), error)
            elif isinstance(decision, Preempt):
                self._preempt(group, decision.device, decision.batch_id)

    # ------------------------------------------------------------ preemption
    #
    # The core re-queued or dropped a preempted batch's requests the moment it
    # decided to preempt, but the executor stops it a little later (at its
    # next exit point) and may even finish it. Until its report arrives it
    # may read the requests' input slots and write their output slots. So a
    # request of a stopping batch is not answered, and not sent to another
    # device, before that report: a drop is held back, and a batch holding
    # such requests for another device is parked and submitted then. (On the
    # same device it is submitted at once: an executor runs its messages in
    # order, so the new batch starts only after the old one has stopped.)
    # Answering a dropped request early would free its slot for a new request
    # the old batch could still overwrite; running a re-queued one elsewhere
    # early would let the old batch overwrite its fresh outputs. The wait is
    # the preemption delay — milliseconds (BENCHMARKS.md, "Preemption").

    def _preempt(self, group: CoreGroup, device: int, batch_id: int) -> None:
        key = (device, batch_id)
        batch = group.batches.pop(batch_id, None)
        if batch is None:
            return  # already reported: nothing is running
        if self._parked.pop(key, None) is not None:
            # Never submitted: nothing to stop; its requests keep the holds
            # they had (the core re-queued or dropped them).
            for stopping in self.stopping.values():
                stopping.parked = [(g, b) for g, b in stopping.parked if b is not batch]
            return
        self.stopping[key] = Stopping(batch)
        for request in batch.requests:
            self._held[request.id] = key
        stopped = False
        if self._cancel is not None:
            try:
                stopped = self._cancel(device, batch_id) is False
            except Exception as exc:  # the executor is gone: its report comes as failed
                log.warning("cancel of batch %d on device %d failed: %s", batch_id, device, exc)
        if stopped:
            self._stop_confirmed(key)

    def _hold_back(self, requests: list[Request], error: Exception) -> list[Request]:
        """The requests that may be answered now; the others wait for their
        stopping batch's report."""
        if not self._held:
            return requests
        now = []
        for request in requests:
            key = self._held.get(request.id)
            if key is None:
                now.append(request)
            else:
                self.stopping[key].drops.append((request, error))
        return now

    def _park(self, group: CoreGroup, batch: Batch) -> bool:
        """Park `batch` if a request of it is held by a batch stopping on
        another device; True when parked."""
        if not self._held:
            return False
        waits = set()
        for request in batch.requests:
            key = self._held.get(request.id)
            if key is not None and key[0] != batch.device:
                waits.add(key)
        if not waits:
            return False
        self._parked[(batch.device, batch.id)] = waits
        for key in waits:
            self.stopping[key].parked.append((group, batch))
        return True

    def _stop_confirmed(self, key: tuple[int, int]) -> None:
        stopping = self.stopping.pop(key)
        for request in stopping.batch.requests:
            if self._held.get(request.id) == key:
                del self._held[request.id]
        for request, error in stopping.drops:
            self._fail([request], error)
        for group, batch in stopping.parked:
            waits = self._parked.get((batch.device, batch.id))
            if waits is None:
                continue
            waits.discard(key)
            if not waits:
                del self._parked[(batch.device, batch.id)]
                if self.closing:
                    continue  # fail_all answered its requests already
                # Submitted late by the stop delay; a start time in the past
                # means "at once" to the executor.
                self._apply(group, [Dispatch(batch)])

    def _fail(self, requests: list[Request], error: Exception) -> None:
        for request in requests:
            pending = self.pending.pop(request.id, None)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(error)

    def _rearm(self, group: CoreGroup) -> None:
        wake_at = group.scheduler.next_wakeup()
        if wake_at == group.wake_at:
            return
        group.wake_at = wake_at
        if wake_at is None:
            if group.wakeup is not None:
                group.wakeup.cancel()
            return
        if group.wakeup is None:
            group.wakeup = make_timer(asyncio.get_running_loop())
        group.wakeup.call_at(wake_at - self.timer_lead_s, self._on_wakeup, group)

    def _on_wakeup(self, group: CoreGroup) -> None:
        due = group.wake_at
        group.wake_at = None
        now = self._now(at_least=due)
        self._apply(group, group.scheduler.advance(now))
        self._rearm(group)

    def _now(self, at_least: float | None = None) -> float:
        """The monotonic clock (the one executors report in), never earlier
        than a time already given to a core."""
        now = time.monotonic()
        if at_least is not None and at_least > now:
            now = at_least
        if now < self._clock:
            now = self._clock
        self._clock = now
        return now

    # -------------------------------------------------------------- shutdown

    def fail_all(self, error: Exception) -> int:
        """Answer every request still waiting with `error`; return how many."""
        self.closing = True
        waiting = [p.request for p in self.pending.values()]
        self._fail(waiting, error)
        for group in self.groups:
            if group.wakeup is not None:
                group.wakeup.close()
                group.wakeup = None
            group.wake_at = None
        return len(waiting)


_DROP_MESSAGES = {
    DropReason.DEADLINE: "dropped: the deadline cannot be met",
    DropReason.QUEUE_TIMEOUT: "dropped: waited longer than the queue timeout",
    DropReason.PREEMPTED: "dropped: preempted and the deadline can no longer be met",
    DropReason.OVERLOADED: "dropped: server overloaded",
    DropReason.NOT_SERVED: "dropped: no device serves this model",
    DropReason.DEVICE_FAILED: "dropped: its device failed and the deadline can no longer be met",
}
