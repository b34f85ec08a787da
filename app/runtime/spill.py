"""Items beyond their slot's bound, each in a shared-memory segment of its own.

A model's arena (app/runtime/arena.py) holds every tensor at its bound. An
`elastic` tensor's bound (app/repository/config.py: one the server chose
for a Triton config that declares none) sizes the slot only: an item
longer than it — a dimension beyond `max_shape`, a BYTES element beyond
`max_bytes` — is written to a segment of its own, and the slot's spill
field, `NAME_BYTES` beside the tensor's data, names that segment (all zero:
the item is in the slot). A variable item's shape is in the slot as
always, so batches are grouped by shape without opening a segment.

A segment holds an 8-byte little-endian header length, the header (the
array's dtype and shape, pickled) and the array's bytes as they are — an
object array of BYTES elements pickled instead. Writing and reading cost
one copy each, as a slot's do, plus making the segment (its pages are new)
and unlinking it: paid only by the items that need it.

Who unlinks a segment:
- an input's: the side that wrote it and frees the slot (the service, or an
  API worker), which created it registered with its resource tracker, as
  its arena is — a crash of that process still removes it;
- an output's: the executor creates it unregistered (app/runtime/shm.py)
  and closes its mapping; the side that reads the answer unlinks it after
  reading, or when it frees the slot unread.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
from collections.abc import Iterable, Mapping
from multiprocessing import shared_memory

import numpy as np

from app.runtime.shm import open_untracked, unlink_untracked

NAME_BYTES = 32  # a spill field: a segment name, NUL-padded
_LENGTH = 8


def segment_name(prefix: str) -> str:
    """A new segment's name: the arenas' prefix, this process, random."""
    return f"{prefix}{os.getpid()}_s{secrets.token_hex(6)}"


def write_item(item: np.ndarray, prefix: str, tracked: bool) -> shared_memory.SharedMemory:
    """A new segment holding `item` (open: the caller closes it, and its
    creator, when `tracked`, unlinks it)."""
    item = np.ascontiguousarray(item)
    if item.dtype.hasobject:  # BYTES: its elements pickled
        header, body = pickle.dumps(("pickle", None, None)), pickle.dumps(item, protocol=5)
        size = _LENGTH + len(header) + len(body)
    else:  # numbers: the array's bytes as they are, one copy
        header, body = pickle.dumps(("raw", item.dtype.str, item.shape)), None
        size = _LENGTH + len(header) + item.nbytes
    name = segment_name(prefix)
    if tracked:
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
    else:
        shm = open_untracked(name, create=True, size=size)
    start = _LENGTH + len(header)
    shm.buf[:_LENGTH] = len(header).to_bytes(_LENGTH, "little")
    shm.buf[_LENGTH:start] = header
    if body is not None:
        shm.buf[start:size] = body
    elif item.nbytes:
        target = np.ndarray(item.shape, item.dtype, buffer=shm.buf, offset=start)
        np.copyto(target, item)
        del target  # no view may outlive the mapping
    return shm


def read_item(name: str) -> np.ndarray:
    """The item in segment `name` (a copy: the mapping is closed on return)."""
    shm = open_untracked(name)
    try:
        length = int.from_bytes(shm.buf[:_LENGTH], "little")
        start = _LENGTH + length
        kind, dtype, shape = pickle.loads(shm.buf[_LENGTH:start])
        if kind == "pickle":
            return pickle.loads(shm.buf[start:])
        view = np.ndarray(tuple(shape), np.dtype(dtype), buffer=shm.buf, offset=start)
        item = view.copy()
        del view
        return item
    finally:
        shm.close()


def field_name(field: np.ndarray) -> str | None:
    """The segment a spill field names, or None (the item is in the slot)."""
    raw = field.tobytes().rstrip(b"\0")
    return raw.decode() if raw else None


def set_field(field: np.ndarray, name: str | None) -> None:
    """Write `name` (None: clear) into a spill field."""
    field[:] = 0
    if name:
        encoded = name.encode()
        if len(encoded) > NAME_BYTES:
            raise ValueError(f"segment name {name!r} is longer than {NAME_BYTES} bytes")
        field[: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)


def unlink(name: str) -> None:
    """Remove an output's segment (one an executor created unregistered)."""
    unlink_untracked(name)


