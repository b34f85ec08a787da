"""HTTP API (app.api) against a fake InferenceService: native /infer, KServe v2
(JSON and binary tensor data, by hand and through tritonclient.http against a
real uvicorn server), metadata and health routes, every malformed case, error
mapping, /metrics and the OpenAPI document."""

from __future__ import annotations

import gzip
import json
import math
import socket
import struct
import zlib

import httpx
import numpy as np
import pytest

from app.api import create_api
from app.server.metrics import Metrics
from tests.fakes import GOOD_V2, FakeService, v2_body

HDR = "Inference-Header-Content-Length"


# service, metrics, app and client: tests/conftest.py
pytestmark = pytest.mark.anyio


def v2_binary_body(header: dict, *blobs: bytes) -> tuple[bytes, dict]:
    js = json.dumps(header).encode()
    return js + b"".join(blobs), {HDR: str(len(js))}


def parse_v2_binary(resp: httpx.Response) -> dict[str, np.ndarray]:
    n = int(resp.headers[HDR])
    head = json.loads(resp.content[:n])
    off = n
    out = {}
    for o in head["outputs"]:
        dt = {"FP32": np.float32, "INT32": np.int32, "BOOL": np.bool_, "FP16": np.float16}
        if "data" in o:
            out[o["name"]] = np.array(o["data"], dtype=dt[o["datatype"]]).reshape(o["shape"])
        else:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(
                resp.content[off : off + size], dtype=dt[o["datatype"]]
            ).reshape(o["shape"])
            off += size
    assert off == len(resp.content)
    return out


# ------------------------------------------------------------------ native /infer


async def test_native_nested_list(client, service):
    r = await client.post(
        "/infer", json={"model": "add_one", "inputs": {"x": [[1, 2, 3, 4.5]]}, "id": "r1"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "add_one" and body["id"] == "r1"
    assert body["outputs"]["y"] == {"shape": [1, 4], "datatype": "FP32", "data": [[2, 3, 4, 5.5]]}
    assert body["timing"] == {
        "queue_ms": 1.25,
        "exec_ms": 3.5,
        "batch_size": 4,
        "device": "cpu:0",
        "intake_ms": 0.5,
        "answer_ms": 0.75,
    }
    assert service.calls[-1]["id"] == "r1" and service.calls[-1]["slo_ms"] is None


async def test_native_batch_dimension_added_and_flat_data(client, service):
    for inp in (
        [1, 2, 3, 4],
        {"data": [1, 2, 3, 4], "shape": [4]},
        {"data": [1, 2, 3, 4], "shape": [1, 4]},
        {"data": [[1, 2], [3, 4]], "shape": [1, 4]},
    ):
        r = await client.post("/infer", json={"model": "add_one", "inputs": {"x": inp}})
        assert r.status_code == 200, (inp, r.text)
        assert r.json()["outputs"]["y"]["data"] == [[2, 3, 4, 5]]
        assert service.calls[-1]["inputs"]["x"].shape == (1, 4)


async def test_native_without_content_type_like_curl(client):
    body = json.dumps({"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
    for ctype in (None, "application/x-www-form-urlencoded", "text/plain"):
        headers = {"content-type": ctype} if ctype else {}
        r = await client.post("/infer", content=body, headers=headers)
        assert r.status_code == 200, r.text


async def test_nan_and_inf_are_data(client):
    body = '{"model": "add_one", "inputs": {"x": [NaN, Infinity, -Infinity, 1]}}'
    r = await client.post("/infer", content=body)
    assert r.status_code == 200, r.text
    y = json.loads(r.text)["outputs"]["y"]["data"][0]  # Python's json reads NaN
    assert math.isnan(y[0]) and y[1] == math.inf and y[2] == -math.inf and y[3] == 2


async def test_json_encoding_without_orjson(client, monkeypatch):
    """Outputs are the same whether orjson (the fast path) is installed or not."""
    import app.api.bodies as bodies

    native = {"model": "typed", "inputs": {"a": [7, -3], "b": [True, False], "c": [[1, 2, 3]]}}
    v2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 2, 3, 1e30]}]}

    async def run():
        r1 = await client.post("/infer", json=native)
        r2 = await client.post("/v2/models/add_one/infer", json=v2)
        assert r1.status_code == r2.status_code == 200
        return r1.json(), r2.json()

    fast_native, fast_v2 = await run()
    monkeypatch.setattr(bodies, "_orjson", None)
    slow_native, slow_v2 = await run()
    assert fast_native == slow_native
    # float32 values may be written with different digits; they read back equal
    y_fast = np.float32(fast_v2["outputs"][0].pop("data"))
    y_slow = np.float32(slow_v2["outputs"][0].pop("data"))
    np.testing.assert_array_equal(y_fast, y_slow)
    np.testing.assert_array_equal(y_fast, np.float32([0.1, 2, 3, 1e30]) + np.float32(1))
    assert fast_v2 == slow_v2


