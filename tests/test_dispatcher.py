"""The live driver of the scheduling core (app/server/dispatcher.py) on a fake
clock with fake executors: it makes the simulator's decisions, carries them
out, and handles executor events after the decisions in hand, never
re-entrantly. Also the server's start-up heap freeze (app/server/heap.py)."""

from __future__ import annotations

import asyncio
import gc
import sys
import time

import numpy as np
import pytest

from app.errors import Dropped, ExecutorFailed, ShuttingDown
from app.runtime.events import BatchFinished, BatchStopped, DeviceDown
from app.scheduling import DeviceInfo, make_scheduler
from app.scheduling.symphony import SymphonyScheduler
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.heap import freeze_startup_heap, thaw_heap
from app.simulation.engine import DeviceFault, run_simulation
from tests.fakes import devices, model
from tests.fakes_live import (
    EmulatedExecutors,
    FakeClock,
    FakeExecutors,
    FakeTimer,
    LiveHarness,
    RecordingCore,
)

# ------------------------------------------------ the same decisions, both drivers

SLOW = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=200.0, max_batch=32)
FAST = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=60.0, max_batch=64)
PREEMPTION_DELAY = 0.002


def _scenario() -> tuple[list[tuple[float, str, float]], list[tuple[float, int, bool]]]:
    """Arrivals (time, model, SLO) and faults (time, device, up): slow
    requests keep both devices busy, a burst of fast ones preempts a slow
    batch (its stop confirmed 2 ms later), device 1 fails at 30 ms with a
    batch on it and returns at 60 ms."""
    arrivals = [(0.0005 * i, "slow", SLOW.slo) for i in range(12)]
    arrivals += [(0.0101 + 0.00001 * i, "fast", FAST.slo) for i in range(40)]
    arrivals += [(0.025 + 0.001 * i, "slow", SLOW.slo) for i in range(10)]
    arrivals += [(0.0405 + 0.00001 * i, "fast", FAST.slo) for i in range(30)]
    arrivals += [(0.070 + 0.002 * i, "slow", SLOW.slo) for i in range(10)]
    faults = [(0.030, 1, False), (0.060, 1, True)]
    return sorted(arrivals, key=lambda a: a[0]), faults


def _core(policy: str, slack: dict[str, float]) -> RecordingCore:
    options = {"preemption_delay_ms": PREEMPTION_DELAY * 1000} if policy == "flex" else {}
    return RecordingCore(make_scheduler(policy, [SLOW, FAST], devices(2), **options, **slack))


@pytest.mark.parametrize("slack", [{}, {"deadline_margin": 0.003, "timer_lead": 0.002}])
@pytest.mark.parametrize("policy", ["flex", "symphony", "clockwork", "triton", "nexus", "clipper"])
def test_simulator_and_live_dispatcher_make_the_same_decisions(policy, slack):
    arrivals, faults = _scenario()
    names = [SLOW.name, FAST.name]
    simulated = _core(policy, slack)
    run_simulation(
        simulated,  # type: ignore[arg-type]
        [SLOW, FAST],
        devices(2),
        np.array([a[0] for a in arrivals]),
        np.array([names.index(a[1]) for a in arrivals]),
        preemption_delay=PREEMPTION_DELAY,
        faults=[DeviceFault(at, device, up) for at, device, up in faults],
    )

    live = _core(policy, slack)
    clock, timer = FakeClock(), FakeTimer()
    executors = EmulatedExecutors({SLOW.name: SLOW, FAST.name: FAST}, devices(2), PREEMPTION_DELAY)
    group = CoreGroup(live, frozenset(names), (0, 1))  # type: ignore[arg-type]
    dispatcher = Dispatcher([group], executors, clock=clock, timer_factory=lambda: timer)

    async def drive() -> list:
        return LiveHarness(dispatcher, executors, clock, timer).run(arrivals, faults)

    pending = asyncio.run(drive())

    assert live.log == simulated.log
    calls = {entry[0] for entry in live.log}
    assert {"add_request", "batch_finished", "device_down", "device_up"} <= calls
    if policy == "flex":
        preempted = [d for entry in live.log for d in entry[3] if d[0] == "preempt"]
        assert preempted and "batch_stopped" in calls
    # Every request answered exactly once, live as simulated.
    assert dispatcher.pending == {}
    assert all(p.future.done() for p in pending) and len(pending) == len(arrivals)


# ------------------------------------------------------------- carrying out


def _single(core, *, executors=None, clock=None):
    clock = clock or FakeClock()
    timer = FakeTimer()
    executors = executors or FakeExecutors()
    group = CoreGroup(core, frozenset(core.models), tuple(core.devices))
    dispatcher = Dispatcher([group], executors, clock=clock, timer_factory=lambda: timer)
    return dispatcher, executors, clock, timer


