"""Spatial sharing of a device: its shares, and the cores each CPU share gets.

A device may be split into shares — fractions in (0, 1] that sum to at most
1 — each served by an executor process of its own (`DEVICE_SHARES`,
`app.runtime.devices.split_devices`). What a share means depends on the
device:

- CPU: the executor is pinned to its share of the device's cores
  (`split_cores`) and runs as many intra-op threads as it has cores.
  Co-located executors still share caches and memory bandwidth.
- GPU: the executor is an MPS client limited to round(100 × share) % of the
  SMs (`app.runtime.mps`); without MPS the shares time-share the GPU.
- Emulated: the executor holds each batch ℓ(b) / share
  (`app.runtime.emulated`): a share is that fraction of the device's speed.
  What co-located models cost each other comes from the latency model, not
  from the emulator.

The setting's text form, `DEVICE=SHARE,SHARE…` items separated by `;`
(`parse_device_shares`): `cpu=0.5,0.5` splits the CPU device into two
executors at half each; `cuda:0=0.3,0.3,0.4;cpu:1=0.5` splits GPU 0 in three
and gives CPU slice 1 one executor on half its cores. DEVICE is a device
kind (every device of that kind) or a device name.

Everything here is plain computation, with no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

# A share's executor is named after its device: "cpu:0" split in two runs
# "cpu:0/0" and "cpu:0/1".
SHARE_SEP = "/"
# What DEVICE may be: a kind, or a kind and its index (a device name).
_DEVICE = re.compile(r"(cpu|cuda|emulated)(:\d+)?")
# Shares may sum to 1 give or take rounding of what a user typed (0.1 × 10).
_SUM_TOLERANCE = 1e-9


def check_shares(device: str, shares: Sequence[float]) -> tuple[float, ...]:
    """The shares of one device, checked: at least one, each a finite
    fraction in (0, 1], summing to at most 1."""
    if not shares:
        raise ValueError(f"device {device!r}: no shares given")
    for share in shares:
        if not (isinstance(share, int | float) and 0.0 < share <= 1.0):
            raise ValueError(f"device {device!r}: a share must be in (0, 1], got {share!r}")
    total = math.fsum(shares)
    if total > 1.0 + _SUM_TOLERANCE:
        raise ValueError(f"device {device!r}: shares sum to {total:g}, more than the whole device")
    return tuple(float(s) for s in shares)


def parse_device_shares(text: str) -> dict[str, tuple[float, ...]]:
    """`DEVICE=SHARE,SHARE…[;DEVICE=…]` → {device: shares}; ValueError
    naming the bad item otherwise."""
    result: dict[str, tuple[float, ...]] = {}
    for item in text.split(";"):
        device, eq, values = (part.strip() for part in item.partition("="))
        if not eq or not device or not values:
            raise ValueError(f"{item.strip()!r}: expected DEVICE=SHARE,SHARE…")
        if not _DEVICE.fullmatch(device):
            raise ValueError(
                f"{device!r} is not a device: use a kind (cpu, cuda, emulated) or a name "
                "such as cuda:0"
            )
        if device in result:
            raise ValueError(f"device {device!r} is given twice")
        try:
            shares = [float(value) for value in values.split(",")]
        except ValueError:
            raise ValueError(f"device {device!r}: {values!r} are not numbers") from None
        result[device] = check_shares(device, shares)
    return result


def show_device_shares(shares: Mapping[str, Sequence[float]]) -> str:
    """The text form `parse_device_shares` reads."""
    return ";".join(f"{d}={','.join(f'{s:g}' for s in v)}" for d, v in shares.items())


def split_cores(cores: Sequence[int], shares: Sequence[float]) -> tuple[tuple[int, ...], ...]:
    """The cores each share is pinned to, in the order of `shares`.

    With at least as many cores as shares, each share gets contiguous cores
    of its own, at least one: the cores the shares cover together (their sum
    of the device, rounded; at least one per share) are apportioned by
    largest remainder, ties to the earlier share. `cpu=0.5,0.5` on 3 cores
    gives (c0, c1) and (c2).

    With more shares than cores, each share gets the one core in which the
    middle of its stretch of the device falls, so some shares run on the
    same core (`shared_cores` names them)."""
    shares = check_shares("cpu", shares)
    cores = tuple(cores)
    if not cores or len(set(cores)) != len(cores):
        raise ValueError(f"cores must be distinct and at least one, got {list(cores)}")
    n, m = len(cores), len(shares)
    if m > n:
        picked, start = [], 0.0
        total = math.fsum(shares)
        for share in shares:
            middle = (start + share / 2) / total
            picked.append((cores[min(n - 1, int(middle * n))],))
            start += share
        return tuple(picked)
    quotas = [share * n for share in shares]
    total_cores = max(m, min(n, round(math.fsum(shares) * n)))
    counts = [max(1, math.floor(q)) for q in quotas]
    while sum(counts) > total_cores:  # minimums took too many: from the most over
        i = max((i for i in range(m) if counts[i] > 1), key=lambda i: counts[i] - quotas[i])
        counts[i] -= 1
    while sum(counts) < total_cores:  # largest remainder first, earlier on ties
        i = max(range(m), key=lambda i: (quotas[i] - counts[i], -i))
        counts[i] += 1
    out, at = [], 0
    for count in counts:
        out.append(cores[at : at + count])
        at += count
    return tuple(out)


def shared_cores(split: Sequence[Sequence[int]]) -> dict[int, tuple[int, ...]]:
    """Core → the shares (indices into `split`) pinned to it, for each core
    more than one share runs on."""
    on: dict[int, list[int]] = {}
    for i, cores in enumerate(split):
        for core in cores:
            on.setdefault(core, []).append(i)
    return {core: tuple(users) for core, users in sorted(on.items()) if len(users) > 1}
