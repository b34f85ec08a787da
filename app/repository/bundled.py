"""The bundled model repository (`app/models/`, package data of `app`).

Nothing is downloaded: the ONNX files are generated deterministically with
`onnx.helper` from a seed (numpy's default_rng) the first time they are
needed, and are git-ignored; only the `config.yaml` files are committed.
The configs are package data (pyproject's package-data), so an installed
`app` (`pip install .`, not only an editable one) carries the bundled
repository: the server builds the missing files next to them in the
installed package on first start. A read-only install cannot: start-up then
fails saying how to build them once or to serve a copy (`_unwritable`).
Writing into the installed package rather than a cache directory keeps one
bundled repository per install, the same layout as a checkout's; pip
uninstall leaves the generated files behind (delete `app/models/`).

Generated models (tensor names `input` → `output`, both FP32):

- `mlp`: 4 dense layers 4096 wide, ReLU between them (not after the last),
  `input` [-1, 4096] → `output` [-1, 4096]. He-uniform weights keep the
  activations O(1). About 256 MiB of FP32 weights: large enough that batching
  pays off on a CPU (weights are read once per batch). Each layer is split
  into MLP_SPLITS = 8 Gemms of 512 output columns (ReLU on each) and a
  Concat: ORT checks RunOptions.terminate only between nodes, so a stop
  waits for the running node, and one 4096×4096 Gemm is ~¼ of a batch. With
  8 chunks a node is ~1/32 of a batch. Measured (bench.preemption, 2-core
  box, see docs/benchmark-history.md): median stop delay 13.4 % unsplit, 5.4 % with 4
  chunks, 4.3 % with 8, 3.4 % with 16; extra time over the unsplit model
  4.4 %, 3.7 %, 8.5 % (noisy: ±10 % per batch size), hence 8.
- `cnn`: a small CIFAR-sized CNN, `input` [-1, 3, 32, 32] → `output` [-1, 10]
  (logits): 5 conv 3×3 + ReLU layers (32, 32, 64, 64, 128 channels) with two
  2×2 max-pools, global average pool, one dense layer. About 0.6 MB. Not
  split (CNN_SPLITS = 1): splitting each Conv by output channels cost more
  than it saved. Median extra time over the unsplit model with 2, 4, 8, 16
  chunks: 9 %, 38 %, 63 %, 84 % (ORT's blocked NCHWc convolution loses its
  reuse of the input across output channels), for a stop delay of 17 %,
  13 %, 7 %, 4 % (against 27 % unsplit; the last two only look good because
  the batches got 3–5× longer). Splitting by output rows instead (Slice
  with a halo, a prototype) cost 35–40 %. Its batches are 1–25 ms, and the
  part of a stop that no split removes (~0.8 ms here, measured with nodes of
  ~0.06 ms) is alone over 5 % of a batch below ~16 ms, so no split reaches
  the 5 % target for it.

- `torchcnn` (backend `torch`, needs the optional `torch` extra): a
  TorchScript `nn.Sequential` of 26 blocks, `input` [-1, 3, 32, 32] →
  `output` [-1, 10]: a stride-2 conv stem (3 → 64), 24 equal Conv3x3(64) +
  ReLU blocks at 16×16 and a head (global average pool, dense 64 → 10). The
  equal blocks give the Torch backend evenly spaced exit points (see
  app/runtime/torch_backend.py); 24 rather than 12 so that a stop waits
  ~1/50 of a batch (12 gave 6.9 % median stop delay, 24 gave 3.8 %, see
  BENCHMARKS.md). Weights from numpy's default_rng(seed), so
  they do not depend on torch's RNG. Skipped (the model stays unavailable)
  when torch is not installed.

- `earlyexit`, `earlyexit-wide` and `encoder`: dynamic models, whose execution time depends
  on their input (an early-exit CNN whose `Loop` runs until a confidence
  threshold — `-wide` with a 64 MiB dense head read once per batch, a fixed
  cost per batch — and a transformer encoder over variable-length sequences
  padded per batch), each with `probes.npz`, the representative inputs its
  `dynamic` config key measures at start-up: app/repository/dynamic_models.py.

Emulated models (`backend: emulated`, profile from symphony.txt Table 5,
NVIDIA 1080Ti) need no file; their configs are committed as they are.

    python -m app.repository.bundled [--root DIR] [--force]

builds whatever generated file is missing (idempotent; atomic rename; the
same seed gives the same bytes).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from app.optional import import_torch
from app.repository import BUNDLED_REPOSITORY, dynamic_models
from app.repository.files import atomic_write_bytes
from app.repository.onnx_format import BUILDER_VERSION, IR_VERSION, OPSET, PRODUCER, serialize

log = logging.getLogger(__name__)

# Fixed so that the bytes do not depend on the installed onnx package's defaults.
# Chunks per large node of the bundled ONNX models (see the module docstring).
MLP_SPLITS = 8
CNN_SPLITS = 1
DEFAULT_ROOT = BUNDLED_REPOSITORY


# --------------------------------------------------------------------------- builders


def build_mlp(
    width: int = 4096,
    layers: int = 4,
    seed: int = 0,
    *,
    splits: int = 1,
    batch_dim: str = "batch",
) -> onnx.ModelProto:
    """`layers` dense layers `width` wide (Gemm), ReLU between them.
    `input` FP32 [batch, width] → `output` FP32 [batch, width].

    `splits` > 1 computes each layer as that many Gemms over consecutive
    output columns (ReLU on each), joined by a Concat: the same function and
    weights (the draws do not depend on `splits`), in nodes small enough for
    ORT's between-node stop check (see the module docstring)."""
    if width < 1 or layers < 1:
        raise ValueError(f"width and layers must be ≥ 1, got {width}, {layers}")
    _check_splits(splits, width)
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: list[tuple[str, np.ndarray]] = []
    x = "input"
    for i in range(layers):
        # He-uniform initialisation, U(±sqrt(6 / fan_in)): keeps E[x²] roughly
        # constant through ReLU layers, so the outputs stay finite and O(1).
        # (Uniform because drawing 16M normals is ~4x slower.)
        w = rng.random((width, width), dtype=np.float32)
        w -= np.float32(0.5)
        w *= np.float32(2.0 * np.sqrt(6.0 / width))
        b = rng.standard_normal(width, dtype=np.float32) * np.float32(0.01)
        last = i == layers - 1
        y = "output" if last else f"relu{i}"
        layer_nodes, layer_weights = _dense_layer(i, x, y, w, b, splits, relu=not last)
        nodes += layer_nodes
        weights += layer_weights
        x = y
    doc = f"MLP {layers}x{width}, ReLU, seed {seed}"
    return _model(
        f"mlp{layers}x{width}",
        doc if splits == 1 else f"{doc}, each layer split into {splits} Gemms",
        nodes,
        weights,
        ("input", [batch_dim, width]),
        ("output", [batch_dim, width]),
    )


