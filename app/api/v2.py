"""The KServe v2 codec: request bodies to tensors, results to response bodies.

Covers the JSON form and the binary tensor data extension as
`tritonclient.http` uses it: a body is a JSON header of
`Inference-Header-Content-Length` bytes followed by the binary data of the
inputs that set `parameters.binary_data_size`, in input order; a response
carries the outputs asked for as binary (`binary_data`, `binary_data_output`)
the same way. Every declared size is checked against the body before a tensor
is built (truncated or lying sizes are malformed requests, 400).

A request may carry n items (batch dimension n, 1 ≤ n ≤ max_batch_size, the
same for every input); the answer's outputs have batch dimension n.
`v2_call` turns a parsed request into the service's call — the HTTP route
and any other front end of the v2 protocol share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi.responses import Response
from pydantic import BaseModel

from app.api import models as m
from app.api import request_params as rp
from app.api.bodies import TensorJSONResponse, dumps_json, is_uint, result_output
from app.api.errors import MalformedRequest
from app.api.tensors import (
    batch_items,
    check_datatype,
    check_input_names,
    check_output_names,
    check_shape,
    datatype_name,
    decode_binary_tensor,
    decode_json_tensor,
    json_data,
    output_bytes,
    spec_map,
)
from app.errors import InvalidInput
from app.repository.config import ModelConfig
from app.server.service import InferResult

HEADER_LENGTH = "Inference-Header-Content-Length"


def split_body(body: bytes, header_value: str | None) -> tuple[bytes, memoryview]:
    """(JSON part, binary part) of a v2 request body; `header_value` is the
    Inference-Header-Content-Length header (None: the whole body is JSON)."""
    if header_value is None:
        return body, memoryview(b"")
    text = header_value.strip()
    if not is_uint(text):
        raise MalformedRequest(
            f"{HEADER_LENGTH} must be a non-negative integer, got {header_value!r}"
        )
    n = int(text)
    if n > len(body):
        raise MalformedRequest(f"{HEADER_LENGTH} is {n} but the body has only {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


def decode_inputs(
    config: ModelConfig,
    req: m.V2InferRequest,
    binary: memoryview,
    header_length: int | None,
    max_elements: int,
) -> dict[str, np.ndarray]:
    """The request's tensors, checked against the model; `header_length` is the
    Inference-Header-Content-Length (None: no header, the body is all JSON).
    Every shape is checked (against the config and `max_elements`) before
    its tensor is built, and every input has the same batch dimension."""
    check_input_names(config, [i.name for i in req.inputs])
    specs = spec_map(config.inputs)

    declared = 0
    sizes = []
    for inp in req.inputs:
        params = inp.parameters
        if params is not None and params.binary_data_size is not None:
            declared += params.binary_data_size
            sizes.append(f"{inp.name}: {params.binary_data_size}")
    if declared != len(binary):
        if header_length is None:
            raise MalformedRequest(
                f"inputs set parameters.binary_data_size ({', '.join(sizes)}) but the request "
                f"has no {HEADER_LENGTH} header to say where the JSON ends"
            )
        if not declared:
            raise MalformedRequest(
                f"{len(binary)} unexpected bytes after the JSON header ({HEADER_LENGTH} "
                "is shorter than the body and no input sets parameters.binary_data_size)"
            )
        raise MalformedRequest(
            f"binary tensor data: the inputs declare {declared} bytes ({', '.join(sizes)}) "
            f"but the body carries {len(binary)} bytes after the {header_length}-byte JSON "
            f"header ({HEADER_LENGTH})"
        )

    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for inp in req.inputs:
        spec = specs[inp.name]
        check_datatype(inp.name, spec, inp.datatype)
        shape = check_shape(
            inp.name, spec, inp.shape, max_elements=max_elements, max_batch=config.max_batch_size
        )
        params = inp.parameters
        size = params.binary_data_size if params is not None else None
        if size is not None:
            if inp.data is not None:
                raise InvalidInput(
                    f"input '{inp.name}' has both data and parameters.binary_data_size; give one"
                )
            inputs[inp.name] = decode_binary_tensor(
                inp.name, spec, binary[offset : offset + size], shape
            )
            offset += size
        elif inp.data is not None:
            inputs[inp.name] = decode_json_tensor(inp.name, spec, inp.data, shape)
        else:
            raise InvalidInput(
                f"input '{inp.name}' has no data: give data or parameters.binary_data_size"
            )
    batch_items(inputs)
    return inputs


@dataclass
class V2Call:
    """A v2 inference request, decoded: what to pass to `InferenceService.infer`
    and how to answer (`build_response(config, req, result, outputs)`)."""

    inputs: dict[str, np.ndarray]
    items: int  # the batch dimension n of every input
    slo_ms: float | None
    request_id: str | None
    app: str  # parameters.app_id ("": the model's default application)
    outputs: list[tuple[str, bool]] | None  # requested_outputs
    # parameters accepted without effect: [(where, name)] (app/api/request_params.py)
    unused: list[tuple[str, str]] = field(default_factory=list)


def _extra(params: BaseModel | None) -> dict[str, Any]:
    return dict(params.model_extra or {}) if params is not None else {}


def v2_call(
    config: ModelConfig,
    req: m.V2InferRequest,
    binary: memoryview,
    header_length: int | None,
    max_elements: int,
) -> V2Call:
    """Decode and check `req` for `config` (the arguments as `decode_inputs`).
    Parameters are taken as Triton takes them (app/api/request_params.py)."""
    p = req.parameters
    params = rp.from_json(
        p.slo_ms if p is not None else None,
        p.app_id if p is not None else None,
        _extra(p),
    )
    unused = [("request", name) for name in params.unused]
    for inp in req.inputs:
        where = f"input '{inp.name}'"
        unused += [("input", n) for n in rp.tensor_parameters_json(where, _extra(inp.parameters))]
    for out in req.outputs or ():
        where = f"output '{out.name}'"
        unused += [("output", n) for n in rp.tensor_parameters_json(where, _extra(out.parameters))]
    inputs = decode_inputs(config, req, binary, header_length, max_elements)
    return V2Call(
        inputs=inputs,
        items=batch_items(inputs),
        slo_ms=rp.request_slo(config, params),
        request_id=req.id,
        app=params.app_id,
        outputs=requested_outputs(config, req),
        unused=unused,
    )


def requested_outputs(config: ModelConfig, req: m.V2InferRequest) -> list[tuple[str, bool]] | None:
    """[(name, binary)] for requested outputs, or None for all outputs."""
    params = req.parameters
    default_binary = bool(params.binary_data_output) if params is not None else False
    if not req.outputs:
        return None
    check_output_names(config, [out.name for out in req.outputs])
    chosen = []
    for out in req.outputs:
        p = out.parameters
        if p is not None and p.classification:
            raise InvalidInput(
                f"output '{out.name}': the classification extension is not supported"
            )
        binary = p.binary_data if p is not None and p.binary_data is not None else default_binary
        chosen.append((out.name, binary))
    return chosen


def build_response(
    config: ModelConfig,
    req: m.V2InferRequest,
    result: InferResult,
    chosen: list[tuple[str, bool]] | None,
) -> Response:
    """The answer to `req`: JSON, or JSON followed by the binary outputs
    (`chosen` from requested_outputs; None: every output)."""
    if chosen is None:
        params = req.parameters
        default_binary = bool(params.binary_data_output) if params is not None else False
        chosen = [(name, default_binary) for name in result.outputs]
    outputs = []
    blobs: list[bytes] = []
    arrays: list[np.ndarray] = []
    for name, binary in chosen:
        arr = result_output(result, name)
        entry: dict[str, Any] = {
            "name": name,
            "shape": [int(d) for d in arr.shape],
            "datatype": datatype_name(arr.dtype),
        }
        if binary:
            blob = output_bytes(arr)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            data = json_data(name, arr)
            entry["data"] = data
            if isinstance(data, np.ndarray):
                arrays.append(data)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": config.model_name, "model_version": config.version}
    request_id = req.id if req.id is not None else result.request_id
    if request_id is not None:
        body["id"] = request_id
    body["parameters"] = result.timing()
    body["outputs"] = outputs
    if not blobs:
        return TensorJSONResponse(body, arrays)
    header = dumps_json(body, arrays)
    return Response(
        b"".join([header, *blobs]),
        media_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(header))},
    )
