"""The Torch backend with several inputs and outputs: TorchScript models
built here (2 inputs, 2 outputs) give torch's eager results through the
backend, staged or not; a model that does not fit its config fails at load
naming the tensor; a stop lands at the exit point after the head; served
end to end through the daemon with `tritonclient.http`, a request of 3
items included; a stopped batch is reported exactly once.
(The exit-point rule and the single-input torchcnn: tests/test_preemption.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from app.repository.config import ModelConfig, TensorSpec
from app.runtime.backend import Terminated

WIDTH = 8


@pytest.fixture(scope="module")
def tm() -> Any:
    """tests/torch_models.py, imported when a test here runs: torch is the
    `test` extra's CPU build."""
    pytest.importorskip("torch")
    from tests import torch_models

    return torch_models


def _config(path: Path, outputs: tuple[str, ...] = ("sum", "product"), **extra: Any) -> ModelConfig:
    shape = (-1, WIDTH)
    return ModelConfig(
        name="twoio",
        backend="torch",
        directory=path.parent,
        inputs=(TensorSpec("a", "FP32", shape), TensorSpec("b", "FP32", shape)),
        outputs=tuple(TensorSpec(n, "FP32", shape) for n in outputs),
        max_batch_size=8,
        slo_ms=1000.0,
        model_file=path,
        extra=dict(extra),
    )


def _inputs(n: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, WIDTH)).astype(np.float32) for _ in range(2))  # type: ignore[return-value]


# ------------------------------------------------------------------ the backend
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "layers", "head"),
    [("Chain", 4, True), ("SumProduct", 0, True), ("ByName", 0, True)],
)
def test_two_inputs_two_outputs_equal_the_eager_module(tm, tmp_path, kind, layers, head):
    from app.runtime.torch_backend import TorchBackend

    module = tm.build(kind, WIDTH)
    path = tm.save(module, tmp_path / "m.pt")
    a, b = _inputs(5)
    expected = tm.eager(module, a, b)
    assert not np.allclose(expected["sum"], expected["product"])  # distinct outputs
    for parameters in ({}, {"exit_points": 2}):
        backend = TorchBackend("cpu", 0, 1)
        backend.load(_config(path, **parameters))
        plan = backend.plan
        assert plan is not None and plan.layers == layers and plan.head is head
        if layers and parameters:  # 3 body blocks and the split, cut in 3
            assert plan.exit_points == 2 and plan.stage_bounds == [0, 2, 3, 4]
        got = backend.run({"a": a, "b": b})
        assert sorted(got) == ["product", "sum"]
        for name in ("sum", "product"):
            assert got[name].shape == (5, WIDTH) and got[name].dtype == np.float32
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)
    # Positional outputs follow the config's order; named ones their names.
    backend = TorchBackend("cpu", 0, 1)
    backend.load(_config(path, outputs=("product", "sum")))
    got = backend.run({"a": a, "b": b})
    named = kind == "ByName"
    np.testing.assert_allclose(got["sum"], expected["sum" if named else "product"], rtol=1e-5)
    np.testing.assert_allclose(got["product"], expected["product" if named else "sum"], rtol=1e-5)


