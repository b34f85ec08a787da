"""The bundled model repository (`models/` at the repository root).

Nothing is downloaded: the ONNX files are generated deterministically with
`onnx.helper` from a seed (numpy's default_rng) the first time they are
needed, and are git-ignored; only the `config.yaml` files are committed.

Generated models (tensor names `input` → `output`, both FP32):

- `mlp`: 4 dense layers 4096 wide, ReLU between them (not after the last),
  `input` [-1, 4096] → `output` [-1, 4096]. He-uniform weights keep the
  activations O(1). About 256 MiB of FP32 weights: large enough that batching
  pays off on a CPU (weights are read once per batch).
- `cnn`: a small CIFAR-sized CNN, `input` [-1, 3, 32, 32] → `output` [-1, 10]
  (logits): 5 conv 3×3 + ReLU layers (32, 32, 64, 64, 128 channels) with two
  2×2 max-pools, global average pool, one dense layer. About 0.6 MB.

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

Emulated models (`backend: emulated`, profile from symphony.txt Table 5,
NVIDIA 1080Ti) need no file; their configs are committed as they are.

    python -m app.repository.bundled [--root models] [--force]

builds whatever generated file is missing (idempotent; atomic rename; the
same seed gives the same bytes).
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from app.repository.loader import atomic_write_bytes

log = logging.getLogger(__name__)

# Fixed so that the bytes do not depend on the installed onnx package's defaults.
OPSET = 17
IR_VERSION = 8
PRODUCER = "deadline-serve bundled models"
DEFAULT_ROOT = Path("models")


# --------------------------------------------------------------------------- builders


def build_mlp(
    width: int = 4096, layers: int = 4, seed: int = 0, *, batch_dim: str = "batch"
) -> onnx.ModelProto:
    """`layers` dense layers `width` wide (Gemm), ReLU between them.
    `input` FP32 [batch, width] → `output` FP32 [batch, width]."""
    if width < 1 or layers < 1:
        raise ValueError(f"width and layers must be ≥ 1, got {width}, {layers}")
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
        weights += [(f"fc{i}.weight", w), (f"fc{i}.bias", b)]
        last = i == layers - 1
        y = "output" if last else f"fc{i}"
        nodes.append(
            helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [y], name=f"fc{i}")
        )
        if not last:
            nodes.append(helper.make_node("Relu", [y], [f"relu{i}"], name=f"relu{i}"))
            y = f"relu{i}"
        x = y
    return _model(
        f"mlp{layers}x{width}",
        f"MLP {layers}x{width}, ReLU, seed {seed}",
        nodes,
        weights,
        ("input", [batch_dim, width]),
        ("output", [batch_dim, width]),
    )


def build_cnn(seed: int = 0, *, batch_dim: str = "batch") -> onnx.ModelProto:
    """A small CNN: `input` FP32 [batch, 3, 32, 32] → `output` FP32 [batch, 10]."""
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
        weights += [(f"conv{i}.weight", w), (f"conv{i}.bias", b)]
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"conv{i}.weight", f"conv{i}.bias"],
                [f"conv{i}"],
                name=f"conv{i}",
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
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
    return _model(
        "cnn",
        f"small CNN 3x32x32 -> 10, seed {seed}",
        nodes,
        weights,
        ("input", [batch_dim, 3, 32, 32]),
        ("output", [batch_dim, 10]),
    )


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
    model.producer_version = "1"
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


def serialize(model: onnx.ModelProto) -> bytes:
    """Deterministic bytes (no map fields in these protos, fixed versions)."""
    return model.SerializeToString(deterministic=True)


def build_torchcnn(seed: int = 0, blocks: int = 12, width: int = 64) -> Any:
    """The `torchcnn` module (eval mode, CPU): see the module docstring."""
    from app.runtime.torch_backend import import_torch

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

    from app.runtime.torch_backend import import_torch

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

    @property
    def relpath(self) -> str:
        return f"{self.model}/{self.file}"


GENERATED: tuple[Generated, ...] = (
    Generated("mlp", "model.onnx", lambda: serialize(build_mlp(4096, 4, seed=0))),
    Generated("cnn", "model.onnx", lambda: serialize(build_cnn(seed=0))),
    Generated(
        "torchcnn",
        "model.pt",
        lambda: torchscript_bytes(build_torchcnn(seed=0, blocks=24)),
        torch_available,
    ),
)


def ensure_bundled_models(
    root: Path, names: Iterable[str] | None = None, *, force: bool = False
) -> list[str]:
    """Build the generated files of the bundled models that are missing under
    `root` and return their paths relative to `root` (e.g. ["mlp/model.onnx"]).

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
        if target.is_file() and not force:
            continue
        if not gen.available():
            log.warning(
                "not building %s: torch is not installed (pip install torch==2.13.0)", target
            )
            continue
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.repository.bundled",
        description="Build the generated files of the bundled model repository.",
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="repository (models)")
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
