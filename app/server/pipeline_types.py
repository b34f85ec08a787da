"""The plain values of the live `ppipe` driver (app/server/pipeline_driver.py):
where stages run, a model served as a pipeline, a request's answer, and
what the driver counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from app.runtime.arena import Arena


class StageExecutors(Protocol):
    """Where stages run (`app.runtime.pool.ExecutorPool`): device ids are
    the layout's instance ids."""

    def submit(
        self, device_id: int, batch_id: int, model: str, slots: Sequence[int], start_at: float
    ) -> None:
        """Queue a run of partition `model` on the device; raises when it
        cannot take it. Exactly one BatchFinished (or BatchStopped) follows
        a run it took."""
        ...


@dataclass(frozen=True)
class PipelineModel:
    """A model served as a pipeline: its arena (the daemon's view: the
    model's inputs and outputs, `create_pipeline_arena`) and the name of
    the partition model the executors loaded for each block range."""

    name: str
    arena: Arena
    partitions: Mapping[tuple[int, int], str]


@dataclass(frozen=True)
class PipelineAnswer:
    """What a request gets: its outputs, and where its batch ran."""

    outputs: dict[str, np.ndarray]
    batch_id: int
    batch_size: int
    pipeline: int
    devices: tuple[int, ...]  # the instance of each stage, in order
    started_at: float  # its first stage's start, as its executor reported it
    finished_at: float


@dataclass
class DriverCounts:
    """What happened, for benchmarks and metrics."""

    submitted: int = 0
    answered: int = 0
    failed: int = 0  # answered with an error (drops included)
    dropped: dict[str, int] = field(default_factory=dict)  # by DropReason value
    dispatched: int = 0
    rerouted: int = 0  # batches dispatched again after a device failed
    stage_runs: int = 0
    stage_errors: int = 0
    overdue: int = 0  # instances routed around for an overdue stage (before the heartbeat)
    # Per "pipeline.stage" of the completed batches: their stages' time, as
    # the executors reported it, and how many (mean = seconds / batches).
    stage_seconds: dict[str, float] = field(default_factory=dict)
    stage_batches: dict[str, int] = field(default_factory=dict)
    # ...and the sums of each one's time ÷ its planned time, and of that
    # squared (the spread of stage times: a simulator's jitter)
    stage_ratio_sum: dict[str, float] = field(default_factory=dict)
    stage_ratio_squares: dict[str, float] = field(default_factory=dict)
    # ...and between a stage's end and the next one's start (the hand-over
    # through the driver, plus any wait for the instance or its reservation)
    handoff_seconds: float = 0.0
    handoffs: int = 0
