"""Executors as Ray actors (app/runtime/ray_pool.py) on a local Ray instance:
outputs equal to local executors', through the shared arena and through the
object store; exactly one event per batch; a cancelled batch stopped; an
actor killed mid-batch brought back; the service serving over them."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import numpy as np
import pytest
import ray

from app.errors import ExecutorFailed
from app.repository.loader import load_repository
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.events import (
    AloneStopped,
    AloneTimed,
    BatchFinished,
    BatchStopped,
    DeviceDown,
    DeviceParked,
    DeviceUnparked,
    DeviceUp,
)
from app.runtime.pool import ExecutorPool
from app.runtime.ray_fit import ActorInfeasible
from app.runtime.ray_pool import NotSupportedOnRay, RayExecutorPool
from app.server import startup
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from app.server.startup import StartupFailed
from tests.fakes import (
    PoolEvents,
    elastic_config,
    emulated_config,
    mlp_onnx,
    onnx_config,
    shout_double_onnx,
)
from tests.test_statistics import emulated_repository

pytestmark = [
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.usefixtures("ray_local", "no_leftover_segments"),
]

CPU = ExecutorDevice(0, "cpu", "cpu:0", threads=1)
EMU = ExecutorDevice(1, "emulated", "emu:0")
HARD_TIMEOUT_S = 120.0  # every scenario, start and stop included


@pytest.fixture(scope="module")
def ray_local() -> Iterator[str]:
    """A local Ray instance with 2 CPUs for the module; its address. The
    instance runs without token authentication, as bench/ray_cluster.py's
    clusters do: a driver that once ran with it fails to run actors on a
    cluster without it. The environment `ray.init` changed is restored."""
    environ = dict(os.environ)
    os.environ["RAY_AUTH_MODE"] = "disabled"  # as bench/ray_cluster.py's clusters run
    info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield info.address_info["address"]
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(environ)


def run(scenario: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, HARD_TIMEOUT_S))


async def mlp_outputs(pool_kind: str, tmp_path: Any, xs: np.ndarray, **options: Any) -> np.ndarray:
    """Run `xs` as batches of 3 rows through a pool of one CPU executor;
    every batch's single event checked; the outputs, row by row."""
    config = onnx_config("mlp", mlp_onnx(tmp_path / "mlp.onnx"))
    arena = Arena.create(config, capacity=32)
    events = PoolEvents()
    cls = RayExecutorPool if pool_kind == "ray" else ExecutorPool
    pool = cls([CPU], [config], {"mlp": arena}, events, **options)
    try:
        await pool.start()
        assert pool.models_on(CPU.id) == ["mlp"]
        slots = arena.acquire_rows(len(xs))
        assert slots is not None
        arena.write_rows(slots, {"x": xs})
        batches = [slots[i : i + 3] for i in range(0, len(slots), 3)]
        futures = [events.expect(i) for i in range(len(batches))]
        start_at = time.monotonic()
        for i, rows in enumerate(batches):
            pool.submit(CPU.id, i, "mlp", rows, start_at)
        done = await asyncio.gather(*futures)
        assert [(e.batch_id, e.error) for e in done] == [(i, None) for i in range(len(batches))]
        assert all(e.started_at <= e.finished_at for e in done)
        await asyncio.sleep(0.1)  # nothing more comes
        ends = [e for e in events.events if isinstance(e, BatchFinished | BatchStopped)]
        assert sorted(e.batch_id for e in ends) == list(range(len(batches)))
        assert pool.inflight(CPU.id) == {}
        return arena.read_rows(slots)["y"]
    finally:
        await pool.stop()


