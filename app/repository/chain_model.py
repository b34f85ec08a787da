"""`chain`: a generated ONNX model deep enough to cut into ~10 blocks
(ppipe.txt §5.2), built like the bundled models (app/repository/bundled.py):
`onnx.helper`, weights from numpy's default_rng(seed), the same seed giving
the same bytes.

`input` FP32 [batch, 3, size, size] → `output` FP32 [batch, 10]:

    stem      Conv 3×3 (3 → width) + ReLU
    block i   y = ReLU(x + ⅕·Conv3×3(ReLU(Conv3×3(x))))   (i < blocks, width kept)
    head      global average pool, Flatten, dense width → 10

Each residual block is a diamond (two tensors cross its middle: `x` and the
branch), so the graph narrows to one activation only between blocks: the
stem's output, every block's output and the head's pooled features are its
cut points (app/repository/partition.py finds them), while the nodes inside
a block cannot be separated. The branch is scaled by ⅕ (its second conv's
weights) so that the activations stay O(1) through the residual sum.

At the defaults (width 48, size 32) a block is two 48-channel 3×3 convs at
32×32, ~85 MFLOP per item: ~0.4 ms at batch 1 on one thread of this
project's 2-core box (once, on a shared machine: indicative only), so the
ten blocks `block_profile.prepartition` makes each take ~0.4 ms; a cut
carries 192 KiB per item (48 × 32 × 32 FP32). Tests build it far smaller
(`width`, `size`).

Not part of the bundled repository on purpose: the server would load and
profile it at every start and every test that enumerates the bundled models
would change; `write_chain` builds it on demand (a model directory with
`model.onnx` and `config.yaml`), `chain_config` gives its ModelConfig.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.repository.config import ModelConfig, TensorSpec
from app.repository.files import atomic_write_bytes
from app.repository.onnx_format import IR_VERSION, OPSET, PRODUCER, serialize

CHAIN_MODEL = "chain"
#: Bump when the graph or the weights change (written as producer_version).
CHAIN_BUILDER_VERSION = "chain-1"
# The residual branch's scale (see the module docstring).
_BRANCH_SCALE = 0.2


def build_chain(
    seed: int = 0,
    *,
    blocks: int = 10,
    width: int = 48,
    size: int = 32,
    batch_dim: str = "batch",
) -> onnx.ModelProto:
    """The `chain` model (see the module docstring)."""
    if blocks < 1 or width < 1 or size < 1:
        raise ValueError(f"blocks, width and size must be ≥ 1, got {blocks}, {width}, {size}")
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []

    def conv(x: str, name: str, cin: int, cout: int, scale: float = 1.0) -> str:
        # He-normal: activations keep their scale through a ReLU.
        w = rng.standard_normal((cout, cin, 3, 3), dtype=np.float32)
        w *= np.float32(scale * np.sqrt(2.0 / (cin * 9)))
        b = rng.standard_normal(cout, dtype=np.float32) * np.float32(0.01)
        weights.append(numpy_helper.from_array(w, f"{name}.weight"))
        weights.append(numpy_helper.from_array(b, f"{name}.bias"))
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{name}.weight", f"{name}.bias"],
                [name],
                name=name,
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
            )
        )
        return name

    def relu(x: str, name: str) -> str:
        nodes.append(helper.make_node("Relu", [x], [name], name=name))
        return name

    x = relu(conv("input", "stem", 3, width), "stem.relu")
    for i in range(blocks):
        branch = relu(conv(x, f"block{i}.conv0", width, width), f"block{i}.relu0")
        branch = conv(branch, f"block{i}.conv1", width, width, scale=_BRANCH_SCALE)
        nodes.append(helper.make_node("Add", [x, branch], [f"block{i}.sum"], name=f"block{i}.add"))
        x = relu(f"block{i}.sum", f"block{i}")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    w = rng.standard_normal((width, 10), dtype=np.float32) * np.float32(np.sqrt(1.0 / width))
    weights.append(numpy_helper.from_array(w, "fc.weight"))
    weights.append(numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["output"], name="fc"))
    graph = helper.make_graph(
        nodes,
        CHAIN_MODEL,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch_dim, 3, size, size])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch_dim, 10])],
        initializer=weights,
        doc_string=f"chain of {blocks} residual conv blocks, width {width}, {size}x{size}, "
        f"seed {seed}",
    )
    model = helper.make_model(
        graph,
        ir_version=IR_VERSION,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version=CHAIN_BUILDER_VERSION,
    )
    onnx.checker.check_model(model)
    return model


_CONFIG = """\
# Generated by app.repository.chain_model (a model to cut into partitions).
description: >-
  Synthetic chain of {blocks} residual conv blocks ({width} channels, {size}x{size}),
  seed {seed}. Generated by app.repository.chain_model.
backend: onnx
model_file: model.onnx
inputs:
  - {{name: input, datatype: FP32, shape: [-1, 3, {size}, {size}]}}
outputs:
  - {{name: output, datatype: FP32, shape: [-1, 10]}}
max_batch_size: {max_batch}
slo_ms: 100
"""


def write_chain(
    directory: Path,
    seed: int = 0,
    *,
    blocks: int = 10,
    width: int = 48,
    size: int = 32,
    max_batch: int = 8,
) -> Path:
    """Write the model as a repository directory (`model.onnx` and
    `config.yaml`) at `directory`, created if missing; returns the ONNX
    file's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    model = build_chain(seed, blocks=blocks, width=width, size=size)
    atomic_write_bytes(path, serialize(model))
    text = _CONFIG.format(blocks=blocks, width=width, size=size, seed=seed, max_batch=max_batch)
    atomic_write_bytes(directory / "config.yaml", text.encode())
    return path


def chain_config(path: Path, *, size: int = 32, max_batch: int = 8) -> ModelConfig:
    """The ModelConfig of a `chain` ONNX file at `path` built with `size`."""
    path = Path(path).resolve()
    return ModelConfig(
        name=CHAIN_MODEL,
        backend="onnx",
        directory=path.parent,
        inputs=(TensorSpec("input", "FP32", (-1, 3, size, size)),),
        outputs=(TensorSpec("output", "FP32", (-1, 10)),),
        max_batch_size=max_batch,
        slo_ms=100.0,
        model_file=path,
    )
