"""Keep the cyclic garbage collector off the event loop's critical path.

Everything the server builds at start-up (modules, FastAPI's routes and
schemas, model configs, numpy, the arenas' views) lives until shutdown, yet
each full (generation-2) collection walks all of it again. Measured live on
workload (a) at 960 r/s: one such collection stalled the event loop for
55 ms, long enough for every request in flight to miss a 25-ms SLO
(docs/benchmark-history.md, 2026-11-23, "early start, GC freeze").
`gc.freeze()` moves those objects into the permanent generation, which
collections skip; what the server allocates while serving is still collected
as usual.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect start-up garbage, then exempt the survivors from later
    collections; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def thaw_heap() -> None:
    """Undo `freeze_startup_heap` (at shutdown: an embedding process, such
    as a test run, may go on and must get its memory back)."""
    gc.unfreeze()