def test_outputs_equal_local_executors_through_the_arena_and_the_object_store(tmp_path):
    xs = np.random.default_rng(3).standard_normal((10, 8)).astype(np.float32)
    local = run(mlp_outputs("local", tmp_path, xs))
    on_ray = run(mlp_outputs("ray", tmp_path, xs))  # the batch channel
    by_calls = run(mlp_outputs("ray", tmp_path, xs, channel=False))
    remote = run(mlp_outputs("ray", tmp_path, xs, all_remote=True))
    assert local.shape == (10, 8)
    assert np.abs(local).sum() > 0
    np.testing.assert_array_equal(on_ray, local)
    np.testing.assert_array_equal(by_calls, local)
    np.testing.assert_array_equal(remote, local)


def test_items_beyond_their_slots_cross_to_an_actor_on_another_node_and_back(tmp_path):
    """An actor that cannot open the daemon's segments (all_remote) gets the
    spilled items beside the slot bytes and returns its spilled answers
    the same way: every answer whole, no segment left on either side."""
    config = elastic_config("elastic", shout_double_onnx(tmp_path / "shout.onnx"))

    async def scenario() -> None:
        arena = Arena.create(config, capacity=8)
        events = PoolEvents()
        pool = RayExecutorPool([CPU], [config], {"elastic": arena}, events, all_remote=True)
        try:
            await pool.start()
            assert pool.remote(CPU.id)
            texts = [b"short", "ü".encode() * 40]  # 5 and 80 bytes: slots hold 8
            requests = [arena.acquire_rows(1) for _ in texts]
            for slots, text, length in zip(requests, texts, [3, 50], strict=True):
                x = np.arange(length, dtype=np.float32).reshape(1, length)
                arena.write_rows(slots, {"text": np.array([[text]], object), "x": x})
            assert arena.spills.spilled(requests[1]) == ["input 'text'", "input 'x'"]
            done = events.expect(1)
            pool.submit(CPU.id, 1, "elastic", requests[0] + requests[1], time.monotonic())
            finished = await done
            assert isinstance(finished, BatchFinished) and finished.error is None
            assert sorted(arena.spills.spilled(requests[1])) == [
                "input 'text'", "input 'x'", "output 'loud'", "output 'y'"
            ]  # fmt: skip
            for slots, text, length in zip(requests, texts, [3, 50], strict=True):
                out = arena.read_rows(slots)
                assert out["loud"].tolist() == [[text + b"!"]]
                np.testing.assert_array_equal(out["y"], 2 * np.arange(length)[np.newaxis])
                arena.release_rows(slots)
        finally:
            await pool.stop()
            arena.close_and_unlink()

    run(scenario())


def test_a_cpu_slice_is_fitted_to_the_node_and_an_infeasible_one_is_named_at_once(tmp_path):
    config = onnx_config("mlp", mlp_onnx(tmp_path / "mlp.onnx"))
    wide = ExecutorDevice(0, "cpu", "cpu:0", threads=4)  # the instance has 2 CPUs

    async def scenario() -> None:
        arena = Arena.create(config, capacity=8)
        pool = RayExecutorPool([wide], [config], {"mlp": arena}, PoolEvents())
        try:
            await pool.start()
            assert pool.request(0) == {"CPU": 2.0}
            assert pool.devices[0].threads == 2
            assert pool.models_on(0) == ["mlp"] and pool.alive(0)
        finally:
            await pool.stop()
        arena = Arena.create(config, capacity=8)
        exact = RayExecutorPool([wide], [config], {"mlp": arena}, PoolEvents(), fit_threads=False)
        with pytest.raises(ActorInfeasible) as error:
            await exact.start(timeout=60.0)  # named before any wait, not after it
        text = str(error.value)
        assert text.startswith("executor cpu:0: its Ray actor asks for 4 CPU")
        assert ": 2 CPU, 0 GPU" in text  # what the node offers
        assert exact.actor(0) is None  # nothing was created

    run(scenario())