def test_a_finished_batch_answers_its_requests_with_its_report():
    async def scenario() -> None:
        core = make_scheduler("clockwork", [SLOW], devices(1))
        dispatcher, executors, clock, _ = _single(core)
        pending = dispatcher.submit_request("slow", 7, SLOW.slo)
        ((device, batch_id, name, slots, start_at),) = executors.submits
        assert (device, name, slots, start_at) == (0, "slow", [7], 0.0)
        clock.now = 0.021
        dispatcher.post(BatchFinished(0, batch_id, 0.0005, 0.0205))
        finished = pending.future.result()
        assert (finished.batch.id, finished.started_at, finished.finished_at) == (
            batch_id,
            0.0005,
            0.0205,
        )
        assert finished.error is None and dispatcher.pending == {}
        # A report the core no longer knows answers nobody twice.
        dispatcher.post(BatchFinished(0, batch_id, 0.0005, 0.0205))
        assert core.in_flight == {}

    asyncio.run(scenario())


def test_events_during_a_submit_are_handled_after_the_decisions_in_hand():
    """An executor that dies under a submit posts DeviceDown at once (the
    pool notices EOF there): the dispatcher finishes carrying out the core's
    decisions first, then hands the event to the core, which re-plans the
    batch's requests on the other device."""
    order: list[str] = []

    async def scenario() -> None:
        core = make_scheduler("clockwork", [SLOW], devices(2))
        executors = FakeExecutors()
        dispatcher, _, clock, _ = _single(RecordingCore(core), executors=executors)
        executors.refuse.add(0)

        def dies(device: int, batch_id: int) -> None:
            order.append("down posted")
            dispatcher.post(DeviceDown(device, "executor emulated:0 died"))
            order.append("post returned")

        executors.on_submit = dies
        pending = dispatcher.submit_request("slow", 3, SLOW.slo)
        order.append("submit_request returned")
        calls = [entry[0] for entry in dispatcher.groups[0].scheduler.log]
        assert calls == ["add_request", "device_down", "batch_finished"]
        # The device's failure came first: its batch was re-planned onto
        # device 1; the submit's own failure report finds nothing.
        assert [s[0] for s in executors.submits] == [1]
        assert not pending.future.done()
        clock.now = 0.03
        dispatcher.post(BatchFinished(1, executors.submits[0][1], 0.0, 0.021))
        assert pending.future.result().batch.device == 1

    asyncio.run(scenario())
    assert order == ["down posted", "post returned", "submit_request returned"]


def test_a_refused_submit_answers_its_requests_with_the_executors_error():
    async def scenario() -> None:
        core = make_scheduler("clockwork", [SLOW], devices(1))
        executors = FakeExecutors()
        executors.refuse.add(0)
        dispatcher, _, _, _ = _single(core, executors=executors)
        pending = dispatcher.submit_request("slow", 0, SLOW.slo)
        finished = pending.future.result()
        assert "not running" in finished.error
        assert core.in_flight == {} and dispatcher.pending == {}

    asyncio.run(scenario())


def test_a_preempted_batch_is_cancelled_and_its_requests_wait_for_the_stop():
    async def scenario() -> None:
        core = make_scheduler("flex", [SLOW, FAST], devices(1))
        dispatcher, executors, clock, _ = _single(core)
        first = dispatcher.submit_request("slow", 0, SLOW.slo)
        ((_, running, *_),) = executors.submits
        clock.now = 0.001
        burst = [dispatcher.submit_request("fast", 1 + i, FAST.slo) for i in range(4)]
        assert executors.cancels == [(0, running)]  # the `slow` batch, stopped
        assert not first.future.done()
        # The stop is confirmed: `slow` can still make it, it runs again.
        clock.now = 0.003
        dispatcher.post(BatchStopped(0, running, 0.003))
        assert not first.future.done()
        assert [s[2] for s in executors.submits] == ["slow", "fast"]
        clock.now = 0.0045
        dispatcher.post(BatchFinished(0, executors.submits[1][1], 0.001, 0.0044))
        assert all(p.future.result().batch.model == "fast" for p in burst)
        assert [s[2] for s in executors.submits] == ["slow", "fast", "slow"]

    asyncio.run(scenario())


def test_a_drop_answers_with_its_reason():
    async def scenario() -> None:
        core = make_scheduler("clockwork", [SLOW], devices(1))
        dispatcher, _, clock, timer = _single(core)
        dispatcher.submit_request("slow", 0, SLOW.slo)  # occupies the device to 21 ms
        late = dispatcher.submit_request("slow", 1, 0.025)  # must start by 4 ms
        assert timer.when == pytest.approx(0.004)
        clock.now = timer.when
        timer.fire()
        with pytest.raises(Dropped) as caught:
            late.future.result()
        assert caught.value.reason == "deadline"

    asyncio.run(scenario())


