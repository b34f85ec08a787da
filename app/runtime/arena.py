"""Shared-memory arenas: where request tensors live between HTTP and executor.

One `multiprocessing.shared_memory` segment per model, cut into `capacity`
slots of equal size. A slot holds one item's inputs (one row of the batch
dimension) followed by its outputs, each tensor at a fixed, 64-byte aligned offset
computed from the model's TensorSpecs::

    slot k: [in_0 | in_1 | ... | out_0 | out_1 | ...]   (slot_nbytes, aligned)
    segment: slot 0, slot 1, ..., slot capacity-1

Every tensor therefore has a strided view of shape (capacity, *slot_shape)
over the whole segment. The executor gathers a batch with one fancy-indexing
copy of that view (`view[slots]`) and scatters outputs with one assignment;
the parent writes a request's inputs with one copy and reads its outputs with
one copy. Tensor bytes never go through pickle.

A request of n items takes n slots (`acquire_rows`), any n free ones: the
executor's gather takes a list of slots anyway, so they need not be
consecutive and the arena never fragments. The memory stays what
`capacity` (ARENA_SLOTS) items need, whatever the mix of request sizes:
`capacity` bounds the items in flight per model, not the requests. Sizing
slots per request instead would reserve max_batch_size rows for every
request, most of them one item.

Variable dimensions and BYTES (app/runtime/tensor_rows.py): a slot holds
a tensor at its bound (`TensorSpec.slot_shape`; a BYTES element as its
4-byte length and `max_bytes` bytes, a trailing uint8 axis of the view);
a tensor with a variable dimension also has its item's actual shape in the
slot (int32 per dimension, beside the data): the parent writes an input's,
the executor reads it (`item_shapes`), and writes each output's
(`scatter(..., shapes)`), which the parent reads back to cut the answer.
A request's rows share one shape. An elastic tensor's item beyond its bound
is in a segment of its own that its slot names (app/runtime/spill.py).

Ownership: the parent creates the segment (`Arena.create`) and is the only
side that unlinks it (`close_and_unlink`, also run by a finalizer at exit and
when creation fails half-way). Executors `Arena.attach(layout)` with the small
plain-dict `layout` and only close their mapping. Attaching does not register
the segment with `multiprocessing.resource_tracker` (``track=False`` on 3.13+,
registration suppressed on older versions): spawned children share the
parent's tracker, so registering/unregistering there would either make the
tracker unlink a live segment or trip a KeyError when the parent unlinks.

Slot bookkeeping (`acquire`/`release`) is parent-side only and not
thread-safe: call it from the event loop thread.
"""

from __future__ import annotations

import os
import re
import secrets
import weakref
from collections.abc import Mapping
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from app.errors import InvalidInput, Overloaded
from app.repository.config import ModelConfig, TensorSpec
from app.runtime import spill
from app.runtime.shm import open_untracked, release_segment
from app.runtime.tensor_rows import as_bytes, pack_bytes, region, unpack_bytes

ALIGN = 64
# Prefix of every segment we create (tests and operators can find ours in /dev/shm).
SEGMENT_PREFIX = "dsrv_"


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _segment_name(model: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9]", "", model)[:16] or "m"
    return f"{SEGMENT_PREFIX}{os.getpid()}_{safe}_{secrets.token_hex(4)}"


def _check_spec(model: str, spec: TensorSpec) -> None:
    if any(d < 0 for d in spec.slot_shape):
        raise ValueError(
            f"model {model!r} tensor {spec.name!r}: shape {list(spec.shape)} has a variable "
            "dimension without a bound (max_shape)"
        )
    if spec.datatype == "BYTES" and not spec.max_bytes:
        raise ValueError(f"model {model!r} tensor {spec.name!r}: BYTES without max_bytes")


