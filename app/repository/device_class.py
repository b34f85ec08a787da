"""A live CPU device class: what an executor of the class runs on — an ONNX
Runtime CPU session with `threads` intra-op threads, and an emulated
`slowdown` (the executor holds each batch that many times its CPU time: a
device that many times slower). Profiled by app/repository/block_profile.py,
served by PPipe pipelines (PPIPE_CLASSES, app/server/pipeline_setup.py).

Share v is 1/v of a device (the artifact's vGPU sizes under MPS); on a CPU
class it is threads / v threads, so v must divide `threads`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

_CLASS_NAME = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class DeviceClass:
    """A live CPU device class (see the module docstring)."""

    name: str
    threads: int
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not _CLASS_NAME.match(self.name):
            raise ValueError(
                f"device class name {self.name!r}: use letters, digits and '_' only "
                "(profile file names separate model, class and share with '-')"
            )
        if self.threads < 1:
            raise ValueError(f"device class {self.name!r}: threads must be ≥ 1, got {self.threads}")
        if not (math.isfinite(self.slowdown) and self.slowdown >= 1.0):
            raise ValueError(
                f"device class {self.name!r}: slowdown must be ≥ 1, got {self.slowdown}"
            )

    def threads_at(self, share: int) -> int:
        """Threads of 1/`share` of this class."""
        if share < 1 or self.threads % share:
            raise ValueError(
                f"device class {self.name!r} ({self.threads} threads): share 1/{share} is not "
                "a whole number of threads"
            )
        return self.threads // share

    def shares(self, wanted: Sequence[int]) -> list[int]:
        """The shares of `wanted` this class has (share 1 always)."""
        return sorted({1, *(v for v in wanted if v >= 1 and self.threads % v == 0)})

    @classmethod
    def parse(cls, text: str) -> DeviceClass:
        """`NAME:THREADS[:SLOWDOWN]`, e.g. `cpu1t:1` or `slow:1:2.5`."""
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"device class {text!r}: expected NAME:THREADS[:SLOWDOWN]")
        try:
            threads = int(parts[1])
            slowdown = float(parts[2]) if len(parts) == 3 else 1.0
        except ValueError:
            raise ValueError(
                f"device class {text!r}: THREADS must be an integer, SLOWDOWN a number"
            ) from None
        return cls(parts[0], threads, slowdown)


DEFAULT_CLASSES = (DeviceClass("cpu2t", 2), DeviceClass("cpu1t", 1))
