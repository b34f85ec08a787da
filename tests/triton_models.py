"""A Triton user's model repository, built in code (deterministic): `simple`,
an ONNX model y = x · scale in version directories 1 (×1) and 2 (×2) with a
config.pbtxt using Triton's fields."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

SIMPLE_PBTXT = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 500
  default_queue_policy { default_timeout_microseconds: 20000 max_queue_size: 64 }
}
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "slo_ms" value { string_value: "50" } }
parameters { key: "allow_slo_loosening" value { string_value: "true" } }
"""


def scale_model(path: Path, scale: float) -> None:
    """OUTPUT0 = INPUT0 · scale, a batch of [n, 4] FP32 (deterministic)."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "S"], ["OUTPUT0"])],
        "scale",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("S", TensorProto.FLOAT, [1], [scale])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def triton_model(root: Path, pbtxt: str = SIMPLE_PBTXT, name: str = "simple") -> Path:
    """`<root>/<name>/config.pbtxt` with versions 1 (×1) and 2 (×2)."""
    directory = root / name
    scale_model(directory / "1" / "model.onnx", 1.0)
    scale_model(directory / "2" / "model.onnx", 2.0)
    (directory / "config.pbtxt").write_text(pbtxt)
    return directory