def compute_layout(config: ModelConfig, capacity: int, name: str) -> dict[str, Any]:
    """The plain-dict layout of an arena for `config` (no segment is created)."""
    if capacity < 1:
        raise ValueError(f"arena capacity must be ≥ 1, got {capacity}")
    offset = 0
    tensors: dict[str, dict[str, dict[str, Any]]] = {"inputs": {}, "outputs": {}}
    for role, specs in (("inputs", config.inputs), ("outputs", config.outputs)):
        for spec in specs:
            _check_spec(config.name, spec)
            is_bytes = spec.datatype == "BYTES"
            entry: dict[str, Any] = {
                "offset": offset,
                "dtype": np.dtype(np.uint8).str if is_bytes else spec.dtype.str,
                "shape": [*spec.slot_shape, *([spec.element_nbytes] if is_bytes else [])],
                "nbytes": spec.item_nbytes,
                "max_bytes": spec.max_bytes,
                "dims_offset": None,  # where the item's actual shape is, if variable
            }
            offset += _align(max(spec.item_nbytes, 1))
            if spec.variable:
                entry["dims_offset"] = offset
                offset += _align(4 * len(spec.item_shape))
            entry["spill_offset"] = None  # an elastic tensor's spill field
            if spec.elastic:
                entry["spill_offset"] = offset
                offset += _align(spill.NAME_BYTES)
            tensors[role][spec.name] = entry
    slot_nbytes = max(_align(offset), ALIGN)
    return {
        "name": name,
        "model": config.name,
        "capacity": capacity,
        "slot_nbytes": slot_nbytes,
        "size": slot_nbytes * capacity,
        "inputs": tensors["inputs"],
        "outputs": tensors["outputs"],
    }


def _beyond(array: np.ndarray, bound: tuple[int, ...], max_bytes: int | None) -> bool:
    """Whether rows `array` (batch dimension first) exceed a slot: a
    dimension beyond `bound`, or a BYTES element beyond `max_bytes`."""
    if any(d > b for d, b in zip(array.shape[1:], bound, strict=False)):
        return True
    if not max_bytes:
        return False
    return any(
        len(v.encode() if isinstance(v, str) else v) > max_bytes
        for v in array.reshape(-1)
        if isinstance(v, (bytes, str))
    )


