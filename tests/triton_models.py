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


# Triton's docs/examples/model_repository/simple_string/config.pbtxt
SIMPLE_STRING_PBTXT = """
name: "simple_string"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }
]
"""


def string_model(path: Path) -> None:
    """Triton's simple_string: INPUT0, INPUT1 strings of integers; OUTPUT0 =
    their sum, OUTPUT1 = their difference, as strings (Cast STRING → INT32,
    Add/Sub, Cast INT32 → STRING), a batch of [n, 16]."""
    string = [
        helper.make_tensor_value_info(name, TensorProto.STRING, ["batch", 16])
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.INT32),
        helper.make_node("Add", ["A", "B"], ["SUM"]),
        helper.make_node("Sub", ["A", "B"], ["DIFF"]),
        helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["DIFF"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    graph = helper.make_graph(nodes, "simple_string", string[:2], string[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


def triton_string_model(root: Path, pbtxt: str = SIMPLE_STRING_PBTXT) -> Path:
    """`<root>/simple_string/` as in Triton's example repository (version 1)."""
    directory = root / "simple_string"
    string_model(directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text(pbtxt)
    return directory
