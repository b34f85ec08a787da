"""The executor watchdog (app.runtime.watchdog): its rules on plain values,
and a pool whose executors are stopped with SIGSTOP, idle or busy."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest

from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.events import BatchFinished, DeviceDown, DeviceUp
from app.runtime.pool import ExecutorPool
from app.runtime.watchdog import (
    Heartbeat,
    batch_overdue,
    beat_interval,
    check_interval,
    hang_of,
    silent_for,
)
from tests.fakes import PoolEvents, emulated_config, our_segments

# ------------------------------------------------------------------ the rules


def test_silence_counts_from_the_last_beat_or_from_serving_whichever_is_later():
    assert silent_for(last_beat=10.0, since=0.0, now=10.5, timeout_s=0.5) is None
    assert silent_for(last_beat=10.0, since=0.0, now=10.75, timeout_s=0.5) == 0.75
    # A process that only just loaded its models has not had time to beat.
    assert silent_for(last_beat=1.0, since=10.0, now=10.4, timeout_s=0.5) is None
    assert silent_for(last_beat=1.0, since=10.0, now=11.0, timeout_s=0.5) == 1.0
    # Timeout 0: the rule is off.
    assert silent_for(last_beat=0.0, since=0.0, now=100.0, timeout_s=0.0) is None


def test_beat_and_check_intervals_follow_the_timeouts():
    assert beat_interval(0.5) == 0.1  # 5 beats per timeout
    assert beat_interval(0.8) == pytest.approx(0.16)
    assert beat_interval(5.0) == 0.2  # at most 0.2 s apart
    assert check_interval(10.0, 1.0, 0.8) == 0.1
    assert check_interval(10.0, 0.3, 0.2) == 0.05  # a quarter of the shortest
    assert check_interval(0.0, 0.02, 0.2) == 0.05  # factor 0: the margin does not count
    assert check_interval(10.0, 0.01, 0.0) == 0.01  # never more often than every 10 ms
    assert batch_overdue(0.0, 1.21, 0.02, 10.0, 1.0) and not batch_overdue(0.0, 1.2, 0.02, 10, 1)
    assert not batch_overdue(0.0, 100.0, 0.02, 0.0, 1.0)  # factor 0: off
    with pytest.raises(ValueError, match="heartbeat timeout must be > 0"):
        Heartbeat(None, 0.0)


def _worker(last_beat: float | None, inflight: dict[int, str] | None = None, **fields):
    beat = None if last_beat is None else SimpleNamespace(last=last_beat)
    inflight = inflight or {}
    values = {
        "device": SimpleNamespace(name="emulated:0"),
        "heartbeat": beat,
        "serving_since": 0.0,
        "progress_at": 0.0,
        "inflight": inflight,
        "sizes": {b: (4, 0.0) for b in inflight},
    }
    return SimpleNamespace(**{**values, **fields})


def _rules(latency_s: float | None = 0.02, timeout_s: float = 0.5):
    return SimpleNamespace(
        stuck_factor=10.0,
        stuck_margin_s=1.0,
        heartbeat_timeout_s=timeout_s,
        expected_latency=None if latency_s is None else (lambda model, size: latency_s),
    )


def test_a_silent_executor_is_hung_idle_or_busy_and_a_beating_one_only_when_overdue():
    # Idle and silent for 0.6 s of a 0.5 s timeout: hung, with no batch to judge.
    assert hang_of(_worker(9.4), 10.0, _rules()) == (
        "executor emulated:0 hung: no heartbeat for 0.60 s (idle)"
    )
    assert hang_of(_worker(9.6), 10.0, _rules()) is None
    # No profile known yet: silence still counts.
    assert hang_of(_worker(9.4), 10.0, _rules(latency_s=None)) is not None
    # Busy and silent: hung long before its batch is overdue (10·20 ms + 1 s).
    busy = _worker(9.4, {7: "m", 8: "m"}, progress_at=9.3)
    assert hang_of(busy, 10.0, _rules()) == (
        "executor emulated:0 hung: no heartbeat for 0.60 s (2 batches in flight)"
    )
    # Busy and beating: judged by its oldest batch only.
    beating = _worker(10.0, {7: "m", 8: "m"}, progress_at=9.3)
    assert hang_of(beating, 10.0, _rules()) is None
    assert hang_of(beating, 10.49, _rules()) is None  # 1.19 s: not yet past 1.2 s
    beating.heartbeat.last = 10.45
    assert hang_of(beating, 10.52, _rules()) == (
        "executor emulated:0 stuck: batch 7 of m ×4 running 1.22 s, profile says 20.0 ms"
    )
    # Heartbeat off (timeout 0, no Heartbeat): only the batch rule.
    assert hang_of(_worker(None), 100.0, _rules(timeout_s=0.0)) is None


# ------------------------------------------------------------------ real pools


async def _until(condition, timeout_s: float) -> float:
    """Seconds until `condition()` holds; fails after `timeout_s`."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_stopped_executors_are_seen_within_the_heartbeat_timeout_and_respawned():
    """SIGSTOP on every executor of an idle pool: with a 0.5-s heartbeat
    timeout both are reported down (DeviceDown) and not alive within 3 s —
    a batch sent to one meanwhile fails then, not never — and respawned
    executors serve again. A long batch and a short stop are not hangs."""
    fast = emulated_config("emu", alpha_ms=1.0, beta_ms=2.0)
    slow = emulated_config("slow", alpha_ms=0.0, beta_ms=1200.0)  # ℓ(1) = 1.2 s

    async def scenario():
        arenas = {c.name: Arena.create(c, capacity=4) for c in (fast, slow)}
        done = PoolEvents()
        devices = [ExecutorDevice(i, "emulated", f"emulated:{i}") for i in range(2)]
        pool = ExecutorPool(devices, [fast, slow], arenas, done, heartbeat_timeout_s=0.5)
        try:
            await pool.start()
            for arena in arenas.values():
                slot = arena.acquire()
                assert slot == 0
                arena.write_inputs(slot, {"x": np.ones(4, np.float32)})

            # Busy for 1.2 s (2.4 timeouts): the heartbeat goes on beside the batch.
            ran = await asyncio.wait_for(_submit(pool, done, 0, 1, "slow"), 10)
            assert ran.error is None and ran.finished_at - ran.started_at >= 1.2
            # Stopped for a fifth of the timeout, then continued: not a hang.
            first = [pool.pid(0), pool.pid(1)]
            os.kill(first[1], signal.SIGSTOP)
            await asyncio.sleep(0.1)
            os.kill(first[1], signal.SIGCONT)
            await asyncio.sleep(0.8)
            assert pool.alive(1) and pool.pid(1) == first[1]
            assert [e for e in done.events if isinstance(e, DeviceDown)] == []

            for pid in first:
                os.kill(pid, signal.SIGSTOP)
            stopped_at = time.monotonic()
            lost = _submit(pool, done, 0, 2, "emu")  # reaches a stopped executor
            seen = await _until(lambda: not pool.alive(0) and not pool.alive(1), 5.0)
            failed = await asyncio.wait_for(lost, 5.0)
            print(f"stopped executors reported down after {seen:.3f} s")
            assert seen < 3.0
            assert isinstance(failed, BatchFinished)
            assert failed.error.startswith("executor emulated:0 hung: no heartbeat for 0.")
            assert failed.error.endswith("(1 batch in flight)")
            assert failed.finished_at - stopped_at < 3.0
            down = {e.device: e.reason for e in done.events if isinstance(e, DeviceDown)}
            assert down[0] == failed.error
            assert down[1].startswith("executor emulated:1 hung") and down[1].endswith("(idle)")

            await _until(lambda: pool.alive(0) and pool.alive(1), 30.0)
            assert {e.device for e in done.events if isinstance(e, DeviceUp)} == {0, 1}
            assert not {pool.pid(0), pool.pid(1)} & set(first)
            for pid in first:  # killed and reaped
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
            for device, batch_id in ((0, 3), (1, 4)):
                ran = await asyncio.wait_for(_submit(pool, done, device, batch_id, "emu"), 10)
                assert ran.error is None
        finally:
            await pool.stop(timeout=2)
        assert our_segments() == []

    asyncio.run(scenario())


def _submit(pool: ExecutorPool, done: PoolEvents, device: int, batch_id: int, model: str):
    future = done.expect(batch_id)
    pool.submit(device, batch_id, model, [0], 0.0)
    return future
