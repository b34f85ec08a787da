"""app.server.timerfd: the dispatcher's and the load generator's timers.
Both kinds (timerfd, and the loop's own as the fallback) run a callback once,
never before its time; re-arming replaces, cancel disarms, close releases the
descriptor. How precise they are belongs to the benchmarks."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from app.server.timerfd import LoopTimer, TimerfdTimer, make_timer

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")


def _timerfds() -> set[int]:
    """This process's open timerfds."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[timerfd]":
                found.add(int(name))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


async def _until(condition, give_up_s: float = 5.0) -> None:
    """Let the loop run until `condition()` holds; fail after `give_up_s`."""
    give_up = time.monotonic() + give_up_s
    while not condition():
        assert time.monotonic() < give_up, f"nothing fired in {give_up_s} s"
        await asyncio.sleep(0.001)


async def _past(t: float) -> None:
    """Let the loop run until 10 ms after `t`: what was due at `t` would
    have fired by then."""
    await _until(lambda: time.monotonic() > t + 0.01)


@pytest.mark.parametrize("precise", [True, False])
def test_fires_once_never_early_and_rearming_replaces(precise: bool):
    async def scenario() -> None:
        timer = make_timer(asyncio.get_running_loop(), precise)
        assert timer.precise == (precise and sys.platform.startswith("linux"))
        fired: list[tuple[str, float]] = []
        try:
            when = time.monotonic() + 0.02
            timer.call_at(when + 0.01, lambda: fired.append(("replaced", time.monotonic())))
            timer.call_at(when, lambda tag: fired.append((tag, time.monotonic())), "kept")
            await _until(lambda: fired)
            await _past(when + 0.01)  # the replaced time, gone by
            assert [tag for tag, _ in fired] == ["kept"]
            if timer.precise:  # the loop's own timers may fire up to 1 ms early
                assert fired[0][1] >= when
            # A time already past fires (not "disarmed").
            fired.clear()
            timer.call_at(time.monotonic() - 5.0, lambda: fired.append(("past", 0.0)))
            await _until(lambda: fired)
            assert [tag for tag, _ in fired] == ["past"]
            # Cancelled: nothing fires, and the timer can be armed again.
            fired.clear()
            cancelled = time.monotonic() + 0.01
            timer.call_at(cancelled, lambda: fired.append(("cancelled", 0.0)))
            timer.cancel()
            await _past(cancelled)
            assert fired == []
            timer.call_at(time.monotonic() + 0.005, lambda: fired.append(("again", 0.0)))
            await _until(lambda: fired)
            assert [tag for tag, _ in fired] == ["again"]
        finally:
            timer.close()

    asyncio.run(scenario())


@linux_only
def test_a_timerfd_is_released_on_close_and_cannot_be_rearmed():
    async def scenario() -> None:
        before = _timerfds()
        timer = make_timer(asyncio.get_running_loop())
        assert isinstance(timer, TimerfdTimer)
        assert _timerfds() - before == {timer.fd}
        timer.call_at(time.monotonic() + 0.01, lambda: None)
        timer.close()
        assert _timerfds() == before
        with pytest.raises(RuntimeError, match="closed"):
            timer.call_at(time.monotonic(), lambda: None)
        timer.close()  # twice is harmless

    asyncio.run(scenario())


@linux_only
def test_an_expiry_the_loop_has_not_read_yet_is_dropped_by_cancel():
    async def scenario() -> None:
        timer = make_timer(asyncio.get_running_loop())
        fired: list[int] = []
        try:
            timer.call_at(time.monotonic() + 0.001, lambda: fired.append(1))
            time.sleep(0.01)  # expired while the loop was not looking
            timer.cancel()
            await asyncio.sleep(0.02)
            assert fired == []
        finally:
            timer.close()

    asyncio.run(scenario())


def test_off_linux_or_without_add_reader_the_loop_timer_stands_in(monkeypatch):
    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, fd, callback, *args):
            raise NotImplementedError

    loop = NoReaders()
    try:
        before = _timerfds() if sys.platform.startswith("linux") else set()
        assert isinstance(make_timer(loop), LoopTimer)
        if sys.platform.startswith("linux"):  # the timerfd it could not watch is closed
            assert _timerfds() == before
    finally:
        loop.close()
    monkeypatch.setattr(sys, "platform", "darwin")
    loop = asyncio.new_event_loop()
    try:
        assert isinstance(make_timer(loop), LoopTimer)
    finally:
        loop.close()
