"""ModelInferRequest → tensors, and an inference result → ModelInferResponse.

Every check is the HTTP API's (app.api.tensors: input names, datatypes,
shapes against the model config and the request's element budget, the
numeric range of each datatype), so a request is accepted or refused alike
over both protocols, with the same message naming the tensor. The shape is
passed through as the client sent it, batch dimension included.

An input's elements come either in `raw_input_contents` (for every input or
for none, in input order, as Triton requires: little-endian, row-major, BOOL
one byte of 0 or 1) or in the typed `contents` field for its datatype —
`int_contents` for INT8/16/32, `uint_contents` for UINT8/16/32, `int64_contents`,
`uint64_contents`, `fp32_contents`, `fp64_contents`, `bool_contents`,
`bytes_contents` for BYTES; FP16 has no typed field and goes raw. Typed
values are range-checked like JSON numbers (300 in an INT8 tensor is
refused, never wrapped). A BYTES tensor's raw contents are its elements
each after a 4-byte little-endian length, as in the HTTP binary form; its
elements are checked alike (max_bytes, UTF-8).

Outputs are returned in `raw_output_contents` (BYTES: length-prefixed
elements), in the order of `outputs`; the answer's `parameters` carry where the request's time went
(queue_ms, exec_ms, batch_size, device, ...) and its application (app_id), as an HTTP v2
answer's do; each time in ms (a double_param) comes also in whole µs as an
int64_param (`queue_us`, `exec_us`, ...) for clients whose proto has no
double_param (the KServe SDK's has bool, int64 and string only).

Request, input and output parameters are taken as Triton's gRPC front end
takes them (app/api/request_params.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from app.api import request_params as rp
from app.api.bodies import result_output
from app.api.tensors import (
    batch_items,
    bytes_elements,
    check_bytes,
    check_datatype,
    check_input_names,
    check_output_names,
    check_shape,
    datatype_name,
    decode_binary_tensor,
    decode_json_tensor,
    output_bytes,
    spec_map,
)
from app.errors import InvalidInput
from app.repository.config import ModelConfig, TensorSpec
from app.server.service import InferResult

# The typed-contents field of each datatype, and the dtype its values have
# on the wire (the range check narrows them to the tensor's datatype).
TYPED_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
}


def decode_inputs(
    config: ModelConfig, request: pb.ModelInferRequest, max_elements: int
) -> dict[str, np.ndarray]:
    """The request's tensors, checked against the model; each shape is
    checked (against the config and `max_elements`) before its tensor is built."""
    check_input_names(config, [tensor.name for tensor in request.inputs])
    specs = spec_map(config.inputs)
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: "
            "give every input's data there, in input order, or none"
        )
    inputs: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        spec = specs[name]
        check_datatype(name, spec, tensor.datatype)
        shape = check_shape(
            name,
            spec,
            list(tensor.shape),
            max_elements=max_elements,
            max_batch=config.max_batch_size,
        )
        input_parameters(name, tensor.parameters)  # shared memory is refused here
        if raw:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"input '{name}' has both contents and raw_input_contents[{index}]; give one"
                )
            inputs[name] = _decode_raw(name, spec, raw[index], index, shape)
        else:
            inputs[name] = _decode_typed(name, spec, tensor.contents, shape)
    batch_items(inputs)  # one batch dimension for every input, named where they differ
    return inputs


def input_parameters(name: str, parameters: Mapping[str, pb.InferParameter]) -> list[str]:
    """An input's parameters: `binary_data_size` (the KServe SDK's marker
    that the input's data is in raw_input_contents) is known; shared memory
    is refused; any other is accepted without effect (its name returned)."""
    return rp.tensor_parameters_grpc(f"input '{name}'", parameters, ("binary_data_size",))


def _decode_raw(
    name: str, spec: TensorSpec, data: bytes, index: int, shape: tuple[int, ...]
) -> np.ndarray:
    if spec.datatype == "BYTES":  # length-prefixed elements, checked as they are read
        return decode_binary_tensor(name, spec, memoryview(data), shape)
    want = math.prod(shape) * spec.dtype.itemsize
    if len(data) != want:
        raise InvalidInput(
            f"input '{name}': raw_input_contents[{index}] has {len(data)} bytes but shape "
            f"{list(shape)} of {spec.datatype} needs {want} bytes"
        )
    return decode_binary_tensor(name, spec, memoryview(data), shape)


def _decode_typed(
    name: str, spec: TensorSpec, contents: pb.InferTensorContents, shape: tuple[int, ...]
) -> np.ndarray:
    given = [field.name for field, _ in contents.ListFields()]
    if spec.datatype == "BYTES":
        return _decode_typed_bytes(name, spec, contents, shape, given)
    typed = TYPED_FIELDS.get(spec.datatype)
    if typed is None:
        raise InvalidInput(
            f"input '{name}': {spec.datatype} data goes in raw_input_contents "
            "(InferTensorContents has no field for it)"
        )
    field, wire_dtype = typed
    others = [g for g in given if g != field]
    if others:
        raise InvalidInput(
            f"input '{name}': contents.{others[0]} is given, but a {spec.datatype} tensor takes "
            f"its elements in contents.{field} (or raw_input_contents)"
        )
    if not given and math.prod(shape) > 0:
        raise InvalidInput(
            f"input '{name}' has no data: give raw_input_contents or contents.{field}"
        )
    values = np.array(getattr(contents, field), dtype=wire_dtype)
    # the HTTP API's check of JSON numbers: element count and datatype range
    return decode_json_tensor(name, spec, values, shape)  # type: ignore[arg-type]


def _decode_typed_bytes(
    name: str,
    spec: TensorSpec,
    contents: pb.InferTensorContents,
    shape: tuple[int, ...],
    given: list[str],
) -> np.ndarray:
    others = [g for g in given if g != "bytes_contents"]
    if others:
        raise InvalidInput(
            f"input '{name}': contents.{others[0]} is given, but a BYTES tensor takes "
            "its elements in contents.bytes_contents (or raw_input_contents)"
        )
    values = list(contents.bytes_contents)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} elements, "
            f"contents.bytes_contents has {len(values)}"
        )
    out = bytes_elements(values, shape)
    check_bytes(name, spec, out)
    return out


def request_parameters(request: pb.ModelInferRequest) -> rp.RequestParameters:
    """The request's parameters, checked as Triton checks them
    (app/api/request_params.py)."""
    return rp.from_grpc(request.parameters)


def unused_parameters(
    request: pb.ModelInferRequest, params: rp.RequestParameters
) -> list[tuple[str, str]]:
    """[(where, name)] of every parameter of the request, its inputs and its
    outputs accepted without effect (checked: call after `decode_inputs` and
    `requested_outputs`)."""
    unused = [("request", name) for name in params.unused]
    for tensor in request.inputs:
        unused += [("input", n) for n in input_parameters(tensor.name, tensor.parameters)]
    for output in request.outputs:
        unused += [("output", n) for n in output_parameters(output.name, output.parameters)]
    return unused


def output_parameters(name: str, parameters: Mapping[str, pb.InferParameter]) -> list[str]:
    """An output's parameters: `binary_data` is known (outputs are always
    raw over gRPC), classification and shared memory are refused, any other
    is accepted without effect (its name returned)."""
    if "classification" in parameters:
        raise InvalidInput(f"output '{name}': the classification extension is not supported")
    return rp.tensor_parameters_grpc(f"output '{name}'", parameters, ("binary_data",))


def requested_outputs(config: ModelConfig, request: pb.ModelInferRequest) -> list[str]:
    """The outputs to return, in the order asked (every output when none is)."""
    if not request.outputs:
        return [spec.name for spec in config.outputs]
    check_output_names(config, [output.name for output in request.outputs])
    chosen: list[str] = []
    for output in request.outputs:
        output_parameters(output.name, output.parameters)
        chosen.append(output.name)
    return chosen


def build_response(
    config: ModelConfig,
    request: pb.ModelInferRequest,
    result: InferResult,
    chosen: Sequence[str],
) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=config.model_name, model_version=config.version)
    request_id = request.id or result.request_id
    if request_id:
        response.id = request_id
    for key, value in result.timing().items():
        set_parameter(response.parameters[key], value)
        if key.endswith("_ms") and isinstance(value, float):
            # the same time in whole µs, for protos without double_param (KServe's)
            response.parameters[key[:-3] + "_us"].int64_param = round(value * 1000.0)
    for name in chosen:
        arr = result_output(result, name)
        response.outputs.add(name=name, datatype=datatype_name(arr.dtype), shape=arr.shape)
        response.raw_output_contents.append(output_bytes(arr))
    return response


def set_parameter(param: pb.InferParameter, value: Any) -> None:
    """An InferParameter holding `value` (bool, int, float or text)."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)
