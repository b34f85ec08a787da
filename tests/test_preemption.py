"""Preemption end to end: real executors stopping emulated, ONNX and Torch
batches early, and the daemon answering preempted requests with a result or
the dropped error, never twice. (What the core holds back until a stop is
confirmed: tests/test_flex.py; the dispatcher's part: tests/test_dispatcher.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
from app.runtime.arena import Arena
from app.runtime.backends import EmulatedBackend, Terminated
from app.runtime.devices import ExecutorDevice
from app.runtime.events import BatchFinished, BatchStopped
from app.runtime.pool import ExecutorPool
from tests.fakes import PoolEvents, mlp_onnx, onnx_config

# The executors the tests start leave no shared memory behind.
pytestmark = pytest.mark.usefixtures("no_leftover_segments")


# ------------------------------------------------------------ emulated backend
def _emulated(name: str, beta_ms: float, **parameters: object) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="emulated",
        directory=Path("."),
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("x", "FP32", (-1, 4)),),
        max_batch_size=8,
        slo_ms=1000.0,
        profile=ProfileSpec(alpha_ms=0.0, beta_ms=beta_ms),
        extra=dict(parameters),
    )


def _stop_after(backend, inputs: dict[str, np.ndarray], after_s: float) -> tuple[float, float]:
    """Run `backend` and terminate it `after_s` in. Returns seconds from the
    start of the run and from terminate() to the Terminated exception."""
    stopped_at: list[float] = []

    def stop() -> None:
        time.sleep(after_s)
        stopped_at.append(time.monotonic())
        backend.terminate()

    thread = threading.Thread(target=stop)
    started = time.monotonic()
    thread.start()
    with pytest.raises(Terminated):
        backend.run(inputs)
    end = time.monotonic()
    thread.join()
    return end - started, end - stopped_at[0]


def test_emulated_backend_stops_at_once_or_after_its_configured_delay():
    x = {"x": np.zeros((2, 4), np.float32)}
    hold = 0.5  # ℓ(2) of both models
    at_once = EmulatedBackend()
    at_once.load(_emulated("a", 500.0))
    ran, at_once_stop = _stop_after(at_once, x, 0.02)
    assert ran < hold  # stopped before its natural end
    delayed = EmulatedBackend()
    delayed.load(_emulated("b", 500.0, preemption_delay_ms=40))
    ran, delayed_stop = _stop_after(delayed, x, 0.02)
    # The delayed one waits its 40 ms (less the clock's granularity), then
    # stops, also well before its natural end; the other one stops sooner.
    assert delayed_stop >= 0.038 and ran < hold
    assert at_once_stop < delayed_stop
    # The next run is not affected by the earlier stop.
    quick = EmulatedBackend()
    quick.load(_emulated("c", 10.0))
    quick.terminate()
    np.testing.assert_array_equal(quick.run(x)["x"], x["x"])


# ------------------------------------------------ real executors stop early
def _normal_and_stopped(config: ModelConfig, batch: int, stop_at: float = 0.25):
    """In one CPU executor: the normal duration of a `batch` (median of 3),
    then the same batch cancelled `stop_at` of the way in. Returns (normal
    s, the BatchStopped of the stopped one, its start, the cancel time)."""

    async def scenario():
        arena = Arena.create(config, capacity=batch)
        done = PoolEvents()
        pool = ExecutorPool(
            [ExecutorDevice(0, "cpu", "cpu:0", threads=1)], [config], {config.name: arena}, done
        )
        try:
            await pool.start()
            assert pool.models_on(0) == [config.name], pool.load_errors(0)
            slots = [arena.acquire() for _ in range(batch)]
            item = config.inputs[0].item_shape
            rng = np.random.default_rng(0)
            for slot in slots:
                x = rng.standard_normal(item).astype(np.float32)
                arena.write_inputs(slot, {config.inputs[0].name: x})
            normal = []
            for batch_id in (1, 2, 3):
                fut = done.expect(batch_id)
                pool.submit(0, batch_id, config.name, slots, 0.0)
                ran = await asyncio.wait_for(fut, 30)
                assert isinstance(ran, BatchFinished) and ran.error is None
                normal.append(ran.finished_at - ran.started_at)
            normal_s = float(np.median(normal))
            fut = done.expect(4)
            started = time.monotonic()
            pool.submit(0, 4, config.name, slots, 0.0)
            await asyncio.sleep(stop_at * normal_s)
            cancelled_at = time.monotonic()
            assert pool.cancel(0, 4)
            stopped = await asyncio.wait_for(fut, 30)
            # The executor serves on: a batch after the stop runs normally.
            fut = done.expect(5)
            pool.submit(0, 5, config.name, slots, 0.0)
            assert (await asyncio.wait_for(fut, 30)).error is None
            return normal_s, stopped, started, cancelled_at
        finally:
            await pool.stop(timeout=5)

    return asyncio.run(scenario())


def _stopped_early(config: ModelConfig, batch: int) -> None:
    """A batch cancelled a quarter of the way in stops well before its end:
    the claims are relative to the batch's own duration (≥ 20 ms here, so
    that the executor's reaction to a cancel is small beside it)."""
    normal, stopped, started, cancelled_at = _normal_and_stopped(config, batch)
    assert normal > 0.02, f"the batch runs only {normal * 1000:.1f} ms: too short to stop"
    assert isinstance(stopped, BatchStopped)
    assert stopped.at - started < 0.7 * normal
    assert stopped.at - cancelled_at < 0.3 * normal


