"""Elastic tensors: bounds that size shared memory only. A Triton config
that declares no bound for a `-1` dimension or a TYPE_STRING tensor gets
the server's default slot size, and a request beyond it is served all the
same, its item in a segment of its own (app/runtime/spill.py), as Triton
serves any length; a declared bound is still a 400.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import numpy as np
import pytest

from app.api.limits import model_body_limit
from app.api.tensors import check_bytes, check_shape
from app.errors import InvalidInput
from app.repository.config import ModelConfig, TensorSpec
from app.runtime.arena import Arena
from app.runtime.executor import run_shape_groups
from bench.elastic import write_repository
from tests.fakes import our_segments


def _config(inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> ModelConfig:
    return ModelConfig("e", "onnx", Path("/nonexistent"), inputs, outputs, 8, 100.0)


X = TensorSpec("x", "FP32", (-1, -1), max_shape=(-1, 4), elastic=True)
Y = TensorSpec("y", "FP32", (-1, -1), max_shape=(-1, 4), follows=(None, ("x", 1)), elastic=True)
TEXT = TensorSpec("t", "BYTES", (-1, 1), max_bytes=4, elastic=True)
LOUD = TensorSpec("loud", "BYTES", (-1, 1), max_bytes=5, elastic=True)


class _Double:
    """Doubles x, shouts t; records each call's inputs."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append({k: v.copy() for k, v in inputs.items()})
        loud = np.array([[v + b"!" for v in row] for row in inputs["t"]], dtype=object)
        return {"y": inputs["x"] * 2, "loud": loud}


def test_items_beyond_the_slot_travel_in_segments_and_come_back(no_leftover_segments):
    config = _config((X, TEXT), (Y, LOUD))
    arena = Arena.create(config, 4)
    try:
        small, big = arena.acquire_rows(1), arena.acquire_rows(2)
        arena.write_rows(
            small, {"x": np.ones((1, 3), np.float32), "t": np.array([[b"ab"]], object)}
        )
        long_x = np.arange(20, dtype=np.float32).reshape(2, 10)  # 10 > bound 4
        long_t = np.array([["é" * 50], ["z"]], dtype=object)  # 100 bytes > max_bytes 4
        arena.write_rows(big, {"x": long_x, "t": long_t})
        before = set(our_segments())
        assert len(before) == 1 + 4  # the arena, and x and t of each big row
        assert sorted(arena.spills.spilled(big)) == ["input 't'", "input 'x'"]
        assert arena.spills.spilled(small) == []
        assert arena.item_shapes("x", small + big) == [(3,), (10,), (10,)]

        backend = _Double()
        run_shape_groups(config, backend, arena, small + big)
        assert [call["x"].shape for call in backend.calls] == [(1, 3), (2, 10)]
        assert backend.calls[1]["t"].tolist() == [["é".encode() * 50], [b"z"]]
        # The long rows' answers are spilled too (y has 10 > 4, loud 101 > 5 bytes).
        assert sorted(arena.spills.spilled(big)) == [
            "input 't'", "input 'x'", "output 'loud'", "output 'y'"
        ]  # fmt: skip
        out = arena.read_rows(big)
        np.testing.assert_array_equal(out["y"], long_x * 2)
        assert out["loud"].tolist() == [["é".encode() * 50 + b"!"], [b"z!"]]
        assert set(our_segments()) - before == set()
        np.testing.assert_array_equal(arena.read_rows(small)["y"], [[2, 2, 2]])
        arena.release_rows(big)
        arena.release_rows(small)
        assert len(our_segments()) == 1  # the arena's only
        # A slot reused by an item that fits leaves no old spill behind.
        again = arena.acquire_rows(2)
        arena.write_rows(
            again, {"x": np.ones((2, 2), np.float32), "t": np.array([[b"a"], [b"b"]], object)}
        )
        assert arena.spills.spilled(again) == []
    finally:
        arena.close_and_unlink()


