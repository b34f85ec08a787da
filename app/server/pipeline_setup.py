"""A PPipe layout served live on this machine: one executor process per
device instance, each instance's partitions loaded, one pipeline arena per
model, and the driver (app/server/pipeline_driver.py) over them.

Device instances become CPU executors of their live device class
(app/repository/block_profile.py's `DeviceClass`: intra-op threads, and an
emulated `slowdown` the executor applies by holding each batch): instance i
of the layout is executor device i, named `CLASS:i`. A share 1/v of a class
is an executor with threads / v threads.

Partitions. Every block range a pipeline's stage runs is written as an ONNX
model (`write_partition`) and loaded on exactly the instances of the pools
that run it (`ModelConfig.devices`). A model's pipelines may cut it at
different blocks; its one arena carries the tensor at every cut any of them
uses, and each partition sees the slice it reads and writes
(`partition_view`): whichever pipeline a batch is routed to, or re-routed
to after a failure, its requests keep their slots.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.repository.config import ModelConfig
from app.repository.device_class import DeviceClass
from app.repository.partition import (
    Partitioning,
    partition_config,
    partition_name,
    write_partition,
)
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.pool import ExecutorPool
from app.runtime.stage_arena import create_pipeline_arena, partition_view
from app.scheduling.ppipe.layout import Layout
from app.scheduling.ppipe.policy import PPipeScheduler
from app.server.pipeline_driver import PipelineDriver
from app.server.pipeline_types import PipelineModel


@dataclass(frozen=True)
class PartitionArena:
    """What the executor pool needs of a partition's arena: the layout its
    executors attach. The segment belongs to the pipeline arena, whose owner
    unlinks it; the pool's `close_and_unlink` at its stop does nothing."""

    layout: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.layout["name"])

    def close_and_unlink(self) -> None:
        return None


def instance_devices(layout: Layout, classes: Mapping[str, DeviceClass]) -> list[ExecutorDevice]:
    """An executor device per instance of `layout`, of its live class."""
    devices = []
    for instance in layout.devices:
        cls = classes.get(instance.device_class)
        if cls is None:
            raise ValueError(
                f"instance {instance.id} is of class {instance.device_class!r}, "
                f"not one of the live classes {sorted(classes)}"
            )
        devices.append(
            ExecutorDevice(
                instance.id,
                "cpu",
                f"{cls.name}:{instance.id}",
                threads=cls.threads_at(instance.share),
                slowdown=cls.slowdown,
            )
        )
    return devices


@dataclass
class ModelPartitions:
    """One model's partitions as the executors load them."""

    arena: Arena  # the daemon's side of the pipeline arena (owner)
    configs: dict[str, ModelConfig]  # partition name → config, on its instances only
    views: dict[str, dict[str, Any]]  # partition name → its arena layout
    ranges: dict[tuple[int, int], str]  # block range → partition name


def model_partitions(
    partitioning: Partitioning,
    layout: Layout,
    devices: list[ExecutorDevice],
    directory: Path,
    *,
    capacity: int,
) -> ModelPartitions:
    """Write the partitions `layout`'s pipelines of `partitioning.name` run
    under `directory` and create the model's pipeline arena (`capacity`
    slots)."""
    model = partitioning.name
    pipelines = layout.pipelines_of(model)
    if not pipelines:
        raise ValueError(f"the layout has no pipeline of {model!r}")
    names = {d.id: d.name for d in devices}
    runs_on: dict[tuple[int, int], set[str]] = {}
    for pipeline in pipelines:
        for stage in pipeline.stages:
            runs_on.setdefault((stage.start, stage.end), set()).update(
                names[i] for i in stage.devices
            )
    # Batches up to the profile's largest: a request may outgrow the planned size.
    max_batch = max(len(s.latency) for p in pipelines for s in p.stages)
    # The arena carries the tensor at every cut some pipeline makes.
    cuts = sorted({b for r in runs_on for b in r})
    chain = [
        partition_config(
            partitioning,
            a,
            b,
            directory / f"{partition_name(model, a, b)}.onnx",
            max_batch_size=max_batch,
        )
        for a, b in itertools.pairwise(cuts)
    ]
    arena, pipeline_layout = create_pipeline_arena(model, chain, capacity)
    configs: dict[str, ModelConfig] = {}
    views: dict[str, dict[str, Any]] = {}
    ranges: dict[tuple[int, int], str] = {}
    try:
        for (start, end), instances in sorted(runs_on.items()):
            path = write_partition(partitioning, start, end, directory)
            config = partition_config(partitioning, start, end, path, max_batch_size=max_batch)
            config = dataclasses.replace(config, devices=tuple(sorted(instances)))
            configs[config.name] = config
            views[config.name] = partition_view(
                pipeline_layout,
                config.name,
                [t.name for t in config.inputs],
                [t.name for t in config.outputs],
            )
            ranges[(start, end)] = config.name
    except BaseException:
        arena.close_and_unlink()
        raise
    return ModelPartitions(arena, configs, views, ranges)


