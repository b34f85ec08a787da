"""What the executor pool tells its owner, as typed events.

The pool posts them on the event loop's thread, in the order things
happened: a batch finished or stopped, a device went down (its executor died
or hung) or came back or got a new share, a sampled request was re-run alone (or that re-run
was stopped). The owner (the dispatcher) queues them and handles
each after it has carried out the decisions in hand, never re-entrantly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchFinished:
    """Batch `batch_id` ran to its end on `device` (`error`: it failed, or
    never ran because its executor was gone or stopped)."""

    device: int
    batch_id: int
    started_at: float
    finished_at: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BatchStopped:
    """A preempted batch stopped on `device` at `at` without finishing."""

    device: int
    batch_id: int
    at: float


@dataclass(frozen=True, slots=True)
class DeviceDown:
    """`device` is out of service: its executor died or hung (`reason`).
    Its batches in flight are lost; BatchFinished events with an error
    follow for them."""

    device: int
    reason: str


@dataclass(frozen=True, slots=True)
class DeviceUp:
    """`device` serves again (a respawned executor loaded its models),
    `seconds_down` after it failed."""

    device: int
    seconds_down: float


@dataclass(frozen=True, slots=True)
class AloneTimed:
    """A sampled request of `model` from application `app` (`items` rows)
    ran alone on `device` in `seconds`: the asynchronous profiler's
    measurement (app/runtime/alone_profiler.py). `dropped`: samples the
    executor dropped from its full backlog since its previous report."""

    device: int
    model: str
    app: str
    items: int
    seconds: float
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class AloneStopped:
    """A sampled request's re-run on `device` was stopped because a batch
    (or another message) arrived, and its time discarded; `dropped` as in
    AloneTimed."""

    device: int
    model: str
    app: str
    items: int
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class DeviceReshared:
    """The device's executor was replaced by one at `new_share` (a reshare,
    app/runtime/pool_reshare.py): batches sent from now on run about
    `speed_ratio` times as fast as on the old one; those the old one holds
    finish there."""

    device: int
    old_share: float
    new_share: float
    speed_ratio: float


@dataclass(frozen=True, slots=True)
class DeviceParked:
    """The device's executor is being stopped on purpose (autoscaling): plan
    nothing more on it. Not a fault: no restart follows."""

    device: int


@dataclass(frozen=True, slots=True)
class DeviceUnparked:
    """A parked device's executor was started again and serves; its start
    took `start_s`."""

    device: int
    start_s: float


ExecutorEvent = (
    BatchFinished
    | BatchStopped
    | DeviceDown
    | DeviceUp
    | DeviceReshared
    | DeviceParked
    | DeviceUnparked
    | AloneTimed
    | AloneStopped
)
EventSink = Callable[[ExecutorEvent], None]
