"""Preemption end to end (issue 5): the dispatcher's Preempt path, real
executors stopping ONNX and Torch batches early, and the daemon answering
preempted requests with a result or the dropped error, never twice."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.errors import Dropped
from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
from app.runtime.arena import Arena
from app.runtime.backends import EmulatedBackend, Terminated
from app.runtime.executor import CANCELLED
from app.runtime.pool import ExecutorDevice, ExecutorPool
from app.scheduling.flex import FlexScheduler
from app.scheduling.types import Batch, Dispatch, Drop, DropReason, Preempt, Request
from app.server.dispatcher import CoreGroup, Dispatcher, Finished
from bench.daemon_launcher import free_port
from tests.helpers import devices, model
from tests.test_runtime import Done, mlp_onnx, onnx_config

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------ dispatcher unit
class Calls:
    """Fake pool: records submit/cancel calls."""

    def __init__(self) -> None:
        self.submits: list[tuple[int, int, str, list[int], float]] = []
        self.cancels: list[tuple[int, int]] = []

    def submit(self, device: int, batch_id: int, model: str, slots: list[int], at: float) -> None:
        self.submits.append((device, batch_id, model, slots, at))

    def cancel(self, device: int, batch_id: int) -> bool:
        self.cancels.append((device, batch_id))
        return True


def _answered(pending) -> int:
    return int(pending.future.done())


def test_preempted_request_that_can_make_it_is_answered_by_its_new_batch():
    # ℓ(b) = b + 100 ms, SLO 1 s: one request runs alone; three more make a
    # batch of 4 ≥ 3.03 × 1 with it, so FLEX preempts and re-queues it.
    async def scenario() -> None:
        info = model(alpha_ms=1.0, beta_ms=100.0, slo_ms=1000.0)
        calls = Calls()
        core = FlexScheduler([info], devices(1))
        d = Dispatcher([CoreGroup(core, frozenset({"m"}), (0,))], calls.submit, cancel=calls.cancel)
        first = d.submit_request("m", 0, 1.0)
        assert [(s[0], s[1], s[3]) for s in calls.submits] == [(0, 1, [0])]
        others = [d.submit_request("m", slot, 1.0) for slot in (1, 2, 3)]
        assert calls.cancels == [(0, 1)]
        # Same device: submitted at once, the executor runs it after the stop.
        assert [(s[0], s[1], sorted(s[3])) for s in calls.submits[1:]] == [(0, 2, [0, 1, 2, 3])]
        everyone = [first, *others]
        assert sum(map(_answered, everyone)) == 0
        # The stop lost the race: batch 1 reports done. It answers nobody.
        assert d.batch_done(0, 1, 0.0, 0.1, None) is None
        assert sum(map(_answered, everyone)) == 0
        assert d.batch_done(0, 2, 0.1, 0.2, None) is not None
        for p in everyone:
            finished = p.future.result()
            assert isinstance(finished, Finished)
            assert finished.error is None and finished.batch.id == 2
        # A duplicate report answers nobody twice and leaves the core alone.
        assert d.batch_done(0, 1, 0.0, 0.1, CANCELLED) is None
        assert core.in_flight == {} and d.pending == {} and d.stopping == {}

    asyncio.run(scenario())


def test_preempted_request_that_cannot_make_it_is_dropped_after_the_stop():
    async def scenario() -> None:
        info = model(alpha_ms=1.0, beta_ms=100.0, slo_ms=1000.0)
        calls = Calls()
        core = FlexScheduler([info], devices(1))
        d = Dispatcher([CoreGroup(core, frozenset({"m"}), (0,))], calls.submit, cancel=calls.cancel)
        tight = d.submit_request("m", 0, 0.105)  # ℓ(1) = 101 ms: feasible only now
        time.sleep(0.01)
        others = [d.submit_request("m", slot, 1.0) for slot in (1, 2, 3, 4)]
        assert calls.cancels == [(0, 1)]
        assert sorted(calls.submits[1][3]) == [1, 2, 3, 4]
        # Its slot may still be written by the stopping batch: no answer yet.
        assert not tight.future.done()
        d.batch_done(0, 1, 0.0, 0.05, CANCELLED)
        with pytest.raises(Dropped) as caught:
            tight.future.result()
        assert caught.value.reason == DropReason.PREEMPTED.value
        d.batch_done(0, 2, 0.05, 0.16, None)
        assert all(p.future.result().batch.id == 2 for p in others)

    asyncio.run(scenario())


class Scripted:
    """A core that answers the n-th arrival with script[n](arrivals so far)."""

    def __init__(self, script) -> None:
        self.script = script
        self.arrivals: list[Request] = []
        self.in_flight: dict[int, Batch] = {}  # what the dispatcher checks

    def add_request(self, request: Request, now: float) -> list:
        self.arrivals.append(request)
        decisions = self.script[len(self.arrivals) - 1](self.arrivals)
        for decision in decisions:
            if isinstance(decision, Dispatch):
                self.in_flight[decision.batch.id] = decision.batch
        return decisions

    def batch_finished(self, device: int, batch_id: int, now: float) -> list:
        return []

    def advance(self, now: float) -> list:
        return []

    def next_wakeup(self) -> None:
        return None


def _batch(batch_id: int, device: int, requests: list[Request]) -> Batch:
    return Batch(batch_id, "m", device, list(requests), 0.0, 0.1)


def test_requeued_request_waits_for_the_stop_before_running_on_another_device():
    script = [
        lambda r: [Dispatch(_batch(1, 0, r[0:1]))],
        lambda r: [Preempt(0, 1), Dispatch(_batch(2, 1, r[0:2]))],
        lambda r: [Dispatch(_batch(3, 0, r[2:3]))],
        lambda r: [Preempt(0, 3), Dispatch(_batch(4, 1, r[2:4]))],
        # Batch 4 is preempted before it was ever submitted; r3 is dropped.
        lambda r: [
            Preempt(1, 4),
            Drop([r[2]], DropReason.PREEMPTED),
            Dispatch(_batch(5, 1, r[3:5])),
        ],
    ]

    async def scenario() -> None:
        calls = Calls()
        d = Dispatcher(
            [CoreGroup(Scripted(script), frozenset({"m"}), (0, 1))],  # type: ignore[arg-type]
            calls.submit,
            cancel=calls.cancel,
        )
        p = [d.submit_request("m", 10, 1.0), d.submit_request("m", 11, 1.0)]
        # Batch 2 holds request 1, which batch 1 on device 0 may still write.
        assert [s[1] for s in calls.submits] == [1] and calls.cancels == [(0, 1)]
        d.batch_done(0, 1, 0.0, 0.01, CANCELLED)
        assert [(s[0], s[1], s[3]) for s in calls.submits] == [(0, 1, [10]), (1, 2, [10, 11])]
        d.batch_done(1, 2, 0.01, 0.1, None)
        assert [x.future.result().batch.id for x in p] == [2, 2]

        p += [d.submit_request("m", slot, 1.0) for slot in (12, 13, 14)]
        assert calls.cancels == [(0, 1), (0, 3)]  # never (1, 4): it never ran
        assert [s[1] for s in calls.submits] == [1, 2, 3, 5]
        assert not p[2].future.done()  # its drop waits for batch 3's report
        d.batch_done(0, 3, 0.2, 0.21, CANCELLED)
        with pytest.raises(Dropped):
            p[2].future.result()
        assert [s[1] for s in calls.submits] == [1, 2, 3, 5]  # batch 4 stays dead
        d.batch_done(1, 5, 0.2, 0.3, None)
        assert [x.future.result().batch.id for x in p[3:]] == [5, 5]
        assert d.pending == {} and d.stopping == {} and d._held == {} and d._parked == {}

    asyncio.run(scenario())


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


def _stop_after(backend, inputs: dict[str, np.ndarray], after_s: float) -> float:
    """Run `backend` and terminate it `after_s` in; seconds from terminate()
    to the Terminated exception."""
    stopped_at: list[float] = []

    def stop() -> None:
        time.sleep(after_s)
        stopped_at.append(time.monotonic())
        backend.terminate()

    thread = threading.Thread(target=stop)
    thread.start()
    with pytest.raises(Terminated):
        backend.run(inputs)
    end = time.monotonic()
    thread.join()
    return end - stopped_at[0]


def test_emulated_backend_stops_at_once_or_after_its_configured_delay():
    x = {"x": np.zeros((2, 4), np.float32)}
    at_once = EmulatedBackend()
    at_once.load(_emulated("a", 500.0))
    assert _stop_after(at_once, x, 0.02) < 0.05  # of a 500 ms hold
    delayed = EmulatedBackend()
    delayed.load(_emulated("b", 500.0, preemption_delay_ms=40))
    assert 0.038 <= _stop_after(delayed, x, 0.02) < 0.15
    # The next run is not affected by the earlier stop.
    quick = EmulatedBackend()
    quick.load(_emulated("c", 10.0))
    quick.terminate()
    np.testing.assert_array_equal(quick.run(x)["x"], x["x"])


# ------------------------------------------------ real executors stop early
def _normal_and_stopped(config: ModelConfig, batch: int, stop_at: float = 0.25):
    """In one CPU executor: the normal duration of a `batch` (median of 3),
    then the same batch cancelled `stop_at` of the way in. Returns (normal
    s, (started, finished, error) of the stopped one, cancel time)."""

    async def scenario():
        arena = Arena.create(config, capacity=batch)
        done = Done()
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
                _, started, finished, error = await asyncio.wait_for(fut, 30)
                assert error is None
                normal.append(finished - started)
            normal_s = float(np.median(normal))
            fut = done.expect(4)
            pool.submit(0, 4, config.name, slots, 0.0)
            await asyncio.sleep(stop_at * normal_s)
            cancelled_at = time.monotonic()
            assert pool.cancel(0, 4)
            _, started, finished, error = await asyncio.wait_for(fut, 30)
            # The executor serves on: a batch after the stop runs normally.
            fut = done.expect(5)
            pool.submit(0, 5, config.name, slots, 0.0)
            assert (await asyncio.wait_for(fut, 30))[3] is None
            return normal_s, (started, finished, error), cancelled_at
        finally:
            await pool.stop(timeout=5)

    return asyncio.run(scenario())


def test_onnx_batch_stops_well_before_its_normal_duration(tmp_path):
    # 64 MatMul+Add+Relu layers 1024 wide (~70 ms for 32 rows on one core):
    # ORT checks RunOptions.terminate between nodes, so the stop comes within
    # a layer (~1/64 of the batch; measured 1–4 ms).
    config = onnx_config(
        "chain", mlp_onnx(tmp_path / "chain.onnx", 1024, 64), width=1024, max_batch=32
    )
    normal, (started, finished, error), cancelled_at = _normal_and_stopped(config, 32)
    assert normal > 0.01  # big enough for the stop to be measurable
    assert error == CANCELLED
    assert finished - started < 0.7 * normal
    assert finished - cancelled_at < 0.3 * normal


def test_split_bundled_mlp_batch_stops_within_a_chunk(tmp_path):
    # The bundled MLP's builder at half the width (4 layers of 2048, ~40 ms
    # for 32 rows on one core), each layer split as the bundled model is
    # (Gemm chunks + Concat): the split graph still stops early and the
    # executor serves on. (That a stop waits ~1/32 of a batch rather than
    # up to a whole layer, 1/4, is measured by bench.preemption, not here.)
    from app.repository.bundled import MLP_SPLITS, build_mlp, serialize

    path = tmp_path / "mlp.onnx"
    path.write_bytes(serialize(build_mlp(2048, 4, seed=0, splits=MLP_SPLITS)))
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
    normal, (started, finished, error), cancelled_at = _normal_and_stopped(config, 32)
    assert normal > 0.01
    assert error == CANCELLED
    assert finished - started < 0.7 * normal
    assert finished - cancelled_at < 0.3 * normal


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


def test_torch_backend_outputs_equal_the_eager_module(tmp_path):
    torch = pytest.importorskip("torch")
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


def test_torch_batch_stops_at_an_exit_point_well_before_its_normal_duration(tmp_path):
    pytest.importorskip("torch")
    # 14 blocks of ~1/13 of the batch each; profiling picks the exit points.
    config = _torch_config(tmp_path)
    normal, (started, finished, error), cancelled_at = _normal_and_stopped(config, 16)
    assert normal > 0.01
    assert error == CANCELLED
    assert finished - started < 0.7 * normal
    assert finished - cancelled_at < 0.3 * normal


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


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    from bench.daemon_launcher import start_daemon, stop_daemon

    repo = tmp_path_factory.mktemp("preempt-repo")
    (repo / "slow").mkdir()
    (repo / "slow" / "config.yaml").write_text(_SLOW)
    port = free_port()
    handle = start_daemon(
        repo,
        port,
        policy="flex",
        emulated_devices=1,
        cpu_slices=0,
        startup_timeout_s=60,
        extra_env={"PYTHONPATH": str(ROOT)},
    )
    yield handle
    stop_daemon(handle, timeout_s=10)


def _burst(url: str, first_slo_ms: float, others: int = 3) -> dict:
    """One request alone on the device (ℓ(1) = 601 ms), then 100 ms later
    `others` more; with 3, the batch of 4 with the first one is ≥ 3.03 × 1,
    so FLEX preempts the first batch. Returns
    {value: (reply, seconds)}; connections are opened beforehand so that the
    arrival times do not depend on connection set-up on a busy machine."""
    out: dict = {}
    go = [threading.Event() for _ in range(1 + others)]

    def client(i: int, value: float, slo_ms: float) -> None:
        with httpx.Client(base_url=url, timeout=10) as c:
            c.get("/v2/health/live")
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
    time.sleep(0.3)  # connections up
    go[0].set()
    time.sleep(0.1)
    for event in go[1:]:
        event.set()
    for thread in threads:
        thread.join()
    return out


def test_daemon_preempted_request_gets_a_result_from_its_new_batch(daemon):
    out = _burst(daemon.url, 2000.0)
    for value, (reply, _) in out.items():
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert np.asarray(body["outputs"]["x"]["data"]).ravel().tolist() == [value] * 4
        assert body["timing"]["batch_size"] == 4  # the first ran again, with the others
    # Without the stop the first answer would take ℓ(1) + ℓ(4) ≈ 1.2 s.
    assert out[1.0][1] < 0.1 + 0.604 + 0.25


def _answers(url: str) -> float:
    """Results plus drops the daemon counted for model slow."""
    metrics = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(("goodput_total{", "late_total{", "dropped_total{"))
        and 'model="slow"' in line
    )


def test_daemon_preempted_request_that_cannot_make_it_gets_503(daemon):
    before = _answers(daemon.url)
    # 620 ms fits ℓ(1) + the 3 ms deadline margin only if it starts at once,
    # so it cannot join the new batch: four others alone make FLEX preempt.
    out = _burst(daemon.url, 620.0, others=4)
    reply, seconds = out[1.0]
    assert reply.status_code == 503
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["reason"] == "preempted"
    assert seconds < 0.45  # answered at the stop, not after its batch's 601 ms
    for value in (2.0, 3.0, 4.0, 5.0):
        assert out[value][0].status_code == 200
        assert out[value][0].json()["timing"]["batch_size"] == 4
    # Each of the 5 requests answered exactly once (4 results, 1 drop).
    time.sleep(0.2)
    assert _answers(daemon.url) - before == 5
