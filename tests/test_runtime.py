"""Executors, shared-memory arenas and backends (real processes, real ONNX Runtime)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.errors import ExecutorFailed, InvalidInput
from app.repository.config import ModelConfig, TensorSpec
from app.runtime import backends as backends_mod
from app.runtime import devices as devices_mod
from app.runtime.arena import Arena
from app.runtime.backends import EmulatedBackend, OnnxBackend
from app.runtime.devices import ExecutorDevice, detect_devices
from app.runtime.events import BatchFinished, BatchStopped, DeviceDown
from app.runtime.executor import Executor
from app.runtime.messages import Ran, config_from_dict, config_to_dict
from app.runtime.pool import ExecutorPool
from tests.fakes import (
    PoolEvents,
    emulated_config,
    mlp_onnx,
    onnx_config,
    our_segments,
    picky_onnx,
)

ROOT = Path(__file__).resolve().parents[1]
# Arenas and executors: each test leaves no shared memory behind.
pytestmark = pytest.mark.usefixtures("no_leftover_segments")


# ----------------------------------------------------------------- builders
# -------------------------------------------------------------------- arena
def test_arena_slots_validation_and_gather_scatter(tmp_path):
    config = onnx_config("m", tmp_path / "unused.onnx", width=3)
    arena = Arena.create(config, capacity=2)
    try:
        assert os.path.exists(f"/dev/shm/{arena.name}")
        a, b = arena.acquire(), arena.acquire()
        assert {a, b} == {0, 1} and arena.acquire() is None
        arena.release(a)
        assert arena.acquire() == a and arena.acquire() is None
        with pytest.raises(ValueError):
            arena.release(5)

        arena.write_inputs(a, {"x": np.array([[1, 2, 3]], dtype=np.float32)})
        arena.write_inputs(b, {"x": np.array([4, 5, 6], dtype=np.float32)})
        with pytest.raises(InvalidInput, match="float64"):
            arena.write_inputs(a, {"x": np.zeros(3)})
        with pytest.raises(InvalidInput, match="shape"):
            arena.write_inputs(a, {"x": np.zeros((2, 3), dtype=np.float32)})
        with pytest.raises(InvalidInput, match="missing"):
            arena.write_inputs(a, {})
        with pytest.raises(InvalidInput, match="unexpected"):
            arena.write_inputs(a, {"x": np.zeros(3, np.float32), "z": np.zeros(1)})

        # The executor's side, attached by layout (same process here).
        other = Arena.attach(arena.layout)
        batch = other.gather("x", [b, a])
        assert batch.flags.c_contiguous
        np.testing.assert_array_equal(batch, [[4, 5, 6], [1, 2, 3]])
        other.scatter("y", [b, a], np.array([[40, 50, 60], [10, 20, 30]], np.float32))
        with pytest.raises(ValueError, match="shape"):
            other.scatter("y", [a], np.zeros((2, 3), np.float32))
        other.close()

        out = arena.read_outputs(a)
        assert out["y"].shape == (1, 3)
        np.testing.assert_array_equal(out["y"], [[10, 20, 30]])
        np.testing.assert_array_equal(arena.read_outputs(b)["y"], [[40, 50, 60]])
    finally:
        arena.close_and_unlink()
    assert not os.path.exists(f"/dev/shm/{arena.name}")
    arena.close_and_unlink()  # idempotent


def test_arena_rejects_unbounded_item_dims(tmp_path):
    config = ModelConfig(
        "d",
        "onnx",
        tmp_path,
        (TensorSpec("x", "FP32", (-1, -1)),),
        (TensorSpec("y", "FP32", (-1, 2)),),
        4,
        10.0,
    )
    with pytest.raises(ValueError, match="variable dimension without a bound \\(max_shape\\)"):
        Arena.create(config, 2)
    assert our_segments() == []


# ------------------------------------------------------- devices & backends
def test_detect_devices_layouts():
    cores = len(os.sched_getaffinity(0))
    (cpu,) = detect_devices(gpus=0)
    assert (cpu.kind, cpu.name, cpu.threads, cpu.cpus) == ("cpu", "cpu:0", cores, None)

    devs = detect_devices(cpu_slices=2, threads_per_slice=1, emulated=2, gpus=0)
    assert [d.name for d in devs] == ["cpu:0", "cpu:1", "emulated:0", "emulated:1"]
    assert [d.id for d in devs] == [0, 1, 2, 3]
    if cores >= 2:
        assert devs[0].cpus != devs[1].cpus and len(devs[0].cpus) == 1

    devs = detect_devices(emulated=1, gpus=2)
    assert [(d.kind, d.index) for d in devs] == [("cuda", 0), ("cuda", 1), ("emulated", 0)]
    devs = detect_devices(cpu_slices=1, gpus=1)
    assert [d.kind for d in devs] == ["cuda", "cpu"]


def test_cuda_paths_chosen_when_provider_available(monkeypatch):
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    for visible, count in (("0,1", 2), ("", 0), ("2,-1,3", 1)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert devices_mod.cuda_device_count() == count
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert [d.name for d in detect_devices()] == ["cuda:0", "cuda:1"]

    _, providers = OnnxBackend("cuda", 1).session_options_and_providers()
    assert providers[0] == ("CUDAExecutionProvider", {"device_id": 1})
    opts, providers = OnnxBackend("cpu", threads=3).session_options_and_providers()
    assert providers == ["CPUExecutionProvider"]
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (3, 1)
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert devices_mod.cuda_device_count() == 0
    with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
        OnnxBackend("cuda", 0).session_options_and_providers()


def test_config_round_trip_and_placement(tmp_path):
    config = emulated_config()
    assert config_from_dict(config_to_dict(config)) == config
    onnx_cfg = onnx_config("m", tmp_path / "m.onnx")
    assert config_from_dict(config_to_dict(onnx_cfg)) == onnx_cfg
    cpu, emu = ExecutorDevice(0, "cpu", "cpu:0"), ExecutorDevice(1, "emulated", "emulated:0")
    assert devices_mod.model_allowed_on(onnx_cfg, cpu)
    assert not devices_mod.model_allowed_on(onnx_cfg, emu)
    assert devices_mod.model_allowed_on(config, emu)
    assert not devices_mod.model_allowed_on(config, cpu)
    pinned = ModelConfig(**{**onnx_cfg.__dict__, "devices": ("cpu:1",)})
    assert not devices_mod.model_allowed_on(pinned, cpu)


def test_emulated_backend_in_process(monkeypatch):
    backend = EmulatedBackend()
    backend.load(emulated_config(alpha_ms=1.0, beta_ms=5.0))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    latency = 0.001 * 2 + 0.005  # ℓ(2)
    t0 = time.monotonic()
    out = backend.run({"x": x})
    took = time.monotonic() - t0
    assert took >= latency  # held for ℓ(2): never less
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["ids"], np.zeros((2, 2), np.int64))
    assert backends_mod.backend_supports("emulated", "emulated")
    # What it holds for: ℓ(2) from the start of the run (how closely the
    # hold keeps to it is measured by the benchmarks).
    holds: list[float] = []
    monkeypatch.setattr(backend, "hold", holds.append)
    t0 = time.monotonic()
    backend.run({"x": x})
    t1 = time.monotonic()
    (until,) = holds
    assert t0 + latency <= until <= t1 + latency


def test_an_emulated_batch_holds_its_device_from_its_start_copies_included(monkeypatch):
    """The executor writes an emulated batch's outputs first and then holds
    the device until started + ℓ(b): the copies count inside ℓ(b), as they
    would in a profiled ℓ(b), so the batch ends when the core planned it to."""
    config = emulated_config("emu", alpha_ms=2.0, beta_ms=20.0)
    arena = Arena.create(config, capacity=4)
    try:
        backend = EmulatedBackend()
        backend.load(config)
        sent: list[tuple] = []

        class Conn:
            def send(self, msg: tuple) -> None:
                sent.append(msg)

        executor = Executor(Conn(), {"name": "emulated:0", "kind": "emulated"})
        executor.backends["emu"] = backend
        executor.arenas["emu"] = arena
        slots = [arena.acquire() for _ in range(3)]
        for slot in slots:
            arena.write_inputs(slot, {"x": np.full(4, slot + 1.0, np.float32)})
        holds: list[tuple[float, list[float]]] = []

        def hold(until: float) -> None:  # records what the arena held by then
            holds.append((until, [float(arena.read_outputs(s)["x"][0, 0]) for s in slots]))

        monkeypatch.setattr(backend, "hold", hold)
        executor.run(7, "emu", slots, 0.0)
        (reply,) = sent
        assert isinstance(reply, Ran) and (reply.batch_id, reply.error) == (7, None)
        assert holds == [
            (pytest.approx(reply.started_at + 0.002 * 3 + 0.020, abs=1e-9), [1.0, 2.0, 3.0])
        ]
    finally:
        arena.close_and_unlink()


# ---------------------------------------------------------- through the pool
@pytest.mark.slow
def test_onnx_pool_matches_session_errors_and_profile(tmp_path):
    mlp_path = mlp_onnx(tmp_path / "mlp.onnx")
    big_path = mlp_onnx(tmp_path / "big.onnx", width=512, layers=2)
    configs = [
        onnx_config("mlp", mlp_path),
        onnx_config("picky", picky_onnx(tmp_path / "picky.onnx")),
        onnx_config("big", big_path, width=512),
        onnx_config("broken", tmp_path / "missing.onnx"),
    ]

    async def scenario():
        arenas = {c.name: Arena.create(c, capacity=4) for c in configs[:2]}
        done = PoolEvents()
        pool = ExecutorPool([ExecutorDevice(0, "cpu", "cpu:0", threads=1)], configs, arenas, done)
        try:
            await pool.start()
            assert pool.alive(0)
            assert sorted(pool.models_on(0)) == ["big", "mlp", "picky"]
            assert "broken" in pool.load_errors(0)

            # A batch of 3 requests in 3 slots: each slot gets its own row.
            rng = np.random.default_rng(1)
            xs = rng.standard_normal((3, 8)).astype(np.float32)
            arena = arenas["mlp"]
            slots = [arena.acquire() for _ in range(3)]
            for slot, row in zip(slots, xs, strict=True):
                arena.write_inputs(slot, {"x": row[None]})
            fut = done.expect(1)
            start_at = time.monotonic() + 0.05
            pool.submit(0, 1, "mlp", [slots[2], slots[0], slots[1]], start_at)
            ran = await asyncio.wait_for(fut, 10)
            assert isinstance(ran, BatchFinished) and (ran.device, ran.error) == (0, None)
            assert start_at <= ran.started_at <= ran.finished_at <= time.monotonic()
            session = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
            for slot, row in zip(slots, xs, strict=True):
                (expected,) = session.run(None, {"x": row[None]})
                got = arena.read_outputs(slot)["y"]
                assert got.shape == (1, 8)
                assert np.allclose(got, expected, atol=1e-6)

            # A batch that fails at run time is an error reply; the loop goes on.
            picky = arenas["picky"]
            p_slots = [picky.acquire() for _ in range(3)]
            for slot in p_slots:
                picky.write_inputs(slot, {"x": np.full(8, slot, np.float32)})
            bad, good = done.expect(2), done.expect(3)
            pool.submit(0, 2, "picky", p_slots[:2], 0.0)
            pool.submit(0, 3, "picky", p_slots, 0.0)
            error = (await asyncio.wait_for(bad, 10)).error
            assert error and "Reshape" in error
            assert (await asyncio.wait_for(good, 10)).error is None
            for slot in p_slots:
                np.testing.assert_array_equal(
                    picky.read_outputs(slot)["y"], np.full((1, 8), slot, np.float32)
                )
            # Slots outside the arena are an error too, not a crash.
            oob = done.expect(4)
            pool.submit(0, 4, "mlp", [99], 0.0)
            assert "out of range" in (await asyncio.wait_for(oob, 10)).error
            with pytest.raises(ExecutorFailed):
                pool.submit(0, 5, "broken", [0], 0.0)

            # Still serving.
            again = done.expect(6)
            pool.submit(0, 6, "mlp", slots, 0.0)
            assert (await asyncio.wait_for(again, 10)).error is None
            assert pool.alive(0)

            times = await pool.profile(0, "big", [1, 4, 16], warmup=2, repeats=7)
            assert sorted(times) == [1, 4, 16]
            assert all(t > 0 for t in times.values())
            # How the times compare is a timing claim (bench/, not here);
            # what must hold is that a model not loaded is an error.
            with pytest.raises(ExecutorFailed, match="not loaded"):
                await pool.profile(0, "broken", [1])
            assert our_segments()  # still there while running
        finally:
            await pool.stop(timeout=5)
        assert not pool.alive(0)
        assert our_segments() == []
        for arena in arenas.values():
            assert not os.path.exists(f"/dev/shm/{arena.name}")

    asyncio.run(scenario())


@pytest.mark.slow
def test_emulated_pool_timing_echo_cancel_and_death():
    config = emulated_config("emu", alpha_ms=2.0, beta_ms=20.0)
    slow = emulated_config("slow", alpha_ms=0.0, beta_ms=2000.0)

    async def scenario():
        arenas = {c.name: Arena.create(c, capacity=8) for c in (config, slow)}
        done = PoolEvents()
        pool = ExecutorPool(
            [ExecutorDevice(0, "emulated", "emulated:0")], [config, slow], arenas, done
        )
        try:
            await pool.start()
            arena = arenas["emu"]
            slots = [arena.acquire() for _ in range(3)]
            for slot in slots:
                arena.write_inputs(slot, {"x": np.full(4, 10.0 * slot + 1, np.float32)})
            expected_hold = 0.002 * 3 + 0.020
            fut = done.expect(1)
            pool.submit(0, 1, "emu", slots, 0.0)
            ran = await asyncio.wait_for(fut, 10)
            assert ran.error is None
            # Held for ℓ(3) from its start: never less (the claim of how
            # much more belongs to bench.preemption's timings).
            assert ran.finished_at - ran.started_at >= expected_hold
            for slot in slots:
                out = arena.read_outputs(slot)
                np.testing.assert_array_equal(out["x"], np.full((1, 4), 10.0 * slot + 1))
                np.testing.assert_array_equal(out["ids"], np.zeros((1, 2), np.int64))

            # start_at in the future is honoured (same monotonic clock).
            loop = asyncio.get_running_loop()
            start_at = loop.time() + 0.1
            fut = done.expect(2)
            pool.submit(0, 2, "emu", slots[:1], start_at)
            ran = await asyncio.wait_for(fut, 10)
            assert ran.error is None and ran.started_at >= start_at

            # Preemption: a running batch is terminated, a queued one skipped.
            s_arena = arenas["slow"]
            s_slot = s_arena.acquire()
            s_arena.write_inputs(s_slot, {"x": np.zeros(4, np.float32)})
            running, queued = done.expect(3), done.expect(4)
            submitted = time.monotonic()
            pool.submit(0, 3, "slow", [s_slot], 0.0)
            pool.submit(0, 4, "slow", [s_slot], 0.0)
            await asyncio.sleep(0.05)
            assert pool.cancel(0, 4) and pool.cancel(0, 3)
            stopped = await asyncio.wait_for(running, 5)
            skipped = await asyncio.wait_for(queued, 5)
            assert isinstance(stopped, BatchStopped) and isinstance(skipped, BatchStopped)
            # Stopped before its 2-s hold would have ended, the queued one
            # skipped after it.
            assert stopped.at < submitted + 2.0 and skipped.at >= stopped.at
            assert not pool.cancel(0, 4)

            # A SIGTERM to the process group (systemd stopping the daemon)
            # reaches the executor too: it leaves the stop to the parent.
            pid = pool.pid(0)
            os.kill(pid, signal.SIGTERM)
            fut = done.expect(7)
            pool.submit(0, 7, "emu", slots[:1], 0.0)
            ran = await asyncio.wait_for(fut, 10)
            assert ran.error is None and pool.pid(0) == pid and pool.alive(0)

            # An executor that dies fails its in-flight batches; the pool survives.
            lost = done.expect(5)
            pool.submit(0, 5, "slow", [s_slot], 0.0)
            os.kill(pool.pid(0), signal.SIGKILL)
            failed = await asyncio.wait_for(lost, 5)
            assert isinstance(failed, BatchFinished) and "died" in failed.error
            down = [e for e in done.events if isinstance(e, DeviceDown)]
            assert [d.device for d in down] == [0] and "died" in down[0].reason
            assert done.events.index(down[0]) < done.events.index(failed)
            assert not pool.alive(0)
            with pytest.raises(ExecutorFailed):
                pool.submit(0, 6, "emu", slots, 0.0)
        finally:
            await pool.stop(timeout=2)
        assert our_segments() == []

    asyncio.run(scenario())


@pytest.mark.slow
def test_no_resource_tracker_warnings_in_a_fresh_interpreter():
    """Create, attach from a spawned executor, stop: nothing on stderr."""
    script = textwrap.dedent(
        """
        import asyncio, numpy as np
        from pathlib import Path
        from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
        from app.runtime.arena import Arena
        from app.runtime.pool import ExecutorDevice, ExecutorPool

        cfg = ModelConfig("e", "emulated", Path("."), (TensorSpec("x", "FP32", (-1, 2)),),
                          (TensorSpec("x", "FP32", (-1, 2)),), 4, 100.0,
                          profile=ProfileSpec(alpha_ms=0.0, beta_ms=1.0))

        async def main():
            done = asyncio.get_running_loop().create_future()
            arenas = {"e": Arena.create(cfg, 2)}
            pool = ExecutorPool([ExecutorDevice(0, "emulated", "emulated:0")], [cfg], arenas,
                                lambda event: done.set_result(event))
            await pool.start()
            slot = arenas["e"].acquire()
            arenas["e"].write_inputs(slot, {"x": np.ones(2, np.float32)})
            pool.submit(0, 1, "e", [slot], 0.0)
            assert (await done).error is None
            await pool.stop()
            print("ok")

        asyncio.run(main())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert proc.stderr == ""


