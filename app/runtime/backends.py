"""Backends by name: `make_backend(config, device_kind, index, threads, share=…)` —
ONNX Runtime (`app.runtime.onnx_backend`), Torch (`app.runtime.torch_backend`,
optional) and the emulator (`app.runtime.emulated`). The interface they
share is `app.runtime.backend`."""

from __future__ import annotations

from app.repository.config import ModelConfig
from app.runtime.backend import Backend, Terminated, backend_supports
from app.runtime.emulated import EmulatedBackend
from app.runtime.onnx_backend import OnnxBackend

__all__ = [
    "Backend",
    "EmulatedBackend",
    "OnnxBackend",
    "Terminated",
    "backend_supports",
    "make_backend",
]


def make_backend(
    config: ModelConfig, device_kind: str, device_index: int, threads: int, share: float = 1.0
) -> Backend:
    """`share`: the executor's share of its device (app.runtime.shares); only
    the emulator uses it, other backends get theirs from pinning or MPS."""
    if config.backend == "onnx":
        return OnnxBackend(device_kind, device_index, threads)
    if config.backend == "emulated":
        return EmulatedBackend(share=share)
    if config.backend == "torch":
        # Imported here: torch is an optional extra, and importing it costs
        # seconds; a server without torch reports the model as unavailable.
        from app.runtime.torch_backend import TorchBackend

        return TorchBackend(device_kind, device_index, threads)
    raise ValueError(f"model {config.name!r}: unsupported backend {config.backend!r}")