class Arena:
    """A model's shared-memory slots (see the module docstring)."""

    def __init__(
        self, shm: shared_memory.SharedMemory, layout: dict[str, Any], owner: bool
    ) -> None:
        self._shm: shared_memory.SharedMemory | None = shm
        self.layout = layout
        self.owner = owner
        self.capacity: int = int(layout["capacity"])
        self.model: str = layout["model"]
        self._views: dict[str, dict[str, np.ndarray]] = {"inputs": {}, "outputs": {}}
        # Variable tensors: (capacity, ndim) int32 views of each item's shape.
        self._dims: dict[str, dict[str, np.ndarray]] = {"inputs": {}, "outputs": {}}
        self._max_bytes: dict[str, int] = {}  # BYTES tensors (names unique per role)
        # Elastic tensors' spill fields (app/runtime/spill.py).
        self.spills = spill.SpillFields(SEGMENT_PREFIX)
        stride = int(layout["slot_nbytes"])
        for role in ("inputs", "outputs"):
            for tname, t in layout[role].items():
                dtype = np.dtype(t["dtype"])
                shape = tuple(int(d) for d in t["shape"])
                item = np.ndarray(shape, dtype=dtype)  # only for its C strides
                self._views[role][tname] = np.ndarray(
                    (self.capacity, *shape),
                    dtype=dtype,
                    buffer=shm.buf,
                    offset=int(t["offset"]),
                    strides=(stride, *item.strides),
                )
                if t.get("max_bytes"):
                    self._max_bytes[f"{role}:{tname}"] = int(t["max_bytes"])
                if t.get("dims_offset") is not None:
                    ndim = len(shape) - (1 if t.get("max_bytes") else 0)
                    self._dims[role][tname] = np.ndarray(
                        (self.capacity, ndim),
                        dtype=np.int32,
                        buffer=shm.buf,
                        offset=int(t["dims_offset"]),
                        strides=(stride, 4),
                    )
                if t.get("spill_offset") is not None:
                    self.spills.fields[role][tname] = np.ndarray(
                        (self.capacity, spill.NAME_BYTES),
                        dtype=np.uint8,
                        buffer=shm.buf,
                        offset=int(t["spill_offset"]),
                        strides=(stride, 1),
                    )
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))
        self._in_use: set[int] = set()
        self._finalizer = weakref.finalize(self, release_segment, shm, owner)

    # ----------------------------------------------------------------- create
    @classmethod
    def create(cls, config: ModelConfig, capacity: int) -> Arena:
        """Create (parent side) a new segment for `config` with `capacity` slots."""
        name = _segment_name(config.name)
        layout = compute_layout(config, capacity, name)
        shm = shared_memory.SharedMemory(name=name, create=True, size=layout["size"])
        try:
            return cls(shm, layout, owner=True)
        except BaseException:
            release_segment(shm, unlink=True)
            raise

    @classmethod
    def attach(cls, layout: Mapping[str, Any]) -> Arena:
        """Attach (executor side) to an existing segment described by `layout`."""
        layout = dict(layout)
        shm = open_untracked(layout["name"])
        try:
            if shm.size < int(layout["size"]):
                raise ValueError(
                    f"segment {layout['name']!r} is {shm.size} bytes, layout needs {layout['size']}"
                )
            return cls(shm, layout, owner=False)
        except BaseException:
            release_segment(shm, unlink=False)
            raise

    @property
    def name(self) -> str:
        return self.layout["name"]

    @property
    def closed(self) -> bool:
        return self._shm is None

    # ------------------------------------------------------- slots (parent)
    def acquire(self) -> int | None:
        """A free slot, or None when all `capacity` slots are in use."""
        if not self._free:
            return None
        slot = self._free.pop()
        self._in_use.add(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot not in self._in_use:
            raise ValueError(f"arena {self.model!r}: slot {slot} is not in use")
        self._in_use.remove(slot)
        self._free.append(slot)

    def set_aside(self, slots: range) -> None:
        """Take free `slots` out of this side's bookkeeping for good: another
        process (an API worker) owns them and writes them."""
        aside = set(slots)
        self._free = [slot for slot in self._free if slot not in aside]

    def acquire_rows(self, n: int) -> list[int] | None:
        """`n` free slots for a request of `n` items (any n, not necessarily
        consecutive), or None when fewer than `n` are free."""
        if n < 1:
            raise ValueError(f"a request takes at least one slot, got {n}")
        if len(self._free) < n:
            return None
        taken = [self._free.pop() for _ in range(n)]
        self._in_use.update(taken)
        return taken

    def release_rows(self, slots: list[int]) -> None:
        self.spills.drop(slots)
        for slot in slots:
            self.release(slot)

    def _input_views(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The input views, once `inputs` names every input and nothing else."""
        views = self._views["inputs"]
        missing = [n for n in views if n not in inputs]
        if missing:
            raise InvalidInput(f"model {self.model!r}: missing input tensor(s) {missing}")
        extra = [n for n in inputs if n not in views]
        if extra:
            raise InvalidInput(
                f"model {self.model!r}: unexpected input tensor(s) {extra}; expected {list(views)}"
            )
        return views

    def write_rows(self, slots: list[int], inputs: Mapping[str, np.ndarray]) -> None:
        """Copy a request's inputs, shape (len(slots), *item_shape), row i
        into `slots[i]`; a variable dimension at most its bound, a BYTES
        tensor an object array of bytes of at most max_bytes each."""
        for slot in slots:
            self._check_slot(slot)
        views = self._input_views(inputs)
        rows = len(slots)
        for name, view in views.items():
            array = np.asarray(inputs[name])
            max_bytes = self._max_bytes.get(f"inputs:{name}")
            dims = self._dims["inputs"].get(name)
            bound = view.shape[1:-1] if max_bytes else view.shape[1:]
            want = np.dtype(object) if max_bytes else view.dtype
            if array.dtype != want:
                raise InvalidInput(
                    f"model {self.model!r} input {name!r}: dtype {array.dtype} "
                    f"but the model expects {want}"
                )
            item = array.shape[1:]
            if (
                array.ndim != 1 + len(bound)
                or array.shape[0] != rows
                or (dims is None and item != bound)
            ):
                raise InvalidInput(
                    f"model {self.model!r} input {name!r}: shape {list(array.shape)} "
                    f"but the model expects {[rows, *bound]}"
                    + (" (at most, per dimension)" if dims is not None else "")
                )
            elastic = self.spills.elastic("inputs", name)
            if elastic and _beyond(array, bound, max_bytes):
                if max_bytes:
                    try:
                        array = as_bytes(array, f"model {self.model!r} input {name!r}")
                    except ValueError as exc:
                        raise InvalidInput(str(exc)) from None
                try:
                    self.spills.write_inputs(name, slots, array)
                except OSError as exc:  # /dev/shm full: come back later
                    raise Overloaded(
                        f"model {self.model!r} input {name!r}: no shared memory for an item "
                        f"beyond its slot: {exc}"
                    ) from None
                if dims is not None:
                    for slot in slots:
                        dims[slot] = item
                continue
            if elastic:
                self.spills.clear("inputs", name, slots)
            over = [i for i, (d, b) in enumerate(zip(item, bound, strict=True)) if d > b]
            if over:
                i = over[0]
                raise InvalidInput(
                    f"model {self.model!r} input {name!r}: dimension {i + 1} is {item[i]}, "
                    f"more than its bound {bound[i]} (max_shape {[-1, *bound]})"
                )
            if max_bytes:
                try:
                    array = pack_bytes(array, max_bytes, f"model {self.model!r} input {name!r}")
                except ValueError as exc:
                    raise InvalidInput(str(exc)) from None
            if dims is not None:
                corner = region(item)
                for i, slot in enumerate(slots):
                    view[slot][corner] = array[i]
                    dims[slot] = item
            elif rows == 1:
                np.copyto(view[slots[0]], array[0])
            else:
                view[np.asarray(slots, dtype=np.intp)] = array

    def read_rows(self, slots: list[int]) -> dict[str, np.ndarray]:
        """A request's outputs, shape (len(slots), *item_shape) — a variable
        output at the shape its executor wrote, BYTES as object arrays of
        bytes: copies."""
        for slot in slots:
            self._check_slot(slot)
        index = np.asarray(slots, dtype=np.intp)
        out = {}
        for name, view in self._views["outputs"].items():
            dims = self._dims["outputs"].get(name)
            if self.spills.any_at("outputs", name, slots):
                out[name] = np.stack([self._output_row(name, slot) for slot in slots])
                continue
            if dims is not None:
                corner = region(dims[slots[0]])  # a request's rows share one shape
                data = np.stack([view[slot][corner] for slot in slots])
            elif len(slots) == 1:
                data = view[slots[0] : slots[0] + 1].copy()
            else:
                data = view[index]
            out[name] = unpack_bytes(data) if f"outputs:{name}" in self._max_bytes else data
        return out

    def _output_row(self, name: str, slot: int) -> np.ndarray:
        """One slot's item of output `name`: from its segment (then unlinked),
        or from the slot."""
        if self.spills.at("outputs", name, slot) is not None:
            return self.spills.take("outputs", name, slot)
        return self._slot_item("outputs", name, slot)

    def _slot_item(self, role: str, name: str, slot: int) -> np.ndarray:
        """One slot's item of a tensor as its writer wrote it (a variable one
        cut to its shape, BYTES unpacked): a copy."""
        data = self._views[role][name][slot]
        dims = self._dims[role].get(name)
        if dims is not None:
            data = data[region(dims[slot])]
        data = np.array(data)
        return unpack_bytes(data) if f"{role}:{name}" in self._max_bytes else data

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return len(self._in_use)

    # ------------------------------------------------------- tensors (parent)
    def write_inputs(self, slot: int, inputs: Mapping[str, np.ndarray]) -> None:
        """Copy one request's inputs into `slot` (one copy per tensor), for
        fixed-shape numeric tensors (`write_rows` takes every kind).

        Each array must have the spec's dtype and shape `item_shape` or
        `(1, *item_shape)`; every input must be present and nothing else.
        """
        self._check_slot(slot)
        views = self._input_views(inputs)
        for name, view in views.items():
            array = np.asarray(inputs[name])
            item_shape = view.shape[1:]
            if array.dtype != view.dtype:
                raise InvalidInput(
                    f"model {self.model!r} input {name!r}: dtype {array.dtype} "
                    f"but the model expects {view.dtype}"
                )
            if array.shape == (1, *item_shape):
                array = array[0]
            elif array.shape != item_shape:
                raise InvalidInput(
                    f"model {self.model!r} input {name!r}: shape {list(array.shape)} "
                    f"but the model expects {[1, *item_shape]} (or {list(item_shape)})"
                )
            np.copyto(view[slot], array)

    def read_outputs(self, slot: int, copy: bool = True) -> dict[str, np.ndarray]:
        """One request's outputs, each with batch dimension 1.

        With ``copy=False`` the arrays of fixed-shape numeric outputs are
        views into shared memory: use them before `release(slot)`.
        """
        if copy or self._dims["outputs"] or self._max_bytes:
            return self.read_rows([slot])
        self._check_slot(slot)
        return {name: view[slot : slot + 1] for name, view in self._views["outputs"].items()}

    def input_view(self, name: str, slot: int) -> np.ndarray:
        """Writable view of one input tensor in `slot` (item_shape, no batch dim),
        for callers that decode straight into shared memory."""
        self._check_slot(slot)
        return self._views["inputs"][name][slot]

    # ----------------------------------------------------- batches (executor)
    def item_shapes(self, input_name: str, slots: list[int]) -> list[tuple[int, ...]]:
        """Each slot's item shape of one input (as its request wrote it)."""
        dims = self._dims["inputs"].get(input_name)
        if dims is None:
            view = self._views["inputs"][input_name]
            bound = (
                view.shape[1:-1] if f"inputs:{input_name}" in self._max_bytes else view.shape[1:]
            )
            return [tuple(bound)] * len(slots)
        return [tuple(int(d) for d in dims[slot]) for slot in slots]

    def gather(
        self, input_name: str, slots: list[int], shape: tuple[int, ...] | None = None
    ) -> np.ndarray:
        """The batch (len(slots), *item_shape) of one input: one copy. With
        `shape` (a variable input): each row's own corner, the rest 0 (a
        BYTES element: empty), for rows of that shape or padded to it."""
        view = self._views["inputs"][input_name]
        if self.spills.any_at("inputs", input_name, slots):
            return self._gather_spilled(input_name, slots, shape)
        index = np.asarray(slots, dtype=np.intp)
        if shape is None:
            data = np.ascontiguousarray(view[index])
        else:
            dims = self._dims["inputs"][input_name]
            data = np.zeros((len(slots), *shape, *view.shape[1 + len(shape) :]), view.dtype)
            for i, slot in enumerate(slots):
                corner = region(dims[slot])
                data[i][corner] = view[slot][corner]
        return unpack_bytes(data) if f"inputs:{input_name}" in self._max_bytes else data

    def _gather_spilled(
        self,
        input_name: str,
        slots: list[int],
        shape: tuple[int, ...] | None,
    ) -> np.ndarray:
        """`gather` for a batch with spilled items: row by row."""
        rows = []
        for slot in slots:
            segment = self.spills.at("inputs", input_name, slot)
            if segment is None:
                rows.append(self._slot_item("inputs", input_name, slot))
            else:
                rows.append(spill.read_item(segment))
        if shape is None:
            return np.stack(rows)
        is_bytes = f"inputs:{input_name}" in self._max_bytes
        dtype = np.dtype(object) if is_bytes else self._views["inputs"][input_name].dtype
        data = np.zeros((len(slots), *shape), dtype)
        if is_bytes:
            data.fill(b"")
        for i, row in enumerate(rows):
            data[i][region(row.shape)] = row
        return data

    def scatter(
        self,
        output_name: str,
        slots: list[int],
        batch_output: np.ndarray,
        shapes: list[tuple[int, ...]] | None = None,
    ) -> None:
        """Write row i of `batch_output` into slot `slots[i]`: one copy. A
        variable output's row i is cut to `shapes[i]` (None: the batch's
        item shape), which must be within the bound, and that shape is
        written beside it."""
        view = self._views["outputs"][output_name]
        max_bytes = self._max_bytes.get(f"outputs:{output_name}")
        dims = self._dims["outputs"].get(output_name)
        bound = view.shape[1:-1] if max_bytes else view.shape[1:]
        batch_output = np.asarray(batch_output)
        what = f"model {self.model!r} output {output_name!r}"
        if dims is None:
            expected = (len(slots), *bound)
            if batch_output.shape != expected:
                raise ValueError(
                    f"{what}: backend returned shape {list(batch_output.shape)}, "
                    f"expected {list(expected)}"
                )
        elif batch_output.ndim != 1 + len(bound) or len(batch_output) != len(slots):
            raise ValueError(
                f"{what}: backend returned shape {list(batch_output.shape)}, expected "
                f"{[len(slots), *bound]} at most"
            )
        if not max_bytes and (
            batch_output.dtype != view.dtype
            and not np.can_cast(batch_output.dtype, view.dtype, casting="same_kind")
        ):
            raise ValueError(
                f"{what}: backend returned dtype {batch_output.dtype}, expected {view.dtype}"
            )
        if self.spills.elastic("outputs", output_name):
            rows = shapes or [tuple(batch_output.shape[1 : 1 + len(bound)])] * len(slots)
            self._scatter_elastic(output_name, slots, batch_output, rows)
            return
        if max_bytes:
            batch_output = pack_bytes(batch_output, max_bytes, what)
        if dims is None:
            view[np.asarray(slots, dtype=np.intp)] = batch_output
            return
        rows = shapes or [tuple(batch_output.shape[1 : 1 + len(bound)])] * len(slots)
        for i, slot in enumerate(slots):
            item = rows[i]
            if any(d > b for d, b in zip(item, bound, strict=True)):
                raise ValueError(f"{what}: shape {list(item)} exceeds its bound {list(bound)}")
            corner = region(item)
            view[slot][corner] = batch_output[i][corner]
            dims[slot] = item

    def _scatter_elastic(
        self,
        output_name: str,
        slots: list[int],
        batch_output: np.ndarray,
        rows: list[tuple[int, ...]],
    ) -> None:
        """`scatter` for an elastic output: a row within the bound into its
        slot, a longer one into a segment of its own (app/runtime/spill.py)."""
        view = self._views["outputs"][output_name]
        max_bytes = self._max_bytes.get(f"outputs:{output_name}")
        dims = self._dims["outputs"].get(output_name)
        bound = view.shape[1:-1] if max_bytes else view.shape[1:]
        what = f"model {self.model!r} output {output_name!r}"
        for i, slot in enumerate(slots):
            item = rows[i]
            row = np.asarray(batch_output[i][region(item)])
            if _beyond(row[np.newaxis], bound, max_bytes):
                spilled = as_bytes(row, what) if max_bytes else row
                self.spills.write_output(output_name, slot, spilled)
            else:
                self.spills.clear("outputs", output_name, [slot])
                if max_bytes:
                    row = pack_bytes(row, max_bytes, what)
                view[slot][region(item)] = row
            if dims is not None:
                dims[slot] = item

    def slot_bytes(self) -> np.ndarray:
        """The segment as a (capacity, slot_nbytes) uint8 view, row k = slot k,
        its inputs first, then its outputs (`layout`'s offsets): whole slots
        copied to an executor on another machine (app/runtime/ray_pool.py)."""
        if self._shm is None:
            raise ValueError(f"arena {self.model!r} is closed")
        stride = int(self.layout["slot_nbytes"])
        return np.ndarray((self.capacity, stride), dtype=np.uint8, buffer=self._shm.buf)

    @property
    def input_names(self) -> list[str]:
        return list(self._views["inputs"])

    @property
    def output_names(self) -> list[str]:
        return list(self._views["outputs"])

    # ------------------------------------------------------------- teardown
    def close(self) -> None:
        """Unmap (both sides); the owner also unlinks — prefer close_and_unlink."""
        if self._shm is None:
            return
        if self.owner and self.spills:
            self.spills.drop(range(self.capacity))
        self._views = {"inputs": {}, "outputs": {}}
        self.spills.fields = {"inputs": {}, "outputs": {}}
        self._shm = None
        self._finalizer()  # runs release_segment once

    def close_and_unlink(self) -> None:
        """Parent side: unmap and remove the segment name from /dev/shm."""
        if not self.owner:
            raise RuntimeError("only the arena's creator unlinks it")
        self.close()

    def _check_slot(self, slot: int) -> None:
        if self._shm is None:
            raise RuntimeError(f"arena {self.model!r} is closed")
        if not 0 <= slot < self.capacity:
            raise IndexError(f"arena {self.model!r}: slot {slot} out of range")

    def __repr__(self) -> str:
        return (
            f"Arena(model={self.model!r}, name={self.name!r}, capacity={self.capacity}, "
            f"used={self.used_slots})"
        )