def _dense_layer(
    i: int, x: str, y: str, w: np.ndarray, b: np.ndarray, splits: int, *, relu: bool
) -> tuple[list[onnx.NodeProto], list[tuple[str, np.ndarray]]]:
    """Layer `i` of the MLP, `y` = [ReLU](`x`·w + b): one Gemm (named as in
    builder version 1), or `splits` Gemms over consecutive output columns,
    each with its ReLU, and a Concat."""
    if splits == 1:
        gemm_out = f"fc{i}" if relu else y
        nodes = [
            helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [gemm_out], name=f"fc{i}")
        ]
        if relu:
            nodes.append(helper.make_node("Relu", [gemm_out], [y], name=f"relu{i}"))
        return nodes, [(f"fc{i}.weight", w), (f"fc{i}.bias", b)]
    nodes, weights, parts = [], [], []
    for j, cols in enumerate(_chunks(w.shape[1], splits)):
        name = f"fc{i}_{j}"
        weights += [(f"{name}.weight", w[:, cols]), (f"{name}.bias", b[cols])]
        nodes.append(
            helper.make_node("Gemm", [x, f"{name}.weight", f"{name}.bias"], [name], name=name)
        )
        if relu:
            # ReLU per chunk rather than after the Concat: ORT fuses Gemm+Relu
            # into one node, as it does for the unsplit layer.
            nodes.append(helper.make_node("Relu", [name], [f"relu{i}_{j}"], name=f"relu{i}_{j}"))
            name = f"relu{i}_{j}"
        parts.append(name)
    nodes.append(helper.make_node("Concat", parts, [y], name=f"concat{i}", axis=1))
    return nodes, weights


