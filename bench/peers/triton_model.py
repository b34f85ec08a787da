"""The Python-backend model Triton runs for every model of a generated repository.

Triton's Python backend starts one stub process per model instance and loads
``<model>/1/model.py`` in it; the generated ``model.py`` (bench/peers/
triton_repository.py) only re-exports `TritonPythonModel` from here, so the
code that runs inside Triton is this module, importable and tested like the
rest (the stub finds the repository root and the venv's packages on
``PYTHONPATH``, set by bench/peers/triton_launcher.py).

What one instance does:

- **Device.** Its instance group is named ``device<k>`` (one group of count 1
  per device, bench/peers/triton_repository.py), so the instance knows which
  emulated device or CPU slice it is: ``args["model_instance_name"]`` is
  ``device<k>`` or ``device<k>_<i>``.
- **Backend.** The daemon's own: `EmulatedBackend` (holds the device for ℓ(b)
  of the model's profile with the same sleep + spin, echoes inputs as
  outputs) or `OnnxBackend` (CPU EP, ``intra_op_num_threads = threads``,
  sequential), made by `app.runtime.backends.make_backend` from the source
  model's config.yaml (``source_directory`` parameter).
- **Batch.** Triton's dynamic batcher hands `execute` the requests of one
  batch; their rows are concatenated, run once, and split back per request.
- **Shared devices.** With a ``lock_directory`` parameter, a batch runs only
  while the instance holds an exclusive ``flock`` on ``<dir>/<device>.lock``:
  instances of different models placed on the same emulated device take turns
  on it, as the daemon's models share a device (the Ray Serve peer does the
  same).
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

_INSTANCE = re.compile(r"^device(\d+)(?:_\d+)?$")


def device_index(instance_name: str) -> int:
    """The device k of an instance named ``device<k>`` or ``device<k>_<i>``."""
    match = _INSTANCE.match(instance_name)
    if match is None:
        raise ValueError(
            f"instance {instance_name!r}: expected an instance group named device<k> "
            "(bench/peers/triton_repository.py writes them)"
        )
    return int(match.group(1))


def parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """The config's ``parameters`` as plain strings."""
    raw = model_config.get("parameters") or {}
    return {key: str(value.get("string_value", "")) for key, value in raw.items()}


def split_rows(array: np.ndarray, counts: list[int]) -> list[np.ndarray]:
    """`array` cut along its first dimension into consecutive pieces of `counts` rows."""
    out, start = [], 0
    for n in counts:
        out.append(np.ascontiguousarray(array[start : start + n]))
        start += n
    return out


def to_numpy(tensor: Any, datatype: str) -> np.ndarray:
    """A request's input (of our `datatype`) as a numpy array, through DLPack
    (see `from_numpy`) but for BYTES."""
    if datatype == "BYTES":
        return tensor.as_numpy()
    return np.from_dlpack(tensor)


def from_numpy(pb_utils: Any, name: str, array: np.ndarray) -> Any:
    """An output tensor made through DLPack. The wheel's stub is built against
    numpy 1.x: under numpy 2 its ``as_numpy``/``Tensor(name, array)`` path
    reads the item size from numpy's changed dtype struct, and Triton answers
    500 "output tensor shape does not match size of output". DLPack is a
    stable ABI; BYTES (object) tensors have no DLPack form and take the numpy
    path."""
    if array.dtype == object:
        return pb_utils.Tensor(name, array)
    return pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(array))


class _DeviceLock:
    """An exclusive lock on one device shared by processes (no-op without a path)."""

    def __init__(self, path: Path | None):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None

    def __enter__(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


class TritonPythonModel:
    """Triton's Python-backend interface: initialize / execute / finalize."""

    def initialize(self, args: dict[str, Any]) -> None:
        import json

        from app.repository.loader import load_model_config
        from app.runtime.backends import make_backend

        model_config = json.loads(args["model_config"])
        params = parameters(model_config)
        self.config = load_model_config(Path(params["source_directory"]))
        kind = params["device_kind"]
        index = device_index(args["model_instance_name"])
        self.device = f"{kind}:{index}"
        self.backend = make_backend(self.config, kind, index, int(params.get("threads") or 1))
        self.backend.load(self.config)
        lock_dir = params.get("lock_directory")
        self._lock = _DeviceLock(Path(lock_dir) / f"{self.device}.lock" if lock_dir else None)
        self._inputs = [(spec.name, spec.datatype) for spec in self.config.inputs]
        self._outputs = [spec.name for spec in self.config.outputs]

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        per_request = [
            {n: to_numpy(pb_utils.get_input_tensor_by_name(r, n), t) for n, t in self._inputs}
            for r in requests
        ]
        first = self._inputs[0][0]
        counts = [len(inputs[first]) for inputs in per_request]
        batch = {n: np.concatenate([inputs[n] for inputs in per_request]) for n, _ in self._inputs}
        with self._lock:
            outputs = self.backend.run(batch)
        pieces = {n: split_rows(outputs[n], counts) for n in self._outputs}
        return [
            pb_utils.InferenceResponse(
                output_tensors=[from_numpy(pb_utils, n, pieces[n][i]) for n in self._outputs]
            )
            for i in range(len(requests))
        ]

    def finalize(self) -> None:
        self.backend = None  # frees the ONNX session before the stub exits