@pytest.mark.slow
def test_a_stop_lands_at_the_exit_point_after_the_head(tm, tmp_path):
    """The head runs, a stop arrives during it, the next stage never runs:
    Terminated; after reset() the same backend answers normally."""
    from app.runtime.torch_backend import TorchBackend

    module = tm.build("Chain", WIDTH)
    backend = TorchBackend("cpu", 0, 1)
    backend.load(_config(tm.save(module, tmp_path / "m.pt")))
    head = backend._head
    ran: list[int] = []

    def head_then_stop(*tensors: Any) -> Any:
        out = head(*tensors)
        ran.append(len(out))
        backend.terminate()  # as the executor's control thread would
        return out

    backend._head = head_then_stop
    a, b = _inputs(3)
    with pytest.raises(Terminated, match="exit point"):
        backend.run({"a": a, "b": b})
    assert ran == [3]
    backend.reset()
    backend._head = head
    got = backend.run({"a": a, "b": b})
    np.testing.assert_allclose(got["product"], tm.eager(module, a, b)["product"], rtol=1e-5)
    # An unstaged model stops only before it starts.
    other = TorchBackend("cpu", 0, 1)
    other.load(_config(tm.save(tm.build("SumProduct", WIDTH), tmp_path / "sp.pt")))
    other.terminate()
    with pytest.raises(Terminated, match="before it started"):
        other.run({"a": a, "b": b})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "change", "message"),
    [
        ("SumProduct", {"outputs": ("sum",)}, "forward returned 2 tensors, the config declares 1"),
        ("SumProduct", {"outputs": ("s", "p", "q")}, "returned 2 tensors, the config declares 3"),
        ("ByName", {"outputs": ("sum", "ratio")}, "forward returned no output 'ratio'"),
        ("SumProduct", {"out_shape": (-1, WIDTH + 1)}, "output 'product' has shape [1, 8]"),
        ("ByName", {"out_dtype": "FP64"}, "output 'sum' is float32, the config says FP64"),
        ("SumProduct", {"inputs": 1}, "takes 2 tensors, the config declares 1 inputs ['a']"),
        ("SumProduct", {"in_shape": (-1, 3)}, "a dry run on zeros of the config's inputs"),
    ],
)
def test_a_model_that_does_not_fit_its_config_fails_at_load(tm, tmp_path, kind, change, message):
    from dataclasses import replace

    from app.runtime.torch_backend import TorchBackend

    config = _config(
        tm.save(tm.build(kind, WIDTH), tmp_path / "m.pt"),
        outputs=change.get("outputs", ("sum", "product")),
    )
    if "out_shape" in change:
        outputs = (config.outputs[0], TensorSpec("product", "FP32", change["out_shape"]))
        config = replace(config, outputs=outputs)
    if "out_dtype" in change:
        outputs = (TensorSpec("sum", change["out_dtype"], (-1, WIDTH)), config.outputs[1])
        config = replace(config, outputs=outputs)
    if "inputs" in change:
        config = replace(config, inputs=config.inputs[:1])
    if "in_shape" in change:
        config = replace(
            config, inputs=tuple(replace(s, shape=change["in_shape"]) for s in config.inputs)
        )
    with pytest.raises(ValueError) as error:
        TorchBackend("cpu", 0, 1).load(config)
    assert message in str(error.value)
    assert "'twoio'" in str(error.value)