def build_cnn(seed: int = 0, *, splits: int = 1, batch_dim: str = "batch") -> onnx.ModelProto:
    """A small CNN: `input` FP32 [batch, 3, 32, 32] → `output` FP32 [batch, 10].

    `splits` > 1 computes each Conv as that many Convs over consecutive
    output channels (ReLU on each), joined by a Concat on the channel axis:
    the same function and weights. At most 32 (the narrowest conv)."""
    _check_splits(splits, 32)
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: list[tuple[str, np.ndarray]] = []
    x = "input"
    channels = 3
    # (out channels, 2x2 max-pool after)
    plan = [(32, False), (32, True), (64, False), (64, True), (128, False)]
    for i, (out, pool) in enumerate(plan):
        fan_in = channels * 9
        w = rng.standard_normal((out, channels, 3, 3), dtype=np.float32)
        w *= np.float32(np.sqrt(2.0 / fan_in))
        b = rng.standard_normal(out, dtype=np.float32) * np.float32(0.01)
        if splits == 1:
            weights += [(f"conv{i}.weight", w), (f"conv{i}.bias", b)]
            nodes += _conv_relu(x, f"conv{i}", f"relu{i}")
        else:
            parts = []
            for j, chans in enumerate(_chunks(out, splits)):
                name = f"conv{i}_{j}"
                weights += [(f"{name}.weight", w[chans]), (f"{name}.bias", b[chans])]
                nodes += _conv_relu(x, name, f"relu{i}_{j}")
                parts.append(f"relu{i}_{j}")
            nodes.append(helper.make_node("Concat", parts, [f"relu{i}"], name=f"concat{i}", axis=1))
        x = f"relu{i}"
        if pool:
            nodes.append(
                helper.make_node(
                    "MaxPool",
                    [x],
                    [f"pool{i}"],
                    name=f"pool{i}",
                    kernel_shape=[2, 2],
                    strides=[2, 2],
                )
            )
            x = f"pool{i}"
        channels = out
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    w = rng.standard_normal((channels, 10), dtype=np.float32)
    w *= np.float32(np.sqrt(1.0 / channels))
    weights += [("fc.weight", w), ("fc.bias", np.zeros(10, dtype=np.float32))]
    nodes.append(helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["output"], name="fc"))
    doc = f"small CNN 3x32x32 -> 10, seed {seed}"
    return _model(
        "cnn",
        doc if splits == 1 else f"{doc}, each conv split into {splits} by output channels",
        nodes,
        weights,
        ("input", [batch_dim, 3, 32, 32]),
        ("output", [batch_dim, 10]),
    )


def _conv_relu(x: str, name: str, relu: str) -> list[onnx.NodeProto]:
    """Conv 3×3 (pad 1) with weights `<name>.weight`/`.bias`, then ReLU."""
    return [
        helper.make_node(
            "Conv",
            [x, f"{name}.weight", f"{name}.bias"],
            [name],
            name=name,
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", [name], [relu], name=relu),
    ]


def _check_splits(splits: int, smallest: int) -> None:
    if not 1 <= splits <= smallest:
        raise ValueError(f"splits must be in 1..{smallest}, got {splits}")


def _chunks(n: int, splits: int) -> list[slice]:
    """`splits` consecutive slices of range(n), sizes differing by at most 1."""
    bounds = np.linspace(0, n, splits + 1).round().astype(int).tolist()
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


# The checker serialises the whole model; skip it for the big weights (the
# tests run it on the same builders at a reduced size).
_CHECK_LIMIT_BYTES = 64 * 2**20


def _model(
    name: str,
    doc: str,
    nodes: list[onnx.NodeProto],
    weights: list[tuple[str, np.ndarray]],
    inp: tuple[str, list],
    out: tuple[str, list],
) -> onnx.ModelProto:
    """A FP32 model built in place: initializers are written straight into the
    proto (helper.make_graph/make_model would copy 256 MiB twice more)."""
    model = onnx.ModelProto()
    model.ir_version = IR_VERSION
    model.producer_name = PRODUCER
    model.producer_version = BUILDER_VERSION
    model.opset_import.add(domain="", version=OPSET)
    graph = model.graph
    graph.name = name
    graph.doc_string = doc
    graph.node.extend(nodes)
    graph.input.append(helper.make_tensor_value_info(inp[0], TensorProto.FLOAT, inp[1]))
    graph.output.append(helper.make_tensor_value_info(out[0], TensorProto.FLOAT, out[1]))
    total = 0
    for wname, arr in weights:
        arr = np.ascontiguousarray(arr, dtype="<f4")
        t = graph.initializer.add()
        t.name = wname
        t.data_type = TensorProto.FLOAT
        t.dims.extend(arr.shape)
        t.raw_data = arr.tobytes()
        total += arr.nbytes
    if total <= _CHECK_LIMIT_BYTES:
        onnx.checker.check_model(model)
    return model


def build_torchcnn(seed: int = 0, blocks: int = 12, width: int = 64) -> Any:
    """The `torchcnn` module (eval mode, CPU): see the module docstring."""
    torch = import_torch()
    nn = torch.nn
    rng = np.random.default_rng(seed)

    def conv(cin: int, cout: int, stride: int = 1) -> Any:
        layer = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        # He-normal, as for the ONNX CNN: activations stay O(1) through ReLUs.
        w = rng.standard_normal((cout, cin, 3, 3), dtype=np.float32)
        w *= np.float32(np.sqrt(2.0 / (cin * 9)))
        b = rng.standard_normal(cout, dtype=np.float32) * np.float32(0.01)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w))
            layer.bias.copy_(torch.from_numpy(b))
        return layer

    layers = [nn.Sequential(conv(3, width, stride=2), nn.ReLU())]
    layers += [nn.Sequential(conv(width, width), nn.ReLU()) for _ in range(blocks)]
    fc = nn.Linear(width, 10)
    w = rng.standard_normal((10, width), dtype=np.float32) * np.float32(np.sqrt(1.0 / width))
    with torch.no_grad():
        fc.weight.copy_(torch.from_numpy(w))
        fc.bias.zero_()
    layers.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), fc))
    return nn.Sequential(*layers).eval()


