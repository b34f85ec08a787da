"""The executors' asynchronous profiler (app/runtime/alone_profiler.py) and
its driver side (app/server/alone_sampling.py, the dispatcher): sampled
requests are re-run alone only while the executor's inbox is empty, a
message stops a re-run, and the measured alone-times reach the core."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import queue
import random
import threading
import time
from typing import Any

import numpy as np
import pytest

from app.repository.config import ModelConfig
from app.runtime.alone_profiler import AloneProfiler, Sample, alone_event
from app.runtime.arena import Arena
from app.runtime.backends import make_backend
from app.runtime.devices import ExecutorDevice
from app.runtime.events import AloneStopped, AloneTimed, BatchFinished
from app.runtime.executor import Executor
from app.runtime.messages import Ran, RanAlone, Run, Stop, Stopped
from app.runtime.pool import ExecutorPool
from app.scheduling import make_scheduler
from app.scheduling.model import InputDependence
from app.scheduling.types import Batch, Request
from app.server.alone_sampling import AloneSampler, alone_time_per_request
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.metrics import Metrics
from app.server.settings import read_settings
from tests.fakes import (
    PoolEvents,
    devices,
    emulated_config,
    mlp_onnx,
    onnx_config,
)
from tests.fakes import model as model_info
from tests.fakes_live import FakeClock, FakeExecutors, FakeTimer

GIVE_UP_S = 10.0  # a guard against a hang, never a timing claim

DYNAMIC = dataclasses.replace(
    model_info("emu", alpha_ms=1.0, beta_ms=4.0, slo_ms=200.0, max_batch=8),
    dynamic=InputDependence(c0=0.001),
)


# ------------------------------------------------------------------ settings


def test_sample_rate_default_and_bounds():
    assert read_settings({}).profile_sample_rate == 0.05
    assert read_settings({"PROFILE_SAMPLE_RATE": "0"}).profile_sample_rate == 0.0
    assert read_settings({"PROFILE_SAMPLE_RATE": "1"}).profile_sample_rate == 1.0
    with pytest.raises(ValueError, match="0 to 1, got 2"):
        AloneSampler(2.0)


# ------------------------------------------------------------ driver side


def _batch(*requests: Request) -> Batch:
    return Batch(1, "emu", 0, list(requests), 0.0, 0.01, 0.0)


def test_the_sampler_marks_each_requests_rows_and_application():
    batch = _batch(
        Request(1, "emu", 0.0, 1.0, items=1, app="short"),
        Request(2, "emu", 0.0, 1.0, items=3, app="long"),
        Request(3, "emu", 0.0, 1.0, items=2),
    )
    assert AloneSampler(1.0).marks(batch, DYNAMIC) == ((0, 1, "short"), (1, 3, "long"), (4, 2, ""))
    assert AloneSampler(0.0).marks(batch, DYNAMIC) == ()
    # A static model's alone-time is its profile's: never re-run.
    static = dataclasses.replace(DYNAMIC, dynamic=None)
    assert AloneSampler(1.0).marks(batch, static) == ()
    assert AloneSampler(1.0).marks(batch, None) == ()
    # A rate between: about that share of 2,000 requests, drawn per request.
    many = _batch(*(Request(i, "emu", 0.0, 1.0) for i in range(2000)))
    marked = AloneSampler(0.25, random.Random(7)).marks(many, DYNAMIC)
    assert 400 <= len(marked) <= 600
    assert all(items == 1 for _, items, _ in marked)


def test_a_request_of_several_items_gives_its_per_request_alone_time():
    # c0 + 4·x = 0.009 → x = 0.002, a = c0 + x = 0.003
    assert alone_time_per_request(0.009, 4, DYNAMIC) == pytest.approx(0.003)
    assert alone_time_per_request(0.009, 1, DYNAMIC) == 0.009
    assert alone_time_per_request(0.009, 4, None) == 0.009


def _dispatcher(rate: float, info=DYNAMIC):
    core = make_scheduler("clockwork", [info], devices(1))
    executors = Marking()
    group = CoreGroup(core, frozenset(core.models), (0,))
    clock, timer = FakeClock(), FakeTimer()
    dispatcher = Dispatcher(
        [group], executors, clock=clock, timer_factory=lambda: timer, alone_sample_rate=rate
    )
    return dispatcher, core, executors, clock


class Marking(FakeExecutors):
    """Fake executors that record the marks of each batch too."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple] = []

    def submit(self, device_id, batch_id, model, slots, start_at, alone=()) -> None:
        super().submit(device_id, batch_id, model, slots, start_at)
        self.marks.append(tuple(alone))


