"""Torch backend: a model run stage by stage with exit points between stages.

Shepherd preempts a running batch in software, adapting PipeSwitch: the
model runs as a sequence of stages and, between two stages, an *exit point*
checks a preemption flag; when it is set the run stops there
(shepherd-nsdi23.txt §6). `terminate()` sets the flag from the executor's
control thread: one byte of a CPU tensor, written through a numpy view of
its memory, so the check can run inside TorchScript.

Running. On a CPU the stages run inside one scripted runner module
(`forward(x, flag)`: a stage, then `flag[0]` is read, the next stage, …),
so an exit point costs a byte read (~4–7 µs measured) instead of a Python
call into the TorchScript interpreter per layer (~40 µs each measured here,
8–13 % of a batch of one, noisy). On a GPU the stages run from Python: each exit point
synchronises the stream first, else the host would queue every kernel ahead
and read the flag long before the GPU reaches the exit point. A model the
runner cannot script also runs from Python.

Models. `model_file` is a TorchScript file (`torch.jit.save`). Its inputs
and outputs match the config's by position (forward(*inputs), returning a
tensor or a tuple/list of them) or by name (a dict in, a dict out), and its
*layers*, the units an exit point can sit between, each take one tensor and
return one: app/runtime/torch_model.py says which modules have which. In
short: an `nn.Sequential` of one input is cut between its top-level
children; a module of several inputs is cut only when its forward is a
chain of its children after the first of which one tensor flows (that
first child, the *head*, runs as a stage of its own, then an exit point);
any other module of several inputs, or of a dict, runs unstaged and can
only be stopped before it starts (a stop during the batch waits for its
end and the batch's answers are delivered: never lost, never twice), and
so does a single-input module that is neither a Sequential nor a chain.
Between stages one tensor flows because the scripted runner and the exit
points carry exactly one; cutting where several flow would need a runner
per model signature.

Load checks with a dry run on zeros of the config's input shapes (batch 1,
a variable dimension taken as 1): forward must accept them, return as many
outputs as the config declares (or every name it declares, for a dict),
each of the config's datatype and shape; an error names the tensor.

Exit points. Too few leave a long preemption delay (the rest of the current
stage); too many slow every batch down (each exit point costs a flag check,
a Python step and, on a GPU, a stream synchronisation — without it the host
would queue every kernel ahead and the flag would be checked long before
the GPU reaches the exit point). The number is chosen per model at load by
profiling that trade-off (§6, §7.3):

1. time each layer at a representative batch size (the model's
   `max_batch_size` // 2, at least 1), with a synchronisation after each;
2. measure the cost `c` of one exit point (≥ 0, fastest of alternating
   repeats — interference from other processes only adds time): on a CPU,
   the scripted runner over as many identity layers, with an exit after
   each minus with none (µs: timing the model itself cannot resolve it);
   from Python (GPU), the model's run with an exit after every layer minus
   the run with none; both per exit point;
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
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.optional import import_torch
from app.repository.config import ModelConfig
from app.runtime.backend import Terminated
from app.runtime.torch_model import (
    check_output,
    extra_outputs,
    log,
    named_outputs,
    sample_inputs,
    structure,
)


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
    # A head (torch_model.Structure) runs first as a stage of its own; an
    # exit point follows it when there are layers (not counted above).
    head: bool = False

    def describe(self) -> str:
        if self.layers == 0:
            return "unstaged: no exit point (a stop waits for the batch to end)"
        how = "pinned" if self.pinned else f"profiled at batch {self.batch}"
        total = sum(self.layer_ms)
        head = "a head taking the inputs, then " if self.head else ""
        return (
            f"{head}{self.exit_points} exit points over {self.layers} layers ({how}; "
            f"batch {total:.2f} ms, expected stop delay {self.expected_delay_ms:.2f} ms, "
            f"exit cost {self.exit_cost_ms * 1000:.1f} µs each)"
        )


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


def _runner_class(torch: Any) -> Any:
    """The scripted stage runner (built lazily: torch is optional)."""
    global _RUNNER
    if _RUNNER is None:

        class StagedRunner(torch.nn.Module):
            def __init__(self, stages: list[Any]) -> None:
                super().__init__()
                self.stages = torch.nn.ModuleList(stages)

            def forward(self, x: torch.Tensor, flag: torch.Tensor) -> tuple[torch.Tensor, bool]:
                for i, stage in enumerate(self.stages):
                    # Exit point: stop here if the flag is set.
                    if i > 0 and bool(flag[0] != 0):
                        return x, True
                    x = stage(x)
                return x, False

        _RUNNER = StagedRunner
    return _RUNNER


_RUNNER: Any = None


class TorchBackend:
    """A TorchScript module on a CPU slice or one CUDA device, run stage by
    stage with exit points (see the module docstring)."""

    def __init__(self, device_kind: str = "cpu", device_index: int = 0, threads: int = 1):
        self.device_kind = device_kind
        self.device_index = device_index
        self.threads = max(1, int(threads))
        self.providers: list[str] = []
        self.plan: ExitPlan | None = None
        self.module: Any = None  # the whole loaded module (no exit points)
        self._torch: Any = None
        self._device: Any = None
        self._config: ModelConfig | None = None
        self._head: Any = None  # takes the inputs (torch_model.Structure)
        self._dict_input = False
        self._layers: list[Any] = []
        self._stages: list[Any] = []
        self._runner: Any = None  # scripted runner of the current stages (CPU)
        self._runners: dict[tuple[int, ...], Any] = {}
        self._scripted = False
        # The preemption flag: flag[0] != 0 means stop at the next exit point.
        self._flag: Any = None
        self._flag_np = np.zeros(1, dtype=np.uint8)

    # ------------------------------------------------------------------ load
    def load(self, config: ModelConfig) -> None:
        torch = import_torch()
        self._torch = torch
        if config.model_file is None:
            raise ValueError(f"model {config.name!r}: torch backend needs a model_file")
        if not config.inputs or not config.outputs:
            raise ValueError(f"model {config.name!r}: the torch backend needs inputs and outputs")
        if self.device_kind == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("device kind 'cuda' but torch sees no CUDA device")
            self._device = torch.device("cuda", self.device_index)
        else:
            self._device = torch.device("cpu")
            torch.set_num_threads(self.threads)
        self.providers = [str(self._device)]
        self._flag = torch.zeros(1, dtype=torch.uint8)
        self._flag_np = self._flag.numpy()  # shares the tensor's memory
        with warnings.catch_warnings():
            # torch 2.13 marks TorchScript deprecated in favour of torch.export;
            # it still loads and runs, and it is what deployed models ship as.
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(config.model_file), map_location=self._device)
        module.eval()
        self.module = module
        self._config = config
        found = structure(module, config)
        self._dict_input, self._head, self._layers = found.dict_input, found.head, found.layers
        self._check_dry_run(config)
        self._scripted = bool(self._layers) and self._device.type == "cpu" and self._try_runner()
        n = len(self._layers)
        pinned = config.extra.get("exit_points")
        if pinned is not None:
            if not isinstance(pinned, int) or isinstance(pinned, bool) or pinned < 0:
                raise ValueError(
                    f"model {config.name!r}: parameters.exit_points must be an integer ≥ 0"
                )
            k = max(0, min(pinned, n - 1))
            self.plan = ExitPlan(n, k, cut([1.0] * n, k) if n else [0, 0])
            self.plan.pinned = True
        elif n:
            batch = max(1, config.max_batch_size // 2)
            self.plan = self._profile_plan(self._head_output(sample_inputs(config, batch)))
        else:  # unstaged: the head is the whole model
            self.plan = ExitPlan(0, 0, [0, 0])
        self.plan.head = self._head is not None
        if n:
            self._set_stages(self.plan.stage_bounds)
            self._runners = {tuple(self.plan.stage_bounds): self._runner}  # drop the others
        log.info("model %r (%s): %s", config.name, found.kind, self.plan.describe())

    def _check_dry_run(self, config: ModelConfig) -> None:
        """forward on zeros of the config's input shapes: a clear error when
        it fails or its outputs do not match the config (module docstring)."""
        zeros = [self._tensor(x) for x in sample_inputs(config, 1, zeros=True)]
        try:
            with self._torch.inference_mode():
                result = self._call(self.module, zeros)
        except Exception as exc:
            shapes = ", ".join(f"{s.name} {list(s.shape)} {s.datatype}" for s in config.inputs)
            raise ValueError(
                f"model {config.name!r}: a dry run on zeros of the config's inputs "
                f"({shapes}) failed: {exc}"
            ) from exc
        outputs = named_outputs(result, config)
        for spec in config.outputs:
            check_output(config, spec, outputs[spec.name], 1)
        extra = extra_outputs(result, config)
        if extra:
            log.warning(
                "model %r: forward returns outputs the config does not declare, not served: %s",
                config.name,
                extra,
            )

    def _tensor(self, array: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self._device)

    def _call(self, module: Any, tensors: list[Any]) -> Any:
        """`module` on the config's inputs: positionally, or as one dict."""
        if self._dict_input:
            assert self._config is not None
            return module({s.name: t for s, t in zip(self._config.inputs, tensors, strict=True)})
        return module(*tensors)

    def _head_output(self, arrays: list[np.ndarray]) -> Any:
        """What flows into the first layer: the head's tensor, or the input."""
        tensors = [self._tensor(a) for a in arrays]
        if self._head is None:
            return tensors[0]
        with self._torch.inference_mode():
            return self._call(self._head, tensors)

    def _try_runner(self) -> bool:
        try:
            self._scripted = True
            self._set_stages([0, len(self._layers)])
            return True
        except Exception:  # not scriptable as a whole: run the stages from Python
            self._scripted = False
            self._runner = None
            return False

    def _set_stages(self, bounds: list[int]) -> None:
        self._stages = [self._layers[a:b] for a, b in itertools.pairwise(bounds)]
        if not self._scripted:
            return
        key = tuple(bounds)
        runner = self._runners.get(key)
        if runner is None:
            torch = self._torch
            stages = [torch.nn.Sequential(*layers) for layers in self._stages]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                runner = torch.jit.script(_runner_class(torch)(stages))
            runner.eval()
            self._runners[key] = runner
        self._runner = runner

    def _sync(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.current_stream(self._device).synchronize()

    def _profile_plan(self, x: Any, repeats: int = 7) -> ExitPlan:
        """`x`: what flows into the first layer, at the profiling batch."""
        torch = self._torch
        n = len(self._layers)
        none_bounds, every_bounds = [0, n], list(range(n + 1))
        per_layer: list[list[float]] = [[] for _ in range(n)]
        every: list[float] = []
        none: list[float] = []

        def timed(bounds: list[int], into: list[float]) -> None:
            self._set_stages(bounds)
            t0 = time.perf_counter()
            self._run_stages(x)
            self._sync()
            into.append(time.perf_counter() - t0)

        # Whole runs with and without exit points give the exit cost from
        # Python (GPU); the scripted runner's is measured apart (see there).
        whole_runs = not self._scripted
        with torch.inference_mode():
            for _ in range(2):  # warm-up (allocator, kernels, graph executor)
                timed(none_bounds, [])
                if whole_runs:
                    timed(every_bounds, [])
            for _ in range(repeats):
                if whole_runs:
                    # Alternate the two whole-run timings so drift hits both.
                    timed(none_bounds, none)
                    timed(every_bounds, every)
                y = x
                for i, layer in enumerate(self._layers):
                    t0 = time.perf_counter()
                    y = layer(y)
                    self._sync()
                    per_layer[i].append(time.perf_counter() - t0)
        # Fastest of the repeats: other processes only ever add time.
        layer_ms = [min(ts) * 1000 for ts in per_layer]
        exit_cost_ms = 0.0
        if n > 1 and self._scripted:
            exit_cost_ms = self._scripted_exit_cost_ms(n)
        elif n > 1:
            exit_cost_ms = max(0.0, (min(every) - min(none)) * 1000 / (n - 1))
        k, bounds = choose_exit_points(layer_ms, exit_cost_ms)
        return ExitPlan(
            layers=n,
            exit_points=k,
            stage_bounds=bounds,
            layer_ms=layer_ms,
            exit_cost_ms=exit_cost_ms,
            batch=len(x),
            expected_delay_ms=expected_delay(layer_ms, bounds),
            overhead_ms=k * exit_cost_ms,
        )

    def _scripted_exit_cost_ms(self, n: int, calls: int = 200, blocks: int = 5) -> float:
        """What an exit point adds in the scripted runner, measured on n
        identity layers: the runner with an exit after each minus the runner
        with none, per exit point. Timing the model itself cannot resolve
        it: it is ~µs, the noise of a 20 ms batch on a shared CPU is ~ms."""
        torch = self._torch
        runner = _runner_class(torch)
        ident = [torch.nn.Identity() for _ in range(n)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            none = torch.jit.script(runner([torch.nn.Sequential(*ident)]))
            every = torch.jit.script(runner([torch.nn.Sequential(i) for i in ident]))
        x = torch.zeros(1)
        flag = torch.zeros(1, dtype=torch.uint8)
        best = {id(none): float("inf"), id(every): float("inf")}
        with torch.inference_mode():
            for _ in range(3):
                none(x, flag)
                every(x, flag)
            for _ in range(blocks):
                for r in (none, every):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        r(x, flag)
                    best[id(r)] = min(best[id(r)], (time.perf_counter() - t0) / calls)
        return max(0.0, (best[id(every)] - best[id(none)]) * 1000 / (n - 1))

    # ------------------------------------------------------------------- run
    def _run_stages(self, x: Any) -> Any:
        if self._runner is not None:
            y, stopped = self._runner(x, self._flag)
            if stopped:
                raise Terminated("run terminated at an exit point")
            return y
        flag = self._flag_np
        cuda = self._device.type == "cuda"
        for i, stage in enumerate(self._stages):
            if i:
                # Exit point. On a GPU wait for the previous stage first, so
                # that stopping here really frees the device now.
                if cuda:
                    self._sync()
                if flag[0]:
                    raise Terminated("run terminated at an exit point")
            for layer in stage:
                x = layer(x)
        return x

    def _forward(self, *arrays: np.ndarray) -> Any:
        """The config's inputs (arrays in its order) through the head, an
        exit point and the stages; forward's result, on the CPU."""
        torch = self._torch
        with torch.inference_mode():
            tensors = [self._tensor(a) for a in arrays]
            if self._head is None:
                x = tensors[0]
            else:
                x = self._call(self._head, tensors)
                if not self._layers:
                    return _to_cpu(x)
                # Exit point after the head (on a GPU once it has finished).
                self._sync()
                if self._flag_np[0]:
                    raise Terminated("run terminated at an exit point")
            return _to_cpu(self._run_stages(x))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._flag_np[0]:
            # Stopped before the first stage (the executor arms the flag
            # per batch, see reset()).
            raise Terminated("run terminated before it started")
        config = self._config
        assert config is not None, "run before load"
        arrays = [np.asarray(inputs[s.name], dtype=s.dtype) for s in config.inputs]
        result = named_outputs(self._forward(*arrays), config)
        return {name: value.numpy() for name, value in result.items()}

    def terminate(self) -> None:
        self._flag_np[0] = 1

    def reset(self) -> None:
        """Clear the flag; the executor calls it, under the lock that guards
        terminate(), when a batch starts and when it ends, so a stop meant
        for one batch never stops the next and one sent just before the run
        begins is not lost."""
        self._flag_np[0] = 0


def _to_cpu(result: Any) -> Any:
    """forward's result (a tensor, a tuple/list or a dict of them) on the CPU."""
    if isinstance(result, dict):
        return {k: _to_cpu(v) for k, v in result.items()}
    if isinstance(result, tuple | list):
        return type(result)(_to_cpu(v) for v in result)
    return result.to("cpu") if hasattr(result, "to") else result
