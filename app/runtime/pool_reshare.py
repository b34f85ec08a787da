"""Reallocating a device share through a shadow executor (InSS §5.3).

`ExecutorPool` (app/runtime/pool.py) owns a `Reshares` (`pool.reshares`),
which works through the pool's executors only by `ShadowHost`.
`reshare(device, share)` gives a device's executor a new share without
dropping a batch:

1. **Shadow.** A second executor process starts for the same device id with
   the new share (`reshared_device`: a CPU share is pinned again to the cores
   `split_cores` gives it among the device's shares, one thread per core; a
   GPU share gets the new MPS percentage; an emulated one holds ℓ(b)/share).
   It loads the models the device serves and runs each once at batch 1, so
   the first real batch pays no first-run cost. The old executor serves on
   meanwhile, untouched; the shadow may run on some of its cores for a while.
2. **Switch**, on the event loop in one step: the shadow becomes the
   device's executor (`submit`, `profile`, `pid`, `devices[id]` are the new
   one's from now on); the old one keeps the batches it holds.
3. **Retire.** The old executor runs those batches; their BatchFinished (or
   BatchStopped: `cancel` finds a batch on either process) are posted as
   usual, exactly once, a batch that was running during the switch
   included. Once it holds none it is told to stop, and is gone when
   `reshare` returns. The watchdog watches it meanwhile; if it dies or is
   killed, its batches end in BatchStopped (the core puts their requests
   back in the queue, as after a preemption, for the new executor), no
   DeviceDown follows and nothing is respawned: the shadow is serving.

If the shadow fails to start, load a model the old one serves, or warm up,
or the old executor fails meanwhile, or models are added or removed while
it loads, the shadow is killed, `ReshareFailed` says why, and the old
executor serves on as before. Refused before anything starts: a share not in
(0, 1], or one that with the device's other shares would sum to more than 1,
an unknown device (ValueError); a reshare of a device that is being reshared
(until its old executor is gone) or respawned, or of a pool not running
(ReshareRefused).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from app.errors import ExecutorFailed
from app.runtime.devices import ExecutorDevice
from app.runtime.events import DeviceReshared, ExecutorEvent
from app.runtime.messages import Stop
from app.runtime.pool_worker import Worker
from app.runtime.shares import check_shares, split_cores
from app.runtime.watchdog import reap

log = logging.getLogger("app.runtime.pool")

# Shares may sum to 1 give or take rounding (as in app.runtime.shares).
_SUM_TOLERANCE = 1e-9
# After a killed retiring executor: how long its pipe may take to report EOF.
_KILL_WAIT_S = 5.0


class ReshareRefused(RuntimeError):
    """A reshare that cannot start now (one in progress, a respawn, a pool
    not running); nothing was changed."""


class ReshareFailed(RuntimeError):
    """The shadow executor did not come up (or the switch could not be
    made); it is gone and the old executor serves as before."""


@dataclass(frozen=True)
class Reshared:
    """What a reshare did and how long each phase took, in seconds.

    `spawn_s` starting the shadow process, `load_s` until it had loaded its
    models (its interpreter's start included: it answers once up),
    `warmup_s` its run per model at batch 1, `switch_s` the switch itself,
    `drain_s` from the switch until the old executor held no batch,
    `stop_s` from then until its process was gone, `total_s` all of it.
    `switched_at` is the switch's `time.monotonic()`. `old_batches` the
    batches the old executor held at the switch: each got its event from
    it. `old_failure` why the old executor ended otherwise than by the
    stop it was sent (died, killed), or None."""

    device: int
    name: str
    old_share: float
    new_share: float
    old_pid: int | None
    new_pid: int
    cpus: tuple[int, ...] | None
    spawn_s: float
    load_s: float
    warmup_s: float
    switch_s: float
    drain_s: float
    stop_s: float
    total_s: float
    switched_at: float
    old_batches: tuple[int, ...]
    old_failure: str | None


def reshared_device(
    device: ExecutorDevice,
    share: float,
    devices: Iterable[ExecutorDevice],
    cores: Sequence[int] | None = None,
) -> ExecutorDevice:
    """`device` at `share`. A CPU share is pinned to the cores `split_cores`
    gives it among the shares of its device in `devices` (in id order, the
    others at their present shares), one thread per core; `cores` are the
    whole device's (default: every core this process may run on, as
    `split_devices` assumes for a device not pinned — pass a pinned CPU
    slice's own). Other kinds keep their index and threads."""
    if device.kind != "cpu":
        return replace(device, share=share)
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        cores = cores or list(range(os.cpu_count() or 1))
    part = sorted((d for d in devices if d.whole == device.whole), key=lambda d: d.id)
    if device.id not in [d.id for d in part]:
        part = sorted([*part, device], key=lambda d: d.id)
    shares = [share if d.id == device.id else d.share for d in part]
    split = split_cores(cores, shares)
    cpus = split[[d.id for d in part].index(device.id)]
    return replace(device, share=share, cpus=tuple(cpus), threads=len(cpus))


def speed_ratio(old: ExecutorDevice, new: ExecutorDevice) -> float:
    """How much faster `new` runs a batch than `old`, by the share alone: a
    CPU share by its cores (its threads), others by the share — InSS's
    running time ∝ 1/ρ (inss.txt §4.1), exact for an emulated share. A
    model that gains less from more cores or SMs than that is planned a
    little fast after a share grows (and slow after it shrinks)."""
    if old.kind == "cpu":
        return new.threads / old.threads
    return new.share / old.share


class ShadowHost(Protocol):
    """What a reshare needs of a pool: its devices and serving executors,
    and starting, loading, warming up and ending an executor process."""

    devices: dict[int, ExecutorDevice]
    load_timeout_s: float
    workers: dict[int, Worker]  # the serving executor of each device

    @property
    def running(self) -> bool:
        """Started and not stopping."""
        ...

    def placement(self, device_id: int) -> list[str]: ...
    def spawn(self, w: Worker) -> None: ...
    async def load(self, w: Worker) -> None: ...
    async def warm_up(self, w: Worker, model: str, timeout: float) -> None:
        """Run `model` once at batch 1 on `w`."""
        ...

    def mark_dead(self, w: Worker, reason: str) -> None: ...
    def post(self, event: ExecutorEvent) -> None: ...


class Reshares:
    """A device's executor replaced by a shadow with a new share; by device
    id, the share asked for, the shadow starting, and the executor it
    replaced while that still runs."""

    def __init__(self, pool: ShadowHost) -> None:
        self._pool = pool
        self.asked: dict[int, float] = {}
        self.shadows: dict[int, Worker] = {}
        self.retiring: dict[int, Worker] = {}

    def in_progress(self, device_id: int) -> bool:
        """A reshare of the device is under way (until its old executor is gone)."""
        return device_id in self.asked or device_id in self.retiring

    async def reshare(
        self,
        device_id: int,
        share: float,
        *,
        cores: Sequence[int] | None = None,
        timeout: float | None = None,
        stop_timeout_s: float = 5.0,
    ) -> Reshared:
        """Give device `device_id`'s executor the share `share` through a
        shadow executor (the module's docstring says how); returns once the
        old executor is gone. `cores`: a CPU device's cores (see
        `reshared_device`); `timeout`: for the shadow's load and warm-up
        together (default: the pool's load timeout); `stop_timeout_s`: how
        long the drained old executor may take to exit before it is killed."""
        old = self._refused(device_id, share)
        new_device = reshared_device(old.device, share, self._pool.devices.values(), cores)
        limit = self._pool.load_timeout_s if timeout is None else timeout
        self.asked[device_id] = share
        try:
            t0 = time.monotonic()
            shadow = Worker(new_device)
            shadow.loading = True  # its death is no fault of the device
            self.shadows[device_id] = shadow
            asked = self._pool.placement(device_id)
            t_spawned, t_loaded, t_warm = await self._start_shadow(old, shadow, share, limit)
            why_not = self._switch_refusal(device_id, old, asked)
            if why_not is not None:
                name = old.device.name
                self._discard_shadow(shadow, f"shadow executor of {name} not switched to")
                raise ReshareFailed(f"resharing {name} to {share:g}: {why_not}")
            switched_at, old_batches = self._switch(device_id, old, shadow)
            t_switched = time.monotonic()
            await asyncio.shield(old.drained)
            t_drained = time.monotonic()
            old_failure = await self._wait_retired(old, stop_timeout_s)
            reap(old.process)
            t_end = time.monotonic()
        finally:
            self.asked.pop(device_id, None)
            self.shadows.pop(device_id, None)
        return Reshared(
            device=device_id,
            name=old.device.name,
            old_share=old.device.share,
            new_share=share,
            old_pid=old.process.pid,
            new_pid=shadow.process.pid,
            cpus=new_device.cpus,
            spawn_s=t_spawned - t0,
            load_s=t_loaded - t_spawned,
            warmup_s=t_warm - t_loaded,
            switch_s=t_switched - switched_at,
            drain_s=t_drained - t_switched,
            stop_s=t_end - t_drained,
            total_s=t_end - t0,
            switched_at=switched_at,
            old_batches=old_batches,
            old_failure=old_failure,
        )

    async def _start_shadow(
        self, old: Worker, shadow: Worker, share: float, limit: float
    ) -> tuple[float, float, float]:
        """Start the shadow, load the old executor's models on it and run
        each once (within `limit` s); when it had started, loaded and warmed
        up. On a failure the shadow is discarded and ReshareFailed says why."""
        name = old.device.name
        stage = "start"
        try:
            self._pool.spawn(shadow)
            t_spawned = time.monotonic()
            stage = "load its models"
            await asyncio.wait_for(self._pool.load(shadow), limit)
            t_loaded = time.monotonic()
            missing = [m for m in old.models if m not in shadow.models]
            if missing:
                raise ExecutorFailed(
                    "; ".join(f"{m}: {shadow.load_errors.get(m, 'not loaded')}" for m in missing)
                )
            stage = "warm up"
            for model in shadow.models:
                left = max(0.0, limit - (time.monotonic() - t_spawned))
                await self._pool.warm_up(shadow, model, left)
            return t_spawned, t_loaded, time.monotonic()
        except BaseException as exc:
            self._discard_shadow(shadow, f"shadow executor of {name} failed to {stage}")
            if isinstance(exc, ExecutorFailed | TimeoutError | OSError):
                raise ReshareFailed(
                    f"resharing {name} to {share:g}: the shadow executor failed to {stage}: "
                    f"{exc or 'timed out'}; {name} serves on at {old.device.share:g}"
                ) from exc
            raise

    def _switch(self, device_id: int, old: Worker, shadow: Worker) -> tuple[float, tuple[int, ...]]:
        """The shadow serves the device from now on; the old executor keeps
        the batches it holds. Nothing awaits in here, so no submit sees half
        of it. When it switched, and the old executor's batches then."""
        switched_at = time.monotonic()
        loop = asyncio.get_running_loop()
        shadow.loading = False
        shadow.serving_since = switched_at
        shadow.restarts, shadow.last_respawn_s = old.restarts, old.last_respawn_s
        del self.shadows[device_id]
        self._pool.workers[device_id] = shadow
        self._pool.devices[device_id] = shadow.device
        old.retiring = True
        old.drained, old.ended = loop.create_future(), loop.create_future()
        self.retiring[device_id] = old
        old_batches = tuple(old.inflight)
        if not old.inflight:
            self.drained(old)
        ratio = speed_ratio(old.device, shadow.device)
        self._pool.post(DeviceReshared(device_id, old.device.share, shadow.device.share, ratio))
        log.info(
            "%s reshared %g → %g: pid %s serves, pid %s retires holding %d batch(es)",
            old.device.name,
            old.device.share,
            shadow.device.share,
            shadow.process.pid,
            old.process.pid,
            len(old_batches),
        )
        return switched_at, old_batches

    # ---------------------------------------------------------- internals
    def _refused(self, device_id: int, share: float) -> Worker:
        """The device's serving executor, if it may be reshared to `share`."""
        if device_id not in self._pool.workers:
            have = ", ".join(f"{i} ({d.name})" for i, d in self._pool.devices.items()) or "none"
            raise ValueError(f"reshare: no device {device_id} in this pool (devices: {have})")
        old = self._pool.workers[device_id]
        name = old.device.name
        check_shares(name, [share])
        others = {
            d.name: max(d.share, self.asked.get(i, 0.0))
            for i, d in self._pool.devices.items()
            if i != device_id and d.whole == old.device.whole
        }
        total = math.fsum([*others.values(), share])
        if total > 1.0 + _SUM_TOLERANCE:
            listed = ", ".join(f"{n} {s:g}" for n, s in others.items())
            raise ValueError(
                f"reshare of {name} to {share:g}: with the other shares of "
                f"{old.device.whole} ({listed}) its shares would sum to {total:g}, "
                "more than the whole device"
            )
        if not self._pool.running:
            raise ReshareRefused(f"reshare of {name}: the pool is not running")
        if device_id in self.asked or device_id in self.retiring:
            doing = self.asked.get(device_id)
            to = "" if doing is None else f" to {doing:g}"
            raise ReshareRefused(f"reshare of {name}: a reshare{to} is in progress")
        if old.dead or old.loading:
            raise ReshareRefused(
                f"reshare of {name}: its executor is down and being respawned; "
                "reshare it once it serves again"
            )
        return old

    def _switch_refusal(self, device_id: int, old: Worker, asked: list[str]) -> str | None:
        """Why the loaded shadow cannot take over now, or None."""
        if not self._pool.running:
            return "the pool stopped"
        if self._pool.workers[device_id] is not old or old.dead or old.loading:
            return f"its executor failed meanwhile (it is respawned); {old.device.name} unchanged"
        if self._pool.placement(device_id) != asked:
            return "models were added or removed while the shadow loaded; try again"
        return None

    def _discard_shadow(self, shadow: Worker, reason: str) -> None:
        if shadow.conn is None:  # its process never started
            return
        if shadow.process is not None and shadow.process.is_alive():
            with contextlib.suppress(OSError):
                shadow.process.kill()
        self._pool.mark_dead(shadow, reason)  # loading: no DeviceDown, no respawn
        reap(shadow.process)

    async def _wait_retired(self, old: Worker, stop_timeout_s: float) -> str | None:
        """Until the drained old executor is gone (killed if it does not
        stop in time); why it ended otherwise than by its stop, or None."""
        assert old.ended is not None
        try:
            return await asyncio.wait_for(asyncio.shield(old.ended), stop_timeout_s)
        except TimeoutError:
            pass
        reason = f"retiring executor {old.device.name} did not stop in {stop_timeout_s:g} s"
        log.warning("%s; killing it", reason)
        with contextlib.suppress(OSError):
            old.process.kill()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(old.ended), _KILL_WAIT_S)
        self._pool.mark_dead(old, reason)
        return reason

    def drained(self, w: Worker) -> None:
        """A retiring executor holds no batch: tell it to stop."""
        if w.drained is not None and not w.drained.done():
            w.drained.set_result(None)
        if w.dead or w.stopping:
            return
        w.stopping = True
        with contextlib.suppress(OSError, ValueError):  # gone already: its EOF says so
            w.conn.send(Stop())

    def retired(self, w: Worker, reason: str) -> None:
        """A retiring executor is gone (`reason`): its batches have their
        events by now."""
        failure = None if w.stopping else reason
        if failure is not None:
            log.error("retiring %s", failure)
        for fut, value in ((w.drained, None), (w.ended, failure)):
            if fut is not None and not fut.done():
                fut.set_result(value)
        if self.retiring.get(w.device.id) is w:
            del self.retiring[w.device.id]