@pytest.mark.parametrize(
    ("rate", "info", "marked"),
    [
        (1.0, DYNAMIC, True),
        (0.0, DYNAMIC, False),
        (1.0, dataclasses.replace(DYNAMIC, dynamic=None), False),
    ],
)
def test_the_dispatcher_sends_marks_only_at_a_positive_rate_for_dynamic_models(rate, info, marked):
    async def scenario() -> None:
        dispatcher, _, executors, clock = _dispatcher(rate, info)
        for request_id in range(3):
            clock.now = 0.1 * request_id
            dispatcher.submit_request("emu", [2 * request_id, 2 * request_id + 1], 0.2)
            _, batch_id, *_ = executors.submits[-1]
            clock.now += 0.02
            dispatcher.post(BatchFinished(0, batch_id, clock.now - 0.01, clock.now))
        assert len(executors.submits) == 3
        assert executors.marks == [((0, 2, ""),) if marked else ()] * 3

    asyncio.run(scenario())


def test_an_alone_time_event_reaches_the_core_per_request():
    async def scenario() -> None:
        dispatcher, core, _, clock = _dispatcher(1.0)
        recorded: list[tuple] = []
        record = core.record_alone_time

        def spy(model: str, app: str, seconds: float, now: float) -> list:
            recorded.append((model, app, seconds, now))
            return record(model, app, seconds, now)

        core.record_alone_time = spy  # type: ignore[method-assign]
        clock.now = 1.5
        dispatcher.post(AloneTimed(0, "emu", "long", 4, 0.009))
        dispatcher.post(AloneStopped(0, "emu", "long", 4))  # nothing for the core
        assert recorded == [("emu", "long", pytest.approx(0.003), 1.5)]

    asyncio.run(scenario())


def test_profiler_metrics_count_times_stops_drops_and_plan_errors():
    metrics = Metrics()
    metrics.alone_profiled("emu", 0.004, 0)
    metrics.alone_profiled("emu", None, 3)
    metrics.batch_timed("emu", planned_s=0.010, actual_s=0.012)
    value = metrics.registry.get_sample_value
    assert value("deadline_serve_alone_seconds_count", {"model": "emu"}) == 1
    assert value("deadline_serve_alone_stopped_total", {"model": "emu"}) == 1
    assert value("deadline_serve_alone_dropped_total", {"model": "emu"}) == 3
    assert value("deadline_serve_batch_time_ratio_sum", {"model": "emu"}) == pytest.approx(1.2)
    assert value("deadline_serve_batch_time_ratio_bucket", {"model": "emu", "le": "1.1"}) == 0
    assert value("deadline_serve_batch_time_ratio_bucket", {"model": "emu", "le": "1.25"}) == 1


# ---------------------------------------------------------------- backlog


def _sample(app: str) -> Sample:
    return Sample("emu", app, 1, {"x": np.zeros((1, 4), np.float32)})


def test_the_backlog_drops_its_oldest_beyond_its_limit_and_says_so():
    profiler = AloneProfiler(limit=2)
    for app in "abc":
        profiler._add(_sample(app))
    assert [s.app for s in profiler.backlog] == ["b", "c"] and profiler.dropped == 1
    first = profiler.next()
    assert first is not None
    assert profiler.report(first, 0.004) == RanAlone("emu", "b", 1, 0.004, 1)
    assert profiler.dropped == 0  # reported once
    profiler.forget(["emu"])
    assert not profiler.backlog and profiler.dropped == 0


def test_a_stopped_sample_is_tried_again_until_its_last_stop():
    profiler = AloneProfiler(max_stops=2)
    profiler._add(_sample("a"))
    profiler._add(_sample("b"))
    sample = profiler.next()
    assert sample is not None
    assert profiler.report(sample, None) == RanAlone("emu", "a", 1, None, 0)
    assert [s.app for s in profiler.backlog] == ["b", "a"]  # behind the others
    profiler.next()
    again = profiler.next()
    assert again is not None and again.app == "a"
    profiler.report(again, None)
    assert not profiler.backlog  # stopped twice: discarded
    assert alone_event(3, RanAlone("emu", "a", 1, None, 2)) == AloneStopped(3, "emu", "a", 1, 2)
    assert alone_event(3, RanAlone("emu", "a", 1, 0.5)) == AloneTimed(3, "emu", "a", 1, 0.5, 0)


# ------------------------------------------------- an executor on a thread