async def test_slo_tighten_loosen(client, service):
    r = await client.post(
        "/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}, "slo_ms": 10}
    )
    assert r.status_code == 200 and service.calls[-1]["slo_ms"] == 10.0
    r = await client.post(
        "/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}, "slo_ms": 500}
    )
    assert r.status_code == 400 and "allow_slo_loosening" in r.json()["error"]
    r = await client.post(
        "/infer", json={"model": "loose", "inputs": {"x": [1, 2, 3, 4]}, "slo_ms": 500}
    )
    assert r.status_code == 200 and service.calls[-1]["slo_ms"] == 500.0
    v2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    r = await client.post("/v2/models/add_one/infer", json={**v2, "parameters": {"slo_ms": 7.5}})
    assert r.status_code == 200 and service.calls[-1]["slo_ms"] == 7.5
    r = await client.post("/v2/models/add_one/infer", json={**v2, "parameters": {"slo_ms": 51}})
    assert r.status_code == 400 and "slo_ms" in r.json()["error"]


async def test_typed_native(client, service):
    r = await client.post(
        "/infer",
        json={
            "model": "typed",
            "inputs": {"a": [7, -3], "b": [True, False], "c": [[[1.5, 2, 3], [4, 5, 6]]]},
        },
    )
    assert r.status_code == 200, r.text
    out = r.json()["outputs"]
    assert out["a2"] == {"shape": [1, 2], "datatype": "INT32", "data": [[14, -6]]}
    assert out["nb"] == {"shape": [1, 2], "datatype": "BOOL", "data": [[False, True]]}
    assert out["c"]["shape"] == [1, 2, 3] and out["c"]["datatype"] == "FP16"
    # integral floats are fine for integer tensors
    r = await client.post(
        "/infer",
        json={"model": "typed", "inputs": {"a": [7.0, 1], "b": [True, True], "c": [[1, 2, 3]]}},
    )
    assert r.status_code == 200, r.text
    assert service.calls[-1]["inputs"]["c"].shape == (1, 1, 3)


# ------------------------------------------------------------------ v2 JSON and binary


async def test_v2_json(client, service):
    req = {
        "id": "abc",
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
    }
    for path in ("/v2/models/add_one/infer", "/v2/models/add_one/versions/1/infer"):
        r = await client.post(path, json=req)
        assert r.status_code == 200, r.text
        assert HDR not in r.headers
        body = r.json()
        assert body["model_name"] == "add_one" and body["model_version"] == "1"
        assert body["id"] == "abc"
        assert body["parameters"]["batch_size"] == 4
        assert body["outputs"] == [
            {"name": "y", "shape": [1, 4], "datatype": "FP32", "data": [2, 3, 4, 5]}
        ]
    # nested data is accepted too; only requested outputs come back
    req["inputs"][0]["data"] = [[1, 2, 3, 4]]
    req["outputs"] = [{"name": "y"}]
    r = await client.post("/v2/models/add_one/infer", json=req)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4, 5]


async def test_v2_binary_by_hand_both_directions(client, service):
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    header = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
    body, headers = v2_binary_body(header, x.tobytes())
    r = await client.post("/v2/models/add_one/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    np.testing.assert_array_equal(parse_v2_binary(r)["y"], x + 1)
    head = json.loads(r.content[: int(r.headers[HDR])])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": 16}
    assert "data" not in head["outputs"][0]

    # binary in, JSON out (explicit binary_data_output false, no outputs listed)
    header.pop("outputs")
    header["parameters"] = {"binary_data_output": False}
    body, headers = v2_binary_body(header, x.tobytes())
    r = await client.post("/v2/models/add_one/infer", content=body, headers=headers)
    assert r.status_code == 200 and HDR not in r.headers
    assert r.json()["outputs"][0]["data"] == [2, 3, 4, 5]

    # JSON in, binary out through binary_data_output (all outputs)
    req = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
        "parameters": {"binary_data_output": True},
    }
    r = await client.post("/v2/models/add_one/infer", json=req)
    assert r.status_code == 200 and HDR in r.headers
    np.testing.assert_array_equal(parse_v2_binary(r)["y"], x + 1)

    # a per-output binary_data overrides binary_data_output
    req["outputs"] = [{"name": "y", "parameters": {"binary_data": False}}]
    r = await client.post("/v2/models/add_one/infer", json=req)
    assert r.status_code == 200 and HDR not in r.headers


