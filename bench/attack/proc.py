"""The daemon's processes as the attacks see them: resident memory from
/proc, and this client's own file-descriptor limit.

Memory is the front-end process's (`python -m app serve`, which runs the
HTTP server and its event loop): that is what request bodies, headers and
connections inflate. Executors hold models and shared memory and are not
touched by what a client sends, so they are left out of the peak.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path


def status_fields(text: str) -> dict[str, int]:
    """The `kB` fields of a /proc/<pid>/status text (VmRSS, VmHWM, …), in kB."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        parts = value.split()
        if sep and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            found[name.strip()] = int(parts[0])
    return found


def memory_mb(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of process `pid` in MB (10^6 bytes); None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kb = status_fields(text)
    if "VmRSS" not in kb:
        return None  # a zombie has no memory fields
    return kb["VmRSS"] * 1024 / 1e6, kb.get("VmHWM", kb["VmRSS"]) * 1024 / 1e6


@dataclass
class RssSampler:
    """Samples one process's RSS every `interval_s` on the running event
    loop. The peak is the largest sample or, if the kernel's high-water mark
    rose while sampling, that mark (it catches a spike between samples)."""

    pid: int
    interval_s: float = 0.02
    samples: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, MB)
    _hwm_start: float | None = None
    _hwm_end: float | None = None
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        first = memory_mb(self.pid)
        self._hwm_start = first[1] if first else None
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            now = memory_mb(self.pid)
            if now is not None:
                self.samples.append((time.monotonic(), now[0]))
                self._hwm_end = now[1]
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def baseline_mb(self, before: float) -> float | None:
        """The median sample before `before` (monotonic)."""
        early = sorted(mb for t, mb in self.samples if t < before)
        return early[len(early) // 2] if early else None

    def peak_mb(self, after: float) -> float | None:
        """The peak from `after` (monotonic) on."""
        late = [mb for t, mb in self.samples if t >= after]
        if not late:
            return None
        peak = max(late)
        start, end = self._hwm_start, self._hwm_end
        if start is not None and end is not None and end > start:
            peak = max(peak, end)
        return peak


def raise_nofile_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; the new
    soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft
