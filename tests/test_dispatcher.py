"""The live driver of the scheduling core (app/server/dispatcher.py), its
timer-lead setting, and the server's start-up heap freeze (app/server/heap.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
import time

import pytest

from app.__main__ import parse_command
from app.errors import Dropped
from app.scheduling.symphony import SymphonyScheduler
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.heap import freeze_startup_heap, thaw_heap
from app.server.settings import Settings
from tests.helpers import devices, model


def test_a_batch_formed_on_an_early_wakeup_may_start_at_once():
    """The dispatcher wakes `timer_lead_s` before the core's timer and lets
    the core decide as of the timer's time, so the batch's planned start is
    up to the lead ahead of the real clock. The executor is told it may start
    the lead earlier — at once — instead of holding a formed batch on an idle
    device."""
    submits: list[tuple[float, float]] = []  # (start_at sent, real time then)

    def submit(device: int, batch_id: int, name: str, slots: list[int], start_at: float) -> None:
        submits.append((start_at, time.monotonic()))

    async def scenario() -> CoreGroup:
        # One request of a model expected at 1,000 r/s: far from a full
        # batch, so Symphony waits to frontrun (symphony.txt §4.3) and the
        # batch is decided on a timer.
        info = model("m", alpha_ms=1.0, beta_ms=5.0, slo_ms=60.0, expected_rate=1000.0)
        core = SymphonyScheduler([info], devices(1))
        group = CoreGroup(core, frozenset({"m"}), (0,))
        dispatcher = Dispatcher([group], submit, timer_lead_s=0.010)
        pending = dispatcher.submit_request("m", 0, 0.060)
        assert submits == [] and group.wake_at is not None
        for _ in range(200):
            if submits:
                break
            await asyncio.sleep(0.005)
        assert pending.batch is not None
        return group

    group = asyncio.run(scenario())
    (sent, real), batch = submits[0], next(iter(group.batches.values()))
    assert sent == pytest.approx(batch.start_at - 0.010, abs=1e-9)
    # The core's plan lies up to the lead ahead of the real clock; what was
    # sent does not (the wakeup cannot fire before its time), so the batch
    # starts as soon as it reaches an idle device.
    assert sent <= real + 1e-3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_on_uvloop_the_dispatchers_wakeups_are_never_early():
    """uvloop's own timers count whole milliseconds and fire up to one early;
    the dispatcher's timerfd fires at its time or after. 20 requests one
    after another, each dispatched by a timer (or, on a stalled box, dropped:
    waited for too, so the test cannot hang); every batch submitted no
    earlier than its start minus the lead."""
    uvloop = pytest.importorskip("uvloop")
    early: list[float] = []

    def submit(device: int, batch_id: int, name: str, slots: list[int], start_at: float) -> None:
        early.append(start_at - time.monotonic())

    async def scenario() -> None:
        info = model("m", alpha_ms=1.0, beta_ms=5.0, slo_ms=20.0, expected_rate=1000.0)
        core = SymphonyScheduler([info], devices(1))
        group = CoreGroup(core, frozenset({"m"}), (0,))
        dispatcher = Dispatcher([group], submit, timer_lead_s=0.0)
        for request_id in range(20):
            count = len(early)
            pending = dispatcher.submit_request("m", request_id, 0.020)
            give_up = time.monotonic() + 5.0
            while len(early) == count and not pending.future.done():
                assert time.monotonic() < give_up, f"request {request_id}: no dispatch, no answer"
                await asyncio.sleep(0.001)
            if pending.future.done():  # dropped: the deadline could not be met
                assert isinstance(pending.future.exception(), Dropped)
        assert group.wakeup is not None and group.wakeup.precise

    uvloop.run(scenario())
    assert len(early) >= 15 and max(early) <= 0.0, early


def test_start_up_heap_is_frozen_until_thawed():
    gc.unfreeze()
    try:
        survivors = [object() for _ in range(1000)]
        frozen = freeze_startup_heap()
        assert frozen >= len(survivors) and gc.get_freeze_count() == frozen
        # Later allocations stay collectable: a new cycle is found.
        cycle: list = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0


def test_timer_lead_is_a_setting():
    assert Settings().timer_lead_ms == 2.0
    assert Settings.from_env({}).timer_lead_ms == 2.0
    assert Settings.from_env({"TIMER_LEAD_MS": "0.5"}).timer_lead_ms == 0.5
    assert Settings.from_env({"TIMER_LEAD_MS": "0"}).timer_lead_ms == 0.0
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(ValueError, match="TIMER_LEAD_MS"):
            Settings.from_env({"TIMER_LEAD_MS": bad})
    command = parse_command(["serve", "--timer-lead-ms", "0.5"], {"TIMER_LEAD_MS": "1"})
    assert command.settings.timer_lead_ms == 0.5
    with pytest.raises(ValueError, match="--timer-lead-ms must be ≥ 0, got -1"):
        parse_command(["serve", "--timer-lead-ms", "-1"], {})