class SpillFields:
    """An arena's spill fields — per role ("inputs", "outputs"), per elastic
    tensor, a (capacity, NAME_BYTES) view into its segment — and the input
    segments this side made, per slot, until the slot is freed."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.fields: dict[str, dict[str, np.ndarray]] = {"inputs": {}, "outputs": {}}
        self._made: dict[int, list[shared_memory.SharedMemory]] = {}

    def __bool__(self) -> bool:
        return any(self.fields.values())

    def elastic(self, role: str, tensor: str) -> bool:
        return tensor in self.fields[role]

    def any_at(self, role: str, tensor: str, slots: list[int]) -> bool:
        """Whether an item of `tensor` in `slots` is spilled."""
        field = self.fields[role].get(tensor)
        return field is not None and any(field_name(field[slot]) for slot in slots)

    def at(self, role: str, tensor: str, slot: int) -> str | None:
        return field_name(self.fields[role][tensor][slot])

    def clear(self, role: str, tensor: str, slots: list[int]) -> None:
        for slot in slots:
            set_field(self.fields[role][tensor][slot], None)

    def write_inputs(self, tensor: str, slots: list[int], array: np.ndarray) -> None:
        """Row i of a request's input into a segment of its own, named in
        `slots[i]`'s field; registered, unlinked when the slot is freed."""
        field = self.fields["inputs"][tensor]
        for i, slot in enumerate(slots):
            self._made.setdefault(slot, []).append(self._spill(field[slot], array[i], True))

    def write_output(self, tensor: str, slot: int, row: np.ndarray) -> None:
        """An executor's answer row into a segment of its own (unregistered:
        the reader unlinks it)."""
        self._spill(self.fields["outputs"][tensor][slot], row, tracked=False)

    def _spill(
        self, field: np.ndarray, item: np.ndarray, tracked: bool
    ) -> shared_memory.SharedMemory:
        """`item` into a new segment that `field` names; the segment, closed."""
        shm = write_item(item, self.prefix, tracked)
        with contextlib.suppress(BufferError):
            shm.close()
        set_field(field, shm.name)
        return shm

    def take(self, role: str, tensor: str, slot: int) -> np.ndarray:
        """The spilled item (it must be), its segment unlinked, its field cleared."""
        field = self.fields[role][tensor][slot]
        segment = field_name(field)
        assert segment is not None
        item = read_item(segment)
        unlink(segment)
        set_field(field, None)
        return item

    def drop(self, slots: Iterable[int]) -> None:
        """Unlink what `slots` still spill — the inputs this side wrote, the
        outputs an executor wrote and nobody read — and clear their fields."""
        for slot in slots:
            for shm in self._made.pop(slot, ()):
                with contextlib.suppress(FileNotFoundError):
                    shm.unlink()
            for field in self.fields["inputs"].values():
                set_field(field[slot], None)
            for field in self.fields["outputs"].values():
                name = field_name(field[slot])
                if name is not None:
                    unlink(name)
                    set_field(field[slot], None)

    def items(
        self, role: str, slots: list[int], take: bool = False
    ) -> dict[int, dict[str, np.ndarray]]:
        """The spilled items of `slots` (position in `slots` → tensor → item,
        copies), for a node that cannot open this one's segments; `take`:
        unlink them too and clear their fields (an executor's outputs)."""
        found: dict[int, dict[str, np.ndarray]] = {}
        for tensor, field in self.fields[role].items():
            for i, slot in enumerate(slots):
                segment = field_name(field[slot])
                if segment is not None:
                    item = self.take(role, tensor, slot) if take else read_item(segment)
                    found.setdefault(i, {})[tensor] = item
        return found

    def place(
        self, role: str, slots: list[int], items: Mapping[int, Mapping[str, np.ndarray]]
    ) -> list[str]:
        """`items` from another node into segments of this one, named in
        `slots`' fields (unregistered: the caller unlinks inputs' after the
        batch; outputs' are unlinked by whoever reads them); every other
        field of `slots` in `role` cleared. The names made."""
        made = []
        for tensor, field in self.fields[role].items():
            for i, slot in enumerate(slots):
                item = items.get(i, {}).get(tensor)
                if item is None:
                    set_field(field[slot], None)
                    continue
                made.append(self._spill(field[slot], item, tracked=False).name)
        return made

    def spilled(self, slots: list[int]) -> list[str]:
        """The tensors of `slots` whose item is in a segment of its own."""
        return [
            f"{role[:-1]} {tensor!r}"
            for role, fields in self.fields.items()
            for tensor in fields
            if self.any_at(role, tensor, slots)
        ]