@pytest.mark.slow
def test_onnx_batch_stops_well_before_its_normal_duration(tmp_path):
    # 128 MatMul+Add+Relu layers 1024 wide sharing their weights (~50 ms for
    # 32 rows on one core): ORT checks RunOptions.terminate between nodes, so
    # the stop comes within a layer (~1/128 of the batch).
    path = mlp_onnx(tmp_path / "chain.onnx", 1024, 128, shared=True)
    _stopped_early(onnx_config("chain", path, width=1024, max_batch=32), 32)


@pytest.mark.slow
def test_split_bundled_mlp_batch_stops_within_a_chunk(tmp_path):
    # The bundled MLP's builder at half the width (12 layers of 2048, ~30 ms
    # for 32 rows on one core), each layer split as the bundled model is
    # (Gemm chunks + Concat): the split graph still stops early and the
    # executor serves on. (That a stop waits ~1/32 of a layer rather than a
    # whole one is measured by bench.preemption, not here.)
    from app.repository.bundled import MLP_SPLITS, build_mlp, serialize

    path = tmp_path / "mlp.onnx"
    path.write_bytes(serialize(build_mlp(2048, 12, seed=0, splits=MLP_SPLITS)))
    config = ModelConfig(
        name="mlp",
        backend="onnx",
        directory=tmp_path,
        inputs=(TensorSpec("input", "FP32", (-1, 2048)),),
        outputs=(TensorSpec("output", "FP32", (-1, 2048)),),
        max_batch_size=32,
        slo_ms=100.0,
        model_file=path,
    )
    _stopped_early(config, 32)


# ------------------------------------------------------------- torch backend
def test_exit_point_rule_trades_stop_delay_against_exit_cost():
    from app.runtime.torch_backend import choose_exit_points, cut, expected_delay

    layers = [1.0] * 12  # ms
    assert cut(layers, 3) == [0, 3, 6, 9, 12]
    assert cut([10.0, 1.0, 1.0, 1.0], 1) == [0, 1, 4]  # the cut follows the time
    # No exit point: a stop waits half the batch on average; 3 stages: 2 ms.
    assert expected_delay(layers, [0, 12]) == pytest.approx(6.0)
    assert expected_delay(layers, [0, 4, 8, 12]) == pytest.approx(2.0)
    # Free exit points: one per layer. At 0.5 ms each: 2 (2 ms + 1 ms beats
    # 3 exits: 1.5 ms + 1.5 ms). Dearer than any saving: none.
    assert choose_exit_points(layers, 0.0)[0] == 11
    assert choose_exit_points(layers, 0.5) == (2, [0, 4, 8, 12])
    assert choose_exit_points(layers, 10.0)[0] == 0


def _torch_config(tmp_path: Path, blocks: int = 12, **parameters: object) -> ModelConfig:
    from app.repository.bundled import build_torchcnn, torchscript_bytes

    path = tmp_path / f"torchcnn{blocks}.pt"
    if not path.is_file():
        path.write_bytes(torchscript_bytes(build_torchcnn(seed=1, blocks=blocks)))
    return ModelConfig(
        name="torchcnn",
        backend="torch",
        directory=tmp_path,
        inputs=(TensorSpec("input", "FP32", (-1, 3, 32, 32)),),
        outputs=(TensorSpec("output", "FP32", (-1, 10)),),
        max_batch_size=16,
        slo_ms=200.0,
        model_file=path,
        extra=dict(parameters),
    )


