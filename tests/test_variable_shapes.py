"""Variable dimensions (a sequence length, bounded by max_shape; padded
where the config says so) and BYTES tensors: configs, shared-memory rows,
the executor's shape groups, HTTP and gRPC decoding, body limits, and the
daemon end to end with tritonclient (HTTP and gRPC), answers equal to ONNX
Runtime's run of the same file.

Models built here with onnx.helper (opset 20):
  seq_sum:    x FP32 [n, L] → ReduceSum over L (keepdims) → y [n, 1]; L ≤ 16,
              not padded: a batch runs one call per length;
  seq_double: x FP32 [n, L] → 2x → y [n, L]; L ≤ 16 padded, y follows x:1;
  shout:      text BYTES [n, 1] (≤ 16 bytes) → text + "!" (BYTES, ≤ 17) and
              whether it matches `a.*` (BOOL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from app.errors import InvalidInput
from app.repository.config import ModelConfig, TensorSpec
from app.repository.triton_config import DEFAULT_MAX_ELEMENTS
from app.runtime.arena import Arena
from app.runtime.executor import run_shape_groups

# ------------------------------------------------------------------ models


def _save(path: Path, nodes: list, inputs: list, outputs: list, inits: list = ()) -> Path:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, path.parent.name, inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _models(repo: Path) -> None:
    from onnx import TensorProto as T
    from onnx import helper

    def value(name: str, kind: int, dims: list) -> Any:
        return helper.make_tensor_value_info(name, kind, dims)

    _save(
        repo / "seq_sum" / "model.onnx",
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        [value("x", T.FLOAT, ["n", "L"])],
        [value("y", T.FLOAT, ["n", 1])],
        [helper.make_tensor("axes", T.INT64, [1], [1])],
    )
    _save(
        repo / "seq_double" / "model.onnx",
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        [value("x", T.FLOAT, ["n", "L"])],
        [value("y", T.FLOAT, ["n", "L"])],
        [helper.make_tensor("two", T.FLOAT, [], [2.0])],
    )
    _save(
        repo / "shout" / "model.onnx",
        [
            helper.make_node("StringConcat", ["text", "bang"], ["loud"]),
            helper.make_node("RegexFullMatch", ["text"], ["match"], pattern="a.*"),
        ],
        [value("text", T.STRING, ["n", 1])],
        [value("loud", T.STRING, ["n", 1]), value("match", T.BOOL, ["n", 1])],
        [helper.make_tensor("bang", T.STRING, [1], [b"!"])],
    )
    common = {
        "backend": "onnx",
        "model_file": "model.onnx",
        "max_batch_size": 8,
        "slo_ms": 20_000,
        "profile": {"alpha_ms": 1.0, "beta_ms": 5.0},
    }
    configs = {
        "seq_sum": {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1], "max_shape": [-1, 16]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
        },
        "seq_double": {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [-1, -1], "max_shape": [-1, 16],
                 "pad": [False, True]}
            ],
            "outputs": [
                {"name": "y", "datatype": "FP32", "shape": [-1, -1], "max_shape": [-1, 16],
                 "follows": [None, "x:1"]}
            ],
        },
        "shout": {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1, 1], "max_bytes": 16}],
            "outputs": [
                {"name": "loud", "datatype": "BYTES", "shape": [-1, 1], "max_bytes": 17},
                {"name": "match", "datatype": "BOOL", "shape": [-1, 1]},
            ],
        },
    }  # fmt: skip
    for name, tensors in configs.items():
        (repo / name / "config.yaml").write_text(yaml.safe_dump({**common, **tensors}))


def _ort(repo: Path, model: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(repo / model / "model.onnx")).run(None, feed)


# ------------------------------------------------------------------ config


def test_configs_load_and_their_onnx_signatures_agree(tmp_path):
    from app.repository.loader import load_repository
    from app.repository.signatures import onnx_signature, signature_problems

    _models(tmp_path)
    index = load_repository(tmp_path)
    assert index.errors == {}
    double = index.models["seq_double"]
    (x,), (y,) = double.inputs, double.outputs
    assert (x.shape, x.max_shape, x.slot_shape, x.pad) == ((-1, -1), (-1, 16), (16,), (False, True))
    assert y.follows == (None, ("x", 1))
    shout = index.models["shout"]
    assert shout.inputs[0].max_bytes == 16 and shout.inputs[0].item_nbytes == 4 + 16
    for config in index.models.values():
        assert signature_problems(config, *onnx_signature(config.model_file)) == []


def test_triton_parameters_bound_dims_and_bytes(tmp_path):
    from app.repository.loader import load_model_config

    _models(tmp_path)
    model = tmp_path / "pb"
    (model / "1").mkdir(parents=True)
    (tmp_path / "seq_double" / "model.onnx").rename(model / "1" / "model.onnx")
    pbtxt = """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }]
        output [{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }]
        parameters { key: "max_shape" value { string_value: "{x: [16], y: [16]}" } }
        parameters { key: "pad" value { string_value: "{x: [true]}" } }
        parameters { key: "follows" value { string_value: "{y: ['x:1']}" } }
    """
    (model / "config.pbtxt").write_text(pbtxt)
    config = load_model_config(model)
    assert config.inputs[0].max_shape == (-1, 16) and config.inputs[0].pad == (False, True)
    assert config.outputs[0].follows == (None, ("x", 1))
    (model / "config.pbtxt").write_text(pbtxt.split("parameters")[0])
    # Without max_shape, as Triton loads it: the variable dimension gets the
    # default bound (DEFAULT_MAX_ELEMENTS elements an item).
    config = load_model_config(model)
    assert config.inputs[0].max_shape == (-1, DEFAULT_MAX_ELEMENTS)
    assert config.outputs[0].max_shape == (-1, DEFAULT_MAX_ELEMENTS)


# ------------------------------------------------------------------ arena + executor


def _config(inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> ModelConfig:
    return ModelConfig("v", "onnx", Path("/nonexistent"), inputs, outputs, 8, 100.0)


def test_arena_rows_keep_each_request_shape_and_bytes(no_leftover_segments):
    x = TensorSpec("x", "FP32", (-1, -1, 2), max_shape=(-1, 5, 2))
    text = TensorSpec("t", "BYTES", (-1, 1), max_bytes=4)
    arena = Arena.create(_config((x, text), (x, text)), 4)
    try:
        a, b = arena.acquire_rows(2), arena.acquire_rows(1)
        xa = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
        arena.write_rows(a, {"x": xa, "t": np.array([[b"ab"], [b""]], dtype=object)})
        arena.write_rows(b, {"x": np.ones((1, 5, 2), np.float32), "t": np.array([["é"]], object)})
        assert arena.item_shapes("x", a + b) == [(3, 2), (3, 2), (5, 2)]
        batch = arena.gather("x", a + b, (5, 2))  # padded with 0 to the longest
        assert batch.shape == (3, 5, 2) and batch[:2, 3:].sum() == 0
        np.testing.assert_array_equal(batch[:2, :3], xa)
        assert arena.gather("t", a + b).tolist() == [[b"ab"], [b""], ["é".encode()]]
        arena.scatter("x", a + b, batch * 10, [(3, 2), (3, 2), (4, 2)])
        arena.scatter("t", a + b, np.array([["x"], ["yy"], ["zzz"]], dtype=object))
        out = arena.read_rows(a)
        np.testing.assert_array_equal(out["x"], xa * 10)
        assert out["t"].tolist() == [[b"x"], [b"yy"]]
        assert arena.read_rows(b)["x"].shape == (1, 4, 2)
        with pytest.raises(InvalidInput, match=r"'x': dimension 1 is 6, more than its bound 5"):
            arena.write_rows(b, {"x": np.ones((1, 6, 2), np.float32), "t": np.array([[b""]])})
        with pytest.raises(InvalidInput, match="5 bytes is longer than max_bytes 4"):
            arena.write_rows(
                b, {"x": np.ones((1, 1, 2), np.float32), "t": np.array([[b"12345"]], object)}
            )
    finally:
        arena.close_and_unlink()


class _Recorder:
    """A backend that doubles x and records each call's input."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(inputs["x"].copy())
        return {"y": inputs["x"] * 2}


