"""The executor layout of a machine: one executor per GPU, CPU slice or
emulated device (`detect_devices`), and which models each may load."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any, Literal

from app.repository.config import ModelConfig
from app.runtime.backend import backend_supports

DeviceKind = Literal["cpu", "cuda", "emulated"]


@dataclass(frozen=True)
class ExecutorDevice:
    """One executor process: a GPU, a CPU slice or an emulated device.

    `index` is the CUDA device ordinal (among visible devices) for "cuda";
    `threads` the intra-op threads of a CPU slice; `cpus` optionally pins the
    process to those cores. `slowdown` (≥ 1) emulates a device that many
    times slower: each batch is held until its start + `slowdown` × its
    compute, the CPU time it took per thread (app/runtime/executor.py), as a
    block profile measured with the same factor says
    (app/repository/block_profile.py).
    """

    id: int
    kind: DeviceKind
    name: str
    index: int = 0
    threads: int = 1
    cpus: tuple[int, ...] | None = None
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not (self.slowdown >= 1.0 and self.slowdown < float("inf")):
            raise ValueError(f"device {self.name!r}: slowdown must be ≥ 1, got {self.slowdown}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpus"] = None if self.cpus is None else list(self.cpus)
        return d


# ---------------------------------------------------------------- detection
def _visible_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cuda_device_count() -> int:
    """GPUs usable by onnxruntime: 0 unless it has the CUDA EP; then
    CUDA_VISIBLE_DEVICES if set, else the lines of `nvidia-smi -L`."""
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return 0
    except ImportError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            entry = entry.strip()
            if not entry or entry == "-1":
                break  # CUDA stops at the first invalid entry
            count += 1
        return count
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def detect_devices(
    cpu_slices: int | None = None,
    threads_per_slice: int | None = None,
    emulated: int = 0,
    *,
    gpus: int | None = None,
) -> list[ExecutorDevice]:
    """The executor layout of this machine.

    One "cuda" device per GPU (see `cuda_device_count`; `gpus` overrides it).
    CPU slices: `cpu_slices=None` means one slice with every visible core when
    there is no GPU and none when there is; `0` none; `n` that many slices of
    `threads_per_slice` threads (default: cores // n), each pinned to its own
    cores when they fit. Then `emulated` emulated devices.
    """
    n_gpus = cuda_device_count() if gpus is None else gpus
    devices: list[ExecutorDevice] = []
    ids = itertools.count()
    for i in range(n_gpus):
        devices.append(ExecutorDevice(next(ids), "cuda", f"cuda:{i}", index=i))
    slices = (0 if n_gpus else 1) if cpu_slices is None else cpu_slices
    if slices < 0:
        raise ValueError(f"cpu_slices must be ≥ 0, got {cpu_slices}")
    if slices:
        cores = _visible_cores()
        threads = threads_per_slice or max(1, len(cores) // slices)
        pin = slices > 1 and slices * threads <= len(cores)
        for i in range(slices):
            cpus = tuple(cores[i * threads : (i + 1) * threads]) if pin else None
            devices.append(
                ExecutorDevice(next(ids), "cpu", f"cpu:{i}", index=i, threads=threads, cpus=cpus)
            )
    if emulated < 0:
        raise ValueError(f"emulated must be ≥ 0, got {emulated}")
    for i in range(emulated):
        devices.append(ExecutorDevice(next(ids), "emulated", f"emulated:{i}", index=i))
    return devices


def model_allowed_on(config: ModelConfig, device: ExecutorDevice) -> bool:
    """Backend supports the device kind, and ModelConfig.devices (kinds or
    names) includes it when set."""
    if not backend_supports(config.backend, device.kind):
        return False
    if config.devices is None:
        return True
    return device.kind in config.devices or device.name in config.devices