def torchscript_bytes(module: Any) -> bytes:
    """`torch.jit.script(module)` saved to bytes (what the torch backend loads)."""
    import io

    torch = import_torch()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # TorchScript is deprecated in torch 2.13 (torch.export replaces it)
        # but still supported; see app/runtime/torch_backend.py.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), buffer)
    return buffer.getvalue()


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Generated:
    """A generated file of a bundled model: `<root>/<model>/<file>`."""

    model: str
    file: str
    build: Callable[[], bytes]
    # False: cannot be built here (an optional extra is missing); skipped.
    available: Callable[[], bool] = lambda: True
    # ONNX: the producer_version the file must have; an existing file that
    # this module generated with another version is rebuilt.
    version: str | None = None
    # ONNX: the same model without split nodes (bench.preemption's reference).
    unsplit: Callable[[], bytes] | None = None

    @property
    def relpath(self) -> str:
        return f"{self.model}/{self.file}"


GENERATED: tuple[Generated, ...] = (
    Generated(
        "mlp",
        "model.onnx",
        lambda: serialize(build_mlp(4096, 4, seed=0, splits=MLP_SPLITS)),
        version=BUILDER_VERSION,
        unsplit=lambda: serialize(build_mlp(4096, 4, seed=0)),
    ),
    Generated(
        "cnn",
        "model.onnx",
        lambda: serialize(build_cnn(seed=0, splits=CNN_SPLITS)),
        version=BUILDER_VERSION,
        unsplit=lambda: serialize(build_cnn(seed=0)),
    ),
    Generated(
        "earlyexit",
        "model.onnx",
        lambda: serialize(dynamic_models.build_early_exit(seed=0)),
        version=BUILDER_VERSION,
    ),
    Generated(
        "earlyexit",
        "probes.npz",
        lambda: dynamic_models.probes_bytes(dynamic_models.probe_inputs("earlyexit")),
    ),
    Generated(
        "earlyexit-wide",
        "model.onnx",
        lambda: serialize(
            dynamic_models.build_early_exit(seed=0, head_width=dynamic_models.EARLY_EXIT_WIDE_HEAD)
        ),
        version=BUILDER_VERSION,
    ),
    Generated(
        "earlyexit-wide",
        "probes.npz",
        lambda: dynamic_models.probes_bytes(dynamic_models.probe_inputs("earlyexit-wide")),
    ),
    Generated(
        "encoder",
        "model.onnx",
        lambda: serialize(dynamic_models.build_encoder(seed=0)),
        version=BUILDER_VERSION,
    ),
    Generated(
        "encoder",
        "probes.npz",
        lambda: dynamic_models.probes_bytes(dynamic_models.probe_inputs("encoder")),
    ),
    Generated(
        "torchcnn",
        "model.pt",
        lambda: torchscript_bytes(build_torchcnn(seed=0, blocks=24)),
        torch_available,
    ),
)


