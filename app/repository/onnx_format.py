"""The format of the ONNX files the repository builds in code (the bundled
models, the dynamic models, the chain model): opset, IR version, producer,
and the builder's version that marks files an older builder wrote."""

from __future__ import annotations

import onnx

OPSET = 17
IR_VERSION = 8
PRODUCER = "deadline-serve bundled models"
# Written as producer_version into every generated ONNX model. Bump it when
# the bundled ONNX models change (graph, weights, chunk counts), so that files
# an older version generated are rebuilt (app/repository/bundled.py's
# `ensure_bundled_models`).
# 1: one node per layer; 2: large nodes split (MLP_SPLITS, CNN_SPLITS).
BUILDER_VERSION = "2"


def serialize(model: onnx.ModelProto) -> bytes:
    """Deterministic bytes (no map fields in these protos, fixed versions)."""
    return model.SerializeToString(deterministic=True)
