"""An ONNX model cut into a chain of blocks (ppipe.txt §5.2), and any range
of blocks extracted as an ONNX model of its own.

Cut points. A cut between two consecutive nodes of the (topologically
ordered) graph is a candidate when exactly one activation crosses it: one
tensor made before the cut is used after it (a graph output made before the
cut counts as used after it). Weights and what is computed from weights
alone (Constant nodes, shapes folded from initializers) do not count: an
extracted partition carries its own copy. A residual block therefore has
cut points at its ends but none inside, where both the skip path and the
branch cross. `find_cut_points` lists the candidates in topological order;
the pieces between consecutive candidates are the model's segments, the
smallest units a block is made of.

Blocks. `partition_by_runtime` groups consecutive segments into N blocks
(N = 10 by default, fewer when the model has fewer segments) of roughly
equal runtime, from each segment's measured time on one device class: the
paper's greedy pass, from the first segment on, each block growing while
that brings its time closer to its target. The target is what remains
divided by the blocks that remain (the paper's is 1/N of the whole; the
remaining share keeps the last block from absorbing the rounding of all
the others). A `Partitioning` is the model with its N − 1 boundary tensors;
`extract(start, end)` is blocks [start, end) as an ONNX model
(`onnx.utils.Extractor`) whose inputs are the boundary tensor before
`start` (the model's inputs for 0) and whose outputs are the one after
`end - 1` (the model's outputs for N).

Checking. `verify_chain` runs the whole model on deterministic inputs
(normal draws from a seed) with every boundary tensor as an extra output,
then runs each block on the whole model's tensor before it and compares its
output with the whole model's, `np.allclose(block, whole, rtol, atol)`
(defaults rtol 1e-4, atol 1e-5: ONNX Runtime may fuse nodes differently in
a block than in the whole graph, but the same float32 arithmetic runs), and
finally chains the blocks from the model's inputs and compares the model's
outputs. A mismatch raises `PartitionMismatch` naming the block, tensor and
largest difference.

Models are held in memory (protobuf's 2 GiB limit applies: no external
data). Measuring segments and blocks is app/repository/block_profile.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.utils import Extractor

from app.repository.config import DATATYPES, ModelConfig, TensorSpec
from app.repository.files import atomic_write_bytes

DEFAULT_BLOCKS = 10
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


class PartitionMismatch(ValueError):
    """Chained partitions do not give the whole model's tensors."""


@dataclass(frozen=True)
class CutPoint:
    """One activation `tensor` is all that crosses between the first
    `position` nodes and the rest."""

    tensor: str
    position: int


# ------------------------------------------------------------------ graph


def load_model(source: Path | onnx.ModelProto) -> onnx.ModelProto:
    """The model with its shapes inferred (the extracted partitions need
    the type of every tensor they take or give)."""
    model = onnx.load(str(source)) if isinstance(source, (str, Path)) else source
    return onnx.shape_inference.infer_shapes(model)