class Watched:
    """A backend whose runs the test sees begin (`began`: the input of each
    call) and may hold at the gate before they begin."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.began: queue.Queue[np.ndarray] = queue.Queue()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.began.put(np.array(next(iter(inputs.values()))))
        self.gate.wait()
        return self.inner.run(inputs)

    def terminate(self) -> None:
        self.inner.terminate()

    def reset(self) -> None:
        if hasattr(self.inner, "reset"):
            self.inner.reset()


class ThreadedExecutor:
    """An Executor serving a real pipe on a thread of this process, with
    one model: by default emulated, `emu`, of latency ℓ(b) = alpha + beta·b ms."""

    def __init__(
        self, alpha_ms: float = 0.0, beta_ms: float = 0.0, config: ModelConfig | None = None
    ) -> None:
        self.config = config or emulated_config("emu", alpha_ms=alpha_ms, beta_ms=beta_ms)
        name = self.config.name
        self.arena = Arena.create(self.config, capacity=max(8, self.config.max_batch_size))
        self.conn, child = mp.Pipe(duplex=True)
        self.executor = Executor(child, {"name": "device:0", "kind": "cpu"})
        inner = make_backend(self.config, "emulated" if name == "emu" else "cpu", 0, 1)
        inner.load(self.config)
        self.backend = Watched(inner)
        self.executor.configs[name] = self.config
        self.executor.backends[name] = self.backend
        self.executor.arenas[name] = Arena.attach(self.arena.layout)
        self.thread = threading.Thread(target=self.executor.serve, daemon=True)
        self.thread.start()

    def write(self, slot: int, value: float) -> None:
        self.arena.write_inputs(slot, {"x": np.full(4, value, np.float32)})

    def reply(self) -> Any:
        assert self.conn.poll(GIVE_UP_S), "no reply from the executor"
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(Stop())
        while not isinstance(self.reply(), Stopped):
            pass
        self.thread.join(GIVE_UP_S)
        self.conn.close()
        self.arena.close_and_unlink()


def test_samples_are_re_run_only_once_back_to_back_batches_are_done():
    """Four batches queued back to back, every request sampled: no re-run
    while a message waits, then one per request, each of its own rows —
    copied before the answer, not read from a slot reused since."""
    ex = ThreadedExecutor(alpha_ms=1.0, beta_ms=4.0)
    try:
        ex.backend.gate.clear()  # the first batch waits until all four are queued
        for slot in range(4):
            ex.write(slot, slot + 1.0)
            ex.conn.send(Run(slot, "emu", [slot], 0.0, ((0, 1, f"app{slot}"),)))
        ex.backend.gate.set()
        replies = []
        while len(replies) < 8:
            reply = ex.reply()
            if isinstance(reply, Ran):
                ex.write(reply.batch_id, 0.0)  # answered: its slot is reused
            replies.append(reply)
        kinds = [type(r).__name__ for r in replies]
        assert kinds == ["Ran"] * 4 + ["RanAlone"] * 4, kinds
        assert all(r.error is None for r in replies[:4])
        alone = replies[4:]
        assert [r.app for r in alone] == ["app0", "app1", "app2", "app3"]
        # Each ran alone for at least ℓ(1) = 5 ms, as one item.
        assert all(r.seconds >= 0.005 and r.items == 1 and r.dropped == 0 for r in alone)
        rows = [ex.backend.began.get_nowait() for _ in range(8)]
        for slot, row in enumerate(rows[4:]):
            np.testing.assert_array_equal(row, np.full((1, 4), slot + 1.0, np.float32))
        # A batch with no marks leaves nothing to re-run.
        ex.conn.send(Run(5, "emu", [5], 0.0))
        ex.conn.send(Run(6, "emu", [6], 0.0, ((0, 1, "marked"),)))
        replies = [ex.reply() for _ in range(3)]
        assert [type(r).__name__ for r in replies] == ["Ran", "Ran", "RanAlone"]
        assert replies[2].app == "marked"
        assert not ex.executor.profiler.backlog
    finally:
        ex.close()


def test_a_batch_arriving_during_a_re_run_stops_it_and_runs_next():
    ex = ThreadedExecutor(alpha_ms=0.0, beta_ms=150.0)
    try:
        ex.write(0, 1.0)
        ex.write(1, 2.0)
        ex.conn.send(Run(1, "emu", [0], 0.0, ((0, 1, "a"),)))
        first = ex.reply()
        assert isinstance(first, Ran) and first.error is None
        ex.backend.began.get(timeout=GIVE_UP_S)  # batch 1
        ex.backend.began.get(timeout=GIVE_UP_S)  # its sample, re-running now
        ex.conn.send(Run(2, "emu", [1], 0.0))
        stopped, second, retried = ex.reply(), ex.reply(), ex.reply()
        # The re-run was stopped and discarded before batch 2 ran; the
        # sample was tried again once the executor was idle.
        assert stopped == RanAlone("emu", "a", 1, None, 0)
        assert isinstance(second, Ran) and second.batch_id == 2 and second.error is None
        assert isinstance(retried, RanAlone) and retried.app == "a"
        assert retried.seconds is not None and retried.seconds >= 0.150
    finally:
        ex.close()


@pytest.mark.slow
def test_an_onnx_re_run_is_stopped_through_run_options_terminate(tmp_path):
    """The same with ONNX Runtime: a sample of 32 rows through 128 layers
    1024 wide (~50 ms alone on one core) is stopped between nodes when a
    batch arrives, and measured in full once the executor idles again."""
    path = mlp_onnx(tmp_path / "chain.onnx", 1024, 128, shared=True)
    ex = ThreadedExecutor(config=onnx_config("chain", path, width=1024, max_batch=32))
    try:
        rows = list(range(32))
        for slot in rows:
            ex.arena.write_inputs(slot, {"x": np.full(1024, 0.01 * slot, np.float32)})
        ex.conn.send(Run(1, "chain", rows, 0.0, ((0, 32, "a"),)))
        first = ex.reply()
        assert isinstance(first, Ran) and first.error is None
        ex.backend.began.get(timeout=GIVE_UP_S)  # batch 1
        ex.backend.began.get(timeout=GIVE_UP_S)  # its sample
        ex.conn.send(Run(2, "chain", rows[:1], 0.0))
        stopped, second, retried = ex.reply(), ex.reply(), ex.reply()
        assert stopped == RanAlone("chain", "a", 32, None, 0)
        assert isinstance(second, Ran) and second.batch_id == 2 and second.error is None
        assert isinstance(retried, RanAlone) and retried.items == 32
        assert retried.seconds is not None and retried.seconds > 0.0
    finally:
        ex.close()


# ------------------------------------------------------ pool and dispatcher


@pytest.mark.slow
def test_every_answered_request_gives_the_core_an_alone_time():
    """Executor processes, the dispatcher and a core at sample rate 1: each
    answered request's alone-time arrives in the core."""
    config = emulated_config("emu", alpha_ms=1.0, beta_ms=4.0)

    async def scenario() -> None:
        arena = Arena.create(config, capacity=8)
        core = make_scheduler("clockwork", [DYNAMIC], devices(1))
        recorded: list[tuple[str, str, float]] = []
        record = core.record_alone_time

        def spy(model: str, app: str, seconds: float, now: float) -> list:
            recorded.append((model, app, seconds))
            return record(model, app, seconds, now)

        core.record_alone_time = spy  # type: ignore[method-assign]
        events = PoolEvents()
        dispatcher: Dispatcher | None = None

        def post(event: Any) -> None:
            events(event)
            if dispatcher is not None:
                dispatcher.post(event)

        pool = ExecutorPool(
            [ExecutorDevice(0, "emulated", "emulated:0")], [config], {"emu": arena}, post
        )
        try:
            await pool.start()
            group = CoreGroup(core, frozenset({"emu"}), (0,))
            dispatcher = Dispatcher([group], pool, alone_sample_rate=1.0)
            for n in range(1, 6):
                slots = arena.acquire_rows(1)
                assert slots is not None
                arena.write_rows(slots, {"x": np.full((1, 4), float(n), np.float32)})
                pending = dispatcher.submit_request("emu", slots, 0.2)
                finished = await asyncio.wait_for(pending.future, GIVE_UP_S)
                assert finished.error is None
                arena.release_rows(slots)
                give_up = time.monotonic() + GIVE_UP_S
                while len(recorded) < n:
                    assert time.monotonic() < give_up, f"request {n}: no alone-time"
                    await asyncio.sleep(0.005)
            assert len(recorded) == 5
            # ℓ(1) = 5 ms alone, one item: the core gets it as measured.
            assert all(m == "emu" and app == "" and s >= 0.005 for m, app, s in recorded)
            timed = [e for e in events.events if isinstance(e, AloneTimed)]
            assert len(timed) == 5 and all(e.device == 0 and e.items == 1 for e in timed)
        finally:
            await pool.stop()

    asyncio.run(scenario())
