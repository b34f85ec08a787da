"""What API workers and the scheduler process tell each other.

Every message is one ZeroMQ frame: a pickled tuple whose first element
names its kind. A worker sends

- `("hello",)` once connected: the scheduler answers `("welcome", busy,
  view)`, `busy` the slots its predecessor (a worker killed and started
  again under the same number) still has in flight, per arena;
- `("infer", InferDescriptor)`: a request whose inputs are in the arena;
- `("refused", model, reason, message)`: a request it refused before
  sending (its arena share full), for the model's metrics and statistics;
- `("call", call_id, method, args)`: a service call (statistics, metrics,
  model control), answered `("result", call_id, value, error, view)`;
- `("metric", name, args)`: what it counted itself (an ignored request
  parameter, a refused gRPC call), for the scheduler's metrics.

The scheduler answers each infer descriptor with `("answer", rid, result,
error)` (`result` an InferResult without outputs: the worker reads them
from the slots) and sends `("view", view)` every VIEW_PERIOD_S: the
service's state that the worker's sync routes read (readiness, models,
configs), and the sign the scheduler is alive.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

from app import errors
from app.repository.config import ModelConfig

# How often the scheduler sends its view; a worker that hears nothing for
# SILENCE_S takes the scheduler for gone (it checks its parent too).
VIEW_PERIOD_S = 0.25
SILENCE_S = 5.0


@dataclass(frozen=True, slots=True)
class InferDescriptor:
    """One request, its tensors in `arena`'s `slots` (one per item)."""

    rid: int  # the worker's own number for it
    model: str  # the served model's key (app/repository/config.py: version_key)
    arena: str  # the segment written into
    slots: list[int]
    slo_ms: float | None
    request_id: str | None
    received_at: float | None  # time.monotonic(): one clock for every process
    app: str


@dataclass(frozen=True, slots=True)
class ErrorDescriptor:
    """A ServingError, as its answer needs it: class, message, reason, status."""

    kind: str
    message: str
    reason: str
    status: int

    @classmethod
    def of(cls, exc: errors.ServingError) -> ErrorDescriptor:
        return cls(type(exc).__name__, exc.message, exc.reason, exc.status)

    def error(self) -> errors.ServingError:
        """The error again, of its class where app.errors has it."""
        kind = getattr(errors, self.kind, None)
        if not (isinstance(kind, type) and issubclass(kind, errors.ServingError)):
            kind = errors.ServingError
        exc = kind.__new__(kind)
        errors.ServingError.__init__(exc, self.message)
        exc.reason, exc.status = self.reason, self.status
        return exc


@dataclass
class ServiceView:
    """The service as a worker's sync routes read it (see the module docstring)."""

    configs: dict[str, ModelConfig] = field(default_factory=dict)  # served key → config
    refusals: dict[str, ErrorDescriptor] = field(default_factory=dict)  # key → why not
    model_names: list[str] = field(default_factory=list)
    ready: dict[str, bool] = field(default_factory=dict)
    server_ready: bool = False
    capacity: dict[str, Any] = field(default_factory=dict)
    repository_index: list[dict[str, str]] = field(default_factory=list)
    device_index: list[dict[str, Any]] = field(default_factory=list)
    plan: dict[str, Any] | None = None  # GET /v2/plan's (None: no plan in force)
    arenas: dict[str, dict[str, Any]] = field(default_factory=dict)  # key → arena layout
    shares: dict[str, int] = field(default_factory=dict)  # key → slots per worker
    closing: bool = False


def dump(message: tuple[Any, ...]) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def load(frame: bytes) -> tuple[Any, ...]:
    """A message from a process of this daemon (never from a client)."""
    return pickle.loads(frame)