def test_an_answer_nobody_reads_is_unlinked_with_its_slot(no_leftover_segments):
    config = _config((X, TEXT), (Y, LOUD))
    arena = Arena.create(config, 2)
    try:
        slots = arena.acquire_rows(1)
        arena.write_rows(
            slots, {"x": np.ones((1, 9), np.float32), "t": np.array([[b"abcdef"]], object)}
        )
        run_shape_groups(config, _Double(), arena, slots)
        assert len(our_segments()) == 1 + 4
        arena.release_rows(slots)  # e.g. a request dropped after its batch ran
        assert len(our_segments()) == 1
        slots = arena.acquire_rows(1)
        arena.write_rows(
            slots, {"x": np.ones((1, 9), np.float32), "t": np.array([[b"abcdef"]], object)}
        )
    finally:
        arena.close_and_unlink()  # unlinks what its slots still hold
    assert our_segments() == []


def test_a_declared_bound_is_still_enforced(no_leftover_segments):
    strict_x = TensorSpec("x", "FP32", (-1, -1), max_shape=(-1, 4))
    arena = Arena.create(_config((strict_x,), (strict_x,)), 2)
    try:
        with pytest.raises(InvalidInput, match="dimension 1 is 5, more than its bound 4"):
            arena.write_rows(arena.acquire_rows(1), {"x": np.ones((1, 5), np.float32)})
    finally:
        arena.close_and_unlink()
    strict_t = TensorSpec("t", "BYTES", (-1, 1), max_bytes=4)
    with pytest.raises(InvalidInput, match="more than the tensor's max_bytes 4"):
        check_bytes("t", strict_t, np.array([[b"12345"]], dtype=object))
    with pytest.raises(InvalidInput, match="dimension 1 is 5, more than its bound 4"):
        check_shape("x", strict_x, (1, 5))
    # Elastic: taken, up to the body limit.
    check_bytes("t", TEXT, np.array([[b"x" * 10_000]], dtype=object))
    assert check_shape("x", X, (1, 5000), max_elements=10_000) == (1, 5000)
    with pytest.raises(InvalidInput, match="more than a request may carry"):
        check_shape("x", X, (1, 20_000), max_elements=10_000)
    assert model_body_limit(_config((X,), (Y,)), 64 << 20) == 64 << 20
    assert model_body_limit(_config((strict_x,), (Y,)), 64 << 20) < 1 << 20


def test_triton_configs_without_bounds_are_elastic_and_declared_ones_are_not(tmp_path):
    from app.repository.loader import load_model_config

    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")
    base = """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] },
               { name: "t" data_type: TYPE_STRING dims: [ 1 ] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }]
    """
    (model / "config.pbtxt").write_text(base)
    config = load_model_config(model)
    assert [(s.name, s.elastic) for s in config.inputs + config.outputs] == [
        ("x", True), ("t", True), ("y", False)
    ]  # fmt: skip
    (model / "config.pbtxt").write_text(
        base + 'parameters { key: "max_shape" value { string_value: "{x: [16]}" } }\n'
        'parameters { key: "max_bytes" value { string_value: "{t: 8}" } }\n'
    )
    config = load_model_config(model)
    assert [s.elastic for s in config.inputs] == [False, False]


def test_elastic_in_config_yaml_is_checked(tmp_path):
    import yaml

    from app.repository.loader import load_model_config

    model = tmp_path / "m"
    model.mkdir()
    (model / "model.onnx").write_bytes(b"")
    doc = {
        "backend": "onnx",
        "model_file": "model.onnx",
        "max_batch_size": 4,
        "slo_ms": 100,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1], "max_shape": [-1, 8],
                    "elastic": True}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2], "elastic": True}],
    }  # fmt: skip
    (model / "config.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=r"elastic.*only a tensor with a variable dimension"):
        load_model_config(model)
    doc["outputs"][0].pop("elastic")
    (model / "config.yaml").write_text(yaml.safe_dump(doc))
    assert load_model_config(model).inputs[0].elastic


# ------------------------------------------------------------------ the daemon


def _spill_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if re.fullmatch(r"dsrv_\d+_s[0-9a-f]{12}", n)}


