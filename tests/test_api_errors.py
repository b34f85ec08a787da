"""HTTP API (app.api) error mapping against a fake InferenceService: every
malformed request gets its 4xx with a body naming the problem, fuzzed bodies
never a 500, the service's own errors (dropped, overloaded, a bug) their
status and reason."""

from __future__ import annotations

import gzip
import json
import socket
import struct

import httpx
import numpy as np
import pytest

from app.api import create_api
from tests.fakes import GOOD_V2, HDR, v2_binary_body, v2_body

pytestmark = pytest.mark.anyio


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
    ("native-batch-33", "/infer", {"model": "add_one", "inputs": {"x": [[1, 2, 3, 4]] * 33}}, {},
     400, ["'x'", "between 1 and the model's max_batch_size (32)", "got 33"]),
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
    ("v2-shape-floats", "/v2/models/add_one/infer", v2_body(shape=[1.0, 4.5]), {}, 422,
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
    ("v2-batch-33", "/v2/models/add_one/infer", v2_body(shape=[33, 4], data=[1] * 132), {}, 400,
     ["'x'", "batch dimension must be between 1 and the model's max_batch_size (32)", "[33, 4]"]),
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
    ("v2-priority", "/v2/models/add_one/infer", {**GOOD_V2, "parameters": {"priority": -1}}, {},
     400, ["Unable to parse 'priority'"]),
    ("v2-triton-param", "/v2/models/add_one/infer",
     {**GOOD_V2, "parameters": {"triton_x": True}}, {}, 400,
     ["parameter keys starting with 'triton_' are reserved for Triton usage"]),
    ("v2-custom-param", "/v2/models/add_one/infer",
     {**GOOD_V2, "parameters": {"scale": [2]}}, {}, 400,
     ["parameter 'scale' has invalid type"]),
    ("v2-output-param", "/v2/models/add_one/infer",
     {**GOOD_V2, "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r"}}]}, {},
     400, ["output 'y': the shared-memory extension is not supported"]),
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


# ------------------------------------------------------------------ a real server


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
