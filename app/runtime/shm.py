"""POSIX shared-memory segments opened without the resource tracker.

`multiprocessing.shared_memory` registers every segment it opens or creates
with the process's resource tracker, which unlinks it when that process
exits. An executor attaching a model's arena, or creating a segment that
the serving side reads and unlinks later (app/runtime/spill.py), must not
register it: spawned executors share the parent's tracker (registering
there would unlink a live segment, or trip a KeyError when the parent
unlinks), and a Ray actor's tracker would unlink a segment it handed over.
"""

from __future__ import annotations

import contextlib
import sys
from multiprocessing import resource_tracker, shared_memory


def open_untracked(name: str, create: bool = False, size: int = 0) -> shared_memory.SharedMemory:
    """Attach segment `name`, or create it with `size` bytes, unregistered."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(  # type: ignore[call-arg]
            name=name, create=create, size=size, track=False
        )
    # 3.10–3.12 always register: suppress that for the duration of the call
    # (executors attach and create from one thread at a time).
    original = resource_tracker.register

    def _register(res_name: str, rtype: str) -> None:
        if rtype != "shared_memory":
            original(res_name, rtype)

    resource_tracker.register = _register  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name, create=create, size=size)
    finally:
        resource_tracker.register = original  # type: ignore[assignment]


def unlink_untracked(name: str) -> None:
    """Remove segment `name` (one nobody registered) from /dev/shm; gone already is fine."""
    import _posixshmem  # type: ignore[import-not-found]  # what SharedMemory.unlink calls

    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)


def release_segment(shm: shared_memory.SharedMemory, unlink: bool) -> None:
    """Close the mapping (tolerating live numpy views) and unlink if owner."""
    # BufferError: someone still holds a view into the buffer; the mapping
    # goes away with the process. Unlinking below still removes the name.
    with contextlib.suppress(BufferError):
        shm.close()
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