def generated(model: str) -> Generated | None:
    """The generated file of bundled model `model`, if it has one."""
    return next((gen for gen in GENERATED if gen.model == model), None)


def onnx_producer(path: Path) -> tuple[str, str] | None:
    """(producer_name, producer_version) of the ONNX file at `path`, read from
    its first KiB only: protobuf writers emit fields in number order, so
    ModelProto's fields 1–6 come before the graph (7) and its 256 MiB of
    weights, which need not be parsed. None when the head is not a ModelProto
    that names its producer."""
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    fields: dict[int, int | bytes] = {}
    pos = 0
    try:
        while pos < len(head):
            key, pos = _varint(head, pos)
            number, wire_type = key >> 3, key & 7
            if number >= 7:
                break  # the graph and what follows
            if wire_type == 0:
                fields[number], pos = _varint(head, pos)
            elif wire_type == 2:
                length, pos = _varint(head, pos)
                if pos + length > len(head):
                    return None
                fields[number], pos = head[pos : pos + length], pos + length
            else:
                return None
        name, version = fields.get(2), fields.get(3)
        if not isinstance(name, bytes) or not isinstance(version, bytes):
            return None
        return name.decode(), version.decode()
    except (ValueError, UnicodeDecodeError):
        return None


_HEAD_BYTES = 1024


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at `buf[pos:]`: (value, position after it)."""
    value = shift = 0
    while pos < len(buf) and shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated or overlong varint")


def _is_current(path: Path, gen: Generated) -> bool:
    """False for a file this module generated with another builder version
    (stale: rebuild it); a file from anywhere else is the user's, kept."""
    if gen.version is None:
        return True
    producer = onnx_producer(path)
    if producer is None or producer[0] != PRODUCER or producer[1] == gen.version:
        return True
    log.info(
        "%s: generated by builder version %s, now %s; rebuilding", path, producer[1], gen.version
    )
    return False


def ensure_bundled_models(
    root: Path, names: Iterable[str] | None = None, *, force: bool = False
) -> list[str]:
    """Build the generated files of the bundled models that are missing under
    `root`, or stale (generated by an older builder version, see
    BUILDER_VERSION), and return their paths relative to `root` (e.g.
    ["mlp/model.onnx"]).

    Only models whose directory exists with a config.yaml are considered, so
    pointing this at a user's repository builds nothing there; `names`
    restricts it further. `force` rebuilds existing files."""
    root = Path(root)
    wanted = None if names is None else set(names)
    built: list[str] = []
    for gen in GENERATED:
        if wanted is not None and gen.model not in wanted:
            continue
        directory = root / gen.model
        if not (directory / "config.yaml").is_file():
            continue
        target = directory / gen.file
        if target.is_file() and not force and _is_current(target, gen):
            continue
        if not gen.available():
            log.warning(
                "not building %s: torch is not installed (pip install torch==2.13.0)", target
            )
            continue
        if not os.access(directory, os.W_OK):
            raise PermissionError(_unwritable(target))
        log.info("building bundled model %s …", target)
        t0 = time.perf_counter()
        data = gen.build()
        atomic_write_bytes(target, data)
        log.info(
            "built bundled model %s (%.1f MiB) in %.1f s",
            target,
            len(data) / 2**20,
            time.perf_counter() - t0,
        )
        built.append(gen.relpath)
    return built


def _unwritable(target: Path) -> str:
    return (
        f"cannot build the bundled model file {target}: its directory is not writable "
        "(an install owned by another user?). Build the files once as a user who can "
        "write there (`python -m app.repository.bundled`), or copy the directory "
        f"{target.parent.parent} elsewhere, build there (`python -m app.repository.bundled "
        "--root COPY`) and serve the copy (MODEL_REPOSITORY=COPY)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.repository.bundled",
        description="Build the generated files of the bundled model repository.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="repository (default: the bundled app/models)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild existing files")
    parser.add_argument("models", nargs="*", help="only these models (default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.root.is_dir():
        parser.error(f"{args.root} is not a directory")
    built = ensure_bundled_models(args.root, args.models or None, force=args.force)
    print("built: " + (", ".join(built) if built else "nothing (all present)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
