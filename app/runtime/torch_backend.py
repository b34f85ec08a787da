"""Torch backend: a model run stage by stage with exit points between stages.

Shepherd preempts a running batch in software, adapting PipeSwitch: the
model runs as a sequence of stages and, between two stages, an *exit point*
checks a preemption flag; when it is set the run stops there
(shepherd-nsdi23.txt §6). `terminate()` sets the flag from the executor's
control thread (a `threading.Event`: the reader thread and the run share the
executor process).

Models. `model_file` is a TorchScript file (`torch.jit.save`) of an
`nn.Sequential`; its (top-level) children are the *layers*, the units an
exit point can sit between. Any other module is one
layer: it runs, but can only be stopped before it starts. One input tensor,
one output tensor (the config's first input and output).

Exit points. Too few leave a long preemption delay (the rest of the current
stage); too many slow every batch down (each exit point costs a flag check,
a Python step and, on a GPU, a stream synchronisation — without it the host
would queue every kernel ahead and the flag would be checked long before
the GPU reaches the exit point). The number is chosen per model at load by
profiling that trade-off (§6, §7.3):

1. time each layer at a representative batch size (the model's
   `max_batch_size` // 2, at least 1), with a synchronisation after each;
2. measure the cost `c` of one exit point: the run with an exit after every
   layer minus the run with none, over the number of layers (median of
   alternating repeats, ≥ 0);
3. for each candidate number of exit points k (0 … layers − 1), cut the
   layers into k + 1 stages of near-equal time (greedy on the cumulative
   time); a stop requested at a uniformly random moment waits on average
   delay(k) = Σ s_j² / (2 Σ s_j) for stage times s_j, and each batch pays
   overhead(k) = k·c;
4. take the k that minimises delay(k) + overhead(k) (ties: fewer exit points).

`parameters: {exit_points: k}` in config.yaml pins k instead (clamped to
layers − 1). `plan` keeps what was measured (`TorchBackend.plan`).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.repository.config import ModelConfig
from app.runtime.backends import Terminated


def import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # optional extra
        raise RuntimeError(
            "backend 'torch' needs PyTorch: pip install -e '.[torch]' (torch==2.13.0)"
        ) from exc
    return torch


@dataclass
class ExitPlan:
    """How a model was cut into stages, and why."""

    layers: int
    exit_points: int
    stage_bounds: list[int]  # layer index where each stage starts, then `layers`
    layer_ms: list[float] = field(default_factory=list)  # at `batch`
    exit_cost_ms: float = 0.0
    batch: int = 0
    expected_delay_ms: float = 0.0
    overhead_ms: float = 0.0
    pinned: bool = False

    def describe(self) -> str:
        how = "pinned" if self.pinned else f"profiled at batch {self.batch}"
        total = sum(self.layer_ms)
        return (
            f"{self.exit_points} exit points over {self.layers} layers ({how}; "
            f"batch {total:.2f} ms, expected stop delay {self.expected_delay_ms:.2f} ms, "
            f"exit cost {self.exit_cost_ms * 1000:.1f} µs each)"
        )


def top_layers(module: Any) -> list[Any]:
    """The children of an nn.Sequential (scripted or not), else [module].
    Only the top level: group cheap layers into one child (e.g. a
    Sequential(conv, relu) block) to keep them under one exit point."""
    name = getattr(module, "original_name", type(module).__name__)
    if name != "Sequential":
        return [module]
    return list(module.children()) or [module]


def cut(layer_ms: list[float], exit_points: int) -> list[int]:
    """Bounds of `exit_points` + 1 contiguous stages of near-equal time: the
    j-th cut goes after the first layer where the cumulative time reaches
    j/(k + 1) of the total, or earlier where needed to leave every later
    stage a layer. Returns [0, cut_1, …, cut_k, layers]."""
    n = len(layer_ms)
    k = max(0, min(exit_points, n - 1))
    times = layer_ms if sum(layer_ms) > 0 else [1.0] * n
    total = sum(times)
    bounds = [0]
    acc = 0.0
    for i in range(n - 1):  # a cut after layer i starts a stage at i + 1
        acc += times[i]
        j = len(bounds)  # the cut we are placing (1 … k)
        if j > k:
            break
        must = n - (i + 1) == k + 1 - j  # exactly one layer per stage left
        if must or acc >= total * j / (k + 1) - 1e-12:
            bounds.append(i + 1)
    bounds.append(n)
    return bounds


def expected_delay(layer_ms: list[float], bounds: list[int]) -> float:
    """Mean wait from a stop requested at a uniform random moment of the
    batch to the next exit point (or the end): Σ s² / (2 Σ s)."""
    stages = [sum(layer_ms[a:b]) for a, b in itertools.pairwise(bounds)]
    total = sum(stages)
    return sum(s * s for s in stages) / (2 * total) if total > 0 else 0.0


def choose_exit_points(layer_ms: list[float], exit_cost_ms: float) -> tuple[int, list[int]]:
    """The k minimising expected_delay + k·exit_cost (ties: smaller k)."""
    best: tuple[float, int, list[int]] | None = None
    for k in range(len(layer_ms)):
        bounds = cut(layer_ms, k)
        score = expected_delay(layer_ms, bounds) + k * exit_cost_ms
        if best is None or score < best[0] - 1e-9:
            best = (score, k, bounds)
    assert best is not None
    return best[1], best[2]


class TorchBackend:
    """A TorchScript `nn.Sequential` on a CPU slice or one CUDA device, run
    stage by stage with exit points (see the module docstring)."""

    def __init__(self, device_kind: str = "cpu", device_index: int = 0, threads: int = 1):
        self.device_kind = device_kind
        self.device_index = device_index
        self.threads = max(1, int(threads))
        self.providers: list[str] = []
        self.plan: ExitPlan | None = None
        self._torch: Any = None
        self._device: Any = None
        self._layers: list[Any] = []
        self._stages: list[Any] = []
        self._input = ""
        self._output = ""
        self._dtype: Any = None
        self._flag = threading.Event()

    # ------------------------------------------------------------------ load
    def load(self, config: ModelConfig) -> None:
        torch = import_torch()
        self._torch = torch
        if config.model_file is None:
            raise ValueError(f"model {config.name!r}: torch backend needs a model_file")
        if len(config.inputs) != 1 or len(config.outputs) != 1:
            raise ValueError(
                f"model {config.name!r}: the torch backend runs one input to one output"
            )
        if self.device_kind == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("device kind 'cuda' but torch sees no CUDA device")
            self._device = torch.device("cuda", self.device_index)
        else:
            self._device = torch.device("cpu")
            torch.set_num_threads(self.threads)
        self.providers = [str(self._device)]
        with warnings.catch_warnings():
            # torch 2.13 marks TorchScript deprecated in favour of torch.export;
            # it still loads and runs, and it is what deployed models ship as.
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(config.model_file), map_location=self._device)
        module.eval()
        self._layers = top_layers(module)
        self._input = config.inputs[0].name
        self._output = config.outputs[0].name
        self._dtype = config.inputs[0].dtype
        item = config.inputs[0].item_shape
        batch = max(1, config.max_batch_size // 2)
        sample = np.random.default_rng(0).standard_normal((batch, *item)).astype(self._dtype)
        pinned = config.extra.get("exit_points")
        if pinned is not None:
            if not isinstance(pinned, int) or isinstance(pinned, bool) or pinned < 0:
                raise ValueError(
                    f"model {config.name!r}: parameters.exit_points must be an integer ≥ 0"
                )
            k = min(pinned, len(self._layers) - 1)
            self.plan = ExitPlan(len(self._layers), k, cut([1.0] * len(self._layers), k))
            self.plan.pinned = True
            self._set_stages(self.plan.stage_bounds)
        else:
            self.plan = self._profile_plan(sample)
            self._set_stages(self.plan.stage_bounds)
        out = self._forward(sample[:1])
        want = config.outputs[0].item_shape
        if tuple(out.shape[1:]) != tuple(want):
            raise ValueError(
                f"model {config.name!r}: output {self._output!r} has item shape "
                f"{list(out.shape[1:])}, the config says {list(want)}"
            )

    def _set_stages(self, bounds: list[int]) -> None:
        self._stages = [self._layers[a:b] for a, b in itertools.pairwise(bounds)]

    def _sync(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.current_stream(self._device).synchronize()

    def _profile_plan(self, sample: np.ndarray, repeats: int = 5) -> ExitPlan:
        torch = self._torch
        x = torch.from_numpy(sample).to(self._device)
        n = len(self._layers)
        per_layer: list[list[float]] = [[] for _ in range(n)]
        every: list[float] = []
        none: list[float] = []
        with torch.inference_mode():
            for _ in range(2):  # warm-up (allocator, kernels, caches)
                self._run_layers(x, [0, *range(1, n), n])
            for _ in range(repeats):
                # Alternate the two whole-run timings so drift hits both.
                self._set_stages([0, n])
                t0 = time.perf_counter()
                self._run_stages(x)
                self._sync()
                none.append(time.perf_counter() - t0)
                self._set_stages(list(range(n + 1)))
                t0 = time.perf_counter()
                self._run_stages(x)
                self._sync()
                every.append(time.perf_counter() - t0)
                y = x
                for i, layer in enumerate(self._layers):
                    t0 = time.perf_counter()
                    y = layer(y)
                    self._sync()
                    per_layer[i].append(time.perf_counter() - t0)
        layer_ms = [statistics.median(ts) * 1000 for ts in per_layer]
        exit_cost_ms = 0.0
        if n > 1:
            diff = statistics.median(every) - statistics.median(none)
            exit_cost_ms = max(0.0, diff * 1000 / (n - 1))
        k, bounds = choose_exit_points(layer_ms, exit_cost_ms)
        return ExitPlan(
            layers=n,
            exit_points=k,
            stage_bounds=bounds,
            layer_ms=layer_ms,
            exit_cost_ms=exit_cost_ms,
            batch=len(sample),
            expected_delay_ms=expected_delay(layer_ms, bounds),
            overhead_ms=k * exit_cost_ms,
        )

    def _run_layers(self, x: Any, bounds: list[int]) -> Any:
        self._set_stages(bounds)
        return self._run_stages(x)

    # ------------------------------------------------------------------- run
    def _run_stages(self, x: Any) -> Any:
        flag = self._flag
        cuda = self._device.type == "cuda"
        for i, stage in enumerate(self._stages):
            if i:
                # Exit point. On a GPU wait for the previous stage first, so
                # that stopping here really frees the device now.
                if cuda:
                    self._sync()
                if flag.is_set():
                    raise Terminated("run terminated at an exit point")
            for layer in stage:
                x = layer(x)
        return x

    def _forward(self, batch: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch, dtype=self._dtype))
            y = self._run_stages(x.to(self._device))
            return y.to("cpu").numpy()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._flag.is_set():
            # Stopped before the first stage (the executor arms the flag
            # per batch, see reset()).
            raise Terminated("run terminated before it started")
        return {self._output: self._forward(inputs[self._input])}

    def terminate(self) -> None:
        self._flag.set()

    def reset(self) -> None:
        """Clear the flag; the executor calls it, under the lock that guards
        terminate(), when a batch starts and when it ends, so a stop meant
        for one batch never stops the next and one sent just before the run
        begins is not lost."""
        self._flag.clear()
