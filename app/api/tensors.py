"""Tensor decoding, validation and encoding for the HTTP API.

Every check raises `InvalidInput` (HTTP 400) with a message that names the
tensor and says what was expected. A request's batch dimension n is its item
count: 1 ≤ n ≤ the model's max_batch_size, the same n for every input. The
scheduler counts the n items toward its batch size and keeps the request
whole; the answer's outputs have batch dimension n.

Binary tensor data (KServe's binary extension) is little-endian, row-major;
BOOL is one byte per element (0 or 1); a BYTES element is a 4-byte
little-endian length followed by that many bytes, as the binary-tensor
extension specifies. In JSON a BYTES element is a string. A BYTES element
is at most its tensor's `max_bytes` and UTF-8 text (ONNX string tensors
hold text); BYTES outputs are answered as strings in JSON, or binary.

A variable dimension (-1 in the config) takes any length up to its bound
(`max_shape`); a longer one is a 400 naming the tensor and the bound —
except in an `elastic` tensor (a Triton config's, whose bounds the server
chose), which takes any length the body limit allows, as does its BYTES
elements' `max_bytes`.

JSON numbers must fit the input's datatype: an integer out of the integer
type's range, or a finite number beyond FP16's or FP32's largest finite value
(65504, about 3.4e38: e.g. 70000 in FP16, 1e39 in FP32) is a 400 naming the
tensor, never a silent wrap or Infinity. NaN and ±Infinity (the JSON literals
`NaN`, `Infinity`, `-Infinity`) are accepted in floating-point tensors as the
values they name. FP64 takes every number JSON's parser gives. Binary tensor
data is taken bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.api.models import MAX_SLO_MS
from app.errors import InvalidInput
from app.repository.config import DATATYPES, ModelConfig, TensorSpec

_DTYPE_TO_NAME: dict[np.dtype, str] = {dt: name for name, dt in DATATYPES.items()}


def datatype_name(dtype: np.dtype) -> str:
    """The v2 datatype name of a numpy dtype (any byte order)."""
    dt = np.dtype(dtype)
    name = _DTYPE_TO_NAME.get(dt.newbyteorder("="))
    if name is None:
        raise TypeError(f"no KServe v2 datatype for numpy dtype {dt}")
    return name


def _fmt_shape(shape: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def is_bytes(spec: TensorSpec) -> bool:
    return spec.datatype == "BYTES"


def expected_shape(spec: TensorSpec) -> list[int]:
    """The shape of a one-item request: batch dimension 1, -1 for any size."""
    return [1, *spec.item_shape] if spec.shape else []


def _expected_text(spec: TensorSpec, max_batch: int = 1) -> str:
    exp = expected_shape(spec)
    text = _fmt_shape(exp)
    if any(d < 0 for d in exp):
        text += " (-1: any size" + (
            f" up to max_shape {list(spec.max_shape)})" if spec.max_shape else ")"
        )
    if max_batch > 1 and exp:
        items = _fmt_shape(["n", *spec.item_shape])  # type: ignore[list-item]
        text += f" (or n items: {items}, n ≤ max_batch_size {max_batch})"
    return text


def check_shape(
    name: str,
    spec: TensorSpec,
    shape: Sequence[int],
    *,
    batch_optional: bool = False,
    max_elements: int | None = None,
    max_batch: int = 1,
) -> tuple[int, ...]:
    """Validate a request tensor's shape; returns it with the batch dimension.

    With `batch_optional`, a shape without the batch dimension gets one of 1.
    The model config fixes every dimension but the batch one (the request's
    items: 1 to `max_batch`, the model's max_batch_size); a variable
    dimension (-1) is bounded by `max_elements` elements, so no shape can
    make the server allocate more than the body could carry.
    """
    shape = tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise InvalidInput(
            f"input '{name}': shape dimensions must be non-negative integers, got {list(shape)}"
        )
    rank = len(spec.shape)
    if batch_optional and len(shape) == rank - 1:
        shape = (1, *shape)
    if len(shape) != rank:
        raise InvalidInput(
            f"input '{name}': expected shape {_expected_text(spec, max_batch)} "
            f"({rank} dimensions, batch dimension first), got {_fmt_shape(shape)}"
        )
    if rank and not 1 <= shape[0] <= max_batch:
        raise InvalidInput(
            f"input '{name}': the batch dimension must be between 1 and the model's "
            f"max_batch_size ({max_batch}), got {shape[0]} (shape {_fmt_shape(shape)})"
        )
    for got, want in zip(shape[1:], spec.item_shape, strict=True):
        if want >= 0 and got != want:
            raise InvalidInput(
                f"input '{name}': expected shape {_expected_text(spec, max_batch)}, "
                f"got {_fmt_shape(shape)}"
            )
    for i, (got, bound) in enumerate(zip(shape[1:], spec.slot_shape, strict=True), start=1):
        if 0 <= bound < got and not spec.elastic:
            raise InvalidInput(
                f"input '{name}': dimension {i} is {got}, more than its bound {bound} "
                f"(max_shape {_fmt_shape(spec.max_shape or spec.shape)} in the model config), "
                f"in shape {_fmt_shape(shape)}"
            )
    if max_elements is not None:
        count = math.prod(shape)
        if count > max_elements:
            raise InvalidInput(
                f"input '{name}': shape {_fmt_shape(shape)} has {count} elements, more than a "
                f"request may carry ({max_elements}, the request body limit)"
            )
    return shape


def _as_numeric_array(name: str, spec: TensorSpec, data: Any) -> np.ndarray:
    """JSON elements (flat or nested lists) → array of spec's dtype, strictly typed."""
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise InvalidInput(
            f"input '{name}': data is not a rectangular array of {spec.datatype} elements "
            "(nested lists of unequal lengths?)"
        ) from None
    target = spec.dtype
    kind = raw.dtype.kind
    if raw.size == 0:
        return raw.astype(target)
    if kind not in "biuf":
        what = {"U": "strings", "S": "strings", "O": "non-numeric or mixed values"}.get(
            kind, f"values of type {raw.dtype}"
        )
        raise InvalidInput(f"input '{name}': expected {_element_text(spec)}, got {what}")
    if target.kind == "b":
        if kind != "b":
            raise InvalidInput(
                f"input '{name}': expected {_element_text(spec)} (true/false), got numbers"
            )
        return raw
    if kind == "b":
        raise InvalidInput(f"input '{name}': expected {_element_text(spec)}, got booleans")
    if target.kind in "iu":
        if kind == "f" and not np.all(np.isfinite(raw)):
            raise InvalidInput(
                f"input '{name}': expected {_element_text(spec)}, got NaN or Infinity "
                "(allowed only in floating-point tensors)"
            )
        if kind == "f" and not np.all(raw == np.floor(raw)):
            raise InvalidInput(
                f"input '{name}': expected {_element_text(spec)}, got non-integer values"
            )
        info = np.iinfo(target)
        lo, hi = raw.min(), raw.max()
        if lo < info.min or hi > info.max:
            raise InvalidInput(
                f"input '{name}': value out of range for {spec.datatype} "
                f"[{info.min}, {info.max}]: got values in [{lo}, {hi}]"
            )
        return raw.astype(target)
    with np.errstate(over="ignore", invalid="ignore"):
        out = raw.astype(target)
    if out.dtype != raw.dtype:  # narrowed: FP16/FP32 from JSON's float64 or integers
        _check_float_range(name, spec, raw, out)
    return out


def bytes_elements(values: Sequence[bytes | str], shape: Sequence[int]) -> np.ndarray:
    """An object array of BYTES elements, shaped `shape`: the one place the
    API builds an object array. Each element is a `bytes` (or `str`) object
    that the JSON or protobuf parser, or a length prefix's slice, made:
    tensor memory is never read as Python objects."""
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out.reshape(tuple(shape))


def _flatten_nested(name: str, data: Any) -> tuple[list[Any], tuple[int, ...]]:
    """JSON elements (flat or nested lists) → (elements in row-major order, shape)."""
    if not isinstance(data, list):
        return [data], ()
    if not data:
        return [], (0,)
    parts = [_flatten_nested(name, item) for item in data]
    shapes = {shape for _, shape in parts}
    if len(shapes) != 1:
        raise InvalidInput(
            f"input '{name}': data is not a rectangular array of BYTES elements "
            "(nested lists of unequal lengths?)"
        )
    return [v for values, _ in parts for v in values], (len(data), *shapes.pop())


def _as_bytes_array(name: str, spec: TensorSpec, data: Any) -> np.ndarray:
    """JSON strings (flat or nested lists) → object array of their UTF-8 bytes."""
    values, shape = _flatten_nested(name, data)
    encoded: list[bytes] = []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise InvalidInput(
                f"input '{name}': BYTES elements are strings in JSON, got "
                f"{type(value).__name__} {value!r:.40}"
            )
        try:
            encoded.append(value.encode())
        except UnicodeEncodeError:
            raise InvalidInput(f"input '{name}': element {i} is not valid Unicode text") from None
    out = bytes_elements(encoded, shape)
    check_bytes(name, spec, out)
    return out


def check_bytes(name: str, spec: TensorSpec, values: np.ndarray) -> None:
    """Each element of a BYTES tensor: at most `max_bytes`, UTF-8 text."""
    limit = None if spec.elastic else spec.max_bytes
    for i, value in enumerate(values.reshape(-1)):
        if limit is not None and len(value) > limit:
            raise InvalidInput(
                f"input '{name}': element {i} has {len(value)} bytes, more than the "
                f"tensor's max_bytes {limit}"
            )
        try:
            value.decode()
        except UnicodeDecodeError:
            raise InvalidInput(
                f"input '{name}': element {i} is not UTF-8 text (ONNX string tensors hold text)"
            ) from None


def _check_float_range(name: str, spec: TensorSpec, raw: np.ndarray, out: np.ndarray) -> None:
    """A finite value that became ±Inf in `out` was out of the datatype's
    range (NaN and ±Inf given as such are data, not errors)."""
    if np.isfinite(out).all():
        return
    overflow = np.isinf(out) & np.isfinite(raw)
    if overflow.any():
        got = raw[overflow].flat[0].item()
        hi = float(np.finfo(spec.dtype).max)
        raise InvalidInput(
            f"input '{name}': value out of range for {spec.datatype} "
            f"(finite values up to ±{hi!r}; NaN and Infinity are accepted as such): got {got!r}"
        )


def _element_text(spec: TensorSpec) -> str:
    kind = spec.dtype.kind
    noun = {"b": "booleans", "i": "integers", "u": "unsigned integers", "f": "numbers"}[kind]
    return f"{spec.datatype} {noun}"


def decode_json_tensor(
    name: str,
    spec: TensorSpec,
    data: list[Any],
    shape: Sequence[int] | None,
    max_batch: int = 1,
) -> np.ndarray:
    """A tensor from JSON elements.

    `shape` None (native nested lists): the shape is the nesting's, and the
    batch dimension may be omitted (then it is 1; at most `max_batch`).
    Otherwise (v2, or native {data, shape}) the elements are flat or nested,
    and their count must equal the shape's.
    """
    arr = (
        _as_bytes_array(name, spec, data) if is_bytes(spec) else _as_numeric_array(name, spec, data)
    )
    if shape is None:
        full = check_shape(name, spec, arr.shape, batch_optional=True, max_batch=max_batch)
        return arr.reshape(full)
    full = tuple(shape)
    count = math.prod(full)
    if arr.size != count:
        raise InvalidInput(
            f"input '{name}': shape {_fmt_shape(full)} needs {count} elements, got {arr.size}"
        )
    return arr.reshape(full)


def decode_binary_tensor(
    name: str, spec: TensorSpec, buf: memoryview, shape: tuple[int, ...]
) -> np.ndarray:
    """A tensor from its binary bytes (already checked: len(buf) == binary_data_size)."""
    if is_bytes(spec):
        return decode_binary_bytes(name, spec, buf, shape)
    count = math.prod(shape)
    want = count * spec.dtype.itemsize
    if len(buf) != want:
        raise InvalidInput(
            f"input '{name}': binary_data_size is {len(buf)} bytes but shape "
            f"{_fmt_shape(shape)} of {spec.datatype} needs {want} bytes"
        )
    arr = np.frombuffer(buf, dtype=spec.dtype.newbyteorder("<"), count=count)
    if spec.dtype.kind == "b" and count and int(arr.view(np.uint8).max()) > 1:
        raise InvalidInput(f"input '{name}': BOOL bytes must be 0 or 1")
    if arr.dtype != spec.dtype:  # big-endian host
        arr = arr.astype(spec.dtype)
    return arr.reshape(shape)


def decode_binary_bytes(
    name: str, spec: TensorSpec, buf: memoryview, shape: tuple[int, ...]
) -> np.ndarray:
    """A BYTES tensor from its binary form: per element a 4-byte little-endian
    length and that many bytes; exactly the shape's count of elements."""
    count = math.prod(shape)
    elements: list[bytes] = []
    offset, size = 0, len(buf)
    for i in range(count):
        if offset + 4 > size:
            raise InvalidInput(
                f"input '{name}': binary BYTES data ends after {i} of the {count} elements "
                f"of shape {_fmt_shape(shape)} (each: a 4-byte length, then its bytes)"
            )
        length = int.from_bytes(buf[offset : offset + 4], "little")
        offset += 4
        if offset + length > size:
            raise InvalidInput(
                f"input '{name}': binary BYTES element {i} says {length} bytes, "
                f"{size - offset} are left"
            )
        elements.append(bytes(buf[offset : offset + length]))
        offset += length
    if offset != size:
        raise InvalidInput(
            f"input '{name}': {size - offset} bytes after the {count} BYTES elements "
            f"of shape {_fmt_shape(shape)}"
        )
    out = bytes_elements(elements, shape)
    check_bytes(name, spec, out)
    return out


def batch_items(inputs: Mapping[str, np.ndarray]) -> int:
    """The request's items: the batch dimension every input shares (shapes
    already checked one by one); a 400 naming the inputs when they differ."""
    sizes = {name: int(arr.shape[0]) if arr.ndim else 1 for name, arr in inputs.items()}
    distinct = set(sizes.values())
    if len(distinct) > 1:
        listed = ", ".join(f"'{n}': {b}" for n, b in sizes.items())
        raise InvalidInput(f"the inputs disagree on the batch dimension ({listed}): give one n")
    return distinct.pop() if distinct else 1


def check_input_names(config: ModelConfig, names: Sequence[str]) -> None:
    """Every model input given exactly once, nothing else."""
    known = [s.name for s in config.inputs]
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise InvalidInput(f"input '{n}' is given more than once")
        seen.add(n)
        if n not in known:
            raise InvalidInput(
                f"unknown input '{n}': model '{config.model_name}' has inputs {', '.join(known)}"
            )
    missing = [n for n in known if n not in seen]
    if missing:
        raise InvalidInput(
            f"missing input {', '.join(repr(m) for m in missing)}: model '{config.model_name}' "
            f"needs inputs {', '.join(known)}"
        )


def check_output_names(config: ModelConfig, names: Sequence[str]) -> None:
    """Requested outputs: each one of the model's, at most once (HTTP's and gRPC's)."""
    known = [s.name for s in config.outputs]
    seen: set[str] = set()
    for n in names:
        if n not in known:
            raise InvalidInput(
                f"unknown output '{n}': model '{config.model_name}' has outputs {', '.join(known)}"
            )
        if n in seen:
            raise InvalidInput(f"output '{n}' is requested more than once")
        seen.add(n)


def check_datatype(name: str, spec: TensorSpec, datatype: str) -> None:
    if datatype != spec.datatype:
        extra = "" if datatype in DATATYPES else " (not a supported datatype)"
        raise InvalidInput(
            f"input '{name}': expected datatype {spec.datatype}, got {datatype!r}{extra}"
        )


def resolve_slo(config: ModelConfig, slo_ms: float | None) -> float | None:
    """A per-request SLO may tighten the model's; loosen it only if the config allows."""
    if slo_ms is None:
        return None
    if not math.isfinite(slo_ms) or slo_ms <= 0:
        raise InvalidInput(f"slo_ms must be a positive number of milliseconds, got {slo_ms}")
    if slo_ms > MAX_SLO_MS:
        raise InvalidInput(
            f"slo_ms {slo_ms:g} is too large: at most {MAX_SLO_MS:.0f} ms (1 hour) per request"
        )
    if slo_ms > config.slo_ms and not config.allow_slo_loosening:
        raise InvalidInput(
            f"slo_ms {slo_ms:g} is looser than model '{config.model_name}' SLO of "
            f"{config.slo_ms:g} ms, and its config does not allow loosening "
            "(allow_slo_loosening: false)"
        )
    return float(slo_ms)


def output_bytes(arr: np.ndarray) -> bytes:
    """Binary tensor data of an output: little-endian, row-major (BYTES:
    each element's 4-byte length, then its bytes)."""
    arr = np.asarray(arr)
    if arr.dtype == object:
        return b"".join(
            len(v).to_bytes(4, "little") + v for v in (_as_element(x) for x in arr.reshape(-1))
        )
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return np.ascontiguousarray(arr).tobytes()


def _as_element(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def json_data(name: str, arr: np.ndarray) -> Any:
    """An output's elements for a JSON answer, flat: the array (numbers), or
    strings (BYTES, which must be UTF-8 text: else ask for binary data)."""
    flat = np.ascontiguousarray(np.asarray(arr).reshape(-1))
    if flat.dtype != object:
        return flat
    try:
        return [_as_element(v).decode() for v in flat]
    except UnicodeDecodeError:
        raise InvalidInput(
            f"output '{name}' holds bytes that are not UTF-8 text: ask for it as binary data"
        ) from None


def spec_map(specs: Sequence[TensorSpec]) -> Mapping[str, TensorSpec]:
    return {s.name: s for s in specs}
