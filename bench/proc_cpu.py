"""CPU time of a process tree, read from /proc (Linux), for `bench.cpu_per_request`.

A process's CPU is its user + system time (`utime` + `stime`, fields 14 and
15 of /proc/<pid>/stat, in clock ticks). A tree is the root and every live
descendant, found by each process's parent (field 4). A child that exits
between two readings is not in the second one: its time is lost, which
`Usage.gone` counts so that a reader can tell.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


@dataclass(frozen=True)
class ProcStat:
    """One process at one reading."""

    pid: int
    ppid: int
    name: str  # the kernel's comm (at most 15 characters)
    cpu_s: float  # utime + stime
    start_ticks: int  # start time since boot: tells a reused pid apart


def parse_stat(text: str) -> ProcStat:
    """A /proc/<pid>/stat line. The name sits in parentheses and may hold
    spaces and parentheses itself, so the fields after it are found from
    its last ')'."""
    pid_text, rest = text.split(" (", 1)
    name, tail = rest.rsplit(")", 1)
    fields = tail.split()  # fields[0] is the state (field 3)
    utime, stime = int(fields[11]), int(fields[12])
    return ProcStat(
        pid=int(pid_text),
        ppid=int(fields[1]),
        name=name,
        cpu_s=(utime + stime) / TICKS_PER_S,
        start_ticks=int(fields[19]),
    )


def read_all(proc: Path = PROC) -> dict[int, ProcStat]:
    """Every process readable now (one that exits while being read is left out)."""
    found: dict[int, ProcStat] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
    return found


def tree(root: int, stats: Mapping[int, ProcStat]) -> list[ProcStat]:
    """`root` and its descendants in `stats` (root first, then by pid)."""
    if root not in stats:
        return []
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    members, todo = [], [root]
    while todo:
        pid = todo.pop()
        members.append(pid)
        todo.extend(children.get(pid, ()))
    rest = sorted((stats[p] for p in members if p != root), key=lambda s: s.pid)
    return [stats[root], *rest]


def read_tree(root: int, proc: Path = PROC) -> list[ProcStat]:
    return tree(root, read_all(proc))


@dataclass(frozen=True)
class ProcessUsage:
    """CPU one process used between two readings."""

    pid: int
    name: str
    role: str  # "main" (the tree's root) or "child"
    cpu_s: float


@dataclass(frozen=True)
class Usage:
    """CPU a tree used between two readings: per process, and the total."""

    processes: list[ProcessUsage]
    gone: int  # processes of the first reading missing from the second

    @property
    def total_s(self) -> float:
        return sum(p.cpu_s for p in self.processes)


def usage(before: Iterable[ProcStat], after: Iterable[ProcStat]) -> Usage:
    """What each process of `after` used since `before`: a process in both
    (same pid and start time) its difference, a new one all of its time."""
    earlier = {(s.pid, s.start_ticks): s for s in before}
    later = list(after)
    root = later[0].pid if later else None
    processes = []
    for stat in later:
        first = earlier.pop((stat.pid, stat.start_ticks), None)
        spent = stat.cpu_s - (first.cpu_s if first is not None else 0.0)
        role = "main" if stat.pid == root else "child"
        processes.append(ProcessUsage(stat.pid, stat.name, role, max(spent, 0.0)))
    return Usage(processes, gone=len(earlier))
