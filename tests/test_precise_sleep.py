"""bench.precise_sleep: the load generator's sub-millisecond sleep (a Linux
timerfd on the event loop): never wakes before its time, survives a
cancelled sleep, and falls back to asyncio.sleep off Linux. How precise it
is belongs to the benchmarks (docs/benchmark-history.md, 2026-11-23,
"the load generator sends on time")."""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time

import pytest

from bench.precise_sleep import PreciseSleeper


async def _sleeps_never_early(sleeper: PreciseSleeper, count: int) -> None:
    """Sleep to `count` random times 0.2–3 ms ahead; none may wake early."""
    rng = random.Random(7)
    for _ in range(count):
        when = time.monotonic() + rng.uniform(0.0002, 0.003)
        await sleeper.sleep_until(when)
        assert time.monotonic() >= when


def test_wakes_at_its_time_never_before():
    async def scenario() -> None:
        sleeper = PreciseSleeper()
        assert sleeper.precise == sys.platform.startswith("linux")
        try:
            await _sleeps_never_early(sleeper, 200)
            # A time already past returns at once: without giving the loop
            # a turn (a callback scheduled before it has not run).
            turns: list[int] = []
            asyncio.get_running_loop().call_soon(turns.append, 1)
            await sleeper.sleep_until(time.monotonic() - 1.0)
            assert turns == []
        finally:
            sleeper.close()

    asyncio.run(scenario())


def test_a_cancelled_sleep_leaves_the_sleeper_usable():
    async def scenario() -> None:
        sleeper = PreciseSleeper()
        try:
            long_sleep = asyncio.create_task(sleeper.sleep_until(time.monotonic() + 5.0))
            await asyncio.sleep(0.01)
            long_sleep.cancel()
            with pytest.raises(asyncio.CancelledError):
                await long_sleep
            short_sleep = asyncio.create_task(sleeper.sleep_until(time.monotonic() + 0.02))
            await asyncio.sleep(0.005)
            short_sleep.cancel()
            with pytest.raises(asyncio.CancelledError):
                await short_sleep
            # The cancelled sleep's timer was disarmed: long after its time,
            # with the loop not looking (a blocking sleep), nothing expired.
            time.sleep(0.05)
            if sleeper.precise:
                with pytest.raises(BlockingIOError):
                    os.read(sleeper._timer.fd, 8)
            when = time.monotonic() + 0.005
            await asyncio.wait_for(sleeper.sleep_until(when), 5.0)  # wakes, never early
            assert when <= time.monotonic()
        finally:
            sleeper.close()

    asyncio.run(scenario())


def test_falls_back_to_asyncio_sleep_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")

    async def scenario() -> None:
        sleeper = PreciseSleeper()
        assert not sleeper.precise
        await _sleeps_never_early(sleeper, 20)
        sleeper.close()

    asyncio.run(scenario())


def test_a_loop_without_add_reader_gets_the_fallback_and_no_leaked_fd():
    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, fd, callback, *args):
            raise NotImplementedError

    loop = NoReaders()
    try:
        fds = set(os.listdir("/proc/self/fd")) if sys.platform.startswith("linux") else set()
        sleeper = PreciseSleeper(loop)
        assert not sleeper.precise
        if fds:
            assert set(os.listdir("/proc/self/fd")) == fds
        loop.run_until_complete(_sleeps_never_early(sleeper, 5))
        sleeper.close()
    finally:
        loop.close()