@pytest.mark.parametrize("pad", [False, True])
def test_a_mixed_batch_runs_per_shape_or_padded(no_leftover_segments, pad):
    """Three requests of lengths 2, 3, 2: without `pad` two calls (the
    length-2 rows together), with it one call padded to 3; every answer has
    its own length and values."""
    x = TensorSpec("x", "FP32", (-1, -1), max_shape=(-1, 4), pad=(False, True) if pad else ())
    y = TensorSpec(
        "y", "FP32", (-1, -1), max_shape=(-1, 4), follows=(None, ("x", 1)) if pad else ()
    )
    arena = Arena.create(_config((x,), (y,)), 4)
    try:
        rows = [arena.acquire_rows(1) for _ in range(3)]
        data = [np.full((1, n), i + 1.0, np.float32) for i, n in enumerate([2, 3, 2])]
        for slots, d in zip(rows, data, strict=True):
            arena.write_rows(slots, {"x": d})
        backend = _Recorder()
        run_shape_groups(_config((x,), (y,)), backend, arena, [s for r in rows for s in r])
        if pad:
            (call,) = backend.calls
            np.testing.assert_array_equal(call, [[1, 1, 0], [2, 2, 2], [3, 3, 0]])
        else:
            assert [c.tolist() for c in backend.calls] == [[[1, 1], [3, 3]], [[2, 2, 2]]]
        for slots, d in zip(rows, data, strict=True):
            np.testing.assert_array_equal(arena.read_rows(slots)["y"], d * 2)
    finally:
        arena.close_and_unlink()


