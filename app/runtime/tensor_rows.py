"""Rows of variable shape and BYTES elements in fixed-size shared-memory slots.

A slot holds a tensor's item at its bound (`TensorSpec.slot_shape`). A
request whose item is smaller fills the leading corner of it
(`region(shape)`: the first d entries along each dimension) and its actual
item shape is written beside the data, so it travels with the request to
the executor and back (app/runtime/arena.py).

A BYTES element is stored as `BYTES_HEADER` (4) bytes of little-endian
length followed by `max_bytes` bytes, the first `length` of them its value:
the same 4-byte length prefix as the KServe v2 binary form, padded to the
bound. Values are numpy object arrays of `bytes` outside shared memory (a
`str` is written as its UTF-8 bytes).

Batches of variable shape (`shape_groups`): the executor runs one model
call per group of rows whose inputs have one shape, except along the
dimensions a config pads (`TensorSpec.pad`), where a group's rows are
padded with 0 to the group's longest (`padded_shape`; `Arena.gather` with
a shape copies each row into a zero-filled batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from app.repository.config import BYTES_HEADER


def region(shape: Sequence[int]) -> tuple[slice, ...]:
    """The leading corner of a bounded item that an item of `shape` fills."""
    return tuple(slice(0, int(d)) for d in shape)


def bytes_of(value: object, what: str) -> bytes:
    """A BYTES element as bytes (a str as its UTF-8); ValueError naming
    `what` for anything else."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, np.bytes_):
        return bytes(value)
    if not isinstance(value, bytes):
        raise ValueError(f"{what}: a BYTES element is {type(value).__name__}, not bytes")
    return value


def as_bytes(values: np.ndarray, what: str) -> np.ndarray:
    """An object array of bytes (or str) with every element bytes."""
    values = np.asarray(values, dtype=object)
    out = np.empty(values.shape, dtype=object)
    flat = out.reshape(-1)
    for i, value in enumerate(values.reshape(-1)):
        flat[i] = bytes_of(value, what)
    return out


def pack_bytes(values: np.ndarray, max_bytes: int, what: str) -> np.ndarray:
    """An object array of bytes (or str) → uint8 (*shape, 4 + max_bytes):
    length prefix, then the value. ValueError naming `what` when an element
    is longer than `max_bytes` or not bytes/str."""
    values = np.asarray(values, dtype=object)
    out = np.zeros((*values.shape, BYTES_HEADER + max_bytes), dtype=np.uint8)
    flat = out.reshape(-1, BYTES_HEADER + max_bytes)
    for i, value in enumerate(values.reshape(-1)):
        value = bytes_of(value, what)
        n = len(value)
        if n > max_bytes:
            raise ValueError(
                f"{what}: a BYTES element of {n} bytes is longer than max_bytes {max_bytes}"
            )
        flat[i, :BYTES_HEADER] = np.frombuffer(n.to_bytes(BYTES_HEADER, "little"), np.uint8)
        flat[i, BYTES_HEADER : BYTES_HEADER + n] = np.frombuffer(value, np.uint8)
    return out


def unpack_bytes(packed: np.ndarray) -> np.ndarray:
    """`pack_bytes` undone: uint8 (*shape, 4 + max_bytes) → object array of bytes."""
    shape = packed.shape[:-1]
    width = packed.shape[-1]
    flat = np.ascontiguousarray(packed).reshape(-1, width)
    lengths = flat[:, :BYTES_HEADER].copy().view("<u4").reshape(-1)
    out = np.empty(len(flat), dtype=object)
    for i, n in enumerate(lengths):
        out[i] = flat[i, BYTES_HEADER : BYTES_HEADER + int(n)].tobytes()
    return out.reshape(shape)


def shape_groups(
    shapes: Mapping[str, Sequence[tuple[int, ...]]], padded: Mapping[str, tuple[bool, ...]]
) -> list[list[int]]:
    """Row positions grouped so that a group's rows have one shape for every
    input, apart from its `padded` dimensions; groups in the order of their
    first row, rows in batch order. `shapes[name][i]` is row i's item shape."""
    groups: dict[tuple[object, ...], list[int]] = {}
    rows = len(next(iter(shapes.values()))) if shapes else 0
    for i in range(rows):
        key = tuple(
            tuple(-1 if pad else d for d, pad in zip(row[i], padded[name], strict=True))
            for name, row in shapes.items()
        )
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def padded_shape(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The item shape a group's rows are padded to: the longest per dimension."""
    return tuple(max(dims) for dims in zip(*shapes, strict=True))
