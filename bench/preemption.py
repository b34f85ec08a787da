"""Preemption overheads of the bundled models (Shepherd Figure 12).

    python -m bench.preemption
    python -m bench.preemption --models cnn,torchcnn --sizes 1,4,16 --trials 7 --json

For each model and batch size, through a real executor process:

- **normal**: the batch's execution time as the executor reports it
  (started → finished), median of `--trials` runs;
- **preemption delay**: the batch is started at a known time and a cancel is
  sent at a uniformly random point between 10 % and 90 % of its normal
  time; the delay is from the cancel call in the parent to the end of the
  stopped batch as the executor reports it (same CLOCK_MONOTONIC), so it
  includes the pipe. Median over `--trials` stops;
- **exit-point overhead**: extra execution time of a normal batch caused by
  the means of preemption, measured in this process, alternating runs,
  fastest of each (see `_alternate`): Torch, the staged run with the exit points the backend chose
  minus the whole TorchScript module's forward; ONNX, `OnnxBackend.run` (a
  fresh RunOptions per run, which ORT checks between nodes) minus a plain
  `session.run`; emulated models have none by construction.

Relative figures are per batch size over that normal time; the summary takes
the median over batch sizes, as Shepherd reports an average over batch sizes
(§7.3). The target is ≤ 5 % for both. Output: a rich table on stdout, or
`--json`; `--markdown` prints the table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from app.repository.config import ModelConfig
from app.repository.loader import load_repository
from app.runtime.arena import Arena
from app.runtime.executor import CANCELLED, synthetic_inputs
from app.runtime.pool import ExecutorDevice, ExecutorPool

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("mlp", "cnn", "torchcnn", "resnet50-emulated")
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32)
TARGET = 0.05


@dataclass
class Point:
    """One model at one batch size (times in ms)."""

    batch: int
    normal_ms: float
    delay_ms: float
    overhead_ms: float | None  # None: no exit points by construction
    stops: int  # trials that ended cancelled (the others finished first)

    @property
    def delay_rel(self) -> float:
        return self.delay_ms / self.normal_ms

    @property
    def overhead_rel(self) -> float | None:
        return None if self.overhead_ms is None else self.overhead_ms / self.normal_ms


@dataclass
class ModelResult:
    model: str
    backend: str
    device: str
    exit_plan: str = ""
    points: list[Point] = field(default_factory=list)

    def median_delay_rel(self) -> float:
        return statistics.median(p.delay_rel for p in self.points)

    def median_overhead_rel(self) -> float | None:
        rel = [p.overhead_rel for p in self.points if p.overhead_rel is not None]
        return statistics.median(rel) if rel else None


# ------------------------------------------------------------ executor side
class _Done:
    def __init__(self) -> None:
        self.futures: dict[int, asyncio.Future] = {}

    def expect(self, batch_id: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.futures[batch_id] = fut
        return fut

    def __call__(self, device: int, batch_id: int, started: float, finished: float, error) -> None:
        fut = self.futures.pop(batch_id, None)
        if fut is not None and not fut.done():
            fut.set_result((started, finished, error))


async def _measure_executor(
    configs: list[ModelConfig], sizes: list[int], trials: int, threads: int, seed: int
) -> dict[str, tuple[str, list[tuple[int, float, float, int]]]]:
    """{model: (device name, [(batch, normal_ms, delay_ms, stops)])}"""
    devices = [
        ExecutorDevice(0, "cpu", "cpu:0", threads=threads),
        ExecutorDevice(1, "emulated", "emulated:0"),
    ]
    arenas = {c.name: Arena.create(c, capacity=c.max_batch_size) for c in configs}
    done = _Done()
    pool = ExecutorPool(devices, configs, arenas, done)
    rng = random.Random(seed)
    ids = iter(range(1, 10**9))
    out: dict[str, tuple[str, list[tuple[int, float, float, int]]]] = {}
    try:
        await pool.start()
        for config in configs:
            device = next((d for d in (0, 1) if config.name in pool.models_on(d)), None)
            if device is None:
                errors = {**pool.load_errors(0), **pool.load_errors(1)}
                print(f"{config.name}: not loaded: {errors.get(config.name)}", file=sys.stderr)
                continue
            arena = arenas[config.name]
            slots = [arena.acquire() for _ in range(config.max_batch_size)]
            inputs = synthetic_inputs(config, config.max_batch_size, seed=seed)
            for i, slot in enumerate(slots):
                arena.write_inputs(slot, {n: a[i] for n, a in inputs.items()})
            rows = []
            for b in [s for s in sizes if s <= config.max_batch_size]:
                batch = slots[:b]
                for _ in range(2):  # warm-up
                    fut = done.expect(bid := next(ids))
                    pool.submit(device, bid, config.name, batch, 0.0)
                    await fut
                normal = []
                for _ in range(trials):
                    fut = done.expect(bid := next(ids))
                    pool.submit(device, bid, config.name, batch, 0.0)
                    started, finished, error = await fut
                    assert error is None, error
                    normal.append(finished - started)
                normal_s = statistics.median(normal)
                delays = []
                for _ in range(trials):
                    fut = done.expect(bid := next(ids))
                    start_at = time.monotonic() + 0.005
                    pool.submit(device, bid, config.name, batch, start_at)
                    cancel_at = start_at + rng.uniform(0.1, 0.9) * normal_s
                    await asyncio.sleep(max(0.0, cancel_at - time.monotonic()))
                    asked = time.monotonic()
                    pool.cancel(device, bid)
                    started, finished, error = await fut
                    if error == CANCELLED:
                        delays.append(finished - asked)
                delay_ms = statistics.median(delays) * 1000 if delays else float("nan")
                rows.append((b, normal_s * 1000, delay_ms, len(delays)))
                print(
                    f"{config.name} b={b}: normal {normal_s * 1000:.2f} ms, "
                    f"delay {delay_ms:.2f} ms ({len(delays)}/{trials} stopped)",
                    file=sys.stderr,
                )
            out[config.name] = (devices[device].name, rows)
    finally:
        await pool.stop(timeout=10)
    return out


# -------------------------------------------------------------- in process
def _alternate(a, b, repeats: int) -> tuple[float, float]:
    """Fastest times (s) of two callables timed alternately after a warm-up:
    on a shared machine other processes only ever add time, and the
    difference sought (µs to a few % of a batch) is below the spread of the
    medians (±10–30 % on the 2-core box of BENCHMARKS.md)."""
    for f in (a, b, a, b):
        f()
    ta, tb = [], []
    for _ in range(repeats):
        for f, times in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
    return min(ta), min(tb)


def _measure_overheads(
    config: ModelConfig, sizes: list[int], repeats: int, threads: int, seed: int
) -> tuple[str, dict[int, float | None]]:
    """(exit plan description, {batch: extra ms of a normal batch})."""
    sizes = [s for s in sizes if s <= config.max_batch_size]
    if config.backend == "emulated":
        return "none (stops at once)", dict.fromkeys(sizes)
    if config.backend == "torch":
        import torch

        from app.runtime.torch_backend import TorchBackend

        backend = TorchBackend("cpu", 0, threads)
        backend.load(config)
        assert backend.plan is not None
        out: dict[int, float | None] = {}
        for b in sizes:
            x = synthetic_inputs(config, b, seed=seed)[config.inputs[0].name]
            tx = torch.from_numpy(x)

            def plain(tx=tx) -> None:
                with torch.inference_mode():
                    backend.module(tx)

            staged, whole = _alternate(lambda x=x: backend._forward(x), plain, repeats)
            out[b] = (staged - whole) * 1000
        return backend.plan.describe(), out
    from app.runtime.backends import OnnxBackend

    backend = OnnxBackend("cpu", 0, threads)
    backend.load(config)
    names = [s.name for s in config.outputs]
    out = {}
    for b in sizes:
        inputs = synthetic_inputs(config, b, seed=seed)
        with_opts, plain_run = _alternate(
            lambda inputs=inputs: backend.run(inputs),
            lambda inputs=inputs: backend.session.run(names, inputs),
            repeats,
        )
        out[b] = (with_opts - plain_run) * 1000
    return "ORT checks RunOptions.terminate between nodes", out


# ------------------------------------------------------------------ report
def _pct(x: float | None) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f} %"


def render(results: list[ModelResult], console: Console) -> None:
    table = Table(title="Preemption overheads (Shepherd Fig. 12)")
    for col in ("model", "batch", "normal ms", "stop delay ms", "delay", "exit overhead"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in results:
        for p in r.points:
            table.add_row(
                f"{r.model} ({r.backend}, {r.device})",
                str(p.batch),
                f"{p.normal_ms:.2f}",
                f"{p.delay_ms:.2f}",
                _pct(p.delay_rel),
                _pct(p.overhead_rel),
            )
        table.add_row(
            f"[b]{r.model}: median over sizes[/b]",
            "",
            "",
            "",
            f"[b]{_pct(r.median_delay_rel())}[/b]",
            f"[b]{_pct(r.median_overhead_rel())}[/b]",
            end_section=True,
        )
    console.print(table)
    for r in results:
        console.print(f"{r.model}: {r.exit_plan}")


def markdown(results: list[ModelResult]) -> str:
    lines = [
        "| model | backend (device) | stop delay, median over sizes | exit-point overhead | "
        "per batch size: b → normal ms / delay ms (delay %, overhead %) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        per = "; ".join(
            f"{p.batch} → {p.normal_ms:.1f} / {p.delay_ms:.2f} "
            f"({_pct(p.delay_rel)}, {_pct(p.overhead_rel)})"
            for p in r.points
        )
        lines.append(
            f"| {r.model} | {r.backend} ({r.device}) | {_pct(r.median_delay_rel())} | "
            f"{_pct(r.median_overhead_rel())} | {per} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preemption", description=__doc__)
    parser.add_argument("--repository", type=Path, default=ROOT / "models")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--trials", type=int, default=9, help="runs and stops per size")
    parser.add_argument(
        "--repeats", type=int, default=15, help="alternating runs per size for the overhead"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU executor threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if args.repository.resolve() == (ROOT / "models").resolve():
        from app.repository.bundled import ensure_bundled_models

        ensure_bundled_models(args.repository, names)
    index = load_repository(args.repository)
    missing = [n for n in names if n not in index.models]
    for n in missing:
        print(f"{n}: unavailable: {index.errors.get(n, 'not in the repository')}", file=sys.stderr)
    configs = [index.models[n] for n in names if n in index.models]
    if not configs:
        return 1
    measured = asyncio.run(_measure_executor(configs, sizes, args.trials, args.threads, args.seed))
    results = []
    for config in configs:
        if config.name not in measured:
            continue
        device, rows = measured[config.name]
        plan, extra = _measure_overheads(config, sizes, args.repeats, args.threads, args.seed)
        result = ModelResult(config.name, config.backend, device, plan)
        for b, normal_ms, delay_ms, stops in rows:
            result.points.append(Point(b, normal_ms, delay_ms, extra.get(b), stops))
        results.append(result)
    if args.json:
        doc = {
            "machine": machine(),
            "threads": args.threads,
            "trials": args.trials,
            "target": TARGET,
            "models": [
                {
                    **asdict(r),
                    "median_delay_rel": r.median_delay_rel(),
                    "median_overhead_rel": r.median_overhead_rel(),
                }
                for r in results
            ],
        }
        print(json.dumps(doc, indent=2))
    else:
        console = Console()
        render(results, console)
        console.print(f"machine: {machine()}")
    if args.markdown:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