def test_stop_comes_after_the_batches_sent_on_the_channel():
    config = emulated_config(alpha_ms=100.0, beta_ms=0.0)  # 100 ms a batch

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events)
        await pool.start()
        assert pool.channelled(EMU.id)
        slots = arena.acquire_rows(3)
        ends = [events.expect(i) for i in range(3)]
        for i in range(3):
            pool.submit(EMU.id, i, "emu", slots[i : i + 1], time.monotonic())
        await pool.stop(timeout=10.0)  # the stop reaches the actor before the batches run
        done = await asyncio.gather(*ends)
        assert [(e.batch_id, e.error) for e in done] == [(0, None), (1, None), (2, None)]
        assert all(e.finished_at - e.started_at >= 0.09 for e in done)  # each one ran

    run(scenario())


def test_batches_go_through_the_channel_and_its_close_is_the_actors_death():
    config = emulated_config(alpha_ms=1000.0, beta_ms=0.0)  # 1 s a batch

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events, heartbeat_timeout_s=0)
        try:
            await pool.start()
            assert pool.channelled(EMU.id)
            slots = arena.acquire_rows(1)
            lost = events.expect(1)
            pool.submit(EMU.id, 1, "emu", slots, time.monotonic())
            await asyncio.sleep(0.3)  # running
            os.kill(pool.pid(EMU.id), signal.SIGKILL)
            failed = await lost
            assert isinstance(failed, BatchFinished) and "channel closed" in failed.error
            assert [type(e).__name__ for e in events.events] == ["DeviceDown", "BatchFinished"]
            while not pool.alive(EMU.id):
                await asyncio.sleep(0.05)
            assert pool.channelled(EMU.id)  # a new channel to the new process
        finally:
            await pool.stop()

    run(scenario())


def test_start_measures_the_dispatch_delays_and_names_the_actor():
    config = emulated_config(alpha_ms=1.0, beta_ms=5.0)

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, PoolEvents(), all_remote=True)
        try:
            await pool.start()
            assert 0 < pool.dispatch_overhead_s < 1.0
            assert pool.bytes_per_s > 1e6
            assert pool.alive(EMU.id) and pool.remote(EMU.id)
            pid = pool.pid(EMU.id)
            assert isinstance(pid, int) and pid > 0
            assert pool.node_of(EMU.id) == ray.get_runtime_context().get_node_id()
            d_ctrl, d_data = pool.delays_for(["emu"], [EMU.id])
            assert d_ctrl == pool.dispatch_overhead_s
            assert d_data == pytest.approx(arena.layout["slot_nbytes"] / pool.bytes_per_s)
            with pytest.raises(NotSupportedOnRay, match="reshare is not supported on Ray"):
                await pool.reshare(EMU.id, 0.5)
        finally:
            await pool.stop()

    run(scenario())


def test_a_cancelled_queued_batch_stops_and_the_running_one_finishes():
    config = emulated_config(alpha_ms=200.0, beta_ms=0.0)  # 200 ms a batch

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events)
        try:
            await pool.start()
            slots = arena.acquire_rows(2)
            first, second = events.expect(1), events.expect(2)
            pool.submit(EMU.id, 1, "emu", slots[:1], time.monotonic())
            pool.submit(EMU.id, 2, "emu", slots[1:], time.monotonic())
            assert pool.cancel(EMU.id, 2)
            ran, stopped = await asyncio.gather(first, second)
            assert isinstance(ran, BatchFinished) and ran.error is None
            assert ran.finished_at - ran.started_at >= 0.19
            assert isinstance(stopped, BatchStopped) and stopped.batch_id == 2
            assert not pool.cancel(EMU.id, 2)  # answered already
            await asyncio.sleep(0.1)
            assert [type(e).__name__ for e in events.events] == ["BatchFinished", "BatchStopped"]
        finally:
            await pool.stop()

    run(scenario())


