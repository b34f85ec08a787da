"""Round trip of one small message to a Ray actor on the driver's node, three
ways: a Ray call, a Ray compiled graph (accelerated DAG: shared-memory
channels), and the executors' batch channel (app/runtime/ray_channel.py).

    python -m bench.ray_channels [--repeats 500]

A local Ray instance (one CPU, no dashboard). Each way sends a small tuple
(what a batch plan is: an id, a model name, slots, a start time) and waits
for its answer, `repeats` times after 50 unmeasured ones; median and p99.
The batch channel's message is its ping (`Channel.round_trips`, what
`RayExecutorPool` measures at start), to an actor of an emulated device.
Prints a table; no files.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.ray_pool import RayExecutorPool

WARMUP = 50
PLAN = ("run", 7, "model", [0, 1, 2, 3], 0.0)


def timed(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median and p99 (ms) of `call`'s wall time."""
    times = []
    for i in range(WARMUP + repeats):
        t0 = time.perf_counter()
        call()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1e3
    return float(np.median(ms)), float(np.percentile(ms, 99))


def echo_actor(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, plan: Any) -> Any:
            return plan

    return Echo.remote()


def compiled_graph(ray: Any, actor: Any, repeats: int) -> tuple[float, float]:
    from ray.dag import InputNode

    with InputNode() as plan:
        dag = actor.echo.bind(plan)
    compiled = dag.experimental_compile()
    try:
        return timed(lambda: ray.get(compiled.execute(PLAN)), repeats)
    finally:
        compiled.teardown()


async def batch_channel(repeats: int) -> tuple[float, float]:
    config = ModelConfig(
        name="zero",
        backend="emulated",
        directory=Path("."),
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("x", "FP32", (-1, 4)),),
        max_batch_size=4,
        slo_ms=100.0,
        profile=ProfileSpec(alpha_ms=0.0, beta_ms=0.0),
    )
    device = ExecutorDevice(0, "emulated", "emulated:0")
    pool = RayExecutorPool([device], [config], {"zero": Arena.create(config, 4)}, lambda e: None)
    await pool.start()
    try:
        channel = pool._actors[device.id].channel
        assert channel is not None
        times = (await channel.round_trips(WARMUP + repeats, 10.0))[WARMUP:]
    finally:
        await pool.stop()
    ms = np.asarray(times) * 1e3
    return float(np.median(ms)), float(np.percentile(ms, 99))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_channels", description=__doc__)
    parser.add_argument("--repeats", type=int, default=500)
    args = parser.parse_args(argv)
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = echo_actor(ray)
        rows = {
            "Ray call": timed(lambda: ray.get(actor.echo.remote(PLAN)), args.repeats),
            "Ray compiled graph": compiled_graph(ray, actor, args.repeats),
            "batch channel (Unix socket)": asyncio.run(batch_channel(args.repeats)),
        }
    finally:
        ray.shutdown()
    print("| way | round trip median ms | p99 ms |")
    print("|---|---:|---:|")
    for name, (median, p99) in rows.items():
        print(f"| {name} | {median:.3f} | {p99:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
