"""A model config's `inputs` and `outputs`: each tensor's keys, checked.

    name:      string, unique among the inputs (outputs)        (required)
    datatype:  a KServe v2 name: FP32, INT64, ..., BYTES       (required)
    shape:     dimensions, the batch dimension -1 first or left out;
               -1 elsewhere: a variable dimension              (required)
    max_shape: the bound of each variable dimension, written like `shape`
               (-1 at the batch dimension, the fixed size where `shape`
               has one): shared memory holds every request at it
                                                   (required with a variable dimension)
    pad:       inputs: per dimension, like `shape`, true where requests of
               different lengths may share a batch: the shorter are padded
               with 0 to the batch's longest (as Triton's ragged batching
               lets a model take them). A padded dimension is variable.
               Without it a batch holds requests of one shape.     [all false]
    follows:   outputs: per dimension, like `shape`, null or "INPUT:DIM":
               this dimension has the length that dimension DIM (counted
               with the batch dimension as 0) of input INPUT has in each
               request; a padded batch's answer is cut back to it. An output
               dimension that follows nothing is answered as the model
               computed it (a padded length stays padded).          [all null]
    max_bytes: BYTES tensors: the longest element, in bytes (> 0)  (BYTES: required)
    elastic:   true: max_shape and max_bytes size shared memory only; a
               request beyond them is taken all the same, its item in a
               shared-memory segment of its own (a copy more), as Triton
               takes any length. A Triton config's tensor without declared
               bounds is elastic.                                    [false]

Every error names the file and the field, and a missing bound says what
to add.
"""

from __future__ import annotations

from typing import Any

from app.config_fields import FieldReader
from app.repository.config import DATATYPES, TensorSpec

TENSOR_KEYS = frozenset(
    {"name", "datatype", "shape", "max_shape", "pad", "follows", "max_bytes", "elastic"}
)
# Backends that serve variable dimensions and BYTES tensors.
VARIABLE_BACKENDS = ("onnx",)