def test_an_actor_killed_mid_batch_fails_its_batch_once_and_comes_back():
    config = emulated_config(alpha_ms=1000.0, beta_ms=0.0)  # 1 s a batch

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        # Ray's own notice of the death, not the heartbeat (which may see
        # the silence first: test_a_hung_actor_...).
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events, heartbeat_timeout_s=0)
        try:
            await pool.start()
            pid = pool.pid(EMU.id)
            slots = arena.acquire_rows(2)
            lost = events.expect(1)
            pool.submit(EMU.id, 1, "emu", slots[:1], time.monotonic())
            await asyncio.sleep(0.3)  # running
            ray.kill(pool.actor(EMU.id), no_restart=False)
            failed = await lost
            assert isinstance(failed, BatchFinished) and "died" in failed.error
            assert isinstance(events.events[0], DeviceDown)
            assert events.events[1] == failed
            assert not pool.alive(EMU.id)
            while not any(isinstance(e, DeviceUp) for e in events.events):
                await asyncio.sleep(0.05)
            assert pool.alive(EMU.id) and pool.restarts(EMU.id) == 1
            assert pool.pid(EMU.id) != pid  # a new worker process
            assert pool.last_respawn_s(EMU.id) > 0
            again = events.expect(2)
            pool.submit(EMU.id, 2, "emu", slots[1:], time.monotonic())
            served = await again
            assert isinstance(served, BatchFinished) and served.error is None
            ends = [e.batch_id for e in events.events if isinstance(e, BatchFinished)]
            assert ends == [1, 2]  # each batch answered exactly once
        finally:
            await pool.stop()

    run(scenario())


async def hang_scenario(hang: str) -> None:
    """A batch that hangs (`stuck`: runs far past its profile; `frozen`: the
    actor's process stopped): DeviceDown naming the rule, the batch failed
    once (a 30-s batch: nothing else ends it with that error within the
    test's timeout), the actor back as a new process that serves."""
    slow = emulated_config("slow", alpha_ms=30_000.0, beta_ms=0.0)
    quick = emulated_config("quick", alpha_ms=1.0, beta_ms=1.0)
    arenas = {c.name: Arena.create(c, capacity=16) for c in (slow, quick)}
    events = PoolEvents()
    pool = RayExecutorPool(
        [EMU],
        [slow, quick],
        arenas,
        events,
        stuck_factor=2.0,
        stuck_margin_s=0.1,
        heartbeat_timeout_s=0.5,
    )
    if hang == "stuck":  # the profile the service would give the slow model: 20 ms
        pool.expected_latency = lambda model, size: 0.02 if model == "slow" else None
    try:
        await pool.start()
        pid = pool.pid(EMU.id)
        assert pid is not None
        lost = events.expect(1)
        pool.submit(EMU.id, 1, "slow", arenas["slow"].acquire_rows(1), time.monotonic())
        if hang == "frozen":
            await asyncio.sleep(0.05)
            os.kill(pid, signal.SIGSTOP)
        failed = await lost
        assert isinstance(failed, BatchFinished)
        down = events.events[0]
        assert isinstance(down, DeviceDown)
        rule = "stuck: batch 1 of slow ×1" if hang == "stuck" else "hung: no heartbeat"
        assert rule in down.reason and rule in failed.error
        while not any(isinstance(e, DeviceUp) for e in events.events):
            await asyncio.sleep(0.05)
        assert pool.alive(EMU.id) and pool.restarts(EMU.id) == 1 and pool.pid(EMU.id) != pid
        assert not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z"
        again = events.expect(2)
        pool.submit(EMU.id, 2, "quick", arenas["quick"].acquire_rows(1), time.monotonic())
        served = await again
        assert isinstance(served, BatchFinished) and served.error is None
        ends = [e.batch_id for e in events.events if isinstance(e, BatchFinished)]
        assert ends == [1, 2]  # each batch answered exactly once
    finally:
        await pool.stop()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    return text[text.rindex(")") + 2]


@pytest.mark.parametrize("hang", ["stuck", "frozen"])
def test_a_hung_actor_is_killed_its_batch_failed_once_and_it_comes_back(hang):
    run(hang_scenario(hang))