@pytest.mark.slow
def test_a_spawn_that_fails_surfaces_its_error_and_stops_the_rest(monkeypatch):
    """The second executor cannot start: pool.start raises that error (not a
    failure of the clean-up), and the first executor is stopped."""
    import multiprocessing.context as mp_context

    real_start = mp_context.SpawnProcess.start
    starts = []

    def start(self):
        starts.append(self.name)
        if len(starts) == 2:
            raise OSError(11, "Resource temporarily unavailable")
        real_start(self)

    monkeypatch.setattr(mp_context.SpawnProcess, "start", start)
    config = emulated_config("emu", alpha_ms=1.0, beta_ms=2.0)

    async def scenario():
        arenas = {config.name: Arena.create(config, capacity=2)}
        devices = [ExecutorDevice(i, "emulated", f"emulated:{i}") for i in range(2)]
        pool = ExecutorPool(devices, [config], arenas, PoolEvents())
        with pytest.raises(OSError, match="Resource temporarily unavailable"):
            await pool.start()
        first = pool.pid(0)
        assert first is not None and not pool.alive(0)
        with pytest.raises(ProcessLookupError):  # stopped and reaped
            os.kill(first, 0)
        assert pool.pid(1) is None
        assert our_segments() == []

    asyncio.run(scenario())