# ------------------------------------------------------------ a real executor
@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
@pytest.mark.parametrize("kind", ["Chain", "SumProduct"])
def test_a_cancelled_batch_is_reported_once_and_the_executor_serves_on(tm, tmp_path, kind):
    """Batches 1–3 of 3 items in one CPU executor, batch 2 cancelled at
    once: 1 and 3 give eager's outputs in the arena; batch 2 is reported
    exactly once (stopped, or finished if it got there first); the
    executor reports in order, so all of batch 2's events precede 3's."""
    from app.runtime.arena import Arena
    from app.runtime.devices import ExecutorDevice
    from app.runtime.events import BatchFinished, BatchStopped
    from app.runtime.pool import ExecutorPool
    from tests.fakes import PoolEvents

    module = tm.build(kind, WIDTH)
    config = _config(tm.save(module, tmp_path / "m.pt"))
    a, b = _inputs(3)
    expected = tm.eager(module, a, b)

    async def scenario() -> tuple[list[Any], dict[int, dict[str, np.ndarray]]]:
        arena = Arena.create(config, capacity=4)
        done = PoolEvents()
        device = ExecutorDevice(0, "cpu", "cpu:0", threads=1)
        pool = ExecutorPool([device], [config], {config.name: arena}, done)
        try:
            await pool.start()
            assert pool.models_on(0) == [config.name], pool.load_errors(0)
            slots = [arena.acquire() for _ in range(3)]
            for i, slot in enumerate(slots):
                arena.write_inputs(slot, {"a": a[i], "b": b[i]})
            read: dict[int, dict[str, np.ndarray]] = {}
            for batch_id in (1, 2, 3):
                fut = done.expect(batch_id)
                pool.submit(0, batch_id, config.name, slots, 0.0)
                if batch_id == 2:
                    assert pool.cancel(0, 2)
                event = await asyncio.wait_for(fut, 60)
                if batch_id != 2:
                    assert isinstance(event, BatchFinished) and event.error is None, event
                    rows = [arena.read_outputs(slot) for slot in slots]
                    read[batch_id] = {n: np.concatenate([r[n] for r in rows]) for n in expected}
            return list(done.events), read
        finally:
            await pool.stop(timeout=5)
            arena.close_and_unlink()

    events, read = asyncio.run(scenario())
    reports = [e for e in events if isinstance(e, BatchFinished | BatchStopped)]
    assert [e.batch_id for e in reports] == [1, 2, 3]
    for batch_id in (1, 3):
        for name, want in expected.items():
            np.testing.assert_allclose(read[batch_id][name], want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ the daemon
@pytest.fixture(scope="module")
def daemon(tm, tmp_path_factory, launch_daemon):
    repo = tmp_path_factory.mktemp("torch-io")
    for name, kind in (("chain", "Chain"), ("sumproduct", "SumProduct"), ("byname", "ByName")):
        (repo / name).mkdir()
        tm.save(tm.build(kind, WIDTH), repo / name / "model.pt")
        tensor = {"datatype": "FP32", "shape": [-1, WIDTH]}
        config = {
            "backend": "torch",
            "model_file": "model.pt",
            "inputs": [{"name": n, **tensor} for n in ("a", "b")],
            "outputs": [{"name": n, **tensor} for n in ("sum", "product")],
            "max_batch_size": 8,
            # Generous, with a given profile: nothing dropped on a busy
            # test box, and start-up does not measure.
            "slo_ms": 20_000,
            "profile": {"alpha_ms": 2.0, "beta_ms": 5.0},
            "devices": ["cpu"],
        }
        (repo / name / "config.yaml").write_text(yaml.safe_dump(config))
    return launch_daemon(
        repo,
        policy="symphony-wc",
        emulated_devices=0,
        cpu_slices=1,
        threads_per_slice=1,
        startup_timeout_s=300,
    )


@pytest.mark.slow
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_two_inputs_two_outputs_equal_torch(tm, daemon, binary):
    import tritonclient.http as th

    client = th.InferenceServerClient(daemon.url.split("://", 1)[1], network_timeout=60)
    try:
        for model, kind in (("chain", "Chain"), ("sumproduct", "SumProduct"), ("byname", "ByName")):
            metadata = client.get_model_metadata(model)
            assert [t["name"] for t in metadata["inputs"]] == ["a", "b"]
            assert [t["name"] for t in metadata["outputs"]] == ["sum", "product"]
            for n in (1, 3):
                a, b = _inputs(n, seed=n)
                expected = tm.eager(tm.build(kind, WIDTH), a, b)
                tensors = []
                for name, x in (("a", a), ("b", b)):
                    tensor = th.InferInput(name, [n, WIDTH], "FP32")
                    tensor.set_data_from_numpy(x, binary_data=binary)
                    tensors.append(tensor)
                outputs = [th.InferRequestedOutput(o, binary_data=binary) for o in expected]
                result = client.infer(model, tensors, outputs=outputs)
                for name, want in expected.items():
                    got = result.as_numpy(name)
                    assert got.shape == (n, WIDTH), (model, name)
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
                assert n <= result.get_response()["parameters"]["batch_size"] <= 8
    finally:
        client.close()
