"""The backend interface: what an executor process runs a model with.

A backend is created per (model, device) inside the executor process by
`app.runtime.backends.make_backend`; `load` may be slow (session creation),
`run` takes a dict of batch arrays and returns a dict of batch arrays.
`terminate()`, where a backend has it, may be called from another thread of
the executor to abort the run in progress (preemption); the aborted `run`
raises `Terminated`. `reset()`, where a backend has it, clears a stop before
and after each batch.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from app.repository.config import ModelConfig

# Which device kinds each backend can run on.
BACKEND_DEVICE_KINDS: dict[str, frozenset[str]] = {
    "onnx": frozenset({"cpu", "cuda"}),
    "torch": frozenset({"cpu", "cuda"}),
    "emulated": frozenset({"emulated"}),
}


def backend_supports(backend: str, device_kind: str) -> bool:
    return device_kind in BACKEND_DEVICE_KINDS.get(backend, frozenset())


class Terminated(RuntimeError):
    """The run was aborted by `terminate()`."""


@runtime_checkable
class Backend(Protocol):
    def load(self, config: ModelConfig) -> None: ...

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