def _graph_inputs(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [v.name for v in model.graph.input if v.name not in initializers]


def _typed(model: onnx.ModelProto) -> set[str]:
    graph = model.graph
    return {
        v.name
        for v in (*graph.value_info, *graph.input, *graph.output)
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")
    }


def find_cut_points(model: onnx.ModelProto) -> list[CutPoint]:
    """The candidate cuts of `model`, in topological order (see the module
    docstring). Only tensors whose type is known (`load_model` infers them)
    are candidates. Raises ValueError if the graph is not topologically
    sorted, as ONNX requires."""
    graph = model.graph
    nodes = list(graph.node)
    static = {t.name for t in graph.initializer}
    inputs = _graph_inputs(model)
    known = set(static) | set(inputs)
    for node in nodes:
        used = [n for n in node.input if n]
        unknown = [n for n in used if n not in known]
        if unknown:
            raise ValueError(
                f"graph {graph.name!r}: node {node.name or node.op_type!r} uses {unknown[0]!r} "
                "before any node makes it (the graph is not topologically sorted)"
            )
        if all(n in static for n in used):
            static.update(o for o in node.output if o)
        known.update(o for o in node.output if o)
    end = len(nodes)
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            if name and name not in static:
                last_use[name] = i
    for out in graph.output:
        last_use[out.name] = end
    typed = _typed(model)
    live = {name for name in inputs if name in last_use}
    cuts: list[CutPoint] = []
    for position in range(1, end):
        node = nodes[position - 1]
        live.update(o for o in node.output if o and o not in static and o in last_use)
        live = {name for name in live if last_use[name] >= position}
        if len(live) != 1:
            continue
        (tensor,) = live
        if tensor in inputs or tensor in {o.name for o in graph.output}:
            continue
        if tensor not in typed or (cuts and cuts[-1].tensor == tensor):
            continue
        cuts.append(CutPoint(tensor, position))
    return cuts


def partition_by_runtime(seconds: Sequence[float], blocks: int = DEFAULT_BLOCKS) -> list[int]:
    """Group consecutive segments with these times into min(blocks,
    len(seconds)) blocks of roughly equal time (see the module docstring);
    returns each block's end, an exclusive segment index (the last is
    len(seconds))."""
    times = [float(t) for t in seconds]
    if not times:
        raise ValueError("no segments to group")
    if any(not np.isfinite(t) or t <= 0 for t in times):
        raise ValueError(f"segment times must be finite and > 0 seconds, got {times}")
    if blocks < 1:
        raise ValueError(f"blocks must be ≥ 1, got {blocks}")
    count = min(blocks, len(times))
    ends: list[int] = []
    start, remaining = 0, sum(times)
    for j in range(count - 1):
        target = remaining / (count - j)
        limit = len(times) - (count - j - 1)  # one segment left for each later block
        end, total = start + 1, times[start]
        while end < limit and abs(total + times[end] - target) <= abs(total - target):
            total += times[end]
            end += 1
        ends.append(end)
        remaining -= total
        start = end
    ends.append(len(times))
    return ends


# ------------------------------------------------------------ partitioning


@dataclass(frozen=True)
class Partitioning:
    """`model` (shape-inferred) as a chain of blocks separated by the
    `boundaries` tensors: block k takes `block_inputs(k)` and gives
    `block_outputs(k)`."""

    name: str
    model: onnx.ModelProto = field(repr=False, compare=False)
    boundaries: tuple[str, ...]
    _extractor: Extractor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cuts = [c.tensor for c in find_cut_points(self.model)]
        order = {tensor: i for i, tensor in enumerate(cuts)}
        for tensor in self.boundaries:
            if tensor not in order:
                raise ValueError(
                    f"model {self.name!r}: {tensor!r} is not a cut point (one activation "
                    f"crossing); cut points: {cuts}"
                )
        positions = [order[t] for t in self.boundaries]
        if positions != sorted(set(positions)):
            raise ValueError(
                f"model {self.name!r}: boundaries {list(self.boundaries)} are not distinct "
                "and in topological order"
            )
        object.__setattr__(self, "_extractor", Extractor(self.model))

    @property
    def blocks(self) -> int:
        return len(self.boundaries) + 1

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(_graph_inputs(self.model))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.model.graph.output)

    def block_inputs(self, block: int) -> tuple[str, ...]:
        self._check_range(block, block + 1)
        return self.inputs if block == 0 else (self.boundaries[block - 1],)

    def block_outputs(self, block: int) -> tuple[str, ...]:
        self._check_range(block, block + 1)
        return self.outputs if block == self.blocks - 1 else (self.boundaries[block],)

    def extract(self, start: int, end: int) -> onnx.ModelProto:
        """Blocks [start, end) as an ONNX model of their own."""
        self._check_range(start, end)
        extracted = self._extractor.extract_model(
            list(self.block_inputs(start)), list(self.block_outputs(end - 1))
        )
        extracted.graph.name = partition_name(self.name, start, end)
        return extracted

    def _check_range(self, start: int, end: int) -> None:
        if not 0 <= start < end <= self.blocks:
            raise ValueError(
                f"model {self.name!r}: block range [{start}, {end}) outside its "
                f"{self.blocks} blocks"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "boundaries": list(self.boundaries)}


