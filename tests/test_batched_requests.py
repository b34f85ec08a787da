"""Requests with several items through the daemon: shared-memory rows, the
executors' gather and scatter, and answers of shape [n, …].

The end-to-end tests start `python -m app serve` on a small repository: the
bundled `mlp` (ONNX, 4 × 4096², its file built once under models/) with a
latency profile in its config (no measuring at start-up), and an emulated
model whose output echoes its input row by row.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from app.errors import InvalidInput
from app.repository import BUNDLED_REPOSITORY
from app.runtime.arena import Arena
from app.scheduling.types import Request
from tests.fakes import api_config

# ------------------------------------------------------------------ arena rows


def test_a_request_of_n_items_takes_n_slots_anywhere_in_the_arena(no_leftover_segments):
    config = api_config("rows", [("x", "FP32", (-1, 3))], [("x", "FP32", (-1, 3))])
    arena = Arena.create(config, 6)
    try:
        one = arena.acquire_rows(1)
        two = arena.acquire_rows(2)
        assert one is not None and two is not None
        arena.release_rows(one)  # a hole before the next request's rows
        three = arena.acquire_rows(3)
        assert (one, two, three) == ([0], [1, 2], [0, 3, 4])  # not one consecutive run
        assert arena.acquire_rows(2) is None  # 1 slot left of 6
        assert arena.free_slots == 1
        x = np.arange(9, dtype=np.float32).reshape(3, 3)
        arena.write_rows(three, {"x": x})
        # the executor's side: gather the batch's rows, scatter its outputs
        rows = two + three
        arena.write_rows(two, {"x": -np.ones((2, 3), np.float32)})
        batch = arena.gather("x", rows)
        assert batch.shape == (5, 3)
        arena.scatter("x", rows, batch * 10)
        np.testing.assert_array_equal(arena.read_rows(three)["x"], x * 10)
        np.testing.assert_array_equal(arena.read_rows(two)["x"], np.full((2, 3), -10.0))
        with pytest.raises(InvalidInput, match="expects \\[3, 3\\]"):
            arena.write_rows(three, {"x": np.zeros((2, 3), np.float32)})
        with pytest.raises(ValueError, match="at least one slot, got 0"):
            arena.acquire_rows(0)
        arena.release_rows(two)
        arena.release_rows(three)
        assert arena.free_slots == 6
    finally:
        arena.close_and_unlink()


def test_request_items_come_from_the_slots_given_to_the_dispatcher():
    from app.server.dispatcher import CoreGroup, Dispatcher
    from tests.fakes import devices, model
    from tests.fakes_live import FakeClock, FakeExecutors, FakeTimer

    info = model("m", max_batch=8)

    async def run() -> tuple[list[Request], list[list[int]]]:
        from app.scheduling import make_scheduler

        clock = FakeClock()
        executors = FakeExecutors()
        core = make_scheduler("clockwork", [info], devices(1))
        dispatcher = Dispatcher(
            [CoreGroup(core, frozenset({"m"}), (0,))],
            executors,
            clock=clock,
            timer_factory=FakeTimer,
        )
        pending = dispatcher.submit_request("m", [5, 2, 7], info.slo)
        return [pending.request], [call[3] for call in executors.submits]

    (request,), submitted = asyncio.run(run())
    assert request.items == 3
    assert submitted == [[5, 2, 7]]  # the batch's rows: the request's three slots


# ------------------------------------------------------------------ the daemon


def _repository(tmp: Path) -> Path:
    from app.repository.bundled import ensure_bundled_models

    ensure_bundled_models(BUNDLED_REPOSITORY, ["mlp"])
    repo = tmp / "repo"
    mlp = repo / "mlp"
    mlp.mkdir(parents=True)
    source = BUNDLED_REPOSITORY / "mlp" / "model.onnx"
    try:  # the server refuses a symbolic link out of the model directory
        os.link(source, mlp / "model.onnx")
    except OSError:  # another file system
        shutil.copyfile(source, mlp / "model.onnx")
    config = yaml.safe_load((BUNDLED_REPOSITORY / "mlp" / "config.yaml").read_text())
    # A generous SLO and a given profile: nothing is dropped on a busy test box,
    # and start-up does not measure.
    config.update(slo_ms=20_000, profile={"alpha_ms": 20.0, "beta_ms": 40.0})
    (mlp / "config.yaml").write_text(yaml.safe_dump(config))
    echo = repo / "echo"
    echo.mkdir()
    (echo / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "backend": "emulated",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                "outputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                "max_batch_size": 8,
                "slo_ms": 5_000,
                "profile": {"alpha_ms": 2.0, "beta_ms": 30.0},
                "devices": ["emulated"],
            }
        )
    )
    return repo


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, launch_daemon):
    repo = _repository(tmp_path_factory.mktemp("batched"))
    # Work-conserving: a batch starts as soon as a device is free, so the
    # answers do not wait for the generous SLOs (symphony would hold a small
    # batch until just before its deadline, and a busy test box can then
    # miss it).
    return launch_daemon(
        repo, policy="symphony-wc", emulated_devices=1, cpu_slices=1, startup_timeout_s=300
    )


@pytest.mark.slow
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_batch_of_4_equals_onnx_runtime(daemon, binary):
    import onnxruntime as ort
    import tritonclient.http as th

    x = np.random.default_rng(7).standard_normal((4, 4096)).astype(np.float32)
    session = ort.InferenceSession(str(BUNDLED_REPOSITORY / "mlp" / "model.onnx"))
    (expected,) = session.run(None, {"input": x})
    client = th.InferenceServerClient(daemon.url.split("://", 1)[1], network_timeout=60)
    try:
        inp = th.InferInput("input", [4, 4096], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = th.InferRequestedOutput("output", binary_data=binary)
        res = client.infer("mlp", [inp], outputs=[out])
        got = res.as_numpy("output")
        assert got.shape == (4, 4096)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        response = res.get_response()
        assert response["outputs"][0]["shape"] == [4, 4096]
        assert response["parameters"]["batch_size"] >= 4
        # Above max_batch_size (32): refused, naming it
        big = th.InferInput("input", [33, 4096], "FP32")
        big.set_data_from_numpy(np.zeros((33, 4096), np.float32), binary_data=True)
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException, match="max_batch_size \\(32\\), got 33"):
            client.infer("mlp", [big])
    finally:
        client.close()


@pytest.mark.slow
def test_mixed_one_and_three_item_requests_count_items_in_batch_sizes(daemon):
    """12 requests at once, 1 and 3 items alternately (24 items), on one
    emulated device with max_batch_size 8: each answer echoes its own rows;
    its batch size counts items (≥ its own, ≤ 8), and Σ items / batch size
    over the answers is the number of batches — a whole number, fewer than
    the requests."""
    sizes = [1, 3] * 6

    async def send_all() -> list[tuple[int, np.ndarray, dict]]:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:

            async def one(i: int, n: int) -> tuple[int, np.ndarray, dict]:
                x = (np.arange(2 * n, dtype=np.float32).reshape(n, 2) + 100 * i).tolist()
                r = await client.post("/v2/models/echo/infer", json={
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [n, 2], "data": x}]
                })  # fmt: skip
                assert r.status_code == 200, r.text
                body = r.json()
                (out,) = body["outputs"]
                assert out["shape"] == [n, 2]
                got = np.array(out["data"], np.float32).reshape(n, 2)
                np.testing.assert_array_equal(got, np.array(x, np.float32))
                return n, got, body["parameters"]

            return await asyncio.gather(*(one(i, n) for i, n in enumerate(sizes)))

    answers = asyncio.run(send_all())
    batch_sizes = [p["batch_size"] for _, _, p in answers]
    assert all(n <= b <= 8 for (n, _, _), b in zip(answers, batch_sizes, strict=True))
    batches = sum(n / b for (n, _, _), b in zip(answers, batch_sizes, strict=True))
    assert math.isclose(batches, round(batches), abs_tol=1e-9)
    assert 3 <= round(batches) < len(sizes), batch_sizes  # 24 items: ≥ 3 batches of ≤ 8
    # The native API: the same, nested lists [n, 2] in, [n, 2] out.
    r = httpx.post(
        f"{daemon.url}/infer",
        json={"model": "echo", "inputs": {"x": [[1, 2], [3, 4], [5, 6]]}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out = r.json()["outputs"]["x"]
    assert out["shape"] == [3, 2] and out["data"] == [[1, 2], [3, 4], [5, 6]]
    assert 3 <= r.json()["timing"]["batch_size"] <= 8
