"""Plain values that cross the scheduling core's boundary.

Times are seconds on the caller's clock (virtual in the simulator, the event
loop's monotonic clock in the daemon). The core never reads a clock itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(slots=True)
class Request:
    """One inference request as the scheduler sees it."""

    id: int
    model: str
    arrival: float
    deadline: float


class DropReason(str, Enum):
    """Why a request was answered with an error instead of a result."""

    DEADLINE = "deadline"  # cannot finish before its deadline any more
    QUEUE_TIMEOUT = "queue_timeout"  # waited longer than the queue allows (Triton)
    PREEMPTED = "preempted"  # its batch was preempted and it can no longer make it
    OVERLOADED = "overloaded"  # refused at admission
    NOT_SERVED = "not_served"  # no device hosts its model
    DEVICE_FAILED = "device_failed"  # its device failed mid-batch and it cannot make it elsewhere


@dataclass(slots=True)
class Batch:
    """A batch the core sent to a device: it should start at `start_at`."""

    id: int
    model: str
    device: int
    requests: list[Request]
    start_at: float
    finish_at: float  # predicted from the latency profile

    @property
    def size(self) -> int:
        return len(self.requests)


@dataclass(slots=True)
class Dispatch:
    """Run `batch` on `batch.device`, starting at `batch.start_at`."""

    batch: Batch


@dataclass(slots=True)
class Drop:
    """Answer these requests with an error naming `reason`."""

    requests: list[Request]
    reason: DropReason


@dataclass(slots=True)
class Preempt:
    """Stop batch `batch_id` on `device` now; the core already re-queued or
    dropped its requests (see the Drop decisions issued with it)."""

    device: int
    batch_id: int


Decision = Dispatch | Drop | Preempt


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