def test_a_batch_formed_on_an_early_wakeup_may_start_at_once():
    """The core handles each timer `timer_lead` before it is due and lets
    the batch start that much earlier (`Batch.release_at`): the dispatcher
    sends the executor the release time, so a formed batch does not wait on
    an idle device."""

    async def scenario() -> None:
        # One request of a model expected at 1,000 r/s: far from a full
        # batch, so Symphony (§4.3's hold, as written) waits to frontrun and
        # the batch is decided on a timer.
        info = model("m", alpha_ms=1.0, beta_ms=5.0, slo_ms=60.0, expected_rate=1000.0)
        core = SymphonyScheduler([info], devices(1), timer_lead=0.010, hold="frontrun")
        dispatcher, executors, clock, timer = _single(core)
        dispatcher.submit_request("m", 0, 0.060)
        assert executors.submits == [] and timer.when is not None
        planned = timer.when + 0.010  # the core's timer, due 10 ms after its wakeup
        clock.now = timer.when
        timer.fire()
        ((_, _, _, _, start_at),) = executors.submits
        (batch,) = core.in_flight.values()
        assert batch.start_at == pytest.approx(planned) and start_at == batch.release_at
        assert start_at == pytest.approx(batch.start_at - 0.010) and start_at <= clock.now

    asyncio.run(scenario())


def test_shutdown_answers_every_waiting_request_and_disarms():
    async def scenario() -> None:
        info = model("m", alpha_ms=1.0, beta_ms=5.0, slo_ms=60.0, expected_rate=1000.0)
        dispatcher, _, _, timer = _single(SymphonyScheduler([info], devices(1)))
        waiting = [dispatcher.submit_request("m", i, 0.060) for i in range(3)]
        assert timer.when is not None
        assert dispatcher.fail_all(ExecutorFailed("stopping")) == 3
        assert all(isinstance(p.future.exception(), ExecutorFailed) for p in waiting)
        assert timer.when is None and dispatcher.pending == {}

    asyncio.run(scenario())


def test_after_shutdown_an_executors_late_report_answers_nobody_twice_and_dispatches_nothing():
    """SIGTERM's end of grace: one batch is still running and two requests
    wait behind it. fail_all answers all three, once; the running batch's
    report then arrives (the executor finishes or is cancelled), and the
    core — which would now dispatch the two waiting requests — is not asked."""

    async def scenario() -> None:
        core = make_scheduler("clockwork", [SLOW], devices(1))
        dispatcher, executors, clock, _ = _single(core)
        waiting = [dispatcher.submit_request("slow", i, SLOW.slo) for i in range(3)]
        ((_, running, _, slots, _),) = executors.submits
        assert slots == [0]  # the other two queue behind it
        error = ShuttingDown("server shut down before this request finished")
        assert dispatcher.fail_all(error) == 3
        assert [p.future.exception() for p in waiting] == [error] * 3
        clock.now = 0.021
        dispatcher.post(BatchFinished(0, running, 0.0, 0.021))
        dispatcher.post(BatchStopped(0, running, 0.021))
        assert len(executors.submits) == 1 and dispatcher.pending == {}
        assert [p.future.exception() for p in waiting] == [error] * 3
        with pytest.raises(ShuttingDown):
            dispatcher.submit_request("slow", 3, SLOW.slo)

    asyncio.run(scenario())


# ------------------------------------------------------------------- the timer


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux's")
def test_on_uvloop_the_dispatchers_wakeups_are_never_early():
    """uvloop's own timers count whole milliseconds and fire up to one early;
    the dispatcher's timerfd fires at its time or after. Requests one after
    another, each dispatched by a timer (or, on a stalled box, dropped:
    waited for too, so the test cannot hang), until 20 were dispatched; every
    batch submitted no earlier than its release time."""
    import uvloop  # uvicorn[standard]'s, on Linux

    early: list[float] = []

    class Submits(FakeExecutors):
        def submit(self, device_id, batch_id, model_name, slots, start_at) -> None:
            early.append(start_at - time.monotonic())

    async def scenario() -> None:
        info = model("m", alpha_ms=1.0, beta_ms=5.0, slo_ms=20.0, expected_rate=1000.0)
        core = SymphonyScheduler([info], [DeviceInfo(0)])
        group = CoreGroup(core, frozenset({"m"}), (0,))
        dispatcher = Dispatcher([group], Submits())
        for request_id in range(200):
            if len(early) == 20:
                break
            count = len(early)
            pending = dispatcher.submit_request("m", request_id, 0.020)
            give_up = time.monotonic() + 5.0
            while len(early) == count and not pending.future.done():
                assert time.monotonic() < give_up, f"request {request_id}: no dispatch, no answer"
                await asyncio.sleep(0.001)
            if pending.future.done():  # dropped: the deadline could not be met
                assert isinstance(pending.future.exception(), Dropped)
        assert dispatcher.timer is not None and dispatcher.timer.precise

    uvloop.run(scenario())
    assert len(early) == 20 and max(early) <= 0.0, early


# ------------------------------------------------------------------- the heap


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