def partition_name(model: str, start: int, end: int) -> str:
    """The served-model key of blocks [start, end) of `model`."""
    return f"{model}.blocks{start}-{end}"


def segments(model: onnx.ModelProto, name: str = "model") -> Partitioning:
    """The model cut at every cut point: its blocks are its segments."""
    return Partitioning(name, model, tuple(c.tensor for c in find_cut_points(model)))


def group_segments(whole: Partitioning, ends: Sequence[int]) -> Partitioning:
    """Segments grouped into blocks ending at `ends` (partition_by_runtime's)."""
    if list(ends) != sorted(set(ends)) or not ends or ends[-1] != whole.blocks or ends[0] < 1:
        raise ValueError(f"block ends {list(ends)} must increase from ≥ 1 to {whole.blocks}")
    return Partitioning(whole.name, whole.model, tuple(whole.boundaries[e - 1] for e in ends[:-1]))


def save_partitioning(partitioning: Partitioning, path: Path) -> None:
    """The boundaries as JSON (the model file itself is not copied)."""
    atomic_write_bytes(Path(path), (json.dumps(partitioning.to_dict(), indent=1) + "\n").encode())


def load_partitioning(path: Path, model: Path | onnx.ModelProto) -> Partitioning:
    """A partitioning saved by `save_partitioning`, applied to `model`
    (checked: each boundary must still be a cut point of it)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("boundaries"), list):
        raise ValueError(f"{path}: not a partitioning (no 'boundaries' list)")
    name = str(data.get("name", "model"))
    return Partitioning(name, load_model(model), tuple(data["boundaries"]))


# ---------------------------------------------------------------- running


def session(model: onnx.ModelProto, threads: int = 1) -> Any:
    """A CPU ONNX Runtime session as the executors make them: `threads`
    intra-op threads, one inter-op thread, sequential execution."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    opts.intra_op_num_threads = max(1, int(threads))
    opts.log_severity_level = 3  # unused initializers of an extracted piece are fine
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run(sess: Any, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feed)), strict=True))