def test_a_parked_actor_finishes_its_batch_frees_its_process_and_a_new_one_serves():
    config = emulated_config(alpha_ms=300.0, beta_ms=0.0)  # 0.3 s a batch

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events)
        try:
            await pool.start()
            pid = pool.pid(EMU.id)
            slots = arena.acquire_rows(2)
            held = events.expect(1)
            pool.submit(EMU.id, 1, "emu", slots[:1], time.monotonic())
            await pool.parking.park(EMU.id)
            # Told first; the batch it held ran and was answered as usual.
            assert isinstance(events.events[0], DeviceParked)
            finished = await held
            assert isinstance(finished, BatchFinished) and finished.error is None
            assert pool.parking.parked(EMU.id) and not pool.alive(EMU.id)
            with pytest.raises(ValueError, match="parked already"):
                await pool.parking.park(EMU.id)
            with pytest.raises(ExecutorFailed):
                pool.submit(EMU.id, 2, "emu", slots[1:], time.monotonic())
            for _ in range(100):  # the actor's worker process goes away
                if not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z":
                    break
                await asyncio.sleep(0.05)
            assert not os.path.exists(f"/proc/{pid}") or _state(pid) == "Z"

            took = await pool.parking.unpark(EMU.id)
            unparked = [e for e in events.events if isinstance(e, DeviceUnparked)]
            assert [(e.device, e.start_s) for e in unparked] == [(EMU.id, took)] and took > 0
            assert (
                pool.alive(EMU.id) and not pool.parking.parked(EMU.id) and pool.pid(EMU.id) != pid
            )
            with pytest.raises(ValueError, match="is not parked"):
                await pool.parking.unpark(EMU.id)
            again = events.expect(2)
            pool.submit(EMU.id, 2, "emu", slots[1:], time.monotonic())
            assert (await again).error is None
            # Parking is no fault: no DeviceDown, no restart.
            assert not any(isinstance(e, DeviceDown) for e in events.events)
            assert pool.restarts(EMU.id) == 0
        finally:
            await pool.stop()

    run(scenario())


def test_a_service_with_autoscale_on_ray_parks_the_devices_above_min(tmp_path, ray_local):
    repository = emulated_repository(tmp_path / "models", {"m": 2.0}, slo_ms=2000)
    # Work-conserving: the batch goes at once. Under `symphony` it would wait
    # for its last moment (deadline − ℓ(b) − DEADLINE_MARGIN_MS, 2 s on), and
    # a timer or Ray call a few ms late on a busy box then prunes a request
    # ("the deadline cannot be met"): what this test checks is the parking.
    settings = Settings(
        repository=repository,
        policy="symphony-wc",
        cpu_slices=0,
        emulated_devices=2,
        ray_address=ray_local,
        autoscale=(1, 2),
    )

    async def scenario() -> None:
        service = LiveService(settings, Metrics())
        await service.start()
        try:
            pool = service.pool
            assert isinstance(pool, RayExecutorPool)
            assert sorted(pool.parking.parked(d) for d in (0, 1)) == [False, True]
            xs = [np.full((1, 4), float(i), dtype=np.float32) for i in range(10)]
            answers = await asyncio.gather(*(service.infer("m", {"x": x}) for x in xs))
            serving = next(d for d in (0, 1) if not pool.parking.parked(d))
            assert {a.device for a in answers} == {f"emulated:{serving}"}
        finally:
            await service.stop()

    run(scenario())


async def wait_for_event(events: PoolEvents, kind: type, count: int = 1) -> list[Any]:
    while len(found := [e for e in events.events if isinstance(e, kind)]) < count:
        await asyncio.sleep(0.02)
    return found