async def test_v2_binary_mixed_datatypes(client, service):
    a = np.array([[5, -9]], dtype=np.int32)
    b = np.array([[True, False]])
    c = np.arange(6, dtype=np.float16).reshape(1, 2, 3)
    header = {
        "inputs": [
            {
                "name": "a",
                "shape": [1, 2],
                "datatype": "INT32",
                "parameters": {"binary_data_size": 8},
            },
            {"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
            {
                "name": "c",
                "shape": [1, 2, 3],
                "datatype": "FP16",
                "parameters": {"binary_data_size": 12},
            },
        ],
        "outputs": [
            {"name": "c", "parameters": {"binary_data": True}},
            {"name": "nb"},
            {"name": "a2", "parameters": {"binary_data": True}},
        ],
    }
    body, headers = v2_binary_body(header, a.tobytes(), c.tobytes())
    r = await client.post("/v2/models/typed/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    out = parse_v2_binary(r)
    np.testing.assert_array_equal(out["a2"], a * 2)
    np.testing.assert_array_equal(out["nb"], ~b)
    np.testing.assert_array_equal(out["c"], c)
    head = json.loads(r.content[: int(r.headers[HDR])])
    assert [o["name"] for o in head["outputs"]] == ["c", "nb", "a2"]  # requested order
    assert service.calls[-1]["inputs"]["b"].dtype == np.bool_


async def test_v2_request_compression(client):
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    header = {
        "inputs": [
            {
                "name": "x",
                "shape": [1, 4],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 16},
            }
        ]
    }
    body, headers = v2_binary_body(header, x.tobytes())
    for enc, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        r = await client.post(
            "/v2/models/add_one/infer", content=data, headers={**headers, "Content-Encoding": enc}
        )
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [2, 3, 4, 5]


# ------------------------------------------------------------------ metadata, health, index


async def test_metadata_health_index(client, service):
    r = await client.get("/v2")
    assert r.status_code == 200
    meta = r.json()
    assert meta["name"] == "deadline-serve" and "binary_tensor_data" in meta["extensions"]
    assert meta["version"]
    assert (await client.get("/v2/health/live")).json() == {"live": True}
    assert (await client.get("/v2/health/ready")).json() == {"ready": True}
    r = await client.get("/v2/models/typed")
    assert r.json() == {
        "name": "typed",
        "versions": ["1"],
        "platform": "emulated",
        "inputs": [
            {"name": "a", "datatype": "INT32", "shape": [-1, 2]},
            {"name": "b", "datatype": "BOOL", "shape": [-1, 2]},
            {"name": "c", "datatype": "FP16", "shape": [-1, -1, 3]},
        ],
        "outputs": [
            {"name": "a2", "datatype": "INT32", "shape": [-1, 2]},
            {"name": "nb", "datatype": "BOOL", "shape": [-1, 2]},
            {"name": "c", "datatype": "FP16", "shape": [-1, -1, 3]},
        ],
    }
    assert (await client.get("/v2/models/typed/versions/1")).json() == r.json()
    assert (await client.get("/v2/models/typed/versions/2")).status_code == 404
    cfg = (await client.get("/v2/models/add_one/config")).json()
    assert cfg["max_batch_size"] == 32 and cfg["slo_ms"] == 50
    assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert (await client.get("/v2/models/add_one/versions/1/config")).status_code == 200
    assert (await client.get("/v2/models/add_one/ready")).json() == {
        "name": "add_one",
        "ready": True,
    }
    assert (await client.get("/v2/models/add_one/versions/1/ready")).status_code == 200
    r = await client.get("/v2/models/cold/ready")
    assert r.status_code == 400 and r.json()["reason"] == "not_ready"
    r = await client.get("/v2/models/nope/ready")
    assert r.status_code == 404 and "nope" in r.json()["error"]

    index = (await client.post("/v2/repository/index")).json()
    assert {e["name"] for e in index} == set(service.configs)
    assert all(set(e) == {"name", "version", "state", "reason"} for e in index)
    ready = (await client.post("/v2/repository/index", json={"ready": True})).json()
    assert "cold" not in {e["name"] for e in ready} and len(ready) == len(index) - 1
    r = await client.post("/v2/repository/index", content=b"{nope")
    assert r.status_code == 400

    service.ready = False
    r = await client.get("/v2/health/ready")
    assert r.status_code == 400 and "error" in r.json()
    assert (await client.get("/v2/health/live")).status_code == 200


# ------------------------------------------------------------------ errors


def _bin(header_inputs, blob, header_len_delta=0, header_value=None, extra=None):
    js = json.dumps({"inputs": header_inputs, **(extra or {})}).encode()
    hv = header_value if header_value is not None else str(len(js) + header_len_delta)
    return js + blob, {HDR: hv}


_X16 = np.arange(4, dtype=np.float32).tobytes()
_BIN_X = {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}

# (id, path, body (dict → JSON | bytes), headers, status, words the error must contain)
BAD = [
    ("native-unknown-model", "/infer", {"model": "nope", "inputs": {"x": [1]}}, {}, 404, ["nope"]),
    ("v2-unknown-model", "/v2/models/nope/infer", GOOD_V2, {}, 404, ["nope"]),
    ("v2-unknown-version", "/v2/models/add_one/versions/9/infer", GOOD_V2, {}, 404, ["9"]),
    ("native-bad-json", "/infer", b'{"model": "add_one", ', {}, 400, ["JSON"]),
    ("v2-bad-json", "/v2/models/add_one/infer", b"{inputs: []}", {}, 400, ["JSON"]),
    ("native-not-utf8", "/infer", b"\xff\xfe\x00garbage", {}, 400, ["JSON"]),
    ("native-missing-inputs", "/infer", {"model": "add_one"}, {}, 422, ["inputs"]),
    ("native-body-is-list", "/infer", [1, 2], {}, 422, []),
    ("native-extra-field", "/infer", {"model": "add_one", "inputs": {}, "input": 1}, {}, 422,
     ["input"]),
    ("native-tensor-string", "/infer", {"model": "add_one", "inputs": {"x": "abc"}}, {}, 422,
     ["input 'x'"]),
    ("native-bad-slo", "/infer", {"model": "add_one", "inputs": {"x": [1, 2, 3, 4]},
     "slo_ms": -1}, {}, 422, ["slo_ms"]),
    ("native-slo-string", "/infer", {"model": "add_one", "inputs": {"x": [1, 2, 3, 4]},
     "slo_ms": "5"}, {}, 422, ["slo_ms"]),
    ("native-loosen", "/infer", {"model": "add_one", "inputs": {"x": [1, 2, 3, 4]},
     "slo_ms": 60}, {}, 400, ["slo_ms", "50"]),
    ("native-wrong-shape", "/infer", {"model": "add_one", "inputs": {"x": [1, 2, 3]}}, {}, 400,
     ["'x'", "[1, 4]", "[1, 3]"]),
    ("native-batch-2", "/infer", {"model": "add_one", "inputs": {"x": [[1, 2, 3, 4]] * 2}}, {},
     400, ["'x'", "batch dimension must be 1", "one item"]),
    ("native-ragged", "/infer", {"model": "add_one", "inputs": {"x": [[1, 2], [3]]}}, {}, 400,
     ["'x'", "rectangular"]),
    ("native-strings", "/infer", {"model": "add_one", "inputs": {"x": ["a", "b", "c", "d"]}}, {},
     400, ["'x'", "FP32", "strings"]),
    ("native-nulls", "/infer", {"model": "add_one", "inputs": {"x": [1, None, 3, 4]}}, {}, 400,
     ["'x'"]),
    ("native-bools-for-float", "/infer", {"model": "add_one",
     "inputs": {"x": [True, False, True, True]}}, {}, 400, ["'x'", "booleans"]),
    ("native-flat-count", "/infer", {"model": "add_one",
     "inputs": {"x": {"data": [1, 2, 3], "shape": [1, 4]}}}, {}, 400, ["'x'", "4 elements", "3"]),
    ("native-missing-input", "/infer", {"model": "add_one", "inputs": {}}, {}, 400,
     ["missing input 'x'"]),
    ("native-unknown-input", "/infer", {"model": "add_one",
     "inputs": {"x": [1, 2, 3, 4], "z": [1]}}, {}, 400, ["unknown input 'z'"]),
    ("native-int-overflow", "/infer", {"model": "typed", "inputs": {"a": [2**40, 1],
     "b": [True, True], "c": [[1, 2, 3]]}}, {}, 400, ["'a'", "INT32", "range"]),
    ("native-int-fraction", "/infer", {"model": "typed", "inputs": {"a": [1.5, 1],
     "b": [True, True], "c": [[1, 2, 3]]}}, {}, 400, ["'a'", "non-integer"]),
    ("native-bool-numbers", "/infer", {"model": "typed", "inputs": {"a": [1, 1],
     "b": [1, 0], "c": [[1, 2, 3]]}}, {}, 400, ["'b'", "BOOL"]),
    ("native-huge-int", "/infer", {"model": "typed", "inputs": {"a": [2**80, 1],
     "b": [True, True], "c": [[1, 2, 3]]}}, {}, 400, ["'a'"]),
    ("v2-missing-inputs", "/v2/models/add_one/infer", {"id": "1"}, {}, 422, ["inputs"]),
    ("v2-shape-not-ints", "/v2/models/add_one/infer", v2_body(shape=[1, "4"]), {}, 422,
     ["input 'x'", "shape[1]"]),
    ("v2-shape-floats", "/v2/models/add_one/infer", v2_body(shape=[1.0, 4.0]), {}, 422,
     ["input 'x'"]),
    ("v2-negative-binary-size", "/v2/models/add_one/infer",
     v2_body(parameters={"binary_data_size": -4}), {}, 422, ["input 'x'", "binary_data_size"]),
    ("v2-wrong-datatype", "/v2/models/add_one/infer", v2_body(datatype="INT32"), {}, 400,
     ["'x'", "FP32", "INT32"]),
    ("v2-bytes-datatype", "/v2/models/add_one/infer", v2_body(datatype="BYTES"), {}, 400,
     ["'x'", "FP32", "BYTES"]),
    ("v2-wrong-shape", "/v2/models/add_one/infer", v2_body(shape=[1, 5], data=[1] * 5), {}, 400,
     ["'x'", "[1, 4]", "[1, 5]"]),
    ("v2-no-batch-dim", "/v2/models/add_one/infer", v2_body(shape=[4]), {}, 400,
     ["'x'", "[1, 4]", "batch dimension first"]),
    ("v2-batch-2", "/v2/models/add_one/infer", v2_body(shape=[2, 4], data=[1] * 8), {}, 400,
     ["'x'", "batch dimension must be 1"]),
    ("v2-negative-dim", "/v2/models/add_one/infer", v2_body(shape=[1, -4]), {}, 400,
     ["'x'", "non-negative"]),
    ("v2-count", "/v2/models/add_one/infer", v2_body(data=[1, 2, 3]), {}, 400,
     ["'x'", "4 elements", "got 3"]),
    ("v2-no-data", "/v2/models/add_one/infer", v2_body(data=None), {}, 400, ["'x'", "no data"]),
    ("v2-duplicate-input", "/v2/models/add_one/infer",
     {"inputs": GOOD_V2["inputs"] * 2}, {}, 400, ["'x'", "more than once"]),
    ("v2-unknown-input", "/v2/models/add_one/infer", v2_body(name="z"), {}, 400,
     ["unknown input 'z'", "x"]),
    ("v2-unknown-output", "/v2/models/add_one/infer", {**GOOD_V2, "outputs": [{"name": "q"}]},
     {}, 400, ["unknown output 'q'", "y"]),
    ("v2-classification", "/v2/models/add_one/infer",
     {**GOOD_V2, "outputs": [{"name": "y", "parameters": {"classification": 3}}]}, {}, 400,
     ["'y'", "classification"]),
    ("v2-shared-memory", "/v2/models/add_one/infer",
     v2_body(parameters={"shared_memory_region": "r0"}), {}, 400, ["'x'", "shared-memory"]),
    ("v2-slo-bool", "/v2/models/add_one/infer", {**GOOD_V2, "parameters": {"slo_ms": True}}, {},
     422, ["slo_ms"]),
    ("v2-bin-header-too-long", "/v2/models/add_one/infer", *_bin([_BIN_X], _X16, 100), 400,
     [HDR]),
    ("v2-bin-header-not-int", "/v2/models/add_one/infer",
     *_bin([_BIN_X], _X16, header_value="12abc"), 400, [HDR]),
    ("v2-bin-header-negative", "/v2/models/add_one/infer",
     *_bin([_BIN_X], _X16, header_value="-5"), 400, [HDR]),
    ("v2-bin-header-too-short", "/v2/models/add_one/infer", *_bin([_BIN_X], _X16, -3), 400,
     ["JSON"]),
    ("v2-bin-truncated", "/v2/models/add_one/infer", *_bin([_BIN_X], _X16[:12]), 400,
     ["16", "12", "x"]),
    ("v2-bin-extra-bytes", "/v2/models/add_one/infer", *_bin([_BIN_X], _X16 + b"\0" * 4), 400,
     ["16", "20"]),
    ("v2-bin-size-vs-shape", "/v2/models/add_one/infer",
     *_bin([{**_BIN_X, "parameters": {"binary_data_size": 12}}], _X16[:12]), 400,
     ["'x'", "12", "16 bytes"]),
    ("v2-bin-unexpected-bytes", "/v2/models/add_one/infer",
     *_bin(GOOD_V2["inputs"], b"\0" * 8), 400, ["8 unexpected bytes"]),
    ("v2-bin-without-header", "/v2/models/add_one/infer", {"inputs": [_BIN_X]}, {}, 400,
     [HDR, "x: 16"]),
    ("v2-bin-and-data", "/v2/models/add_one/infer",
     *_bin([{**_BIN_X, "data": [1, 2, 3, 4]}], _X16), 400, ["'x'", "both"]),
    ("v2-bin-bad-bool", "/v2/models/typed/infer",
     *_bin([{"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]},
            {"name": "b", "shape": [1, 2], "datatype": "BOOL",
             "parameters": {"binary_data_size": 2}},
            {"name": "c", "shape": [1, 1, 3], "datatype": "FP16", "data": [1, 2, 3]}],
           b"\x01\x07"), 400, ["'b'", "BOOL"]),
    ("bad-gzip", "/v2/models/add_one/infer", b"not gzip at all",
     {"Content-Encoding": "gzip"}, 400, ["gzip"]),
    ("truncated-gzip", "/infer",
     gzip.compress(json.dumps({"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}}).encode())[:-9],
     {"Content-Encoding": "gzip"}, 400, ["gzip"]),
    ("unsupported-encoding", "/infer", b"{}", {"Content-Encoding": "br"}, 415, ["br"]),
    ("too-large", "/infer", b" " * ((1 << 20) + 1), {}, 413, ["exceeds"]),
    ("gzip-bomb", "/infer", gzip.compress(b" " * (4 << 20)), {"Content-Encoding": "gzip"}, 413,
     ["exceeds"]),
]  # fmt: skip


@pytest.mark.parametrize(
    "path,body,headers,status,words", [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
async def test_bad_requests(client, service, path, body, headers, status, words):
    if isinstance(body, bytes):
        r = await client.post(path, content=body, headers=headers)
    else:
        r = await client.post(path, content=json.dumps(body).encode(), headers=headers)
    assert r.status_code == status, r.text
    err = r.json()
    assert isinstance(err["error"], str) and err["error"]
    assert err["reason"]
    for w in words:
        assert w in err["error"], (w, err["error"])
    assert not service.calls  # nothing reached the scheduler
    ok = await client.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
    assert ok.status_code == 200  # and the server keeps answering


async def test_fuzzed_requests_never_500(client, service):
    """Random corruptions of valid requests: always a 4xx JSON error or a 200."""
    rng = np.random.default_rng(7)
    x = np.arange(4, dtype=np.float32)
    good_bin, good_headers = v2_binary_body({"inputs": [_BIN_X]}, x.tobytes())
    good_json = json.dumps(GOOD_V2).encode()
    native = json.dumps({"model": "typed", "inputs": {"a": [1, 2], "b": [True, False],
                         "c": {"data": [1, 2, 3], "shape": [1, 3]}}}).encode()  # fmt: skip
    seeds = [
        ("/v2/models/add_one/infer", good_bin, good_headers),
        ("/v2/models/add_one/infer", good_json, {}),
        ("/infer", native, {}),
    ]
    for i in range(300):
        path, body, headers = seeds[i % len(seeds)]
        body = bytearray(body)
        headers = dict(headers)
        op = rng.integers(5)
        if op == 0 and body:  # truncate
            body = body[: rng.integers(len(body))]
        elif op == 1 and body:  # flip a few bytes
            for pos in rng.integers(len(body), size=rng.integers(1, 4)):
                body[pos] = rng.integers(256)
        elif op == 2:  # lie about the header length
            headers[HDR] = str(int(rng.integers(-3, len(body) + 5)))
        elif op == 3 and body:  # swap in printable garbage
            pos = int(rng.integers(len(body)))
            body[pos : pos + 3] = rng.choice(list(b'{}[],:"0-9eE.tn'), size=3).tobytes()
        else:  # append junk
            body += bytes(rng.integers(256, size=int(rng.integers(1, 9)), dtype=np.uint8))
        r = await client.post(path, content=bytes(body), headers=headers)
        assert r.status_code == 200 or 400 <= r.status_code < 500, (i, r.status_code, r.text)
        if r.status_code != 200:
            assert r.json()["error"]


async def test_dropped_overloaded_internal(client):
    x = {"x": [1, 2, 3, 4]}
    r = await client.post("/infer", json={"model": "dropper", "inputs": x})
    assert r.status_code == 503
    assert r.json() == {
        "error": "deadline can no longer be met (needs 7.0 ms, 1.0 left)",
        "reason": "deadline",
    }
    r = await client.post("/v2/models/dropper/infer", json=GOOD_V2)
    assert r.status_code == 503 and r.json()["reason"] == "deadline"
    r = await client.post("/infer", json={"model": "busy", "inputs": x})
    assert r.status_code == 429 and r.json()["reason"] == "overloaded"
    assert r.headers["retry-after"] == "1"
    r = await client.post("/v2/models/busy/infer", json=GOOD_V2)
    assert r.status_code == 429
    r = await client.post("/infer", json={"model": "broken", "inputs": x})
    assert r.status_code == 500 and r.json()["reason"] == "internal"
    r = await client.post("/infer", json={"model": "add_one", "inputs": x})
    assert r.status_code == 200


async def test_framework_errors_are_json(client):
    r = await client.get("/no/such/route")
    assert r.status_code == 404 and r.json()["error"]
    r = await client.get("/infer")
    assert r.status_code == 405 and r.json()["reason"] == "method_not_allowed"


async def test_service_provider_errors(metrics):
    from app.errors import ShuttingDown

    def provider():
        raise ShuttingDown("server is shutting down")

    app = create_api(provider, metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        r = await c.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
        assert r.status_code == 503 and r.json()["reason"] == "shutting_down"
        assert (await c.get("/v2/health/ready")).status_code == 400
        assert (await c.get("/v2/health/live")).status_code == 200


# ------------------------------------------------------------------ metrics


async def test_metrics(client, metrics):
    metrics.request_received("add_one")
    metrics.request_received("add_one")
    metrics.request_finished("add_one", 0.012, 0.002, 8, True)
    metrics.request_finished("add_one", 0.080, 0.050, 8, False)
    metrics.request_dropped("add_one", "deadline")
    metrics.batch_executed("add_one", "cpu:0", 8)
    metrics.set_device_busy("cpu:0", 0.75)
    metrics.set_autoscale(bad_rate=12.5, idle_fraction=0.25, advised_change=2)
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in (
        'requests_total{model="add_one"} 2.0',
        'goodput_total{model="add_one"} 1.0',
        'late_total{model="add_one"} 1.0',
        'dropped_total{model="add_one",reason="deadline"} 1.0',
        'queue_delay_seconds_count{model="add_one"} 2.0',
        'latency_seconds_bucket{le="0.015",model="add_one"} 1.0',
        'batch_size_count{model="add_one"} 1.0',
        'request_batch_size_sum{model="add_one"} 16.0',
        'batches_total{device="cpu:0",model="add_one"} 1.0',
        'busy_fraction{device="cpu:0"} 0.75',
        "bad_rate 12.5",
        "idle_fraction 0.25",
        "advised_device_change 2.0",
    ):
        assert line in text, line
    om = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")


def test_metrics_namespace_and_isolation():
    a, b = Metrics(namespace="dserve"), Metrics()
    a.request_received("m")
    text_a = a.render()[0].decode()
    assert 'dserve_requests_total{model="m"} 1.0' in text_a
    assert 'requests_total{model="m"}' not in b.render()[0].decode()


# ------------------------------------------------------------------ OpenAPI


async def test_openapi_document(client):
    r = await client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    paths = doc["paths"]
    expected = {
        "/infer": {"post"},
        "/v2": {"get"},
        "/v2/health/live": {"get"},
        "/v2/health/ready": {"get"},
        "/v2/models/{name}": {"get"},
        "/v2/models/{name}/versions/{version}": {"get"},
        "/v2/models/{name}/config": {"get"},
        "/v2/models/{name}/versions/{version}/config": {"get"},
        "/v2/models/{name}/ready": {"get"},
        "/v2/models/{name}/versions/{version}/ready": {"get"},
        "/v2/models/{name}/infer": {"post"},
        "/v2/models/{name}/versions/{version}/infer": {"post"},
        "/v2/repository/index": {"post"},
        "/metrics": {"get"},
    }
    assert {p: set(ops) for p, ops in paths.items()} == expected
    schemas = doc["components"]["schemas"]

    def resolve(node):
        if isinstance(node, dict):
            if "$ref" in node:
                name = node["$ref"].removeprefix("#/components/schemas/")
                assert name in schemas, node["$ref"]
            for v in node.values():
                resolve(v)
        elif isinstance(node, list):
            for v in node:
                resolve(v)

    resolve(doc)
    assert "HTTPValidationError" not in json.dumps(doc)  # 422s are ErrorResponse too
    for path, ops in paths.items():
        for op in ops.values():
            ok = op["responses"]["200"]["content"]
            assert any("schema" in c for c in ok.values()), path
            if path not in ("/metrics", "/v2", "/v2/health/live"):  # these cannot fail
                assert "ErrorResponse" in json.dumps(op["responses"]), path
    # request bodies of hand-parsed routes are documented
    req = paths["/infer"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert req == {"$ref": "#/components/schemas/InferRequest"}
    assert set(schemas["InferRequest"]["required"]) == {"model", "inputs"}
    infer = paths["/v2/models/{name}/infer"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/V2InferRequest"
    )
    assert {p["name"] for p in infer["parameters"]} >= {"name", HDR}
    assert set(infer["responses"]["200"]["content"]) == {
        "application/json",
        "application/octet-stream",
    }
    assert infer["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/V2InferResponse"
    )
    assert HDR in infer["responses"]["200"]["headers"]
    for code in ("400", "404", "422", "429", "503"):
        assert code in infer["responses"]
    assert "binary_data_size" in json.dumps(schemas["V2InputParameters"])
    assert "slo_ms" in json.dumps(schemas["V2RequestParameters"])
    idx = paths["/v2/repository/index"]["post"]
    assert idx["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/RepositoryIndexRequest"
    )
    import openapi_spec_validator  # the `test` extra's

    openapi_spec_validator.validate(doc)


# ------------------------------------------------------------------ real server + tritonclient


@pytest.fixture(scope="module")
def live_server(uvicorn_in_thread):
    service = FakeService()
    return uvicorn_in_thread(create_api(lambda: service, Metrics())), service


@pytest.fixture(scope="module")
def triton(live_server):
    import tritonclient.http  # the `test` extra's

    client = tritonclient.http.InferenceServerClient(live_server[0], network_timeout=10)
    yield client
    client.close()


@pytest.mark.slow
@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False, None])  # None: no outputs → all binary
def test_tritonclient_infer(live_server, triton, binary_in, binary_out):
    import tritonclient.http as th

    x = np.array([[1.5, -2, 3, 1e30]], dtype=np.float32)
    inp = th.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    outputs = None if binary_out is None else [th.InferRequestedOutput("y", binary_data=binary_out)]
    res = triton.infer("add_one", [inp], outputs=outputs, request_id="t1")
    np.testing.assert_array_equal(res.as_numpy("y"), x + 1)
    out = res.get_output("y")
    assert ("binary_data_size" in out.get("parameters", {})) == (binary_out is not False)
    resp = res.get_response()
    assert resp["id"] == "t1" and resp["parameters"]["batch_size"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_datatypes_and_versions(live_server, triton, binary):
    import tritonclient.http as th

    a = np.array([[3, -4]], dtype=np.int32)
    b = np.array([[False, True]])
    c = (np.arange(9, dtype=np.float16) / 3).reshape(1, 3, 3)
    inputs = []
    for name, arr, dt in (("a", a, "INT32"), ("b", b, "BOOL"), ("c", c, "FP16")):
        i = th.InferInput(name, list(arr.shape), dt)
        i.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(i)
    outputs = [th.InferRequestedOutput(n, binary_data=binary) for n in ("a2", "nb", "c")]
    res = triton.infer("typed", inputs, model_version="1", outputs=outputs)
    np.testing.assert_array_equal(res.as_numpy("a2"), a * 2)
    np.testing.assert_array_equal(res.as_numpy("nb"), ~b)
    np.testing.assert_array_equal(res.as_numpy("c"), c)


@pytest.mark.slow
def test_tritonclient_compression_slo_and_errors(live_server, triton):
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    service = live_server[1]
    x = np.array([[0, 1, 2, 3]], dtype=np.float32)
    inp = th.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    for algo in ("gzip", "deflate"):
        res = triton.infer(
            "add_one", [inp], request_compression_algorithm=algo, parameters={"slo_ms": 9}
        )
        np.testing.assert_array_equal(res.as_numpy("y"), x + 1)
        assert service.calls[-1]["slo_ms"] == 9
    with pytest.raises(InferenceServerException, match="deadline can no longer be met") as e:
        triton.infer("dropper", [inp])
    assert e.value.status() == "503"
    with pytest.raises(InferenceServerException) as e:
        triton.infer("busy", [inp])
    assert e.value.status() == "429"
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        triton.infer("nope", [inp])
    bad = th.InferInput("x", [1, 4], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 4), np.int32))
    with pytest.raises(InferenceServerException, match="input 'x': expected datatype FP32"):
        triton.infer("add_one", [bad])
    with pytest.raises(InferenceServerException, match="slo_ms"):
        triton.infer("add_one", [inp], parameters={"slo_ms": 1000})
    # still serving
    np.testing.assert_array_equal(triton.infer("add_one", [inp]).as_numpy("y"), x + 1)


@pytest.mark.slow
def test_tritonclient_metadata(live_server, triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("add_one") and triton.is_model_ready("add_one", "1")
    assert not triton.is_model_ready("cold")
    meta = triton.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"]
    md = triton.get_model_metadata("add_one")
    assert md["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert triton.get_model_metadata("add_one", "1") == md
    cfg = triton.get_model_config("add_one")
    assert cfg["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]
    index = triton.get_model_repository_index()
    assert {m["name"] for m in index} >= {"add_one", "typed", "cold"}


@pytest.mark.slow
def test_live_server_survives_garbage(live_server, triton):
    """Raw malformed traffic at the real server, then normal service."""
    addr = live_server[0]
    with httpx.Client(base_url=f"http://{addr}", timeout=10) as c:
        for path, body, headers in (
            (case[1], case[2], case[3]) for case in BAD if not case[0].startswith("too-large")
        ):
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = c.post(path, content=content, headers=headers)
            assert 400 <= r.status_code < 500 and "error" in r.json(), (path, r.text)
        # lying Content-Length-free chunked body and a truncated binary stream
        r = c.post("/v2/models/add_one/infer", content=iter([b'{"inputs": [', b"]}"]))
        assert r.status_code == 400  # empty inputs → missing input 'x'
        assert "missing input 'x'" in r.json()["error"]
    # a half-sent body: the client goes away mid-request
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(
            b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
            b"Inference-Header-Content-Length: 10\r\n\r\n" + struct.pack("<4f", 1, 2, 3, 4)
        )
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    import tritonclient.http as th

    inp = th.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(triton.infer("add_one", [inp]).as_numpy("y"), x + 1)