class LivePipelines:
    """Executors, arenas and the driver of one `PPipeScheduler`'s layout.
    `await start()`, then `driver.submit(...)`; `await stop()` at the end."""

    def __init__(
        self,
        scheduler: PPipeScheduler,
        partitionings: Mapping[str, Partitioning],
        classes: Mapping[str, DeviceClass],
        directory: Path,
        *,
        capacity: int = 64,
        respawn: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        layout = scheduler.layout
        self.devices = instance_devices(layout, classes)
        self.partitions: dict[str, ModelPartitions] = {}
        try:
            for model in layout.slo_s:
                if model not in partitionings:
                    raise ValueError(f"no partitioning of model {model!r}")
                self.partitions[model] = model_partitions(
                    partitionings[model], layout, self.devices, Path(directory), capacity=capacity
                )
        except BaseException:
            self._unlink()
            raise
        configs = {n: c for p in self.partitions.values() for n, c in p.configs.items()}
        views = {
            n: PartitionArena(view) for p in self.partitions.values() for n, view in p.views.items()
        }
        models = {
            name: PipelineModel(name, p.arena, p.ranges) for name, p in self.partitions.items()
        }
        self.pool = ExecutorPool(
            self.devices,
            configs,
            views,  # type: ignore[arg-type]  # the pool only sends their layouts
            self._post,
            respawn=respawn,
        )
        self.driver = PipelineDriver(scheduler, models, self.pool, clock=clock)
        # Sees every executor event before the driver does (logs, metrics).
        self.on_event: Callable[[Any], None] | None = None

    def _post(self, event: Any) -> None:
        if self.on_event is not None:
            self.on_event(event)
        self.driver.post(event)

    async def start(self, timeout: float = 120.0) -> None:
        try:
            await self.pool.start(timeout)
        except BaseException:
            self._unlink()
            raise
        missing = {
            d.name: sorted(set(self.pool.placement(d.id)) - set(self.pool.models_on(d.id)))
            for d in self.devices
        }
        missing = {k: v for k, v in missing.items() if v}
        if missing:
            await self.stop()
            errors = {d.name: self.pool.load_errors(d.id) for d in self.devices}
            raise RuntimeError(f"partitions failed to load: {missing}: {errors}")

    async def warm_up(self, timeout: float = 30.0) -> None:
        """Run each partition once at batch 1 on each executor holding it:
        a fresh session's first run costs more (its memory, its kernels'
        first calls), and pipelines started while serving take traffic at
        once (app/server/pipeline_switch.py)."""
        workers = self.pool.workers
        await asyncio.gather(
            *(
                self.pool.warm_up(workers[d.id], model, timeout)
                for d in self.devices
                for model in self.pool.models_on(d.id)
            )
        )

    async def stop(self) -> None:
        from app.errors import ShuttingDown

        self.driver.fail_all(ShuttingDown("stopped"))
        await self.pool.stop()
        self._unlink()

    def _unlink(self) -> None:
        for p in self.partitions.values():
            if not p.arena.closed:
                p.arena.close_and_unlink()


async def wait_answered(driver: PipelineDriver, timeout: float) -> bool:
    """Wait until every submitted request has its answer (True) or
    `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while driver.pending and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return not driver.pending