@pytest.mark.parametrize("remote", [False, True])
def test_samples_are_re_run_alone_once_the_actor_is_idle(remote):
    config = emulated_config(alpha_ms=0.0, beta_ms=40.0)  # ℓ(1) = 40 ms

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events, all_remote=remote)
        try:
            await pool.start()
            slots = arena.acquire_rows(3)
            done = events.expect(1)
            # Three requests of one item; the first and the third sampled.
            pool.submit(EMU.id, 1, "emu", slots, time.monotonic(), ((0, 1, "a"), (2, 1, "b")))
            assert (await done).error is None
            timed = await wait_for_event(events, AloneTimed, 2)
            assert sorted(e.app for e in timed) == ["a", "b"]
            assert all(e.items == 1 and e.seconds >= 0.040 for e in timed)
            await asyncio.sleep(0.2)  # nothing more: both samples were used
            assert len([e for e in events.events if isinstance(e, AloneTimed)]) == 2
        finally:
            await pool.stop()

    run(scenario())


def test_a_batch_sent_during_a_re_run_stops_it_and_the_sample_is_tried_again():
    config = emulated_config(alpha_ms=0.0, beta_ms=800.0)  # a re-run of 0.8 s

    async def scenario() -> None:
        arena = Arena.create(config, capacity=16)
        events = PoolEvents()
        pool = RayExecutorPool([EMU], [config], {"emu": arena}, events)
        try:
            await pool.start()
            slots = arena.acquire_rows(2)
            first = events.expect(1)
            pool.submit(EMU.id, 1, "emu", slots[:1], time.monotonic(), ((0, 1, "a"),))
            assert (await first).error is None
            await asyncio.sleep(0.3)  # the sample is re-running (for 0.8 s)
            second = events.expect(2)
            sent = time.monotonic()
            pool.submit(EMU.id, 2, "emu", slots[1:], sent)
            (stopped,) = await wait_for_event(events, AloneStopped)
            assert (stopped.model, stopped.app, stopped.items) == ("emu", "a", 1)
            finished = await second
            assert finished.error is None and finished.started_at - sent < 0.4
            (timed,) = await wait_for_event(events, AloneTimed)
            assert timed.app == "a" and timed.seconds >= 0.8
            kinds = [type(e).__name__ for e in events.events]
            assert kinds == ["BatchFinished", "AloneStopped", "BatchFinished", "AloneTimed"]
        finally:
            await pool.stop()

    run(scenario())


# ------------------------------------------------------------- the daemon
def test_a_service_with_ray_address_serves_requests_on_ray_actors(tmp_path, ray_local):
    repository = emulated_repository(tmp_path / "models", {"m": 2.0}, slo_ms=2000)
    settings = Settings(
        repository=repository, cpu_slices=0, emulated_devices=2, ray_address=ray_local
    )

    async def scenario() -> None:
        service = LiveService(settings, Metrics())
        await service.start()
        try:
            pool = service.pool
            assert isinstance(pool, RayExecutorPool)
            assert [pool.alive(d) for d in (0, 1)] == [True, True]
            assert service.dispatcher is not None
            (group,) = service.dispatcher.groups
            assert group.scheduler.d_ctrl == pool.dispatch_overhead_s > 0
            assert group.scheduler.d_data == 0.0  # both actors share the daemon's arena
            xs = [np.full((1, 4), float(i), dtype=np.float32) for i in range(20)]
            answers = await asyncio.gather(*(service.infer("m", {"x": x}) for x in xs))
            for x, answer in zip(xs, answers, strict=True):
                np.testing.assert_array_equal(answer.outputs["x"], x)
            assert {a.device for a in answers} <= {"emulated:0", "emulated:1"}
            assert service.outstanding("m") == 0
        finally:
            await service.stop()

    run(scenario())


