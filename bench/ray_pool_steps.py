"""The in-process steps of `bench.ray_executors`: the same batches through a
local `ExecutorPool` and through `RayExecutorPool`s whose one actor is
pinned to the driver's raylet (shared-memory arena) or to another raylet
(Ray's object store), on a `LocalRayCluster`.

* outputs: a small ONNX MLP (built here with `onnx`), the same rows through
  each pool, max |Δ| against the local pool's outputs;
* dispatch overhead: batches of one row of an emulated model with
  ℓ(b) = 0, sent one after another (each after the previous one's event);
  per batch, the time from `submit` to its BatchFinished reaching the sink
  minus the run time the executor reports — what the pool and its transport
  add to a batch, not what the model takes.

Every batch must end in exactly one event, without an error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.events import BatchFinished, BatchStopped, ExecutorEvent
from app.runtime.pool import ExecutorPool
from app.runtime.ray_pool import RayExecutorPool

# The ways a batch reaches an executor, in the order they are run: a local
# executor process; a Ray actor on the driver's node through its batch
# channel (app/runtime/ray_channel.py) or through Ray calls; one on another
# raylet (Ray's object store).
LOCAL, SAME_NODE, SAME_NODE_CALLS, OTHER_NODE = (
    "local",
    "ray same node",
    "ray same node, Ray calls",
    "ray other node",
)
KINDS = (LOCAL, SAME_NODE, SAME_NODE_CALLS, OTHER_NODE)
CPU = ExecutorDevice(0, "cpu", "cpu:0", threads=1)
EMULATED = ExecutorDevice(0, "emulated", "emulated:0")
WIDTH = 16  # the MLP's features
OUTPUT_ROWS = 24
ROWS_PER_BATCH = 4
EVENT_TIMEOUT_S = 30.0  # one batch's event; none should take more than milliseconds


class StepFailed(RuntimeError):
    """A batch did not end in exactly one error-free event."""


@dataclass
class TimedEvents:
    """The pool's event sink: every event with when it arrived (monotonic),
    and a future per batch id."""

    events: list[tuple[float, ExecutorEvent]] = field(default_factory=list)
    futures: dict[int, asyncio.Future] = field(default_factory=dict)

    def expect(self, batch_id: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.futures[batch_id] = future
        return future

    def __call__(self, event: ExecutorEvent) -> None:
        arrived = time.monotonic()
        self.events.append((arrived, event))
        if isinstance(event, BatchFinished | BatchStopped):
            future = self.futures.get(event.batch_id)
            if future is not None and not future.done():
                future.set_result((arrived, event))

    def ends(self) -> list[int]:
        """The batch ids of every BatchFinished or BatchStopped, in order."""
        return [e.batch_id for _, e in self.events if isinstance(e, BatchFinished | BatchStopped)]


def mlp_model(path: Path) -> ModelConfig:
    """Y = Relu(X·W + B), FP32 [-1, WIDTH], written to `path` as ONNX."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
    b = rng.standard_normal(WIDTH).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["add"]),
            helper.make_node("Relu", ["add"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTH])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # readable by older onnxruntime releases too
    path.parent.mkdir(parents=True, exist_ok=True)
    save(model, str(path))
    return ModelConfig(
        name="mlp",
        backend="onnx",
        directory=path.parent,
        inputs=(TensorSpec("x", "FP32", (-1, WIDTH)),),
        outputs=(TensorSpec("y", "FP32", (-1, WIDTH)),),
        max_batch_size=16,
        slo_ms=100.0,
        model_file=path,
    )


def zero_model() -> ModelConfig:
    """An emulated model that holds its device for ℓ(b) = 0."""
    return ModelConfig(
        name="zero",
        backend="emulated",
        directory=Path("."),
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("x", "FP32", (-1, 4)),),
        max_batch_size=8,
        slo_ms=100.0,
        profile=ProfileSpec(alpha_ms=0.0, beta_ms=0.0),
    )


PoolFactory = Callable[[str, ExecutorDevice, ModelConfig, Arena, TimedEvents], Any]


def pool_factory(same_node: str, other_node: str) -> PoolFactory:
    """Makes the pool of a kind: the Ray ones pinned to `same_node` (the
    driver's raylet) or `other_node` (Ray node ids)."""

    def make(
        kind: str, device: ExecutorDevice, config: ModelConfig, arena: Arena, sink: TimedEvents
    ) -> Any:
        arenas = {config.name: arena}
        if kind == LOCAL:
            return ExecutorPool([device], [config], arenas, sink)
        node = {SAME_NODE: same_node, SAME_NODE_CALLS: same_node, OTHER_NODE: other_node}[kind]
        return RayExecutorPool(
            [device],
            [config],
            arenas,
            sink,
            nodes={device.id: node},
            channel=kind != SAME_NODE_CALLS,
        )

    return make


