"""Spatial sharing in the runtime: which cores each CPU share gets, devices
split into shares, MPS for GPU shares (with a fake control program), an
emulated share's speed, and two pinned CPU executors serving at once."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.runtime import devices as devices_mod
from app.runtime.arena import Arena
from app.runtime.backends import EmulatedBackend, make_backend
from app.runtime.devices import ExecutorDevice, detect_devices, model_allowed_on, split_devices
from app.runtime.events import BatchFinished
from app.runtime.mps import (
    MPS_CONTROL,
    PIPE_DIRECTORY,
    THREAD_PERCENTAGE,
    GpuSharing,
    MpsPlan,
    executor_env,
    plan_mps,
    thread_percentage,
)
from app.runtime.pool import ExecutorPool
from app.runtime.shares import (
    parse_device_shares,
    shared_cores,
    show_device_shares,
    split_cores,
)
from app.server.profiling import device_tag
from tests.fakes import PoolEvents, emulated_config, mlp_onnx, onnx_config


# -------------------------------------------------------------- split_cores
def test_each_share_gets_contiguous_cores_of_its_own_when_there_are_enough():
    assert split_cores((0, 1), (0.5, 0.5)) == ((0,), (1,))
    assert split_cores((0, 1, 2), (0.5, 0.5)) == ((0, 1), (2,))  # remainder: earlier share
    assert split_cores(range(8), (0.25, 0.75)) == ((0, 1), (2, 3, 4, 5, 6, 7))
    assert split_cores((2, 5, 7, 9), (0.5, 0.5)) == ((2, 5), (7, 9))  # the given cores, in order
    assert split_cores(range(4), (0.25, 0.25)) == ((0,), (1,))  # half the device: 2 cores
    assert split_cores(range(4), (0.5,)) == ((0, 1),)
    # At least one core each: the large share gives one up.
    assert split_cores(range(10), (0.98, 0.01, 0.01)) == (tuple(range(8)), (8,), (9,))
    assert split_cores((0, 1), (0.9, 0.1)) == ((0,), (1,))
    assert shared_cores(split_cores(range(10), (0.98, 0.01, 0.01))) == {}


def test_apportioned_cores_never_overlap_and_cover_the_shares_part():
    rng = np.random.default_rng(3)
    for n, m in itertools.product(range(1, 9), range(1, 6)):
        if m > n:
            continue
        for _ in range(20):
            raw = rng.uniform(0.05, 1.0, m)
            shares = tuple(float(s) for s in raw / raw.sum() * rng.uniform(0.3, 1.0))
            split = split_cores(range(n), shares)
            flat = [c for cores in split for c in cores]
            assert all(len(cores) >= 1 for cores in split)
            assert flat == list(range(len(flat)))  # contiguous, in order, disjoint
            assert len(flat) == max(m, min(n, round(sum(shares) * n)))
            for cores, share in zip(split, shares, strict=True):
                # Largest remainder with a minimum of one: within a core of the quota
                # unless the minimums forced a larger share down.
                assert len(cores) <= max(1, share * n) + 1


def test_more_shares_than_cores_share_cores_and_say_which():
    split = split_cores((0, 1), (1 / 3, 1 / 3, 1 / 3))
    assert split == ((0,), (1,), (1,))
    assert shared_cores(split) == {1: (1, 2)}
    assert split_cores((4,), (0.5, 0.5)) == ((4,), (4,))
    assert shared_cores(split_cores((4,), (0.5, 0.5))) == {4: (0, 1)}
    assert split_cores((0, 1), (0.1, 0.1, 0.8)) == ((0,), (0,), (1,))


def test_split_cores_refuses_bad_input():
    with pytest.raises(ValueError, match="cores must be distinct and at least one"):
        split_cores((), (0.5,))
    with pytest.raises(ValueError, match="cores must be distinct"):
        split_cores((0, 0), (0.5,))
    with pytest.raises(ValueError, match=r"shares sum to 1\.2, more than the whole device"):
        split_cores((0, 1), (0.6, 0.6))
    with pytest.raises(ValueError, match=r"a share must be in \(0, 1\], got 0"):
        split_cores((0, 1), (0.5, 0))


# ------------------------------------------------------------ the setting
def test_device_shares_text_round_trips():
    text = "cpu=0.5,0.5;cuda:0=0.3,0.3,0.4;emulated:1=0.25"
    shares = parse_device_shares(text)
    assert shares == {"cpu": (0.5, 0.5), "cuda:0": (0.3, 0.3, 0.4), "emulated:1": (0.25,)}
    assert show_device_shares(shares) == text
    assert parse_device_shares("cpu=" + ",".join(["0.1"] * 10))["cpu"] == (0.1,) * 10


# ------------------------------------------------------------ split devices
def test_detect_devices_splits_the_devices_named(monkeypatch):
    monkeypatch.setattr(devices_mod, "_visible_cores", lambda: [0, 1, 2, 3])
    devs = detect_devices(emulated=2, gpus=0, shares={"cpu": (0.25, 0.75), "emulated:1": (0.5,)})
    assert [(d.id, d.name, d.kind, d.share) for d in devs] == [
        (0, "cpu:0/0", "cpu", 0.25),
        (1, "cpu:0/1", "cpu", 0.75),
        (2, "emulated:0", "emulated", 1.0),
        (3, "emulated:1/0", "emulated", 0.5),
    ]
    assert [(d.cpus, d.threads) for d in devs[:2]] == [((0,), 1), ((1, 2, 3), 3)]
    assert [d.whole for d in devs] == ["cpu:0", "cpu:0", "emulated:0", "emulated:1"]
    assert devs[3].index == 1

    # A slice keeps to its own cores; GPUs keep their ordinal.
    devs = detect_devices(cpu_slices=2, emulated=0, gpus=2, shares={"cpu:1": (0.5, 0.5)})
    assert [d.name for d in devs] == ["cuda:0", "cuda:1", "cpu:0", "cpu:1/0", "cpu:1/1"]
    assert [d.cpus for d in devs[2:]] == [(0, 1), (2,), (3,)]
    devs = detect_devices(cpu_slices=0, emulated=0, gpus=2, shares={"cuda:1": (0.3, 0.7)})
    assert [(d.name, d.index, d.share) for d in devs] == [
        ("cuda:0", 0, 1.0),
        ("cuda:1/0", 1, 0.3),
        ("cuda:1/1", 1, 0.7),
    ]


def test_split_devices_refuses_what_names_nothing_or_twice():
    devs = [ExecutorDevice(0, "cpu", "cpu:0", cpus=(0, 1)), ExecutorDevice(1, "cuda", "cuda:0")]
    with pytest.raises(ValueError, match=r"'cuda:1' names no device of this server \(cpu:0, cuda"):
        split_devices(devs, {"cuda:1": (0.5,)})
    with pytest.raises(ValueError, match="cpu:0 is given by both 'cpu' and 'cpu:0'"):
        split_devices(devs, {"cpu": (0.5,), "cpu:0": (0.5,)})
    with pytest.raises(ValueError, match=r"shares sum to 1\.5"):
        split_devices(devs, {"cuda": (0.75, 0.75)})
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\], got 0"):
        ExecutorDevice(0, "cuda", "cuda:0", share=0.0)


def test_more_cpu_shares_than_cores_are_said_in_a_log_line(caplog):
    devs = [ExecutorDevice(0, "cpu", "cpu:0", cpus=(0, 1))]
    with caplog.at_level(logging.WARNING, logger="app.runtime.devices"):
        split = split_devices(devs, {"cpu": (0.25, 0.25, 0.5)})
    assert [(d.cpus, d.threads) for d in split] == [((0,), 1), ((0,), 1), ((1,), 1)]
    (record,) = caplog.records
    assert record.getMessage() == (
        "cpu:0: 3 shares on 2 cores, so cpu:0/0 and cpu:0/1 run on core 0 together"
    )


def test_a_model_naming_a_device_runs_on_each_of_its_shares():
    devs = split_devices([ExecutorDevice(0, "cuda", "cuda:0")], {"cuda": (0.5, 0.5)})
    config = onnx_config("m", Path("m.onnx"))

    def on(names: tuple[str, ...]) -> list[bool]:
        return [model_allowed_on(replace(config, devices=names), d) for d in devs]

    assert on(("cuda:0",)) == [True, True]
    assert on(("cuda",)) == [True, True]
    assert on(("cuda:0/1",)) == [False, True]
    assert on(("cuda:1",)) == [False, False]


# ------------------------------------------------------------------- MPS
def _gpu_shares() -> list[ExecutorDevice]:
    return split_devices(
        [ExecutorDevice(0, "cuda", "cuda:0"), ExecutorDevice(1, "cpu", "cpu:0", cpus=(0,))],
        {"cuda:0": (0.3, 0.7)},
    )


def test_mps_is_started_only_for_gpu_shares_and_only_when_found():
    found = {MPS_CONTROL: "/opt/cuda/bin/" + MPS_CONTROL}
    which = found.get
    assert plan_mps([ExecutorDevice(0, "cuda", "cuda:0")], which) == MpsPlan()
    cpu_shares = split_devices(
        [ExecutorDevice(0, "cpu", "cpu:0", cpus=(0, 1))], {"cpu": (0.5, 0.5)}
    )
    assert plan_mps(cpu_shares, which) == MpsPlan()
    assert plan_mps(_gpu_shares(), which) == MpsPlan(control="/opt/cuda/bin/" + MPS_CONTROL)
    absent = plan_mps(_gpu_shares(), {}.get)
    assert absent.control is None
    assert absent.warning == (
        "nvidia-cuda-mps-control is not on PATH: the shares of cuda:0 time-share their GPU "
        "instead of running at once under MPS"
    )


def test_each_gpu_share_is_an_mps_client_at_its_percentage():
    gpu0, gpu1, cpu = _gpu_shares()
    assert executor_env(gpu0, "/tmp/d") == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/d/pipe",
        "CUDA_MPS_LOG_DIRECTORY": "/tmp/d/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert executor_env(gpu1, "/tmp/d")[THREAD_PERCENTAGE] == "70"
    assert executor_env(cpu, "/tmp/d") == {}
    assert executor_env(gpu0, None) == {}  # no daemon: time-sharing
    assert executor_env(ExecutorDevice(0, "cuda", "cuda:0"), "/tmp/d") == {}
    assert [thread_percentage(s) for s in (0.001, 0.126, 0.5, 1.0)] == [1, 13, 50, 100]


@pytest.fixture
def fake_mps(tmp_path, monkeypatch) -> Path:
    """A fake nvidia-cuda-mps-control first on PATH: it records its
    arguments, pipe directory and input in a file, and returns that file."""
    record = tmp_path / "calls.txt"
    program = tmp_path / "bin" / MPS_CONTROL
    program.parent.mkdir()
    program.write_text(
        "#!/bin/sh\n"
        f'echo "args=$* pipe=${PIPE_DIRECTORY}" >> "{record}"\n'
        'if [ "$1" != "-d" ]; then read line; echo "input=$line" >> ' + f'"{record}"; fi\n'
        'exit "${FAKE_MPS_EXIT:-0}"\n'
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    return record


def test_the_daemon_is_started_and_told_to_quit_through_the_control_program(fake_mps):
    sharing = GpuSharing.start(_gpu_shares())
    assert sharing.directory is not None
    pipe = os.path.join(sharing.directory, "pipe")
    assert os.path.isdir(pipe)
    assert fake_mps.read_text().splitlines() == [f"args=-d pipe={pipe}"]
    gpu0, _, cpu = _gpu_shares()
    assert sharing.env_for(gpu0)[PIPE_DIRECTORY] == pipe
    assert sharing.env_for(gpu0)[THREAD_PERCENTAGE] == "30"
    assert sharing.env_for(cpu) == {}
    directory = sharing.directory
    sharing.stop()
    assert fake_mps.read_text().splitlines()[1:] == [f"args= pipe={pipe}", "input=quit"]
    assert not os.path.exists(directory)
    sharing.stop()  # once only
    assert len(fake_mps.read_text().splitlines()) == 3


def test_a_daemon_that_fails_to_start_leaves_time_sharing_with_a_warning(
    fake_mps, monkeypatch, caplog
):
    monkeypatch.setenv("FAKE_MPS_EXIT", "3")
    with caplog.at_level(logging.WARNING, logger="app.runtime.mps"):
        sharing = GpuSharing.start(_gpu_shares())
    assert sharing.directory is None
    assert sharing.env_for(_gpu_shares()[0]) == {}
    (record,) = caplog.records
    assert record.getMessage().startswith("the MPS control daemon did not start (exit code 3")
    sharing.stop()
    assert len(fake_mps.read_text().splitlines()) == 1  # no quit for a daemon that never ran


def test_without_the_control_program_one_warning_says_why(monkeypatch, caplog):
    calls: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    with caplog.at_level(logging.WARNING, logger="app.runtime.mps"):
        sharing = GpuSharing.start(_gpu_shares(), which=lambda _: None, run=run)
    assert (sharing.directory, calls) == (None, [])
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "nvidia-cuda-mps-control is not on PATH"
    ]


# --------------------------------------------------------- emulated shares
def test_an_emulated_share_holds_each_batch_for_its_latency_over_its_share():
    config = emulated_config(alpha_ms=2.0, beta_ms=20.0)
    whole, half = EmulatedBackend(), make_backend(config, "emulated", 0, 1, share=0.5)
    whole.load(config)
    half.load(config)
    for b in (1, 4, 8):
        assert half.latency(b) == pytest.approx(2 * whole.latency(b))
    assert whole.latency(4) == pytest.approx(0.028)
    with pytest.raises(ValueError, match=r"share must be in \(0, 1\], got 1.5"):
        EmulatedBackend(share=1.5)


def test_a_gpu_share_has_a_profile_cache_key_of_its_own():
    gpu0, gpu1, cpu = _gpu_shares()
    assert [device_tag(d) for d in (gpu0, gpu1, cpu)] == ["cuda-0-0.3", "cuda-0-0.7", "cpu-1t"]
    assert device_tag(ExecutorDevice(0, "cuda", "cuda:0")) == "cuda-0"


# ------------------------------------------------- two CPU shares, live
@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_two_cpu_shares_are_pinned_to_their_own_cores_and_both_serve(tmp_path):
    path = mlp_onnx(tmp_path / "mlp.onnx")
    config = onnx_config("mlp", path)
    visible = sorted(os.sched_getaffinity(0))
    devices = detect_devices(emulated=0, gpus=0, shares={"cpu": (0.5, 0.5)})
    assert [d.name for d in devices] == ["cpu:0/0", "cpu:0/1"]
    expected = split_cores(visible, (0.5, 0.5))
    assert [d.cpus for d in devices] == list(expected)
    assert [d.threads for d in devices] == [len(c) for c in expected]
    if len(visible) >= 2:  # this box: one core each
        assert not set(devices[0].cpus) & set(devices[1].cpus)

    async def scenario() -> None:
        arenas = {"mlp": Arena.create(config, capacity=8)}
        done = PoolEvents()
        pool = ExecutorPool(devices, [config], arenas, done)
        try:
            await pool.start()
            for device in devices:
                assert pool.models_on(device.id) == ["mlp"]
                # Every thread of the executor (ORT's, heartbeat, cancels) is pinned.
                pid = pool.pid(device.id)
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
                assert len(tids) >= 2
                assert {tid: os.sched_getaffinity(tid) for tid in tids} == {
                    tid: set(device.cpus) for tid in tids
                }
            arena = arenas["mlp"]
            rng = np.random.default_rng(7)
            xs = rng.standard_normal((4, 8)).astype(np.float32)
            slots = [arena.acquire() for _ in range(4)]
            for slot, row in zip(slots, xs, strict=True):
                arena.write_inputs(slot, {"x": row[None]})
            futures = [done.expect(1), done.expect(2)]
            start_at = time.monotonic() + 0.02
            pool.submit(devices[0].id, 1, "mlp", slots[:2], start_at)
            pool.submit(devices[1].id, 2, "mlp", slots[2:], start_at)
            ran = await asyncio.wait_for(asyncio.gather(*futures), 10)
            assert [(r.device, r.error) for r in ran] == [(0, None), (1, None)]
            assert all(isinstance(r, BatchFinished) for r in ran)
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            for slot, row in zip(slots, xs, strict=True):
                (want,) = session.run(None, {"x": row[None]})
                np.testing.assert_allclose(arena.read_outputs(slot)["y"], want, atol=1e-6)
        finally:
            await pool.stop(timeout=5)

    asyncio.run(scenario())
