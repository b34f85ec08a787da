"""The measuring parts of `bench.gpu_check`: the models it builds, the
repository it serves them from, ℓ(b) measured in process, and the stop delay
of a batch preempted at an exit point through a real executor.

Imported only after `bench.gpu_check` has installed what the daemon needs,
so this module may import the project (and torch) at the top.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.optional import import_torch
from app.repository.config import ModelConfig
from app.repository.loader import load_repository
from app.repository.profiles import fit_linear
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.events import BatchFinished, BatchStopped
from app.runtime.executor import synthetic_inputs
from app.runtime.pool import ExecutorPool
from app.runtime.torch_backend import TorchBackend
from bench.preemption import _Done


@dataclass(frozen=True)
class Sizes:
    """How big the run is: the GPU run's, or the CPU dry run's tiny ones."""

    image: int  # ResNet input height and width
    resnet_blocks: tuple[int, int, int, int]  # bottlenecks per stage (ResNet-50: 3, 4, 6, 3)
    resnet_width: int  # the stem's channels (ResNet-50: 64)
    max_batch: int
    profile_batches: tuple[int, ...]
    profile_repeats: int
    preempt_batches: tuple[int, ...]
    preempt_trials: int
    # The served ResNet's input (the same module: it pools adaptively). A
    # request carries its tensor as JSON, ~8 bytes a float: 1.2 MB at 224²,
    # which the front door parses at a few ms a request, so the capacity
    # steps serve a smaller image to measure the device and the policy.
    serve_image: int


GPU_SIZES = Sizes(224, (3, 4, 6, 3), 64, 64, tuple(range(1, 65)), 5, (1, 8, 32, 64), 25, 112)
DRY_SIZES = Sizes(32, (1, 1, 1, 1), 8, 8, (1, 2, 4, 8), 3, (1, 8), 5, 24)


# ------------------------------------------------------------------ models
def _plain_resnet(torch: Any, blocks: tuple[int, ...], width: int, seed: int) -> tuple[Any, str]:
    """A ResNet of bottleneck blocks (ResNet-50's layout with `blocks`
    (3, 4, 6, 3) and `width` 64) in plain torch, random weights."""
    nn = torch.nn
    torch.manual_seed(seed)

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            cout = mid * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.down = (
                nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
                )
                if stride != 1 or cin != cout
                else nn.Identity()
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):  # unannotated: TorchScript takes it as a Tensor
            return self.relu(self.body(x) + self.down(x))

    layers: list[Any] = [
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    cin = width
    for stage, count in enumerate(blocks):
        mid = width * 2**stage
        for i in range(count):
            layers.append(Bottleneck(cin, mid, 2 if (i == 0 and stage > 0) else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers).eval(), f"ResNet-like in plain torch, blocks {list(blocks)}"


def build_resnet(sizes: Sizes, seed: int = 0) -> tuple[Any, str]:
    """ResNet-50 of torchvision with random weights when it imports and the
    sizes are ResNet-50's, else the same layout in plain torch; as an
    `nn.Sequential` of its stem, bottlenecks and head, so that the Torch
    backend can put exit points between them (app/runtime/torch_model.py)."""
    torch = import_torch()
    if sizes.resnet_blocks == (3, 4, 6, 3) and sizes.resnet_width == 64:
        try:
            import torchvision
        except ImportError:
            pass
        else:
            torch.manual_seed(seed)
            net = torchvision.models.resnet50(weights=None).eval()
            layers = [net.conv1, net.bn1, net.relu, net.maxpool]
            for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
                layers.extend(stage.children())
            layers += [net.avgpool, torch.nn.Flatten(), net.fc]
            what = f"torchvision {torchvision.__version__} resnet50, random weights"
            return torch.nn.Sequential(*layers).eval(), what
    return _plain_resnet(torch, sizes.resnet_blocks, sizes.resnet_width, seed)


def _save_script(module: Any, path: Path) -> None:
    import warnings

    torch = import_torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))


CONFIG = """\
description: {description}
backend: torch
model_file: model.pt
inputs:
  - {{name: input, datatype: FP32, shape: [-1, 3, {size}, {size}]}}
outputs:
  - {{name: output, datatype: FP32, shape: [-1, {classes}]}}
max_batch_size: {max_batch}
slo_ms: {slo_ms}
"""


def write_model(
    root: Path, name: str, module: Any, description: str, size: int, classes: int, sizes: Sizes
) -> None:
    """`module` as a TorchScript model `name` of the repository at `root`."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    _save_script(module, folder / "model.pt")
    set_slo(root, name, 1000.0, description=description, size=size, classes=classes, sizes=sizes)


def set_slo(
    root: Path,
    name: str,
    slo_ms: float,
    *,
    description: str,
    size: int,
    classes: int,
    sizes: Sizes,
) -> None:
    text = CONFIG.format(
        description=description.replace(":", " -"),
        size=size,
        classes=classes,
        max_batch=sizes.max_batch,
        slo_ms=round(slo_ms, 3),
    )
    (root / name / "config.yaml").write_text(text)


