"""The pool's record of each device's Ray actor (`Actor`), what its
heartbeat keeps (`ActorBeat`), and where an arena slot's outputs begin
(`inputs_end`, read by the pool and by the actor): the values that
app/runtime/ray_pool.py, ray_faults.py, ray_alone.py and ray_actor.py share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.runtime.devices import ExecutorDevice
from app.runtime.ray_channel import Channel


class ActorBeat:
    """When an actor last answered a ping (the watchdog's heartbeat)."""

    __slots__ = ("last",)

    def __init__(self, last: float) -> None:
        self.last = last


@dataclass
class Actor:
    """The pool's record of one device's actor."""

    device: ExecutorDevice
    handle: Any = None
    node_id: str = ""
    pid: int | None = None
    remote: bool = False  # its data goes through the object store
    channel: Channel | None = None  # its batch channel (same node; app.runtime.ray_channel)
    request: dict[str, float] = field(default_factory=dict)  # what it asks Ray for
    clock_offset: float = 0.0  # its monotonic clock minus ours
    models: list[str] = field(default_factory=list)
    load_errors: dict[str, str] = field(default_factory=dict)
    load_info: dict[str, str] = field(default_factory=dict)
    inflight: dict[int, str] = field(default_factory=dict)  # batch_id → model
    dead: bool = True
    loading: bool = False
    generation: int = 0  # bumped at each failure: replies of an older one are stale
    down_since: float | None = None
    restarts: int = 0
    last_respawn_s: float | None = None
    overhead_s: float = 0.0  # median round trip of an empty call
    bytes_per_s: float = float("inf")  # PROBE_BYTES there and back
    # What the hang watchdog reads (app.runtime.watchdog.Watched):
    heartbeat: ActorBeat | None = None  # its last answered ping (None: the rule is off)
    serving_since: float = 0.0  # when it had loaded its models
    progress_at: float = 0.0  # its last reply, or work given to it idle
    sizes: dict[int, tuple[int, float]] = field(default_factory=dict)  # batch → (size, start)
    # The asynchronous profiler (app.runtime.ray_alone):
    samples_left: int = 0  # samples the actor keeps to re-run alone (≥ 1: some)
    rerunning: bool = False  # a re-run loop is under way


def inputs_end(layout: Mapping[str, Any]) -> int:
    """Where a slot's outputs begin: its bytes before are the inputs (and
    their shapes), after it the outputs (app.runtime.arena's layout)."""
    offsets = [int(t["offset"]) for t in layout["outputs"].values()]
    return min(offsets) if offsets else int(layout["slot_nbytes"])
