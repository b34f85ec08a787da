"""The live workloads the comparison runs, and how each system serves them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from app.repository import BUNDLED_REPOSITORY
from app.workloads.spec import Workload

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
LIVE = REPO_ROOT / "bench" / "repositories" / "live"
ZOO8 = REPO_ROOT / "bench" / "repositories" / "zoo8"
WORKLOADS = REPO_ROOT / "bench" / "workloads"


@dataclass(frozen=True)
class Setup:
    """A workload and the devices every system gets for it."""

    key: str
    workload: Path
    repository: Path
    emulated_devices: int  # the daemon's emulated devices (= peer replicas per model)
    cpu_slices: int = 0  # the daemon's CPU executors
    cpu_threads: int = 2  # ONNX threads per CPU executor / peer replica
    # Devices when --devices is not given: one, where one model's batching is
    # compared; the file's own count where many models share many devices
    # (0), since one device would serialise eight models' batches.
    default_devices: int = 1

    @property
    def devices(self) -> int:
        """Devices each peer gets: one replica (instance, worker) per device."""
        return self.emulated_devices or max(self.cpu_slices, 1)

    def on_devices(self, devices: int) -> Setup:
        """The same setup on `devices` emulated devices (a CPU setup keeps
        its executors: the CPU is the device)."""
        if devices < 1 or not self.emulated_devices:
            return self
        return dataclasses.replace(self, emulated_devices=devices)

    def workload_on_devices(self, workload: Workload) -> Workload:
        """`workload` on this setup's device count, its rates scaled in
        proportion (so rate scale 1 loads each device as the file does)."""
        count = self.devices
        if len(workload.devices) == count:
            return workload
        ratio = count / len(workload.devices)
        first = workload.devices[0]
        return dataclasses.replace(
            workload,
            devices=[dataclasses.replace(first, name=f"dev{i}") for i in range(count)],
            models=[
                m if m.rate is None else dataclasses.replace(m, rate=m.rate * ratio)
                for m in workload.models
            ],
        )


SETUPS = {
    "a": Setup("a", WORKLOADS / "live-a-resnet50-emulated.yaml", LIVE, emulated_devices=2),
    "b": Setup(
        "b", WORKLOADS / "live-b-mlp.yaml", BUNDLED_REPOSITORY, emulated_devices=0, cpu_slices=1
    ),
    "c": Setup("c", WORKLOADS / "live-c-bursty-mix.yaml", LIVE, emulated_devices=4),
    # The daemon's own ceiling: a model of ℓ(b) ≈ 0 (run with --cdf-fraction 0.5).
    "ceiling": Setup("ceiling", WORKLOADS / "live-ceiling.yaml", LIVE, emulated_devices=1),
    # Many models on many devices: 8 of the Table 5 zoo on 8 emulated devices,
    # every system's instances of a device taking turns on it (one lock each).
    "zoo8": Setup(
        "zoo8", WORKLOADS / "live-zoo8-poisson.yaml", ZOO8, emulated_devices=8, default_devices=0
    ),
    "zoo8-bursty": Setup(
        "zoo8-bursty",
        WORKLOADS / "live-zoo8-bursty.yaml",
        ZOO8,
        emulated_devices=8,
        default_devices=0,
    ),
}