def synthetic_inputs(
    model: onnx.ModelProto, batch: int, seed: int = 0, names: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """Deterministic inputs for `names` (default: the graph's inputs):
    standard normal draws for floats, zeros otherwise, the first dimension
    `batch` when it is symbolic."""
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, got {batch}")
    wanted = list(names) if names is not None else _graph_inputs(model)
    infos = {v.name: v for v in (*model.graph.value_info, *model.graph.input)}
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name in wanted:
        if name not in infos:
            raise ValueError(f"model {model.graph.name!r}: no type for tensor {name!r}")
        shape = tensor_shape(infos[name], model.graph.name)
        dtype = helper.tensor_dtype_to_np_dtype(infos[name].type.tensor_type.elem_type)
        dims = (batch, *shape[1:]) if shape[0] < 0 else shape
        if np.issubdtype(dtype, np.floating):
            out[name] = rng.standard_normal(dims).astype(dtype)
        else:
            out[name] = np.zeros(dims, dtype=dtype)
    return out


def tensor_shape(info: onnx.ValueInfoProto, model: str = "model") -> tuple[int, ...]:
    """A tensor's shape, -1 for a symbolic first (batch) dimension; any
    other symbolic dimension is an error (partitions need fixed shapes)."""
    dims = info.type.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
    if not shape or any(d < 0 for d in shape[1:]):
        raise ValueError(
            f"model {model!r} tensor {info.name!r}: shape {list(shape)} must be fixed "
            "except the first (batch) dimension"
        )
    return shape


def verify_chain(
    partitioning: Partitioning,
    *,
    batch: int = 2,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
) -> None:
    """Check that the blocks, run one after another, give the whole model's
    tensors (see the module docstring); raise PartitionMismatch if not."""
    model = partitioning.model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    infos = {v.name: v for v in model.graph.value_info}
    for tensor in partitioning.boundaries:
        probe.graph.output.append(infos[tensor])
    feed = synthetic_inputs(model, batch, seed)
    whole = run(session(probe), feed)
    chained = dict(feed)
    for k in range(partitioning.blocks):
        block = session(partitioning.extract(k, k + 1))
        alone = run(block, {n: whole.get(n, feed.get(n)) for n in partitioning.block_inputs(k)})
        chained = run(block, {n: chained[n] for n in partitioning.block_inputs(k)})
        for name in partitioning.block_outputs(k):
            _compare(partitioning, k, name, alone[name], whole[name], rtol, atol, "its own input")
            _compare(partitioning, k, name, chained[name], whole[name], rtol, atol, "the chain")


def _compare(
    p: Partitioning,
    block: int,
    name: str,
    got: np.ndarray,
    want: np.ndarray,
    rtol: float,
    atol: float,
    fed: str,
) -> None:
    if got.shape != want.shape:
        raise PartitionMismatch(
            f"model {p.name!r} block {block} of {p.blocks}, fed {fed}: tensor {name!r} has "
            f"shape {list(got.shape)}, the whole model's {list(want.shape)}"
        )
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = float(np.max(np.abs(got.astype(np.float64) - want)))
        raise PartitionMismatch(
            f"model {p.name!r} block {block} of {p.blocks}, fed {fed}: tensor {name!r} differs "
            f"from the whole model's by up to {diff:.3g} (rtol {rtol}, atol {atol})"
        )


# ----------------------------------------------------- partitions as models

_DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"}


def partition_config(
    partitioning: Partitioning,
    start: int,
    end: int,
    model_file: Path,
    *,
    max_batch_size: int = 8,
    slo_ms: float = 100.0,
) -> ModelConfig:
    """The ModelConfig of blocks [start, end) stored at `model_file` (see
    `write_partition`), named `partition_name(...)`: what an executor loads."""
    extracted = partitioning.extract(start, end)
    graph = extracted.graph

    def spec(info: onnx.ValueInfoProto) -> TensorSpec:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type))
        if dtype not in _DATATYPE_OF:
            raise ValueError(f"tensor {info.name!r}: unsupported type {dtype}")
        shape = tensor_shape(info, graph.name)
        if shape[0] >= 0:
            raise ValueError(
                f"model {graph.name!r} tensor {info.name!r}: shape {list(shape)} has no "
                "symbolic batch dimension"
            )
        return TensorSpec(info.name, _DATATYPE_OF[dtype], shape)

    model_file = Path(model_file).resolve()
    return ModelConfig(
        name=graph.name,
        backend="onnx",
        directory=model_file.parent,
        inputs=tuple(spec(v) for v in graph.input if v.name in partitioning.block_inputs(start)),
        outputs=tuple(spec(v) for v in graph.output),
        max_batch_size=max_batch_size,
        slo_ms=slo_ms,
        model_file=model_file,
        description=f"blocks [{start}, {end}) of {partitioning.name}",
    )


def write_partition(partitioning: Partitioning, start: int, end: int, directory: Path) -> Path:
    """Blocks [start, end) as `directory/<partition_name>.onnx`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{partition_name(partitioning.name, start, end)}.onnx"
    data = partitioning.extract(start, end).SerializeToString(deterministic=True)
    atomic_write_bytes(path, data)
    return path


def write_pipeline(
    partitioning: Partitioning,
    ranges: Sequence[tuple[int, int]],
    directory: Path,
    *,
    max_batch_size: int = 8,
    slo_ms: float = 100.0,
) -> list[ModelConfig]:
    """The partitions of one pipeline (block ranges that follow each other
    from block 0 to the last, as a plan's stages do) written under
    `directory`, and their configs in order: the stages of
    app/runtime/stage_arena.py's pipeline arena."""
    starts = [0, *(end for _, end in ranges[:-1])]
    if (
        not ranges
        or [start for start, _ in ranges] != starts
        or ranges[-1][1] != partitioning.blocks
    ):
        raise ValueError(
            f"model {partitioning.name!r}: block ranges {list(ranges)} must follow each other "
            f"from 0 to {partitioning.blocks}"
        )
    return [
        partition_config(
            partitioning,
            start,
            end,
            write_partition(partitioning, start, end, directory),
            max_batch_size=max_batch_size,
            slo_ms=slo_ms,
        )
        for start, end in ranges
    ]