@pytest.mark.slow
@pytest.mark.parametrize("api_workers", [0, 1])
def test_a_triton_repository_serves_strings_and_lengths_beyond_the_default_slot(
    tmp_path, launch_daemon, api_workers
):
    """A 3,000-byte string (default slot 256 bytes) and a 10,000-long -1
    dimension (default slot 4,096 elements), over HTTP (JSON and binary) and
    gRPC, batched with requests that fit: answers equal ONNX Runtime's, and
    every segment made for them is gone once answered."""
    import tritonclient.grpc as tg
    import tritonclient.http as th

    from bench.daemon_launcher import free_port

    repo = tmp_path / "repo"
    write_repository(repo)
    port = free_port()
    daemon = launch_daemon(
        repo,
        policy="symphony-wc",
        emulated_devices=0,
        cpu_slices=1,
        startup_timeout_s=300,
        extra_env={"GRPC_PORT": str(port), "API_WORKERS": str(api_workers)},
    )
    long_text = ("ü" * 1500).encode()  # 3,000 bytes
    texts = [long_text, b"short", b"x" * 300]
    lengths = [10_000, 3, 5_000]
    http = th.InferenceServerClient(daemon.url.removeprefix("http://"), concurrency=6)
    grpc = tg.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        for binary in (False, True):
            pending = []
            for text, length in zip(texts, lengths, strict=True):
                t = th.InferInput("text", [1, 1], "BYTES")
                t.set_data_from_numpy(np.array([[text]], dtype=object), binary_data=binary)
                x = th.InferInput("x", [1, length], "FP32")
                data = np.arange(length, dtype=np.float32).reshape(1, length)
                x.set_data_from_numpy(data, binary_data=binary)
                pending.append((text, data, http.async_infer("shout", [t])))
                pending.append((text, data, http.async_infer("double", [x])))
            for i, (text, data, request) in enumerate(pending):
                result = request.get_result()
                if i % 2 == 0:
                    assert result.as_numpy("loud").tolist() == [[text + b"!"]]
                else:
                    np.testing.assert_array_equal(result.as_numpy("y"), data * 2)
        t = tg.InferInput("text", [2, 1], "BYTES")
        t.set_data_from_numpy(np.array([[long_text], [b"a"]], dtype=object))
        assert grpc.infer("shout", [t]).as_numpy("loud").tolist() == [
            [long_text + b"!"],
            [b"a!"],
        ]
        x = tg.InferInput("x", [1, 10_000], "FP32")
        x.set_data_from_numpy(np.ones((1, 10_000), np.float32))
        np.testing.assert_array_equal(grpc.infer("double", [x]).as_numpy("y"), 2.0)
        assert _spill_segments_of(daemon.process.pid) == set()
    finally:
        http.close()
        grpc.close()


def _spill_segments_of(root: int) -> set[str]:
    """The spill segments named for process `root` or any of its descendants
    (executors, API workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return {name for name in _spill_segments() if int(name.split("_")[1]) in tree}


def test_allow_ragged_batch_pads_requests_of_different_lengths_into_one_batch(tmp_path):
    from app.repository.loader import load_model_config

    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"")
    (model / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] allow_ragged_batch: true },\n'
        '       { name: "k" data_type: TYPE_INT64 dims: [ 2 ] allow_ragged_batch: true }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
    )
    config = load_model_config(model)
    x, k = config.inputs
    assert x.pad == (False, True, False) and x.padded == (True, False)
    assert k.pad == ()  # nothing varies: nothing to pad
    assert x.elastic and x.max_shape == (-1, 1365, 3)


def test_no_shared_memory_for_a_spill_is_a_429_and_leaves_nothing(
    monkeypatch, no_leftover_segments
):
    from app.errors import Overloaded
    from app.runtime import spill

    arena = Arena.create(_config((X, TEXT), (Y, LOUD)), 2)
    made = []

    def full(item, prefix, tracked):
        if made:
            raise OSError(28, "No space left on device")
        made.append(real(item, prefix, tracked))
        return made[-1]

    real = spill.write_item
    monkeypatch.setattr(spill, "write_item", full)
    try:
        slots = arena.acquire_rows(2)
        big = {"x": np.ones((2, 9), np.float32), "t": np.array([[b"a"], [b"b"]], object)}
        with pytest.raises(Overloaded, match="input 'x': no shared memory for an item beyond"):
            arena.write_rows(slots, big)
        arena.release_rows(slots)  # as the route does: the one segment made goes
        assert len(our_segments()) == 1
    finally:
        arena.close_and_unlink()
