"""The executor layout of a machine: one executor per GPU, CPU slice or
emulated device (`detect_devices`), or per share of one when a device is
split into shares (`split_devices`, the rules in `app.runtime.shares`), and
which models each may load."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from app.repository.config import ModelConfig
from app.runtime.backend import backend_supports
from app.runtime.shares import SHARE_SEP, check_shares, shared_cores, split_cores

log = logging.getLogger("app.runtime.devices")

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
    (app/repository/block_profile.py). `share` (in (0, 1]) is the fraction
    of a device split into shares that this executor has (`split_devices`):
    its name is then the whole device's, "/" and the share's number.
    """

    id: int
    kind: DeviceKind
    name: str
    index: int = 0
    threads: int = 1
    cpus: tuple[int, ...] | None = None
    slowdown: float = 1.0
    share: float = 1.0

    def __post_init__(self) -> None:
        if not (self.slowdown >= 1.0 and self.slowdown < float("inf")):
            raise ValueError(f"device {self.name!r}: slowdown must be ≥ 1, got {self.slowdown}")
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"device {self.name!r}: share must be in (0, 1], got {self.share}")

    @property
    def whole(self) -> str:
        """The name of the device this executor has a share of (its own
        name when it is not split)."""
        return self.name.partition(SHARE_SEP)[0]

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
    shares: Mapping[str, Sequence[float]] | None = None,
) -> list[ExecutorDevice]:
    """The executor layout of this machine.

    One "cuda" device per GPU (see `cuda_device_count`; `gpus` overrides it).
    CPU slices: `cpu_slices=None` means one slice with every visible core when
    there is no GPU and none when there is; `0` none; `n` that many slices of
    `threads_per_slice` threads (default: cores // n), each pinned to its own
    cores when they fit. Then `emulated` emulated devices. Last, the devices
    `shares` names are split into shares (`split_devices`).
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
    return split_devices(devices, shares) if shares else devices


def split_devices(
    devices: Sequence[ExecutorDevice], shares: Mapping[str, Sequence[float]]
) -> list[ExecutorDevice]:
    """`devices` with those that `shares` names split: one executor per
    share, in its place, named `<device>/<i>`; ids are numbered again in
    order. A key of `shares` is a device name or kind (every device of that
    kind); each must name some device, and no device twice.

    A CPU share is pinned to its part of the device's cores (its `cpus`, or
    every visible core) by `split_cores`, with one thread per core; shares
    that must run on one core are said in a log line. A GPU or emulated share
    keeps the device's index and threads."""
    by_device: dict[str, tuple[str, tuple[float, ...]]] = {}
    for key, values in shares.items():
        matched = [d for d in devices if key in (d.name, d.kind)]
        if not matched:
            have = ", ".join(d.name for d in devices) or "no devices"
            raise ValueError(f"device shares: {key!r} names no device of this server ({have})")
        for d in matched:
            if d.name in by_device:
                raise ValueError(
                    f"device shares: {d.name} is given by both {by_device[d.name][0]!r} and {key!r}"
                )
            by_device[d.name] = (key, check_shares(key, values))
    out: list[ExecutorDevice] = []
    for device in devices:
        if device.name not in by_device:
            out.append(replace(device, id=len(out)))
            continue
        values = by_device[device.name][1]
        names = [f"{device.name}{SHARE_SEP}{i}" for i in range(len(values))]
        if device.kind != "cpu":
            for name, share in zip(names, values, strict=True):
                out.append(replace(device, id=len(out), name=name, share=share))
            log.info("%s split into shares: %s", device.name, _listed(out[-len(values) :]))
            continue
        cores = device.cpus if device.cpus is not None else tuple(_visible_cores())
        split = split_cores(cores, values)
        for name, share, cpus in zip(names, values, split, strict=True):
            part = replace(device, id=len(out), name=name, share=share, cpus=cpus)
            out.append(replace(part, threads=len(cpus)))  # a thread per core
        log.info("%s split into shares: %s", device.name, _listed(out[-len(values) :]))
        for core, users in shared_cores(split).items():
            log.warning(
                "%s: %d shares on %d cores, so %s run on core %d together",
                device.name,
                len(values),
                len(cores),
                " and ".join(names[i] for i in users),
                core,
            )
    return out


def _listed(parts: Sequence[ExecutorDevice]) -> str:
    return ", ".join(
        f"{d.name} ({d.share:g}" + ("" if d.cpus is None else f", cores {list(d.cpus)}") + ")"
        for d in parts
    )


def model_allowed_on(config: ModelConfig, device: ExecutorDevice) -> bool:
    """Backend supports the device kind, and ModelConfig.devices (kinds or
    names) includes it when set; naming a device split into shares names
    each of its shares."""
    if not backend_supports(config.backend, device.kind):
        return False
    if config.devices is None:
        return True
    return any(n in config.devices for n in (device.kind, device.name, device.whole))
