"""Reallocating a device share through a shadow executor (app.runtime.pool_reshare):
a CPU share's cores recomputed, refusals, and live emulated pools resharing
under load — every batch answered once, the switch mid-batch, the old
process gone, the new share's speed; a shadow that fails leaves the old
executor serving; a retiring executor's death takes no device down."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing.context as mp_context
import os
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice, split_devices
from app.runtime.events import BatchFinished, BatchStopped, DeviceDown, DeviceUp
from app.runtime.pool import ExecutorPool
from app.runtime.pool_reshare import Reshared, ReshareFailed, ReshareRefused, reshared_device
from tests.fakes import PoolEvents, emulated_config

# "long" holds 0.3 s per batch on a whole device, "emu" 6 ms at batch 1.
LONG = emulated_config("long", alpha_ms=0.0, beta_ms=300.0)
EMU = emulated_config("emu", alpha_ms=1.0, beta_ms=5.0)


# ------------------------------------------------------------- plain parts
def test_a_cpu_share_is_pinned_again_to_the_cores_its_new_share_gives_it():
    cores = [0, 1, 2, 3]  # cpu:0 split in halves by split_devices on 4 cores
    halves = [
        ExecutorDevice(i, "cpu", f"cpu:0/{i}", threads=2, cpus=cpus, share=0.5)
        for i, cpus in enumerate([(0, 1), (2, 3)])
    ]
    smaller = reshared_device(halves[0], 0.25, halves, cores)
    assert (smaller.share, smaller.cpus, smaller.threads) == (0.25, (0,), 1)
    assert (smaller.id, smaller.name) == (0, "cpu:0/0")
    bigger = reshared_device(halves[1], 0.75, [smaller, halves[1]], cores)
    assert (bigger.cpus, bigger.threads) == ((1, 2, 3), 3)
    emulated = ExecutorDevice(3, "emulated", "emulated:0/1", share=0.5)
    assert reshared_device(emulated, 0.2, [emulated]) == replace(emulated, share=0.2)


def test_bad_shares_unknown_devices_and_a_pool_not_running_are_refused():
    devices = split_devices([ExecutorDevice(0, "emulated", "emulated:0")], {"emulated": (0.5, 0.3)})
    pool = ExecutorPool(devices, [EMU], {}, PoolEvents())

    def refused(device_id: int, share: float) -> None:
        asyncio.run(pool.reshare(device_id, share))

    with pytest.raises(ValueError, match=r"no device 7 in this pool \(devices: 0 \(emulated:0/0\)"):
        refused(7, 0.5)
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"emulated:0/0.*share must be in \(0, 1\]"):
            refused(0, bad)
    with pytest.raises(
        ValueError,
        match=r"emulated:0/0 to 0.8: with the other shares of emulated:0 \(emulated:0/1 0.3\) "
        r"its shares would sum to 1.1, more than the whole device",
    ):
        refused(0, 0.8)
    with pytest.raises(ReshareRefused, match="emulated:0/0: the pool is not running"):
        refused(0, 0.7)  # 0.7 + 0.3 fits: only the pool's state refuses it
    assert pool.devices[0].share == 0.5


# ------------------------------------------------------------- live pools
class _Load:
    """Batches for device 0 of `pool`, one slot per model, each id's future."""

    def __init__(self, pool: ExecutorPool, done: PoolEvents, arenas: dict[str, Arena]) -> None:
        self.pool, self.done = pool, done
        self.ids = itertools.count(1)
        self.futures: dict[int, asyncio.Future] = {}
        self.slots = {}
        for name, arena in arenas.items():
            slot = arena.acquire()
            arena.write_inputs(slot, {"x": np.ones(4, np.float32)})
            self.slots[name] = slot

    def send(self, model: str) -> int:
        batch_id = next(self.ids)
        self.futures[batch_id] = self.done.expect(batch_id)
        self.pool.submit(0, batch_id, model, [self.slots[model]], 0.0)
        return batch_id

    async def busy_until_switch(self, old_pid: int, task: asyncio.Task) -> list[int]:
        """Keep three "long" batches in flight on the old executor until the
        switch (the pid changes): one of them runs while it happens."""
        sent = []
        while self.pool.pid(0) == old_pid and not task.done():
            if len(self.pool.inflight(0)) < 3:
                sent.append(self.send("long"))
            await asyncio.sleep(0.02)
        return sent

    async def results(self) -> dict[int, BatchFinished | BatchStopped]:
        ids = list(self.futures)
        done = await asyncio.wait_for(asyncio.gather(*self.futures.values()), 60)
        return dict(zip(ids, done, strict=True))


def _run_s(event: BatchFinished) -> float:
    return event.finished_at - event.started_at


