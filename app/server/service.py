"""What the HTTP layer needs from the server (implemented by the dispatcher)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.errors import InvalidInput
from app.repository.config import ModelConfig


@dataclass
class InferResult:
    model: str
    request_id: str | None
    outputs: dict[str, np.ndarray]  # each with the request's batch dimension (n, ...)
    queue_ms: float  # arrival → batch start
    exec_ms: float  # batch execution
    batch_size: int  # size of the batch it ran in, in items
    device: str
    intake_ms: float = 0.0  # arrival → the scheduler saw it (parsing, event loop)
    answer_ms: float = 0.0  # batch end → answer ready (report, outputs read)
    app: str = ""  # the request's application ("": the model's default)

    def timing(self) -> dict[str, Any]:
        """Where the request's time went: the `timing` object of an answer."""
        return {
            "queue_ms": float(self.queue_ms),
            "exec_ms": float(self.exec_ms),
            "batch_size": int(self.batch_size),
            "device": str(self.device),
            "intake_ms": float(self.intake_ms),
            "answer_ms": float(self.answer_ms),
            "app_id": str(self.app),
        }


class InferenceService(Protocol):
    """Raises the errors of app.errors (ModelNotFound, InvalidInput, Dropped, ...)."""

    def model_names(self) -> list[str]: ...

    def model_config(self, name: str, version: str | None = None) -> ModelConfig:
        """`name`'s config, of `version` (None: the default version); its
        `name` is the served model's key that `infer` and `model_ready` take."""
        ...

    def model_ready(self, name: str) -> bool: ...

    def server_ready(self) -> bool: ...

    def model_statistics(
        self, name: str | None = None, version: str | None = None
    ) -> dict[str, Any]:
        """Triton's statistics response, `{"model_stats": [...]}`: every
        loaded model's, or `name`'s (app/server/statistics.py)."""
        ...

    def repository_index(self) -> list[dict[str, str]]:
        """[{name, version, state: READY|UNAVAILABLE|LOADING, reason}]"""
        ...

    async def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        slo_ms: float | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
        app: str = "",
    ) -> InferResult:
        """`inputs` are validated against the model config by the HTTP layer
        (names, datatypes, shapes with one batch dimension n, 1 ≤ n ≤
        max_batch_size: the request's items, answered with outputs [n, …]). `received_at`:
        the monotonic time the request reached the server (its SLO starts
        there; app/api/received.py); None means now. `app`: the request's
        application, checked by the API (app/api/app_id.py); "" is the
        model's default one. The result echoes it."""
        ...


def request_items(config: ModelConfig, inputs: dict[str, np.ndarray]) -> int:
    """A request's items: its inputs' batch dimension, one n for all of
    them, 1 ≤ n ≤ the model's max_batch_size (the HTTP layer checks this
    first, with the tensor's name; this guards every other caller)."""
    sizes = {int(np.shape(a)[0]) if np.ndim(a) else 1 for a in inputs.values()}
    if len(sizes) != 1:
        raise InvalidInput(
            f"model {config.model_name!r}: the inputs disagree on the batch dimension: "
            f"{sorted(sizes)}"
        )
    (items,) = sizes
    if not 1 <= items <= config.max_batch_size:
        raise InvalidInput(
            f"model {config.model_name!r}: the batch dimension must be between 1 and the model's "
            f"max_batch_size ({config.max_batch_size}), got {items}"
        )
    return items


def placed_items(config: ModelConfig, placed: tuple[str, list[int]]) -> int:
    """The items of a request an API worker placed in `placed`'s slots
    (its arena, the slots): one slot per item, 1 ≤ n ≤ max_batch_size."""
    items = len(placed[1])
    if not 1 <= items <= config.max_batch_size:
        raise InvalidInput(
            f"model {config.model_name!r}: the batch dimension must be between 1 and the model's "
            f"max_batch_size ({config.max_batch_size}), got {items}"
        )
    return items
