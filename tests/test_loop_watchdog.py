"""The loop watchdog: a handler that never yields can no
longer keep the process alive past a stop signal or forever; and a stop
signal sent twice at once (as `timeout` does) is one stop, not a hurry."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from app.server.loop_watchdog import EXIT_STATUS, LoopWatchdog
from app.server.stop_signals import REPEAT_WINDOW_S, StopSignals


def _wedged_loop(watchdog_kwargs: dict, block_s: float, signal_after_s: float | None):
    """Run a loop whose only callback blocks for `block_s`; what the watchdog did."""
    exits: list[tuple[int, float]] = []
    freed: list[float] = []
    loop = asyncio.new_event_loop()
    began = time.monotonic()
    watchdog = LoopWatchdog(
        loop,
        on_exit=lambda: freed.append(time.monotonic() - began),
        exit=lambda status: exits.append((status, time.monotonic() - began)),
        interval_s=0.05,
        warn_s=0.2,
        **watchdog_kwargs,
    )

    async def main() -> None:
        watchdog.start()
        if signal_after_s is not None:
            threading.Timer(signal_after_s, watchdog.signalled).start()
        await asyncio.sleep(0.1)
        time.sleep(block_s)  # a handler that never yields

    try:
        loop.run_until_complete(main())
    finally:
        watchdog.stop()
        loop.close()
    return exits, freed, watchdog


@pytest.mark.slow  # over a second of wall time
def test_a_stop_signal_ends_a_wedged_loop_after_grace_and_safety_net():
    # grace 0.2 s + safety net 1.0 s + margin 0.3 s = 1.5 s after the signal at 0.2 s
    exits, freed, watchdog = _wedged_loop(
        {"grace_s": 0.2, "exit_margin_s": 0.3, "stall_exit_s": 0}, block_s=3.0, signal_after_s=0.2
    )
    assert len(exits) == 1 and exits[0][0] == EXIT_STATUS == 70
    assert 1.6 <= exits[0][1] <= 2.6, exits
    assert len(freed) == 1 and freed[0] <= exits[0][1]  # executors and memory first
    assert "after a stop signal" in (watchdog.exited or "")


@pytest.mark.slow  # over a second of wall time
def test_a_loop_stalled_past_the_limit_exits_and_a_short_stall_does_not():
    exits, _, watchdog = _wedged_loop(
        {"grace_s": 30.0, "stall_exit_s": 0.8}, block_s=2.0, signal_after_s=None
    )
    assert len(exits) == 1 and 0.85 <= exits[0][1] <= 1.8, exits
    assert "stalled" in (watchdog.exited or "")
    exits, _, watchdog = _wedged_loop(
        {"grace_s": 30.0, "stall_exit_s": 0.8}, block_s=0.4, signal_after_s=None
    )
    assert exits == [] and watchdog.exited is None
    assert 0.3 <= watchdog.worst_lag_s < 0.8


def test_the_same_signal_twice_at_once_is_one_stop_and_later_it_hurries():
    loop = asyncio.new_event_loop()
    first: list[str] = []
    again: list[str] = []
    received: list[int] = []
    signals = StopSignals(
        loop, 1.0, first.append, again.append, on_received=lambda: received.append(1)
    )
    try:
        signals._handle(signal.SIGTERM, None)
        signals._handle(signal.SIGTERM, None)  # `timeout`: the process, then its group
        loop.run_until_complete(asyncio.sleep(0))
        assert (first, again, len(received)) == (["SIGTERM"], [], 2)
        later = StopSignals(loop, 1.0, first.append, again.append)
        later._handle(signal.SIGTERM, None)
        later._first_at = time.monotonic() - REPEAT_WINDOW_S  # the same one, 0.1 s later
        later._handle(signal.SIGTERM, None)
        loop.run_until_complete(asyncio.sleep(0))
        assert (first, again) == (["SIGTERM", "SIGTERM"], ["SIGTERM"])
    finally:
        loop.close()