# ------------------------------------------------------------------ the daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory, launch_daemon):
    repo = tmp_path_factory.mktemp("variable") / "repo"
    _models(repo)
    handle = launch_daemon(
        repo, policy="symphony-wc", emulated_devices=0, cpu_slices=1, startup_timeout_s=300
    )
    return handle, repo


@pytest.mark.slow
def test_sequences_of_different_lengths_sent_together_equal_onnx_runtime(served):
    import tritonclient.http as th

    daemon, repo = served
    rng = np.random.default_rng(3)
    lengths = [3, 16, 1, 7, 7, 12, 3, 5]
    client = th.InferenceServerClient(
        daemon.url.split("://", 1)[1], concurrency=8, network_timeout=60
    )
    try:
        for model in ("seq_sum", "seq_double"):
            sent = []
            for i, n in enumerate(lengths):
                x = rng.standard_normal((1 + i % 2, n)).astype(np.float32)
                inp = th.InferInput("x", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=bool(i % 2))
                sent.append((x, client.async_infer(model, [inp])))
            for x, pending in sent:
                got = pending.get_result().as_numpy("y")
                (expected,) = _ort(repo, model, {"x": x})
                assert got.shape == expected.shape
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    finally:
        client.close()


@pytest.mark.slow
def test_bytes_in_json_and_binary_equal_onnx_runtime(served):
    import tritonclient.http as th

    daemon, repo = served
    text = np.array([[b"apple"], ["h\u00e9llo".encode()], [b""], [b"a" * 16]], dtype=object)
    (loud, match) = _ort(repo, "shout", {"text": np.array([[t.decode()] for (t,) in text])})
    client = th.InferenceServerClient(daemon.url.split("://", 1)[1], network_timeout=60)
    try:
        for binary in (False, True):
            inp = th.InferInput("text", [4, 1], "BYTES")
            inp.set_data_from_numpy(text, binary_data=binary)
            outputs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("loud", "match")]
            res = client.infer("shout", [inp], outputs=outputs)
            got = res.as_numpy("loud")
            assert got.shape == (4, 1)
            assert [v.decode() if isinstance(v, bytes) else v for v in got.reshape(-1)] == list(
                loud.reshape(-1)
            )
            np.testing.assert_array_equal(res.as_numpy("match"), match)
    finally:
        client.close()


@pytest.mark.slow
def test_over_the_bounds_is_a_400_naming_tensor_and_bound(served):
    import httpx

    daemon, _ = served
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        r = client.post("/v2/models/seq_sum/infer", json={
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 17], "data": [0.0] * 17}]
        })  # fmt: skip
        assert r.status_code == 400
        assert "input 'x': dimension 1 is 17, more than its bound 16" in r.json()["error"]
        r = client.post("/v2/models/shout/infer", json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["x" * 17]}]
        })  # fmt: skip
        assert r.status_code == 400
        assert (
            "input 'text': element 0 has 17 bytes, more than the tensor's max_bytes 16"
            in (r.json()["error"])
        )


