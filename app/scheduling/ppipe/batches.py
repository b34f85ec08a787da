"""Multi-stage batches and the decisions about them.

A batch of a pooled pipeline runs stage after stage, each on one device
instance of the stage's pool, with a transfer of the intermediate tensor
between consecutive stages (over the sender node's uplink and the receiver
node's downlink at once; none between instances on the same node). The core
plans every step when it dispatches the batch and keeps the plan up to date
from the executors' reports.

Decisions (the driver carries them out, in order):

* `PipelineDispatch(batch, from_stage)` — run `batch.stages[from_stage:]`:
  each transfer from its `transfer_start` and each stage from its `start`
  (or later, when the step before it ends late), one after another. A batch
  already dispatched is dispatched again with `from_stage > 0` or = 0 when a
  device it was to use failed (`device_down`): the driver drops what it
  queued for stages ≥ `from_stage` and runs the new route; the input of
  stage `from_stage` is the output of stage `from_stage − 1`, which the
  driver still holds on that stage's device (or the requests' inputs when
  `from_stage` = 0).
* `PipelineComplete(batch, requests)` — the last stage finished: answer the
  requests with its outputs.
* `StageStart(batch, stage, device, start_at, run)` — hand stage `stage`
  of `batch` to `device` now; it runs from `start_at`, or as soon as the
  device is free after that, reading what the stage before it wrote. Its
  report (`stage_finished`, or `stage_failed`) names `run`. The core hands
  stages over in the order of their reservations and only once their
  input is there (app/scheduling/ppipe/sequencer.py).
* `TransferStart(batch, stage, run)` — move the output of stage `stage − 1`
  to stage `stage`'s node now; report its start and end
  (`transfer_finished`) naming `run`.
* `Drop(requests, reason)` (app/scheduling/types.py) — answer with an error.
  A request of a dispatched batch that can no longer meet its deadline is
  dropped when its next stage is due (`DropReason.DEADLINE`), not served
  late; the rest of its batch goes on without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.scheduling.types import Drop, Request


@dataclass(slots=True)
class StageRun:
    """Where and when one stage of a batch runs, as planned (and corrected
    by reports). `transfer_*` is the transfer of the previous stage's output
    into this one, from node `source_node` to node `node`; None for the
    first stage and between instances on one node."""

    stage: int
    device: int
    node: int
    start: float
    finish: float
    transfer_start: float | None = None
    transfer_finish: float | None = None
    source_node: int | None = None
    done: bool = False  # the executor reported this stage finished


@dataclass(slots=True)
class PipelineBatch:
    id: int
    model: str
    pipeline: int
    requests: list[Request]
    stages: list[StageRun]
    dispatched_at: float

    @property
    def size(self) -> int:
        """Items in the batch (what the stage latencies are indexed by)."""
        return sum(r.items for r in self.requests)

    @property
    def finish_at(self) -> float:
        return self.stages[-1].finish


@dataclass(slots=True)
class PipelineDispatch:
    batch: PipelineBatch
    from_stage: int = 0


@dataclass(slots=True)
class PipelineComplete:
    batch: PipelineBatch
    requests: list[Request]


@dataclass(slots=True)
class StageStart:
    batch: PipelineBatch
    stage: int
    device: int
    start_at: float
    run: int


@dataclass(slots=True)
class TransferStart:
    batch: PipelineBatch
    stage: int
    run: int


PipelineDecision = PipelineDispatch | PipelineComplete | StageStart | TransferStart | Drop
