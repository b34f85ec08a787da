"""A model file's signature (inputs and outputs with their KServe v2
datatypes and dimensions) and how a config disagrees with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.repository.config import ModelConfig

# ONNX TensorProto element types (and ORT's type strings) → KServe v2 names.
ONNX_TO_V2 = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",  # STRING
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
}
ORT_TO_V2 = {
    "tensor(float)": "FP32",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(uint16)": "UINT16",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
}

# (name, v2 datatype or None if unsupported, dims with None for symbolic ones)
Signature = list[tuple[str, str | None, list[int | None]]]


def onnx_signature(path: Path) -> tuple[Signature, Signature]:
    """Graph inputs (initializers excluded) and outputs of an ONNX file."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}

    def describe(values: Any) -> Signature:
        out: Signature = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            out.append((v.name, ONNX_TO_V2.get(t.elem_type), dims))
        return out

    return describe(model.graph.input), describe(model.graph.output)


def ort_signature(session: Any) -> tuple[Signature, Signature]:
    """Inputs and outputs of an onnxruntime.InferenceSession."""

    def describe(args: Any) -> Signature:
        return [
            (a.name, ORT_TO_V2.get(a.type), [d if isinstance(d, int) else None for d in a.shape])
            for a in args
        ]

    return describe(session.get_inputs()), describe(session.get_outputs())


def signature_problems(config: ModelConfig, inputs: Signature, outputs: Signature) -> list[str]:
    """How the config's tensors disagree with a model's signature (empty when
    they agree). A symbolic model dimension matches anything; the config's
    -1 (the batch dimension, or a variable one) matches a symbolic one and
    not a fixed one (the model would refuse other lengths)."""
    problems: list[str] = []
    for kind, declared, actual in (
        ("input", config.inputs, inputs),
        ("output", config.outputs, outputs),
    ):
        by_name = {n: (dt, dims) for n, dt, dims in actual}
        for spec in declared:
            if spec.name not in by_name:
                problems.append(
                    f"{kind} {spec.name!r} is not in the model (it has {sorted(by_name)})"
                )
                continue
            dt, dims = by_name.pop(spec.name)
            if dt != spec.datatype:
                problems.append(
                    f"{kind} {spec.name!r}: config says {spec.datatype}, model has {dt}"
                )
            shown = [-1 if d is None else d for d in dims]
            if len(dims) != len(spec.shape) or any(
                d is not None and d != s for s, d in zip(spec.item_shape, dims[1:], strict=True)
            ):
                problems.append(
                    f"{kind} {spec.name!r}: config shape {list(spec.shape)}, model shape {shown}"
                )
            elif dims[0] is not None:
                problems.append(
                    f"{kind} {spec.name!r}: model shape {shown} has a fixed batch dimension; "
                    "batching needs it dynamic"
                )
        if kind == "input" and by_name:
            problems.append(f"model inputs missing from the config: {sorted(by_name)}")
    return problems