def build_repository(root: Path, sizes: Sizes) -> dict[str, Any]:
    """The repository the run serves: `resnet50` and the bundled `torchcnn`
    (app/repository/bundled.py, seed 0), both Torch models of max batch
    `sizes.max_batch`. Returns what was built."""
    from app.repository.bundled import build_torchcnn

    resnet, what = build_resnet(sizes)
    meta = {"image": sizes.image, "max_batch": sizes.max_batch}
    write_model(root, "resnet50", resnet, what, sizes.image, 1000, sizes)
    write_model(root, "torchcnn", build_torchcnn(), "bundled torchcnn", 32, 10, sizes)
    index = load_repository(root)
    if index.errors:
        raise RuntimeError(f"repository {root}: {index.errors}")
    return {
        "resnet50": {**meta, "built": what, "parameters": _parameters(resnet)},
        "torchcnn": {"image": 32, "max_batch": sizes.max_batch, "built": "bundled torchcnn"},
    }


def _parameters(module: Any) -> int:
    return int(sum(p.numel() for p in module.parameters()))


# ----------------------------------------------------------------- profile
def profile_model(
    config: ModelConfig,
    device: str,
    sizes: Sizes,
    threads: int,
    deadline: float,
    batches: tuple[int, ...] = (),
) -> dict[str, Any]:
    """ℓ(b) of `config` through `TorchBackend.run` (inputs from and outputs
    to host memory, exit points as chosen at load, as the executor runs it):
    median of `sizes.profile_repeats` runs after one warm-up, per batch
    size, then the linear fit. Stops early (keeping what it has) at
    `deadline` (time.monotonic())."""
    backend = TorchBackend(device, 0, threads)
    backend.load(config)
    assert backend.plan is not None
    table: dict[int, float] = {}
    for b in batches or sizes.profile_batches:
        if b > config.max_batch_size or time.monotonic() > deadline:
            break
        inputs = synthetic_inputs(config, b)
        backend.run(inputs)
        times = []
        for _ in range(sizes.profile_repeats):
            t0 = time.perf_counter()
            backend.run(inputs)
            times.append(time.perf_counter() - t0)
        table[b] = statistics.median(times) * 1000
    alpha, beta, r2 = fit_linear(table)
    return {
        "device": device,
        "latency_ms": {str(b): round(ms, 4) for b, ms in table.items()},
        "alpha_ms": alpha,
        "beta_ms": beta,
        "r2": r2,
        "exit_plan": backend.plan.describe(),
        "exit_points": backend.plan.exit_points,
        "complete": len(table)
        == len([b for b in batches or sizes.profile_batches if b <= config.max_batch_size]),
    }


# -------------------------------------------------------------- preemption
def _p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


async def _preempt(
    configs: list[ModelConfig], device: ExecutorDevice, sizes: Sizes, deadline: float, seed: int
) -> dict[str, Any]:
    """Per model and batch size, through one executor on `device`: the
    batch's time (median), and the stop delay of a cancel sent at a uniform
    random point of 10-90 % of it (bench/preemption.py's method), median
    and p99."""
    arenas = {c.name: Arena.create(c, capacity=c.max_batch_size) for c in configs}
    done = _Done()
    pool = ExecutorPool([device], configs, arenas, done)
    rng = random.Random(seed)
    ids = iter(range(1, 10**9))
    out: dict[str, Any] = {}
    try:
        await pool.start()
        for config in configs:
            if config.name not in pool.models_on(0):
                out[config.name] = {"error": f"not loaded: {pool.load_errors(0).get(config.name)}"}
                continue
            arena = arenas[config.name]
            slots = [arena.acquire() for _ in range(config.max_batch_size)]
            inputs = synthetic_inputs(config, config.max_batch_size, seed=seed)
            for i, slot in enumerate(slots):
                arena.write_inputs(slot, {n: a[i] for n, a in inputs.items()})
            rows = []
            for b in sizes.preempt_batches:
                if b > config.max_batch_size or time.monotonic() > deadline:
                    continue
                batch = slots[:b]
                normal = []
                for k in range(2 + sizes.preempt_trials):
                    fut = done.expect(bid := next(ids))
                    pool.submit(0, bid, config.name, batch, 0.0)
                    ran = await fut
                    if not isinstance(ran, BatchFinished) or ran.error is not None:
                        raise RuntimeError(f"{config.name} b={b}: {ran}")
                    if k >= 2:  # two warm-ups
                        normal.append(ran.finished_at - ran.started_at)
                normal_s = statistics.median(normal)
                delays = []
                for _ in range(sizes.preempt_trials):
                    fut = done.expect(bid := next(ids))
                    start_at = time.monotonic() + 0.005
                    pool.submit(0, bid, config.name, batch, start_at)
                    cancel_at = start_at + rng.uniform(0.1, 0.9) * normal_s
                    await asyncio.sleep(max(0.0, cancel_at - time.monotonic()))
                    asked = time.monotonic()
                    pool.cancel(0, bid)
                    ended = await fut
                    if isinstance(ended, BatchStopped):
                        delays.append((ended.at - asked) * 1000)
                rows.append(
                    {
                        "batch": b,
                        "normal_ms": normal_s * 1000,
                        "stops": len(delays),
                        "trials": sizes.preempt_trials,
                        "delay_median_ms": statistics.median(delays) if delays else None,
                        "delay_p99_ms": _p99(delays) if delays else None,
                        "delay_rel_median": (
                            statistics.median(delays) / (normal_s * 1000) if delays else None
                        ),
                    }
                )
            out[config.name] = {"device": device.name, "points": rows}
    finally:
        await pool.stop(timeout=10)
    return out


def preemption(
    root: Path, names: list[str], device: ExecutorDevice, sizes: Sizes, deadline: float
) -> dict[str, Any]:
    index = load_repository(root)
    configs = [index.models[n] for n in names]
    return asyncio.run(_preempt(configs, device, sizes, deadline, seed=0))