@pytest.mark.slow
def test_torch_backend_outputs_equal_the_eager_module(tmp_path):
    import torch  # the `test` extra's CPU build

    from app.repository.bundled import build_torchcnn
    from app.runtime.torch_backend import TorchBackend

    x = np.random.default_rng(2).standard_normal((5, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        eager = build_torchcnn(seed=1, blocks=4)(torch.from_numpy(x)).numpy()
    for parameters in ({}, {"exit_points": 2}, {"exit_points": 99}):
        backend = TorchBackend("cpu", 0, 1)
        backend.load(_torch_config(tmp_path, blocks=4, **parameters))
        assert backend.plan is not None and backend.plan.layers == 6
        pinned = parameters.get("exit_points")
        if pinned is None:
            assert 0 <= backend.plan.exit_points <= 5 and not backend.plan.pinned
        else:
            assert backend.plan.exit_points == min(pinned, 5)  # at most layers − 1
        got = backend.run({"input": x})["output"]
        assert got.shape == (5, 10)
        np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)
        # A stop before the first stage, then the flag is re-armed.
        backend.terminate()
        with pytest.raises(Terminated):
            backend.run({"input": x})
        backend.reset()
        np.testing.assert_allclose(backend.run({"input": x})["output"], eager, atol=1e-5)
    # The stages run from Python (the GPU path, without its stream syncs).
    backend._runner = None
    np.testing.assert_allclose(backend.run({"input": x})["output"], eager, atol=1e-5)
    backend.terminate()
    with pytest.raises(Terminated):
        backend._forward(x)


@pytest.mark.slow
def test_torch_batch_stops_at_an_exit_point_well_before_its_normal_duration(tmp_path):
    # 14 blocks of ~1/13 of the batch each; profiling picks the exit points.
    _stopped_early(_torch_config(tmp_path), 16)


# -------------------------------------------------------------- live daemon
_SLOW = """\
backend: emulated
inputs:
  - {name: x, datatype: FP32, shape: [-1, 4]}
outputs:
  - {name: x, datatype: FP32, shape: [-1, 4]}
max_batch_size: 8
slo_ms: 2000
allow_slo_loosening: true
profile: {alpha_ms: 1.0, beta_ms: 600.0}
devices: [emulated]
"""
L1, L4 = 0.601, 0.604  # ℓ(1) and ℓ(4) of model slow, seconds


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, launch_daemon):
    repo = tmp_path_factory.mktemp("preempt-repo")
    (repo / "slow").mkdir()
    (repo / "slow" / "config.yaml").write_text(_SLOW)
    return launch_daemon(repo, policy="flex", emulated_devices=1, cpu_slices=0)


def _burst(url: str, first_slo_ms: float, others: int = 3) -> dict:
    """One request alone on the device (ℓ(1) = 601 ms), then 100 ms later
    `others` more; with 3, the batch of 4 with the first one is ≥ 3.03 × 1,
    so FLEX preempts the first batch. Returns
    {value: (reply, seconds)}; connections are opened beforehand so that the
    arrival times do not depend on connection set-up on a busy machine."""
    out: dict = {}
    go = [threading.Event() for _ in range(1 + others)]
    connected = threading.Barrier(2 + others)

    def client(i: int, value: float, slo_ms: float) -> None:
        with httpx.Client(base_url=url, timeout=10) as c:
            c.get("/v2/health/live")
            connected.wait(timeout=10)
            go[i].wait()
            body = {"model": "slow", "inputs": {"x": [[value] * 4]}, "slo_ms": slo_ms}
            t0 = time.monotonic()
            reply = c.post("/infer", json=body)
            out[value] = (reply, time.monotonic() - t0)

    slos = [first_slo_ms] + [2000.0] * others
    threads = [
        threading.Thread(target=client, args=(i, i + 1.0, slo)) for i, slo in enumerate(slos)
    ]
    for thread in threads:
        thread.start()
    connected.wait(timeout=10)  # connections up
    go[0].set()
    time.sleep(0.1)
    for event in go[1:]:
        event.set()
    for thread in threads:
        thread.join()
    return out


@pytest.mark.slow
def test_daemon_preempted_request_gets_a_result_from_its_new_batch(daemon):
    out = _burst(daemon.url, 2000.0)
    for value, (reply, _) in out.items():
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert np.asarray(body["outputs"]["x"]["data"]).ravel().tolist() == [value] * 4
        assert body["timing"]["batch_size"] == 4  # the first ran again, with the others
    # Stopped, then run again with the others: sooner than its first batch
    # to its end and then another (ℓ(1) + ℓ(4)), never sooner than ℓ(4).
    assert L4 <= out[1.0][1] < L1 + L4


_ANSWERED = tuple(f"deadline_serve_{c}_total{{" for c in ("goodput", "late", "dropped"))


def _answers(url: str) -> float:
    """Results plus drops the daemon counted for model slow."""
    metrics = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(_ANSWERED) and 'model="slow"' in line
    )


@pytest.mark.slow
def test_daemon_preempted_request_that_cannot_make_it_gets_503(daemon):
    before = _answers(daemon.url)
    # 620 ms fits ℓ(1) + the 3 ms deadline margin only if it starts at once,
    # so it cannot join the new batch: four others alone make FLEX preempt.
    out = _burst(daemon.url, 620.0, others=4)
    reply, seconds = out[1.0]
    assert reply.status_code == 503
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["reason"] == "preempted"
    assert seconds < L1  # answered at the stop, before its batch's natural end
    for value in (2.0, 3.0, 4.0, 5.0):
        assert out[value][0].status_code == 200
        assert out[value][0].json()["timing"]["batch_size"] == 4
    # Each of the 5 requests answered exactly once (4 results, 1 drop); the
    # counters may trail the replies a little.
    give_up = time.monotonic() + 5.0
    while _answers(daemon.url) - before < 5 and time.monotonic() < give_up:
        time.sleep(0.05)
    assert _answers(daemon.url) - before == 5
