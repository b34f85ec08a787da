"""Faults and probes of Ray executors: `ActorFaults`, owned by
`RayExecutorPool`, which it works through `FaultHost` (create, bring up,
kill an actor; fail its batches; post; run in the background).

Each actor has a `watch` call pending; it, or any call, failing means the
actor died: DeviceDown is posted (not while the pool stops), then a
BatchFinished with the reason for each of its batches in flight — each
batch answered exactly once: a reply of the actor's earlier life (its
`generation`) is dropped. Actors are created with `max_restarts`, so Ray
restarts the worker; the pool waits until it answers, has it load its
models again, and posts DeviceUp. An actor Ray no longer restarts (its
restarts used up, its node gone) is replaced by a new one after three
failed tries.

Hangs. A killed process is noticed by Ray; a frozen or deadlocked one is
not. The pool therefore applies the local executors' two rules
(app.runtime.watchdog.hang_of) to each actor: a ping every
`beat_interval(heartbeat_timeout_s)` in the actor's control group, which
answers while a batch runs (the batch runs in the default group), so a
long batch is not silence; and the oldest batch in flight against its
profile. A hung actor is killed with Ray restarting it (`ray.kill`,
`no_restart=False`) and taken down as a dead one is; a reply of its hung
life is stale and dropped.

Probes, at start: the round trip of an empty call (the control path) and
of `PROBE_BYTES` there and back (the data path), and, for an actor on
another node, the offset of its monotonic clock from ours (the fastest of
a few pings; its error is at most half that round trip).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

import numpy as np

from app.runtime.events import DeviceDown, DeviceUp, ExecutorEvent
from app.runtime.ray_records import Actor
from app.runtime.watchdog import beat_interval, watch_for_hangs

log = logging.getLogger("app.runtime.ray_pool")

# The data-path probe: bytes sent to each actor and back at start.
PROBE_BYTES = 1 << 20
PROBE_REPEATS = 10


async def clock_offset(handle: Any) -> float:
    """The actor's monotonic clock minus ours."""
    best: tuple[float, float] | None = None
    for _ in range(5):
        t0 = time.monotonic()
        theirs = await handle.ping.remote()
        t1 = time.monotonic()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, theirs - (t0 + t1) / 2)
    assert best is not None
    return best[1]


async def measure_paths(handle: Any) -> tuple[float, float]:
    """The actor's median control round trip (s) and data rate (bytes/s)."""
    pings = []
    for _ in range(PROBE_REPEATS + 2):
        t0 = time.perf_counter()
        await handle.ping.remote()
        pings.append(time.perf_counter() - t0)
    overhead = statistics.median(pings[2:])
    probe = np.ones(PROBE_BYTES, dtype=np.uint8)
    echoes = []
    for _ in range(3):
        t0 = time.perf_counter()
        await handle.echo.remote(probe)
        echoes.append(time.perf_counter() - t0)
    moving = max(statistics.median(echoes) - overhead, 1e-6)
    return overhead, 2 * PROBE_BYTES / moving


class FaultHost(Protocol):
    """What the fault handling needs of the pool: its watchdog settings
    (app.runtime.watchdog.Rules), its actors, and the Ray-side steps."""

    respawn: bool
    load_timeout_s: float
    stuck_factor: float
    stuck_margin_s: float
    heartbeat_timeout_s: float
    expected_latency: Callable[[str, int], float | None] | None

    @property
    def stopped(self) -> bool: ...
    def watched(self) -> Iterable[Actor]: ...
    def post(self, event: ExecutorEvent) -> None: ...
    def background(self, coro: Coroutine[Any, Any, None]) -> None: ...
    def create(self, a: Actor) -> None: ...
    async def bring_up(self, a: Actor) -> None: ...
    def kill(self, a: Actor, *, restart: bool) -> None: ...
    def fail_inflight(self, a: Actor, reason: str) -> None: ...


class ActorFaults:
    """An actor's death or hang noticed, reported, and the actor brought back."""

    def __init__(self, pool: FaultHost) -> None:
        self.pool = pool

    def watch(self, a: Actor) -> None:
        """The actor serves: report its death and, with heartbeats on, its silence."""
        self.pool.background(self._watch(a, a.generation))
        if a.heartbeat is not None:
            self.pool.background(self._beat(a, a.generation))

    async def _beat(self, a: Actor, generation: int) -> None:
        """Ping the actor while this life of it serves; each answer is a beat."""
        interval = beat_interval(self.pool.heartbeat_timeout_s)
        while not self.pool.stopped and a.generation == generation and a.heartbeat is not None:
            try:
                await a.handle.ping.remote()
            except asyncio.CancelledError:
                raise
            except Exception:
                return  # it died: its watch call reports it
            if a.generation == generation and a.heartbeat is not None:
                a.heartbeat.last = time.monotonic()
            await asyncio.sleep(interval)

    async def watchdog(self) -> None:
        """Kill an actor that stopped answering or whose oldest batch runs
        far beyond its profile (app.runtime.watchdog's rules and loop)."""
        await watch_for_hangs(self.pool, self._hung)

    def _hung(self, a: Actor, reason: str) -> None:
        """Kill the hung actor's process (Ray restarts it), then down it as a
        dead one."""
        reason = f"{reason} (Ray actor pid {a.pid})"
        log.error("%s; killing it", reason)
        self.pool.kill(a, restart=True)
        self.fault(a, a.generation, reason)

    async def _watch(self, a: Actor, generation: int) -> None:
        try:
            await a.handle.watch.remote()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.fault(a, generation, f"executor {a.device.name} (Ray actor) died: {exc}")

    def fault(self, a: Actor, generation: int, reason: str) -> None:
        """The actor died: DeviceDown first (not while stopping), then its
        batches fail, then it is brought back."""
        pool = self.pool
        if a.generation != generation or pool.stopped:
            return
        a.generation += 1
        a.dead = True
        a.down_since = time.monotonic()
        log.error("%s", reason)
        pool.post(DeviceDown(a.device.id, reason))
        pool.fail_inflight(a, reason)
        a.heartbeat = None
        if pool.respawn:
            pool.background(self._respawn(a))
        else:
            pool.kill(a, restart=False)

    async def _respawn(self, a: Actor) -> None:
        """Ray restarts the actor; once it answers and has loaded its models,
        DeviceUp. After three failed tries (Ray no longer restarts it), a
        new actor."""
        pool = self.pool
        tries, backoff = 0, 0.1
        while not pool.stopped:
            try:
                await asyncio.wait_for(pool.bring_up(a), pool.load_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                tries += 1
                log.error("bringing executor %s back failed: %s", a.device.name, exc)
                a.dead = True
                if tries % 3 == 0:
                    pool.kill(a, restart=False)
                    pool.create(a)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if pool.stopped:
                return
            down = time.monotonic() - (a.down_since or time.monotonic())
            a.restarts += 1
            a.last_respawn_s = down
            a.down_since = None
            log.warning(
                "executor %s is back (Ray actor pid %s, restart %d) after %.3f s",
                a.device.name,
                a.pid,
                a.restarts,
                down,
            )
            pool.post(DeviceUp(a.device.id, down))
            return
