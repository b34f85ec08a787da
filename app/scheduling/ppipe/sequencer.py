"""Stage sequencing: when each planned stage and transfer is handed to the
resource that runs it (ppipe.txt §5.4: "each resource executes the work in
the order of its reservations").

The core plans every stage and transfer of a batch when it dispatches it
(`StageRun`: device, reserved start, and the transfer into it). This part
keeps, per device instance and per node link, the work planned on it in the
order of the reserved starts, and hands each piece over once

* its input is there: the batch's own inputs for its first stage; the
  previous stage's output (its report, plus the pipeline's hand-over
  `handoff_s`) or the transfer's end for the others; the previous stage's
  report for a transfer;
* its time has come: `lead` before its reserved start (a live executor
  holds it until that start, so that the hand-over's own delay is hidden;
  0 in the simulator, whose devices take work at once; a transfer too);
* the resource can take it: a device holds at most `hold` runs handed
  over and not reported yet (a live executor runs one and has the next in
  its inbox; an emulated device of the simulator holds one); a link carries
  one transfer at a time, and a transfer needs the sender's uplink and the
  receiver's downlink together, at the head of both.

Each handed-over piece has a run id; a report names it. Re-planning a batch
(a device failed) replaces its pieces from the re-planned stage on with a
new generation: what was handed out for the old route is stale, and so are
its reports. Everything is sans-IO: time comes in, runs come out.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from app.scheduling.ppipe.batches import PipelineBatch
from app.scheduling.ppipe.layout import Layout

_INF = math.inf

# Runs a live executor holds at once: the one it runs and the next, in its
# inbox (app/server/pipeline_driver.py says why).
LIVE_HOLD = 2


# (factor, margin s): a live instance whose oldest stage has not reported 4 ×
# its planned time + 0.1 s after it could start is routed around (policy.py,
# "Overdue instances"), well before the pool's heartbeat timeout.
LIVE_OVERDUE = (4.0, 0.1)


def live_lead(layout: Layout) -> float:
    """How long before its reserved start a live executor is handed a stage:
    half the shortest stage of the layout at batch 1, at most 1 ms — shorter
    than any stage, so that no batch reserved later fits before it."""
    shortest = min(s.latency[0] for p in layout.pipelines for s in p.stages)
    return min(0.001, 0.5 * shortest)


@dataclass(frozen=True, slots=True)
class Handed:
    """A piece of work handed over: stage `stage` of batch `batch_id` on
    `device`, or the transfer into it over `link` (uplink node, downlink
    node; `device` is −1), as run `run`."""

    run: int
    batch_id: int
    stage: int
    device: int
    link: tuple[int, int] | None = None


@dataclass(slots=True)
class _Resource:
    # (reserved start, batch id, stage, generation) of the work planned on it
    queue: list[tuple[float, int, int, int]]
    held: int = 0  # runs handed over and not reported yet
    wake: float = _INF  # when its head becomes due (if it waits for its time)


class StageSequencer:
    """Hands a core's planned stages and transfers to the devices and links
    (see the module docstring)."""

    def __init__(self, devices: int, nodes: int, *, lead: float, hold: int) -> None:
        if not (0.0 <= lead < _INF):
            raise ValueError(f"lead must be a finite number ≥ 0, got {lead}")
        if hold < 1:
            raise ValueError(f"hold must be ≥ 1, got {hold}")
        self.lead = lead
        self.hold = hold
        self._devices = [_Resource([]) for _ in range(devices)]
        self._uplinks = [_Resource([]) for _ in range(nodes)]
        self._downlinks = [_Resource([]) for _ in range(nodes)]
        self._gen: dict[tuple[int, int], int] = {}
        self._input_at: dict[tuple[int, int], float] = {}  # a stage's input is there from
        self._data_at: dict[tuple[int, int], float] = {}  # a transfer's data is there from
        self._runs: dict[int, Handed] = {}  # handed over, not reported
        self._current: dict[tuple[int, int], int] = {}  # (batch, stage) → its live run
        self._link_wakes: dict[tuple[int, int], float] = {}  # (up, down) → due
        self._links: dict[tuple[int, int], tuple[int, int]] = {}  # (batch, stage) → (up, down)
        self._next_run = 1

    # ------------------------------------------------------------- planning

    def plan(self, batch: PipelineBatch, first: int, now: float) -> None:
        """Queue `batch.stages[first:]` (a new route for them); the input
        of stage `first` is there now."""
        for run in batch.stages[first:]:
            key = (batch.id, run.stage)
            gen = self._gen.get(key, 0) + 1
            self._gen[key] = gen
            self._input_at.pop(key, None)
            self._data_at.pop(key, None)
            self._current.pop(key, None)
            job = (run.start, batch.id, run.stage, gen)
            heapq.heappush(self._devices[run.device].queue, job)
            if run.source_node is not None:
                assert run.transfer_start is not None
                job = (run.transfer_start, batch.id, run.stage, gen)
                heapq.heappush(self._uplinks[run.source_node].queue, job)
                heapq.heappush(self._downlinks[run.node].queue, job)
                self._links[key] = (run.source_node, run.node)
        head = batch.stages[first]
        if head.source_node is None:
            self._input_at[(batch.id, first)] = now
        else:
            self._data_at[(batch.id, first)] = now

    def forget(self, batch: PipelineBatch) -> None:
        """The batch is over (completed, dropped): its queued work is stale."""
        for k in range(len(batch.stages)):
            key = (batch.id, k)
            self._gen.pop(key, None)
            self._input_at.pop(key, None)
            self._data_at.pop(key, None)
            self._current.pop(key, None)
            self._links.pop(key, None)

    # ------------------------------------------------------------- reports

    def reported(self, run: int) -> tuple[Handed | None, bool]:
        """Run `run` reported: the resource that held it is free of it.
        Returns what it was (None if unknown) and whether it is still the
        live run of its piece (not of a route replaced since)."""
        handed = self._runs.pop(run, None)
        if handed is None:
            return None, False
        if handed.link is not None:
            up, down = handed.link
            self._uplinks[up].held = self._downlinks[down].held = 0
        else:
            resource = self._devices[handed.device]
            resource.held = max(0, resource.held - 1)
        key = (handed.batch_id, handed.stage)
        if self._current.get(key) != run:
            return handed, False
        del self._current[key]
        return handed, True

    def stage_done(self, batch: PipelineBatch, stage: int, finished: float, handoff: float) -> None:
        """Stage `stage` ended at `finished`: the next one's input (or its
        transfer's data) is there."""
        if stage + 1 >= len(batch.stages):
            return
        nxt = batch.stages[stage + 1]
        key = (batch.id, stage + 1)
        if nxt.source_node is None:
            self._input_at[key] = finished + handoff
        else:
            self._data_at[key] = finished

    def transfer_done(self, batch_id: int, stage: int, finished: float, handoff: float) -> None:
        """The transfer into stage `stage` ended: its input is there."""
        self._input_at[(batch_id, stage)] = finished + handoff

    def current_run(self, batch_id: int, stage: int) -> int | None:
        """The run of the piece's live route handed over, if any."""
        return self._current.get((batch_id, stage))

    def device_down(self, device: int) -> None:
        """What the device held or had queued is lost (the core re-routes
        its batches, which queues them anew)."""
        self._devices[device] = _Resource([])
        for run, handed in list(self._runs.items()):
            if handed.device == device:
                del self._runs[run]
                self._current.pop((handed.batch_id, handed.stage), None)

    # ------------------------------------------------------------- handing over

    def next_device_work(self, device: int, now: float) -> tuple[int, int, float] | None:
        """The device's next piece, if it may be handed over now: (batch id,
        stage, its start: the reserved one, or later when its input comes
        later). None when there is none, it waits for its input, or for its
        time (then `next_due` includes it), or the device holds enough."""
        resource = self._devices[device]
        if resource.held >= self.hold:
            return None
        queue = resource.queue
        while queue and not self._live(queue[0]):
            heapq.heappop(queue)
        if not queue:
            resource.wake = _INF
            return None
        start, batch_id, stage, _ = queue[0]
        input_at = self._input_at.get((batch_id, stage))
        if input_at is None:
            resource.wake = _INF
            return None
        start_at = max(start, input_at)
        due = max(start - self.lead, input_at)
        if due > now:
            resource.wake = due
            return None
        resource.wake = _INF
        return batch_id, stage, start_at

    def skip_device_work(self, device: int) -> None:
        """Drop the device's head piece (its batch was given up)."""
        heapq.heappop(self._devices[device].queue)

    def hand_device_work(self, device: int) -> Handed:
        """Hand the device's head piece over (after `next_device_work`)."""
        resource = self._devices[device]
        _, batch_id, stage, _ = heapq.heappop(resource.queue)
        resource.held += 1
        return self._handed(batch_id, stage, device)

    def next_transfer(self, up: int, down: int, now: float) -> tuple[int, int] | None:
        """The transfer at the head of both links, if it may start now:
        (batch id, stage it feeds)."""
        uplink, downlink = self._uplinks[up], self._downlinks[down]
        if uplink.held or downlink.held:
            return None
        for queue in (uplink.queue, downlink.queue):
            while queue and not self._live(queue[0]):
                heapq.heappop(queue)
        if not uplink.queue or not downlink.queue or uplink.queue[0] != downlink.queue[0]:
            return None
        planned, batch_id, stage, _ = uplink.queue[0]
        if (batch_id, stage) not in self._data_at:
            return None
        if planned - self.lead > now:
            self._link_wakes[(up, down)] = planned - self.lead
            return None
        self._link_wakes.pop((up, down), None)
        heapq.heappop(uplink.queue)
        heapq.heappop(downlink.queue)
        uplink.held = downlink.held = 1
        return batch_id, stage

    def hand_transfer(self, batch_id: int, stage: int) -> Handed:
        """Hand the transfer `next_transfer` found over."""
        return self._handed(batch_id, stage, -1, self._links[(batch_id, stage)])

    def link_pairs(self, up: int, down: int) -> list[tuple[int, int]]:
        """The (uplink, downlink) pairs worth trying once `up` and `down`
        are free: the transfers now at the head of each may pair with
        another link."""
        pairs: list[tuple[int, int]] = []
        for queue in (self._uplinks[up].queue, self._downlinks[down].queue):
            while queue and not self._live(queue[0]):
                heapq.heappop(queue)
            if queue:
                pairs.append(self._links[(queue[0][1], queue[0][2])])
        return pairs

    def device_due(self, device: int) -> float:
        return self._devices[device].wake

    def due_devices(self, now: float) -> list[int]:
        return [d for d, r in enumerate(self._devices) if r.wake <= now]

    def due_links(self, now: float) -> list[tuple[int, int]]:
        due = [pair for pair, at in self._link_wakes.items() if at <= now]
        for pair in due:
            del self._link_wakes[pair]
        return due

    def next_due(self) -> float | None:
        """The earliest time a piece waits for."""
        wake = min((r.wake for r in self._devices), default=_INF)
        if self._link_wakes:
            wake = min(wake, min(self._link_wakes.values()))
        return wake if wake < _INF else None

    def held_by(self, device: int) -> list[Handed]:
        return [h for h in self._runs.values() if h.device == device]

    # ------------------------------------------------------------- plumbing

    def _live(self, job: tuple[float, int, int, int]) -> bool:
        _, batch_id, stage, gen = job
        return self._gen.get((batch_id, stage)) == gen

    def _handed(
        self, batch_id: int, stage: int, device: int, link: tuple[int, int] | None = None
    ) -> Handed:
        run = self._next_run
        self._next_run += 1
        handed = Handed(run, batch_id, stage, device, link)
        self._runs[run] = handed
        self._current[(batch_id, stage)] = run
        return handed