@pytest.mark.slow
def test_grpc_bytes_and_sequences_equal_onnx_runtime(tmp_path_factory, launch_daemon):
    import tritonclient.grpc as tg

    from bench.daemon_launcher import free_port

    repo = tmp_path_factory.mktemp("variable_grpc") / "repo"
    _models(repo)
    port = free_port()
    daemon = launch_daemon(
        repo,
        policy="symphony-wc",
        emulated_devices=0,
        cpu_slices=1,
        startup_timeout_s=300,
        extra_env={"GRPC_PORT": str(port)},
    )
    assert daemon
    client = tg.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        x = np.arange(10, dtype=np.float32).reshape(2, 5)
        inp = tg.InferInput("x", [2, 5], "FP32")
        inp.set_data_from_numpy(x)
        (expected,) = _ort(repo, "seq_double", {"x": x})
        np.testing.assert_array_equal(client.infer("seq_double", [inp]).as_numpy("y"), expected)
        text = np.array([[b"abc"], [b"zz"]], dtype=object)
        inp = tg.InferInput("text", [2, 1], "BYTES")
        inp.set_data_from_numpy(text)
        res = client.infer("shout", [inp])
        assert res.as_numpy("loud").tolist() == [[b"abc!"], [b"zz!"]]
        assert res.as_numpy("match").tolist() == [[True], [False]]
    finally:
        client.close()


# ------------------------------------------------------------------ decoding


def _bytes_config() -> ModelConfig:
    text = TensorSpec("t", "BYTES", (-1, 2), max_bytes=3)
    return _config((text,), (text,))


def test_binary_bytes_are_length_prefixed_and_checked():
    from app.api.tensors import decode_binary_tensor, output_bytes

    spec = _bytes_config().inputs[0]
    blob = b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    got = decode_binary_tensor("t", spec, memoryview(blob), (1, 2))
    assert got.tolist() == [[b"ab", b""]]
    assert output_bytes(got) == blob  # the same form on the way out
    for bad, message in [
        (blob[:-1], "ends after 1 of the 2 elements"),
        (blob + b"x", "1 bytes after the 2 BYTES elements"),
        (b"\x09\x00\x00\x00ab", "element 0 says 9 bytes, 2 are left"),
        (b"\x04\x00\x00\x00abcd\x00\x00\x00\x00", "element 0 has 4 bytes, more than"),
        (b"\x01\x00\x00\x00\xff\x00\x00\x00\x00", "element 0 is not UTF-8 text"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            decode_binary_tensor("t", spec, memoryview(bad), (1, 2))


def test_json_bytes_are_strings():
    from app.api.tensors import decode_json_tensor, json_data

    spec = _bytes_config().inputs[0]
    got = decode_json_tensor("t", spec, ["ab", "é"], (1, 2))
    assert got.tolist() == [[b"ab", "é".encode()]]
    assert json_data("t", got) == ["ab", "é"]
    assert decode_json_tensor("t", spec, [["x", "y"]], None).shape == (1, 2)  # native nesting
    with pytest.raises(InvalidInput, match="BYTES elements are strings in JSON, got int"):
        decode_json_tensor("t", spec, ["ab", 3], (1, 2))
    with pytest.raises(InvalidInput, match="not a rectangular array of BYTES"):
        decode_json_tensor("t", spec, [["a"], ["b", "c"]], None)
    with pytest.raises(InvalidInput, match="output 't' holds bytes that are not UTF-8"):
        json_data("t", np.array([b"\xff"], dtype=object))


def test_grpc_bytes_contents_and_raw_contents():
    from tritonclient.grpc import service_pb2 as pb

    from app.grpc.tensors import decode_inputs

    config = _bytes_config()
    request = pb.ModelInferRequest(model_name="v")
    tensor = request.inputs.add(name="t", datatype="BYTES", shape=[1, 2])
    tensor.contents.bytes_contents.extend([b"ab", b"c"])
    assert decode_inputs(config, request, 1000)["t"].tolist() == [[b"ab", b"c"]]
    tensor.contents.bytes_contents[1] = b"long"
    with pytest.raises(InvalidInput, match="element 1 has 4 bytes, more than the tensor's"):
        decode_inputs(config, request, 1000)
    tensor.ClearField("contents")
    request.raw_input_contents.append(b"\x01\x00\x00\x00a\x01\x00\x00\x00b")
    assert decode_inputs(config, request, 1000)["t"].tolist() == [[b"a", b"b"]]


def test_body_limits_count_bounds():
    from app.api.limits import ELEMENT_SLACK, HEADER_ALLOWANCE, model_body_limit

    x = TensorSpec("x", "FP32", (-1, -1), max_shape=(-1, 16))
    text = TensorSpec("t", "BYTES", (-1, 2), max_bytes=3)
    per_item = 16 * (24 + ELEMENT_SLACK) + 2 * (6 * 3 + 2 + ELEMENT_SLACK)
    config = _config((x, text), (x,))
    assert model_body_limit(config, 1 << 30) == HEADER_ALLOWANCE + 8 * per_item
