"""Measuring bundled ONNX models on CPU shares through the real runtime, for
bench/inss_cpu_model.py: alone at each share, two at once on one core each,
and the shared-memory arena's copy bandwidth.

* Alone: `ExecutorPool.profile` on one executor (its synthetic inputs, the
  median of `repeats` timed runs after `warmup`, timed inside the executor
  around the backend's run: the running time, without the arena copies).
  A share of 0.5 is one executor of `cpu=0.5,0.5` (one core, one thread)
  while the other executor of that split idles; a share of 1 is the whole
  device split as `cpu=1` (both cores, two threads).
* Co-located: both executors of `cpu=0.5,0.5` (one core each) run back to
  back at once — each a loop of `profile` calls at the configuration's
  batch size — until both have finished `calls` + 2 calls; the first and
  the last call of each loop are dropped (the other may not have started
  yet, or may have stopped), and the time is the median of the kept calls'
  medians. Each call times enough runs to last about `call_s`, so the gaps
  between calls (a message each way and the synthetic inputs) are a small
  part of the co-runner's time.
* Arena bandwidth: the parent's `Arena.gather` of a batch's inputs and
  `scatter` of its outputs, timed in this process (the copies the executor
  makes around each batch; a memory copy on one core).

Nothing here fits anything; see bench/inss_cpu_fit.py.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.repository.bundled import ensure_bundled_models
from app.repository.config import ModelConfig
from app.repository.loader import load_model_config
from app.runtime.arena import Arena
from app.runtime.devices import detect_devices
from app.runtime.pool import ExecutorPool

MODELS_ROOT = Path(__file__).resolve().parent.parent / "app" / "models"
ONE_CORE = 0.5  # a share of this box's 2 cores
WHOLE = 1.0


@dataclass(frozen=True)
class AlonePoint:
    model: str
    share: float
    batch: int
    seconds: float


@dataclass(frozen=True)
class CoPoint:
    """`model`'s running time at `batch` and `share` while `co_runner` runs at
    the same batch size and `co_share` on the other core."""

    model: str
    co_runner: str
    batch: int
    share: float
    co_share: float
    seconds: float
    calls: int  # the profile calls whose medians gave `seconds`


def load_models(names: Sequence[str]) -> dict[str, ModelConfig]:
    """The bundled models `names` (their ONNX files built when missing),
    each checked to be an ONNX model."""
    ensure_bundled_models(MODELS_ROOT, names)
    configs = {}
    for name in names:
        directory = MODELS_ROOT / name
        if not (directory / "config.yaml").is_file():
            raise ValueError(f"{name!r} is not a bundled model under {MODELS_ROOT}")
        config = load_model_config(directory)
        if config.backend != "onnx":
            raise ValueError(f"model {name!r} has backend {config.backend!r}, not onnx")
        configs[name] = config
    return configs


def _ignore(_event: object) -> None:
    """The pool's event sink: `profile` answers through its own future and no
    batch is submitted, so there is nothing to handle."""


async def started_pool(shares: Sequence[float], configs: dict[str, ModelConfig]) -> ExecutorPool:
    devices = detect_devices(cpu_slices=1, shares={"cpu": tuple(shares)})
    pool = ExecutorPool(devices, configs, {}, _ignore, heartbeat_timeout_s=0.0)
    await pool.start()
    for device in devices:
        missing = set(configs) - set(pool.models_on(device.id))
        if missing:
            await pool.stop()
            raise RuntimeError(f"{device.name}: not loaded: {pool.load_errors(device.id)}")
    return pool


def batches_of(config: ModelConfig, batches: Sequence[int]) -> list[int]:
    """The batch sizes the model takes (≤ its max_batch_size)."""
    return sorted(b for b in set(batches) if b <= config.max_batch_size)


async def measure_alone(
    configs: dict[str, ModelConfig],
    batches: Sequence[int],
    warmup: int,
    repeats: int,
    pool_split: ExecutorPool,
) -> list[AlonePoint]:
    """Every model alone at one core (executor 0 of `pool_split`) and at the
    whole device (a pool of its own, started and stopped here)."""
    points = []
    for name, config in configs.items():
        sizes = batches_of(config, batches)
        ms = await pool_split.profile(0, name, sizes, warmup=warmup, repeats=repeats)
        points += [AlonePoint(name, ONE_CORE, b, ms[b] / 1000.0) for b in sizes]
    whole = await started_pool([WHOLE], configs)
    try:
        for name, config in configs.items():
            sizes = batches_of(config, batches)
            ms = await whole.profile(0, name, sizes, warmup=warmup, repeats=repeats)
            points += [AlonePoint(name, WHOLE, b, ms[b] / 1000.0) for b in sizes]
    finally:
        await whole.stop()
    return points


async def _loop(
    pool: ExecutorPool,
    device: int,
    model: str,
    batch: int,
    repeats: int,
    stop: asyncio.Event,
    out: list[float],
) -> None:
    while not stop.is_set():
        ms = await pool.profile(device, model, [batch], warmup=0, repeats=repeats)
        out.append(ms[batch] / 1000.0)


async def measure_pair(
    pool: ExecutorPool,
    first: str,
    second: str,
    batch: int,
    alone_s: Callable[[str], float],
    calls: int,
    call_s: float,
) -> tuple[CoPoint, CoPoint]:
    """`first` on executor 0 and `second` on executor 1 of `pool` (one core
    each), at `batch`, at once; `alone_s(model)` sizes each call."""
    runs = {m: max(1, min(200, math.ceil(call_s / alone_s(m)))) for m in (first, second)}
    times: tuple[list[float], list[float]] = ([], [])
    stop = asyncio.Event()
    loops = [
        asyncio.create_task(_loop(pool, i, m, batch, runs[m], stop, times[i]))
        for i, m in enumerate((first, second))
    ]
    try:
        while min(len(t) for t in times) < calls + 2:
            done = [task for task in loops if task.done()]
            if done:
                await done[0]  # raises what ended it
                raise RuntimeError("a co-location loop ended early")
            await asyncio.sleep(0.002)
    finally:
        stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
    kept = [t[1:-1] for t in times]
    return (
        CoPoint(first, second, batch, ONE_CORE, ONE_CORE, statistics.median(kept[0]), len(kept[0])),
        CoPoint(second, first, batch, ONE_CORE, ONE_CORE, statistics.median(kept[1]), len(kept[1])),
    )


def arena_bandwidth(configs: dict[str, ModelConfig], batch: int, repeats: int) -> float:
    """Bytes/s of the arena's copies in and out of a batch: the median over
    the fixed-shape models of (input + output bytes) / (gather + scatter)."""
    rates = []
    for config in configs.values():
        if any(s.variable for s in (*config.inputs, *config.outputs)):
            continue  # variable shapes are copied row by row, not as one batch
        b = min(batch, config.max_batch_size)
        arena = Arena.create(config, capacity=b)
        try:
            slots = arena.acquire_rows(b)
            assert slots is not None
            outputs = {s.name: np.ones((b, *s.slot_shape), dtype=s.dtype) for s in config.outputs}
            nbytes = sum(s.item_nbytes for s in (*config.inputs, *config.outputs)) * b
            took = []
            for _ in range(repeats + 2):
                t0 = time.perf_counter()
                for name in arena.input_names:
                    arena.gather(name, slots)
                for name, array in outputs.items():
                    arena.scatter(name, slots, array)
                took.append(time.perf_counter() - t0)
            rates.append(nbytes / statistics.median(took[2:]))
        finally:
            arena.close_and_unlink()
    if not rates:
        raise ValueError("no fixed-shape model to measure the arena's bandwidth with")
    return statistics.median(rates)


def item_bytes(config: ModelConfig) -> tuple[float, float]:
    """(p_d, p_f): input and output bytes per item, at their bounds."""
    return (
        float(sum(s.item_nbytes for s in config.inputs)),
        float(sum(s.item_nbytes for s in config.outputs)),
    )