def parse_tensors(ctx: FieldReader, raw: Any, where: str) -> tuple[TensorSpec, ...]:
    """The tensors of `where` ("inputs" or "outputs"); the outputs' `follows`
    are checked against the inputs by `check_follows`."""
    if not isinstance(raw, list) or not raw:
        ctx.fail(where, "must be a non-empty list of {name, datatype, shape}")
    specs: list[TensorSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        ctx.keys(entry, w, TENSOR_KEYS, required=("name", "datatype", "shape"))
        name = entry["name"]
        if not isinstance(name, str) or not name:
            ctx.fail(f"{w}.name", f"must be a non-empty string, got {name!r}")
        if name in seen:
            ctx.fail(f"{w}.name", f"duplicate tensor name {name!r}")
        seen.add(name)
        w = f"{where}[{i}] ({name})"
        datatype = entry["datatype"]
        if not isinstance(datatype, str) or datatype.upper() not in DATATYPES:
            ctx.fail(
                f"{w}.datatype",
                f"unknown datatype {datatype!r}; expected one of {list(DATATYPES)}",
            )
        datatype = datatype.upper()
        shape = parse_shape(ctx, entry["shape"], w)
        max_shape = _parse_max_shape(ctx, entry.get("max_shape"), shape, w)
        pad: tuple[bool, ...] = ()
        follows: tuple[tuple[str, int] | None, ...] = ()
        if entry.get("pad") is not None:
            if where != "inputs":
                ctx.fail(f"{w}.pad", "only inputs are padded; an output dimension `follows` one")
            pad = _parse_pad(ctx, entry["pad"], shape, w)
        if entry.get("follows") is not None:
            if where != "outputs":
                ctx.fail(f"{w}.follows", "only outputs follow an input's dimension")
            follows = _parse_follows(ctx, entry["follows"], shape, w)
        max_bytes = _parse_max_bytes(ctx, entry.get("max_bytes"), datatype, w)
        elastic = _parse_elastic(ctx, entry.get("elastic"), datatype, shape, w)
        specs.append(
            TensorSpec(name, datatype, shape, max_shape, pad, follows, max_bytes, elastic)
        )
    return tuple(specs)


def parse_shape(ctx: FieldReader, raw: Any, where: str) -> tuple[int, ...]:
    """`shape`, with the batch dimension -1 first (added when left out)."""
    if not isinstance(raw, list):
        ctx.fail(f"{where}.shape", f"must be a list of dimensions like [-1, 4096], got {raw!r}")
    dims = list(raw)
    if dims and dims[0] == -1:
        dims = dims[1:]
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or (d < 1 and d != -1):
            ctx.fail(
                f"{where}.shape",
                f"dimension {d!r} in {raw} must be a positive integer or -1 (variable, "
                "bounded by max_shape)",
            )
    return (-1, *dims)


def _aligned(ctx: FieldReader, raw: Any, shape: tuple[int, ...], field: str) -> list[Any]:
    """A per-dimension list written like `shape` (batch dimension optional),
    returned with the batch dimension's entry first (None when left out)."""
    if not isinstance(raw, list):
        ctx.fail(field, f"must be a list with one entry per dimension of {list(shape)}")
    if len(raw) == len(shape):
        return list(raw)
    if len(raw) == len(shape) - 1:
        return [None, *raw]
    ctx.fail(
        field,
        f"has {len(raw)} entries; the shape {list(shape)} has {len(shape)} dimensions "
        f"({len(shape) - 1} without the batch dimension)",
    )


def _parse_max_shape(
    ctx: FieldReader, raw: Any, shape: tuple[int, ...], where: str
) -> tuple[int, ...] | None:
    field = f"{where}.max_shape"
    variable = [i for i, d in enumerate(shape) if i and d < 0]
    if raw is None:
        if variable:
            example = [-1, *(128 if d < 0 else d for d in shape[1:])]
            ctx.fail(
                field,
                f"shape {list(shape)} has variable dimension(s) {variable}: add max_shape, "
                f"their bounds (e.g. max_shape: {example}), which shared memory is sized for",
            )
        return None
    dims = _aligned(ctx, raw, shape, field)
    bounded: list[int] = [-1]
    for i, (d, bound) in enumerate(zip(shape[1:], dims[1:], strict=True), start=1):
        if isinstance(bound, bool) or not isinstance(bound, int):
            ctx.fail(field, f"dimension {i}: {bound!r} is not an integer")
        if d < 0:
            if bound < 1:
                ctx.fail(field, f"dimension {i} is variable: its bound must be ≥ 1, got {bound}")
        elif bound not in (d, -1):
            ctx.fail(field, f"dimension {i} is fixed at {d} in shape, max_shape says {bound}")
        bounded.append(bound if d < 0 else d)
    if dims[0] not in (None, -1):
        ctx.fail(field, f"max_batch_size bounds the batch dimension: write -1, not {dims[0]}")
    if not variable:
        ctx.fail(field, f"shape {list(shape)} has no variable dimension to bound; remove it")
    return tuple(bounded)


def _parse_pad(ctx: FieldReader, raw: Any, shape: tuple[int, ...], where: str) -> tuple[bool, ...]:
    field = f"{where}.pad"
    flags = _aligned(ctx, raw, shape, field)
    if flags[0] is None:
        flags[0] = False
    for i, flag in enumerate(flags):
        if not isinstance(flag, bool):
            ctx.fail(field, f"dimension {i}: must be true or false, got {flag!r}")
    if flags[0]:
        ctx.fail(field, "the batch dimension is not padded (requests are concatenated along it)")
    fixed = [i for i, flag in enumerate(flags) if flag and shape[i] >= 0]
    if fixed:
        ctx.fail(field, f"dimension(s) {fixed} are fixed in shape {list(shape)}: only -1 pads")
    return tuple(flags) if any(flags) else ()


def _parse_follows(
    ctx: FieldReader, raw: Any, shape: tuple[int, ...], where: str
) -> tuple[tuple[str, int] | None, ...]:
    field = f"{where}.follows"
    entries = _aligned(ctx, raw, shape, field)
    out: list[tuple[str, int] | None] = []
    for i, entry in enumerate(entries):
        if entry is None:
            out.append(None)
            continue
        text = str(entry)
        input_name, sep, dim = text.rpartition(":")
        if not sep or not input_name or not dim.isdigit() or int(dim) < 1:
            ctx.fail(field, f"dimension {i}: {entry!r} is not INPUT:DIM (e.g. tokens:1)")
        if i == 0 or shape[i] >= 0:
            ctx.fail(field, f"dimension {i} is not variable in shape {list(shape)}")
        out.append((input_name, int(dim)))
    return tuple(out) if any(out) else ()


def check_follows(
    ctx: FieldReader, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
) -> None:
    """Each `follows` names an input's padded dimension."""
    by_name = {spec.name: spec for spec in inputs}
    for index, spec in enumerate(outputs):
        for i, ref in enumerate(spec.follows):
            if ref is None:
                continue
            field = f"outputs[{index}] ({spec.name}).follows"
            name, dim = ref
            source = by_name.get(name)
            if source is None:
                ctx.fail(field, f"dimension {i}: no input {name!r} (inputs: {sorted(by_name)})")
            if dim >= len(source.shape) or not source.pad or not source.pad[dim]:
                ctx.fail(
                    field,
                    f"dimension {i}: input {name!r} has no padded dimension {dim} "
                    f"(its pad: {list(source.pad) or 'none'}); an output follows a padded one",
                )


def check_backend(ctx: FieldReader, backend: str, specs: tuple[TensorSpec, ...]) -> None:
    """Variable dimensions and BYTES tensors are served by VARIABLE_BACKENDS."""
    if backend in VARIABLE_BACKENDS:
        return
    for spec in specs:
        if spec.variable or spec.datatype == "BYTES":
            what = "BYTES" if spec.datatype == "BYTES" else f"variable shape {list(spec.shape)}"
            ctx.fail(
                f"{spec.name}",
                f"{what}: served by the {', '.join(VARIABLE_BACKENDS)} backend only, not {backend}",
            )


def _parse_elastic(
    ctx: FieldReader, raw: Any, datatype: str, shape: tuple[int, ...], where: str
) -> bool:
    field = f"{where}.elastic"
    if raw is None:
        return False
    if not isinstance(raw, bool):
        ctx.fail(field, f"must be true or false, got {raw!r}")
    if raw and datatype != "BYTES" and not any(d < 0 for d in shape[1:]):
        ctx.fail(
            field,
            f"only a tensor with a variable dimension or BYTES has bounds to exceed; "
            f"this one is {datatype} {list(shape)}",
        )
    return raw


def _parse_max_bytes(ctx: FieldReader, raw: Any, datatype: str, where: str) -> int | None:
    field = f"{where}.max_bytes"
    if datatype != "BYTES":
        if raw is not None:
            ctx.fail(field, f"only BYTES tensors have max_bytes, this one is {datatype}")
        return None
    if raw is None:
        ctx.fail(
            field,
            "a BYTES tensor needs max_bytes, its longest element in bytes "
            "(e.g. max_bytes: 256), which shared memory is sized for",
        )
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        ctx.fail(field, f"must be an integer ≥ 1, got {raw!r}")
    return int(raw)