def _pool_scenario(scenario: Callable[[ExecutorPool, PoolEvents, _Load], object]) -> None:
    async def main() -> None:
        arenas = {c.name: Arena.create(c, capacity=4) for c in (LONG, EMU)}
        done = PoolEvents()
        device = ExecutorDevice(0, "emulated", "emulated:0", share=0.5)
        pool = ExecutorPool([device], [LONG, EMU], arenas, done)
        try:
            await pool.start()
            await scenario(pool, done, _Load(pool, done, arenas))
        finally:
            await pool.stop(timeout=5)

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_batches_before_during_and_after_a_reshare_are_each_answered_once():
    async def scenario(pool: ExecutorPool, done: PoolEvents, load: _Load) -> None:
        old_pid = pool.pid(0)
        before = [load.send("long"), load.send("emu")]
        task = asyncio.create_task(pool.reshare(0, 1.0))
        await asyncio.sleep(0)  # it has started its shadow
        with pytest.raises(ReshareRefused, match=r"emulated:0: a reshare to 1 is in progress"):
            await pool.reshare(0, 0.5)
        during = [load.send("emu"), *await load.busy_until_switch(old_pid, task)]
        assert pool.pid(0) != old_pid and pool.devices[0].share == 1.0
        after = [load.send("long"), load.send("emu"), load.send("long")]
        report: Reshared = await asyncio.wait_for(task, 60)
        ran = await load.results()

        # Every batch: one event, a BatchFinished without error.
        counts = Counter(
            e.batch_id for e in done.events if isinstance(e, BatchFinished | BatchStopped)
        )
        assert counts == dict.fromkeys(ran, 1)
        assert all(isinstance(e, BatchFinished) and e.error is None for e in ran.values())
        assert not [e for e in done.events if isinstance(e, DeviceDown | DeviceUp)]

        # The old executor finished what it held at the switch, one batch
        # of it running then; what came after ran on the new one.
        assert (report.old_pid, report.new_pid) == (old_pid, pool.pid(0))
        assert report.old_failure is None and (report.old_share, report.new_share) == (0.5, 1.0)
        held = set(report.old_batches)
        assert held and held <= set(before + during) and not held & set(after)
        assert all(ran[b].finished_at > report.switched_at for b in held)
        assert any(ran[b].started_at <= report.switched_at for b in held)
        # Sent before the switch: ran on the old one, done by then or held.
        assert all(b in held or ran[b].finished_at <= report.switched_at for b in before + during)
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)  # stopped and reaped
        assert pool.inflight(0) == {} and pool.alive(0) and pool.restarts(0) == 0

        # The new share's speed: a "long" batch holds about half as long at
        # 1.0 as at 0.5 (the executors' own start and end times).
        half = _run_s(ran[before[0]])
        whole = (_run_s(ran[after[0]]) + _run_s(ran[after[2]])) / 2
        assert 0.4 < whole / half < 0.6

        phases = (report.spawn_s, report.load_s, report.warmup_s, report.switch_s)
        assert all(p >= 0 for p in phases) and report.drain_s > 0 and report.stop_s >= 0
        assert report.total_s >= sum(phases) + report.drain_s + report.stop_s - 1e-9

    _pool_scenario(scenario)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_a_failed_shadow_leaves_the_old_executor_serving(monkeypatch):
    async def scenario(pool: ExecutorPool, done: PoolEvents, load: _Load) -> None:
        old_pid = pool.pid(0)

        async def still_serving() -> None:
            batch_id = load.send("emu")
            ran = await asyncio.wait_for(load.futures[batch_id], 10)
            assert ran.error is None and pool.pid(0) == old_pid
            assert pool.devices[0].share == 0.5 and pool.alive(0)

        # The shadow cannot load a model the old one serves.
        good = pool.configs["emu"]
        pool.configs["emu"] = replace(good, extra={"preemption_delay_ms": -1})
        with pytest.raises(
            ReshareFailed,
            match=r"emulated:0 to 1: the shadow executor failed to load its models: emu: .*"
            r"preemption_delay_ms.*; emulated:0 serves on at 0.5",
        ):
            await pool.reshare(0, 1.0)
        pool.configs["emu"] = good
        await still_serving()

        # The shadow's process cannot start.
        def start(self: object) -> None:
            raise OSError(11, "Resource temporarily unavailable")

        with monkeypatch.context() as patch:
            patch.setattr(mp_context.SpawnProcess, "start", start)
            with pytest.raises(ReshareFailed, match=r"failed to start: .*temporarily unavailable"):
                await pool.reshare(0, 1.0)
        await still_serving()
        assert not [e for e in done.events if isinstance(e, DeviceDown | DeviceUp)]
        assert pool.restarts(0) == 0

    _pool_scenario(scenario)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_a_retiring_executor_that_dies_stops_its_batches_and_takes_no_device_down():
    async def scenario(pool: ExecutorPool, done: PoolEvents, load: _Load) -> None:
        old_pid = pool.pid(0)
        task = asyncio.create_task(pool.reshare(0, 1.0))
        held = await load.busy_until_switch(old_pid, task)
        assert held and pool.pid(0) != old_pid
        # A batch the old executor holds is found there by cancel.
        first = next(iter(pool.inflight(0)))
        assert pool.cancel(0, first)
        stopped = await asyncio.wait_for(load.futures[first], 10)
        # (Finished first, if its hold ended before the cancel came.)
        assert isinstance(stopped, BatchStopped) or stopped.error is None
        os.kill(old_pid, signal.SIGKILL)
        report: Reshared = await asyncio.wait_for(task, 60)
        assert report.old_failure is not None and "died" in report.old_failure
        ran = await load.results()
        # Its batches are stopped, not failed: their requests go back to
        # the queue for the new executor (issue 42: they were answered 503).
        lost = {b for b, e in ran.items() if isinstance(e, BatchStopped)} - {first}
        assert lost and lost <= set(report.old_batches) - {first}
        failed = [b for b, e in ran.items() if isinstance(e, BatchFinished) and e.error]
        assert failed == [], failed
        assert not [e for e in done.events if isinstance(e, DeviceDown | DeviceUp)]
        batch_id = load.send("emu")
        assert (await asyncio.wait_for(load.futures[batch_id], 10)).error is None

        # The new executor dies: the device goes down, and is not reshared
        # while it is respawned.
        new_pid = pool.pid(0)
        os.kill(new_pid, signal.SIGKILL)
        while not [e for e in done.events if isinstance(e, DeviceDown)]:
            await asyncio.sleep(0.001)
        with pytest.raises(ReshareRefused, match="emulated:0: its executor is down and being"):
            await pool.reshare(0, 0.5)
        assert [e.device for e in done.events if isinstance(e, DeviceDown)] == [0]

    _pool_scenario(scenario)