def test_models_load_and_unload_on_ray_actors_while_serving(tmp_path, ray_local):
    from app.errors import ModelUnloaded
    from app.server import model_control

    root = tmp_path / "models"
    repository = emulated_repository(root, {"m": 2.0}, slo_ms=2000)
    settings = Settings(
        repository=repository, cpu_slices=0, emulated_devices=2, ray_address=ray_local
    )
    x = np.full((1, 4), 3.0, dtype=np.float32)

    async def scenario() -> None:
        service = LiveService(settings, Metrics())
        await service.start()
        try:
            pool = service.pool
            assert isinstance(pool, RayExecutorPool)
            emulated_repository(root, {"m2": 1.0}, slo_ms=2000)  # a model added on disk
            await model_control.load(service, "m2")
            assert [sorted(pool.models_on(d)) for d in (0, 1)] == [["m", "m2"]] * 2
            answer = await service.infer("m2", {"x": x})
            np.testing.assert_array_equal(answer.outputs["x"], x)

            await model_control.unload(service, "m")
            assert [pool.models_on(d) for d in (0, 1)] == [["m2"]] * 2
            with pytest.raises(ModelUnloaded, match="model 'm' is unloaded"):
                await service.infer("m", {"x": x})
            answer = await service.infer("m2", {"x": x})  # the other one still serves
            np.testing.assert_array_equal(answer.outputs["x"], x)
        finally:
            await service.stop()

    run(scenario())


def test_ray_address_without_ray_installed_stops_start_up_naming_the_extra(tmp_path, monkeypatch):
    repository = emulated_repository(tmp_path / "models", {"m": 2.0})
    settings = Settings(repository=repository, cpu_slices=0, ray_address="auto")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    index = load_repository(repository)
    arenas = {"m": Arena.create(index.models["m"], 8)}
    with pytest.raises(StartupFailed, match=re.escape("pip install -e '.[ray]'")):
        startup.ray_pool(settings, [EMU], index, arenas, PoolEvents())
    assert all(arena.closed for arena in arenas.values())


def test_ray_nodes_place_executors_on_the_named_node(tmp_path, ray_local):
    repository = emulated_repository(tmp_path / "models", {"m": 2.0})
    index = load_repository(repository)
    (node,) = [n for n in ray.nodes() if n["Alive"]]
    ip, node_id = node["NodeManagerAddress"], node["NodeID"]

    settings = Settings(repository=repository, ray_address="auto", ray_nodes={EMU.id: ip})
    arenas = {"m": Arena.create(index.models["m"], 8)}
    pool = startup.ray_pool(settings, [EMU], index, arenas, PoolEvents())
    assert pool.nodes == {EMU.id: node_id}

    async def placed() -> str:
        await pool.start()
        try:
            return pool.node_of(EMU.id)
        finally:
            await pool.stop()

    assert run(placed()) == node_id
    for arena in arenas.values():
        arena.close_and_unlink()

    # `local`: the daemon's own node.
    settings = Settings(repository=repository, ray_address="auto", ray_nodes={EMU.id: "local"})
    arenas = {"m": Arena.create(index.models["m"], 8)}
    pool = startup.ray_pool(settings, [EMU], index, arenas, PoolEvents())
    assert pool.nodes == {EMU.id: ray.get_runtime_context().get_node_id()}
    for arena in arenas.values():
        arena.close_and_unlink()

    # A node the cluster lacks stops start-up naming the live ones.
    settings = Settings(repository=repository, ray_address="auto", ray_nodes={EMU.id: "10.9.9.9"})
    arenas = {"m": Arena.create(index.models["m"], 8)}
    with pytest.raises(StartupFailed, match=f"is not a live node of the cluster .{node_id[:12]}"):
        startup.ray_pool(settings, [EMU], index, arenas, PoolEvents())
    assert all(arena.closed for arena in arenas.values())


def test_ray_nodes_without_ray_address_stops_start_up(tmp_path):
    repository = emulated_repository(tmp_path / "models", {"m": 2.0})
    settings = Settings(repository=repository, cpu_slices=0, ray_nodes={EMU.id: "10.0.0.2"})
    index = load_repository(repository)
    with pytest.raises(StartupFailed, match="RAY_NODES places Ray executors: it needs RAY_ADDRESS"):
        run(startup.start_executors(settings, [EMU], index, PoolEvents()))