async def run_one_by_one(
    pool: Any, sink: TimedEvents, device: ExecutorDevice, model: str, batches: Sequence[list[int]]
) -> list[float]:
    """Submit `batches` one after another, each once the previous one's event
    came; each batch's overhead (s): submit → event, minus the run time."""
    overheads = []
    for batch_id, rows in enumerate(batches):
        future = sink.expect(batch_id)
        submitted = time.monotonic()
        pool.submit(device.id, batch_id, model, rows, submitted)
        arrived, event = await asyncio.wait_for(future, EVENT_TIMEOUT_S)
        if not isinstance(event, BatchFinished) or event.error is not None:
            raise StepFailed(f"{type(pool).__name__}: batch {batch_id} ended with {event}")
        overheads.append((arrived - submitted) - (event.finished_at - event.started_at))
    await asyncio.sleep(0.1)  # any late, second event would come now
    if sink.ends() != list(range(len(batches))):
        raise StepFailed(f"{type(pool).__name__}: batch events {sink.ends()} are not one a batch")
    return overheads


async def outputs_of(make: PoolFactory, kind: str, config: ModelConfig, xs: np.ndarray) -> Any:
    """`xs` through a pool of `kind` in batches of ROWS_PER_BATCH; the
    outputs, row by row, and the pool's data path."""
    arena = Arena.create(config, capacity=len(xs))
    sink = TimedEvents()
    pool = make(kind, CPU, config, arena, sink)
    try:
        await pool.start()
        slots = arena.acquire_rows(len(xs))
        if slots is None:
            raise StepFailed("the arena has no room for the rows")
        arena.write_rows(slots, {"x": xs})
        batches = [slots[i : i + ROWS_PER_BATCH] for i in range(0, len(slots), ROWS_PER_BATCH)]
        await run_one_by_one(pool, sink, CPU, config.name, batches)
        return np.array(arena.read_rows(slots)["y"], copy=True), data_path(pool, CPU)
    finally:
        await pool.stop()


async def overheads_of(make: PoolFactory, kind: str, batches: int) -> dict[str, Any]:
    """`batches` one-row batches of `zero_model` through a pool of `kind`."""
    config = zero_model()
    arena = Arena.create(config, capacity=4)
    sink = TimedEvents()
    pool = make(kind, EMULATED, config, arena, sink)
    try:
        await pool.start()
        slots = arena.acquire_rows(1)
        if slots is None:
            raise StepFailed("the arena has no room for a row")
        arena.write_rows(slots, {"x": np.ones((1, 4), dtype=np.float32)})
        overheads = await run_one_by_one(pool, sink, EMULATED, config.name, [slots] * batches)
        path = data_path(pool, EMULATED)
    finally:
        await pool.stop()
    ms = np.asarray(overheads) * 1e3
    return {
        "batches": batches,
        "events": len(sink.ends()),
        "data_path": path,
        "median_ms": float(np.median(ms)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def data_path(pool: Any, device: ExecutorDevice) -> str:
    if isinstance(pool, RayExecutorPool):
        if pool.remote(device.id):
            where = "object store"
        elif pool.channelled(device.id):
            where = "shared-memory arena, batch channel"
        else:
            where = "shared-memory arena, Ray calls"
        return f"{where} (node {pool.node_of(device.id)[:8]})"
    return "shared-memory arena (executor process)"


async def pool_steps(
    same_node: str, other_node: str, model_dir: Path, batches: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """Both steps for the three kinds (Ray must be initialised, connected to
    the cluster whose nodes these are)."""
    make = pool_factory(same_node, other_node)
    config = mlp_model(model_dir / "mlp" / "model.onnx")
    xs = np.random.default_rng(1).standard_normal((OUTPUT_ROWS, WIDTH)).astype(np.float32)
    outputs: dict[str, Any] = {}
    reference = None
    for kind in KINDS:
        ys, path = await outputs_of(make, kind, config, xs)
        if reference is None:
            reference = ys
        delta = float(np.abs(ys - reference).max())
        outputs[kind] = {"rows": len(ys), "data_path": path, "max_abs_delta": delta}
        log(f"  outputs {kind}: max |Δ| {delta:g} ({path})")
    overheads = {}
    for kind in KINDS:
        overheads[kind] = await overheads_of(make, kind, batches)
        o = overheads[kind]
        log(f"  overhead {kind}: median {o['median_ms']:.3f} ms, p99 {o['p99_ms']:.3f} ms")
    return {"outputs": outputs, "overhead": overheads}
