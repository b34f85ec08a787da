"""Plain values that cross the scheduling core's boundary.

Times are seconds on the caller's clock (virtual in the simulator, the event
loop's monotonic clock in the daemon). The core never reads a clock itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(slots=True)
class Request:
    """One inference request as the scheduler sees it.

    `deadline` is where its SLO ends: the answer is judged against it.
    `due` is the deadline the core plans with — `deadline` less the core's
    deadline margin, set by the core when the request is admitted (until
    then equal to `deadline`).

    `items` is the request's batch dimension: how many rows it carries. The
    core counts items wherever it sizes a batch (ℓ(b) is per item, batch
    caps are in items) and never splits a request across batches.

    `app` is the application the request comes from: requests of one
    application to one model share an execution-time distribution (orloj.txt
    §3, per-application tracking). "" is the model's default application."""

    id: int
    model: str
    arrival: float
    deadline: float
    items: int = 1
    app: str = ""
    due: float = field(init=False, repr=False, compare=False)

    # Written out (the dataclass keeps it) rather than generated with a
    # __post_init__: one call instead of two, once per request.
    def __init__(
        self,
        id: int,
        model: str,
        arrival: float,
        deadline: float,
        items: int = 1,
        app: str = "",
    ) -> None:
        if items < 1:
            raise ValueError(f"request {id}: items must be ≥ 1, got {items}")
        self.id = id
        self.model = model
        self.arrival = arrival
        self.deadline = deadline
        self.items = items
        self.app = app
        self.due = deadline


class DropReason(str, Enum):
    """Why a request was answered with an error instead of a result."""

    DEADLINE = "deadline"  # cannot finish before its deadline any more (never split)
    QUEUE_TIMEOUT = "queue_timeout"  # waited longer than the queue allows (Triton)
    PREEMPTED = "preempted"  # its batch was preempted and it can no longer make it
    OVERLOADED = "overloaded"  # refused at admission
    NOT_SERVED = "not_served"  # no device hosts its model
    DEVICE_FAILED = "device_failed"  # its device failed mid-batch and it cannot make it elsewhere
    UNLOADED = "unloaded"  # its model was unloaded before it ran


@dataclass(slots=True)
class Batch:
    """A batch the core sent to a device.

    `start_at` is the start the core planned, `finish_at` the end it
    predicts from the latency profile. The device may begin it from
    `release_at` (the planned start less the core's timer lead, see
    `Scheduler`), or as soon as it is free after that."""

    id: int
    model: str
    device: int
    requests: list[Request]
    start_at: float
    finish_at: float
    release_at: float

    @property
    def size(self) -> int:
        """Items in the batch (the sum of its requests' items): what ℓ(b)
        and every batch cap count. `len(batch.requests)` counts requests."""
        return sum(r.items for r in self.requests)


@dataclass(slots=True)
class Dispatch:
    """Run `batch` on `batch.device`: from `batch.release_at`, after the
    batches sent to that device before it (a device runs its batches in
    order)."""

    batch: Batch


@dataclass(slots=True)
class Complete:
    """`batch` ran to its end: answer `requests` (the batch's requests, or
    those of a preempted batch that were still held when it finished first)
    with its outputs."""

    batch: Batch
    requests: list[Request]


@dataclass(slots=True)
class Drop:
    """Answer these requests with an error naming `reason`."""

    requests: list[Request]
    reason: DropReason


@dataclass(slots=True)
class Preempt:
    """Stop batch `batch_id` on `device` now. The core holds its requests
    until the driver confirms the stop (`Scheduler.batch_stopped`, or
    `batch_finished` if the batch ended first). `model` and `requests` say
    what was stopped (the daemon counts preemptions per model)."""

    device: int
    batch_id: int
    model: str = ""
    requests: int = 0


Decision = Dispatch | Complete | Drop | Preempt


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A device the core may send batches to. `speed` divides profile latency
    (2.0 runs batches twice as fast as the profile says)."""

    id: int
    name: str = ""
    speed: float = 1.0
    kind: str = "emulated"


@dataclass(slots=True)
class AutoscaleSignals:
    """Symphony's autoscaling signals (symphony.txt §4.4) over a window."""

    window_s: float
    finished_good: int = 0
    finished_late: int = 0
    dropped: int = 0
    bad_rate: float = 0.0
    idle_fraction: float = 0.0
    advised_device_change: int = 0
    per_device_busy: dict[int, float] = field(default_factory=dict)
