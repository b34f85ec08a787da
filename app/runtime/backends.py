"""Model backends an executor process runs: ONNX Runtime, Torch
(`app.runtime.torch_backend`, optional) and an emulator.

A backend is created per (model, device) inside the executor process; `load`
may be slow (session creation), `run` takes a dict of batch arrays and returns
a dict of batch arrays. `terminate()` may be called from another thread of
the executor to abort the run in progress (preemption); the aborted `run`
raises `Terminated`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Protocol, runtime_checkable

import numpy as np

from app.repository.config import ModelConfig, TensorSpec
from app.scheduling.profile import LatencyProfile

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


# An emulated device sleeps, then spins only this long for accuracy: with the
# executor's timer slack at 1 µs (executor.py) a wake-up is ~0.1 ms late, and
# a longer spin would burn a core per busy device on a small CPU box.
EMULATED_SPIN_S = 0.0002


def spin_until(deadline: float, spin_s: float = EMULATED_SPIN_S) -> None:
    """Sleep until `deadline` (time.monotonic()), spinning the last `spin_s`
    for sub-millisecond accuracy."""
    remaining = deadline - time.monotonic()
    if remaining > spin_s:
        time.sleep(remaining - spin_s)
    while time.monotonic() < deadline:
        pass


# --------------------------------------------------------------------- ONNX
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
        try:
            results = self.session.run(self._output_names, inputs, options)
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


# ----------------------------------------------------------------- Emulated
def profile_of(config: ModelConfig) -> LatencyProfile:
    p = config.profile
    if p is None:
        raise ValueError(f"model {config.name!r}: an emulated model needs a latency profile")
    if p.latency_ms:
        return LatencyProfile.from_table(p.latency_ms, config.max_batch_size)
    if p.alpha_ms is not None and p.beta_ms is not None:
        return LatencyProfile.linear(p.alpha_ms, p.beta_ms, config.max_batch_size)
    raise ValueError(
        f"model {config.name!r}: profile needs alpha_ms and beta_ms or a latency table"
    )


class EmulatedBackend:
    """Holds the device for ℓ(b) of the model's profile, then answers.

    Outputs: for each output spec, the batch of the input with the same name
    if it has the same item shape and dtype, else the first input (in config
    order) that has; zeros when none matches. Echoing lets tests check that
    every request gets its own row back in its own slot.

    Preemption: `terminate()` stops the hold at once, or — with
    `parameters: {preemption_delay_ms: d}` in config.yaml — d ms later, to
    emulate a device that only stops at its next exit point. A batch whose
    hold ends before that finishes normally (the stop lost the race).
    """

    def __init__(self, *_: Any, **__: Any) -> None:
        self.profile: LatencyProfile | None = None
        self.preemption_delay_s = 0.0
        self._plan: list[tuple[str, str | None, TensorSpec]] = []
        self._abort = threading.Event()
        # Fault injection for tests only: while the file named by
        # EMULATED_HANG_FILE exists and is empty or holds this process's pid,
        # a batch hangs (as a stuck kernel would) instead of finishing.
        # Unset in normal use: no cost, no effect.
        self._hang_file = os.environ.get("EMULATED_HANG_FILE") or None

    def load(self, config: ModelConfig) -> None:
        self.profile = profile_of(config)
        delay = config.extra.get("preemption_delay_ms", 0.0)
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise ValueError(
                f"model {config.name!r}: parameters.preemption_delay_ms must be a "
                f"number ≥ 0, got {delay!r}"
            )
        self.preemption_delay_s = float(delay) / 1000.0
        plan = []
        for out in config.outputs:
            candidates = sorted(config.inputs, key=lambda s: s.name != out.name)
            source = next(
                (
                    s.name
                    for s in candidates
                    if s.item_shape == out.item_shape and s.datatype == out.datatype
                ),
                None,
            )
            plan.append((out.name, source, out))
        self._plan = plan

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.monotonic()
        self.reset()
        outputs = self.outputs(inputs)
        self.hold(start + self.latency(_batch_of(inputs)))
        return outputs

    def latency(self, batch: int) -> float:
        """ℓ(batch) in seconds."""
        assert self.profile is not None, "load() first"
        return self.profile.latency(batch)

    def outputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch's outputs (echoes or zeros), ready before the hold ends."""
        batch = _batch_of(inputs)
        outputs: dict[str, np.ndarray] = {}
        for name, source, spec in self._plan:
            if source is not None:
                outputs[name] = inputs[source]
            else:
                outputs[name] = np.zeros((batch, *spec.item_shape), dtype=spec.dtype)
        return outputs

    def hold(self, until: float) -> None:
        """Hold the device until `until` (time.monotonic()): interruptible
        sleep, short spin at the end. Raises Terminated if stopped since the
        last `reset()`."""
        if self._hang_file is not None and _hang_requested(self._hang_file):
            until += 3600.0
        remaining = until - time.monotonic()
        if remaining > EMULATED_SPIN_S and self._abort.wait(remaining - EMULATED_SPIN_S):
            stop_at = time.monotonic() + self.preemption_delay_s
            if stop_at < until:
                spin_until(stop_at)
                raise Terminated("run terminated")
        spin_until(until)
        if self._abort.is_set() and self.preemption_delay_s == 0.0:
            raise Terminated("run terminated")

    def terminate(self) -> None:
        self._abort.set()

    def reset(self) -> None:
        """Forget an earlier stop (the executor calls this, under the lock
        that guards terminate(), as each batch starts and ends)."""
        self._abort.clear()


def _batch_of(inputs: dict[str, np.ndarray]) -> int:
    return len(next(iter(inputs.values()))) if inputs else 1


def _hang_requested(path: str) -> bool:
    try:
        with open(path) as f:
            target = f.read().strip()
    except OSError:
        return False
    return target in ("", str(os.getpid()))


def make_backend(config: ModelConfig, device_kind: str, device_index: int, threads: int):
    if config.backend == "onnx":
        return OnnxBackend(device_kind, device_index, threads)
    if config.backend == "emulated":
        return EmulatedBackend()
    if config.backend == "torch":
        # Imported here: torch is an optional extra, and importing it costs
        # seconds; a server without torch reports the model as unavailable.
        from app.runtime.torch_backend import TorchBackend

        return TorchBackend(device_kind, device_index, threads)
    raise ValueError(f"model {config.name!r}: unsupported backend {config.backend!r}")
