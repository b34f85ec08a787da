"""ONNX Runtime backend: one `InferenceSession` per model on a CPU slice or a
CUDA device; preemption through `RunOptions.terminate` (checked between
graph nodes).

BYTES tensors are ONNX STRING tensors: ORT takes an object array of `str`
(it would turn a `bytes` element into its repr), so BYTES inputs are decoded
as UTF-8 here (the API has refused elements that are not UTF-8); string
outputs come back as `str` and are stored as their UTF-8 bytes."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from app.repository.config import ModelConfig, TensorSpec
from app.runtime.backend import Terminated

_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def _check_io(model: str, role: str, spec: TensorSpec, node: Any) -> None:
    datatype = _ORT_TYPES.get(node.type)
    if datatype != spec.datatype:
        raise ValueError(
            f"model {model!r} {role} {spec.name!r}: config says {spec.datatype}, "
            f"the ONNX model has {node.type}"
        )
    shape = list(node.shape)
    if len(shape) != len(spec.shape):
        raise ValueError(
            f"model {model!r} {role} {spec.name!r}: config shape {list(spec.shape)}, "
            f"the ONNX model has {shape}"
        )
    for got, want in zip(shape[1:], spec.shape[1:], strict=True):
        if isinstance(got, int) and got > 0 and want > 0 and got != want:
            raise ValueError(
                f"model {model!r} {role} {spec.name!r}: config shape {list(spec.shape)}, "
                f"the ONNX model has {shape}"
            )


def _as_ort(array: np.ndarray) -> np.ndarray:
    """A BYTES (object) array as ORT's string tensors want it: `str` elements."""
    if array.dtype != object:
        return array
    flat = [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1)]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


class OnnxBackend:
    """`onnxruntime.InferenceSession` on a CPU slice or one CUDA device.

    On a "cuda" device with CUDAExecutionProvider available the session uses
    ``[("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]``;
    otherwise the CPU EP with `intra_op_num_threads = threads`,
    `inter_op_num_threads = 1` and sequential execution.
    """

    def __init__(self, device_kind: str = "cpu", device_index: int = 0, threads: int = 1):
        self.device_kind = device_kind
        self.device_index = device_index
        self.threads = max(1, int(threads))
        self.session: Any = None
        self.providers: list[str] = []
        self._output_names: list[str] = []
        self._lock = threading.Lock()
        self._run_options: Any = None

    def session_options_and_providers(self) -> tuple[Any, list[Any]]:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.inter_op_num_threads = 1
        available = ort.get_available_providers()
        if self.device_kind == "cuda" and "CUDAExecutionProvider" in available:
            providers: list[Any] = [
                ("CUDAExecutionProvider", {"device_id": self.device_index}),
                "CPUExecutionProvider",
            ]
        else:
            if self.device_kind == "cuda":
                raise RuntimeError(
                    "device kind 'cuda' but onnxruntime has no CUDAExecutionProvider "
                    f"(available: {available}); install onnxruntime-gpu"
                )
            opts.intra_op_num_threads = self.threads
            providers = ["CPUExecutionProvider"]
        return opts, providers

    def load(self, config: ModelConfig) -> None:
        import onnxruntime as ort

        if config.model_file is None:
            raise ValueError(f"model {config.name!r}: onnx backend needs a model_file")
        opts, providers = self.session_options_and_providers()
        self.session = ort.InferenceSession(str(config.model_file), opts, providers=providers)
        self.providers = list(self.session.get_providers())
        inputs = {n.name: n for n in self.session.get_inputs()}
        outputs = {n.name: n for n in self.session.get_outputs()}
        for spec in config.inputs:
            if spec.name not in inputs:
                raise ValueError(
                    f"model {config.name!r}: input {spec.name!r} not in the ONNX model "
                    f"(it has {list(inputs)})"
                )
            _check_io(config.name, "input", spec, inputs[spec.name])
        for spec in config.outputs:
            if spec.name not in outputs:
                raise ValueError(
                    f"model {config.name!r}: output {spec.name!r} not in the ONNX model "
                    f"(it has {list(outputs)})"
                )
            _check_io(config.name, "output", spec, outputs[spec.name])
        self._output_names = [s.name for s in config.outputs]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        options = ort.RunOptions()
        with self._lock:
            self._run_options = options
        feed = {name: _as_ort(array) for name, array in inputs.items()}
        try:
            results = self.session.run(self._output_names, feed, options)
        except Exception as exc:
            if options.terminate:
                raise Terminated("run terminated") from exc
            raise
        finally:
            with self._lock:
                self._run_options = None
        return dict(zip(self._output_names, results, strict=True))

    def terminate(self) -> None:
        with self._lock:
            if self._run_options is not None:
                self._run_options.terminate = True
