"""What a request may cost the server before it is refused: each model's body
limit (app.api.limits) checked from Content-Length before the body is read
and while it streams, gzip/deflate decoded chunk by chunk under the same
limit, big JSON parsed in a worker thread (app.api.bodies), and FP16/FP32
numbers held to their datatype's range (app.api.tensors).

The limits are asserted by what the app pulled from the ASGI `receive`, what
the decoder produced and the memory traced, never by time."""

from __future__ import annotations

import gzip
import json
import math
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from app.api import bodies, create_api
from app.api.limits import (
    DEFAULT_MAX_JSON_BYTES,
    HEADER_ALLOWANCE,
    RequestLimits,
    element_bytes,
    model_body_limit,
)
from app.repository import BUNDLED_REPOSITORY
from app.repository.config import ModelConfig
from app.server.metrics import Metrics
from app.server.service import InferResult
from tests.fakes import HDR, FakeService, api_config, v2_binary_body

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
MAX = 1 << 20  # the conftest app's max_body_bytes
# The native /infer is all JSON: MAX_JSON_BYTES caps it below the largest
# bundled model's limit.
NATIVE_LIMIT = DEFAULT_MAX_JSON_BYTES  # 2,097,152 bytes
ADD_ONE_LIMIT = HEADER_ALLOWANCE + 32 * 4 * (24 + 24)  # FP32 [-1, 4], 32 items: 71,680 bytes


def bundled_configs() -> dict[str, ModelConfig]:
    """The bundled models' configs (their inputs and outputs; no model files
    needed), those of fixed shapes: a variable dimension's limit is
    max_body_bytes (`typed` tests it), the same for the bundled encoder."""
    configs = {}
    for path in sorted(BUNDLED_REPOSITORY.glob("*/config.yaml")):
        doc = yaml.safe_load(path.read_text())
        if any(-1 in t["shape"][1:] for t in doc["inputs"] + doc["outputs"]):
            continue

        def specs(key: str, doc: dict = doc) -> list[tuple[str, str, tuple[int, ...]]]:
            return [(t["name"], t["datatype"], tuple(t["shape"])) for t in doc[key]]

        name = path.parent.name
        configs[name] = api_config(name, specs("inputs"), specs("outputs"))
    assert len(configs) >= 5, sorted(configs)
    return configs


class BundledService(FakeService):
    """The bundled models' configs; every output is zeros of its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.configs = bundled_configs()

    async def infer(self, model, inputs, *, slo_ms=None, request_id=None, received_at=None, app=""):
        self.calls.append({"model": model, "inputs": inputs})
        config = self.configs[model]
        outs = {s.name: np.zeros((1, *s.item_shape), s.dtype) for s in config.outputs}
        return InferResult(model, request_id, outs, 1.0, 1.0, 1, "cpu:0", 0.1, 0.1)


async def asgi_post(
    app: Any, path: str, headers: dict[str, str], chunks: list[bytes] | AsyncIterator[bytes]
) -> tuple[int, dict, int]:
    """POST through the raw ASGI interface: (status, JSON body, bytes the app
    pulled from `receive`). `chunks` are sent one per receive call, the last
    with more_body false; no Content-Length unless `headers` has one."""
    pulled = 0
    source = chunks if hasattr(chunks, "__anext__") else _aiter(chunks)
    ended = False

    async def receive() -> dict:
        nonlocal pulled, ended
        if ended:
            return {"type": "http.disconnect"}
        try:
            chunk = await source.__anext__()  # type: ignore[union-attr]
        except StopAsyncIteration:
            ended = True
            return {"type": "http.request", "body": b"", "more_body": False}
        pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "server": ("test", 80),
        "client": ("127.0.0.1", 1),
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), pulled


async def _aiter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


# ------------------------------------------------------------------ the limits


def test_each_model_gets_a_limit_from_its_inputs():
    service = FakeService()
    add_one = service.configs["add_one"]
    assert element_bytes(add_one.inputs[0]) == 48  # FP32: 24 bytes of text + 24 of slack
    assert model_body_limit(add_one, MAX) == ADD_ONE_LIMIT == 71_680
    assert model_body_limit(add_one, 1000) == 1000  # max_body_bytes stays the ceiling
    # a variable dimension (typed's c: FP16 [-1, -1, 3]) falls back to max_body_bytes
    assert model_body_limit(service.configs["typed"], MAX) == MAX
    limits = RequestLimits(MAX)
    assert limits.for_model(add_one) is limits.for_model(add_one)  # computed once
    assert limits.for_model(add_one).bytes == ADD_ONE_LIMIT
    assert limits.for_model(service.configs["typed"]) is limits.server
    # the native route, before it knows the model: the largest limit (typed's)
    assert limits.any_model(service).bytes == MAX

    bundled = {name: model_body_limit(c, 64 << 20) for name, c in bundled_configs().items()}
    # max_batch_size 32 items of each input
    assert bundled["mlp"] == HEADER_ALLOWANCE + 32 * 4096 * 48 == 6_356_992  # FP32 [-1, 4096]
    assert bundled["cnn"] == HEADER_ALLOWANCE + 32 * 3 * 32 * 32 * 48 == 4_784_128
    assert bundled["resnet50-emulated"] == HEADER_ALLOWANCE + 32 * 16 * 48 == 90_112
    assert max(bundled.values()) == bundled["mlp"]
    only_bundled = BundledService()
    assert RequestLimits(64 << 20).any_model(only_bundled).bytes == 6_356_992


@pytest.mark.parametrize(
    ("path", "limit", "model"),
    [("/v2/models/add_one/infer", ADD_ONE_LIMIT, "add_one"), ("/infer", NATIVE_LIMIT, "JSON")],
)
async def test_content_length_over_the_limit_is_413_before_the_body_is_read(path, limit, model):
    """Under the default MAX_BODY_BYTES (64 MiB): add_one's limit on v2; on
    the native route (all JSON) MAX_JSON_BYTES, below the largest bundled
    model's limit (mlp's 6,356,992 bytes)."""
    service = BundledService() if path == "/infer" else FakeService()
    app = create_api(lambda: service, Metrics())
    size = limit + 1
    status, body, pulled = await asgi_post(app, path, {"content-length": str(size)}, [b" " * size])
    assert status == 413, body
    assert body["reason"] == "payload_too_large"
    assert pulled == 0  # refused on the header alone
    assert f"of {size} bytes exceeds {limit} bytes" in body["error"]
    assert model in body["error"]


async def test_a_repository_index_request_is_limited_to_64_kib(client):
    """It carries no tensors: `{"ready": true}` at most, padded or not."""
    padded = b'{"ready": true}' + b" " * (HEADER_ALLOWANCE - 15)
    assert (await client.post("/v2/repository/index", content=padded)).status_code == 200
    r = await client.post("/v2/repository/index", content=padded + b" ")
    assert r.status_code == 413, r.text
    assert f"exceeds {HEADER_ALLOWANCE} bytes" in r.json()["error"]


async def test_unsupported_encoding_is_415_before_the_body_is_read(app):
    status, body, pulled = await asgi_post(
        app, "/v2/models/add_one/infer", {"content-encoding": "br"}, [b"x" * 100]
    )
    assert (status, body["reason"], pulled) == (415, "unsupported_encoding", 0)


@pytest.mark.parametrize("path", ["/v2/models/add_one/infer", "/infer"])
async def test_a_streamed_body_stops_being_read_at_the_limit(path):
    """No Content-Length: 2.5 MiB offered in 8 KiB chunks; the app stops
    pulling at the first chunk past the limit."""
    service = BundledService() if path == "/infer" else FakeService()
    app = create_api(lambda: service, Metrics(), max_body_bytes=64 << 20)
    limit = NATIVE_LIMIT if path == "/infer" else ADD_ONE_LIMIT  # native: the JSON cap
    chunk = 8192
    status, body, pulled = await asgi_post(app, path, {}, [b" " * chunk] * 320)
    assert status == 413, body
    assert limit < pulled <= limit + chunk


async def test_the_native_body_is_held_to_its_own_models_limit(app):
    """/infer reads under the largest limit (typed's variable dimension: 1 MiB),
    then holds the body to the model it names."""
    good = {"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}}
    padded = json.dumps(good).encode() + b" " * ADD_ONE_LIMIT
    async with _client(app) as c:
        r = await c.post("/infer", content=padded)
        assert r.status_code == 413, r.text
        assert "add_one" in r.json()["error"]
        at_limit = padded[:ADD_ONE_LIMIT]
        assert (await c.post("/infer", content=at_limit)).status_code == 200


async def test_a_variable_dimension_falls_back_to_max_body_bytes(app, service):
    """typed's c is FP16 [-1, -1, 3]: a body of ~600 KB (nine times add_one's
    limit, under MAX) is served; the same bytes for add_one are refused."""
    n = 40_000
    req = {
        "inputs": [
            {"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]},
            {"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
            {"name": "c", "shape": [1, n, 3], "datatype": "FP16", "data": [0.5] * (3 * n)},
        ]
    }
    body = json.dumps(req).encode()
    assert 6 * ADD_ONE_LIMIT < len(body) < MAX
    async with _client(app) as c:
        r = await c.post("/v2/models/typed/infer", content=body)
        assert r.status_code == 200, r.text
        assert service.calls[-1]["inputs"]["c"].shape == (1, n, 3)
        r = await c.post("/v2/models/add_one/infer", content=body)
        assert r.status_code == 413 and "add_one" in r.json()["error"]


async def test_json_text_is_held_to_max_json_bytes_binary_tensors_are_not(service):
    """typed's c is FP16 [-1, -1, 3], limited by MAX_BODY_BYTES only. With
    MAX_JSON_BYTES 64 KiB its ~280 KB JSON body is refused (413 naming the
    setting and the binary extension) from Content-Length, before a byte is
    read, on both routes, while the same tensor as binary data is served; a
    binary request whose JSON header passes the cap is refused too."""
    app = create_api(lambda: service, Metrics(), max_body_bytes=MAX, max_json_bytes=64 << 10)
    n = 20_000
    head = [
        {"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]},
        {"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
    ]
    c_json = {"name": "c", "shape": [1, n, 3], "datatype": "FP16", "data": [0.5] * (3 * n)}
    body = json.dumps({"inputs": [*head, c_json]}).encode()
    assert 64 << 10 < len(body) < MAX
    for path in ("/v2/models/typed/infer", "/infer"):
        sent = (
            body
            if path != "/infer"
            else json.dumps(
                {
                    "model": "typed",
                    "inputs": {"a": [[1, 2]], "b": [[True, False]], "c": [[[0.5] * 3] * n]},
                }
            ).encode()
        )
        status, err, pulled = await asgi_post(app, path, {"content-length": str(len(sent))}, [sent])
        assert (status, pulled) == (413, 0), (path, status, err)
        assert "MAX_JSON_BYTES" in err["error"] and "binary" in err["error"], err
    blob = np.full((1, n, 3), 0.5, np.float16).tobytes()
    c_bin = {
        "name": "c",
        "shape": [1, n, 3],
        "datatype": "FP16",
        "parameters": {"binary_data_size": len(blob)},
    }
    binary, headers = v2_binary_body({"inputs": [*head, c_bin]}, blob)
    async with _client(app) as client:
        r = await client.post("/v2/models/typed/infer", content=binary, headers=headers)
        assert r.status_code == 200, r.text
        assert service.calls[-1]["inputs"]["c"].shape == (1, n, 3)
        padded = {"inputs": [*head, c_bin], "id": "x" * (64 << 10)}
        binary, headers = v2_binary_body(padded, blob)
        r = await client.post("/v2/models/typed/infer", content=binary, headers=headers)
        assert r.status_code == 413 and "JSON header" in r.json()["error"], r.text


# ---------------------------------------------------------------- compression


class _CountingZlib:
    """`zlib` as app.api.bodies sees it, counting the bytes its decoders produce."""

    error = zlib.error
    MAX_WBITS = zlib.MAX_WBITS

    def __init__(self) -> None:
        self.decoded = 0

    def decompressobj(self, *args: Any) -> Any:
        counter = self
        real = zlib.decompressobj(*args)

        class Counting:
            def decompress(self, data: bytes, max_length: int = 0) -> bytes:
                out = real.decompress(data, max_length)
                counter.decoded += len(out)
                return out

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        return Counting()


@pytest.mark.parametrize(
    ("service_kind", "path", "limit"),
    [
        ("fake", "/v2/models/add_one/infer", ADD_ONE_LIMIT),
        ("bundled", "/v2/models/resnet50-emulated/infer", 90_112),
        ("bundled", "/infer", NATIVE_LIMIT),  # native: all JSON, the JSON cap
    ],
)
async def test_a_gzip_bomb_is_refused_after_at_most_limit_plus_one_decoded_bytes(
    monkeypatch, service_kind, path, limit
):
    """60 MB of zeros gzipped to ~59 KB, under the default MAX_BODY_BYTES
    (64 MiB): the decoder stops one byte past the model's limit."""
    bomb = gzip.compress(b"\0" * 60_000_000, compresslevel=9)
    assert len(bomb) < 64_000
    service = BundledService() if service_kind == "bundled" else FakeService()
    app = create_api(lambda: service, Metrics())  # max_body_bytes: the default 64 MiB
    counting = _CountingZlib()
    monkeypatch.setattr(bodies, "zlib", counting)
    tracemalloc.start()
    try:
        status, body, pulled = await asgi_post(
            app,
            path,
            {"content-encoding": "gzip"},
            [bomb[i : i + 16384] for i in range(0, len(bomb), 16384)],
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413, body
    assert body["error"].startswith("decompressed request body exceeds")
    assert counting.decoded == limit + 1
    assert pulled <= len(bomb)
    assert peak < 4 * limit + (1 << 20), peak  # the limit's worth, never the 60 MB


async def test_gzip_and_deflate_bodies_decode_in_pieces(app, service):
    """A body split across chunks and across gzip members decodes whole; data
    after the end of a deflate stream is refused, not ignored."""
    body = json.dumps({"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}}).encode()
    two_members = gzip.compress(body[:20]) + gzip.compress(body[20:])
    pieces = [two_members[i : i + 7] for i in range(0, len(two_members), 7)]
    status, reply, _ = await asgi_post(app, "/infer", {"content-encoding": "gzip"}, pieces)
    assert status == 200, reply
    assert service.calls[-1]["inputs"]["x"].tolist() == [[1, 2, 3, 4]]
    trailing = zlib.compress(body) + b"junk"
    status, reply, _ = await asgi_post(app, "/infer", {"content-encoding": "deflate"}, [trailing])
    assert status == 400 and "after the end of the deflate stream" in reply["error"]


# ------------------------------------------------------- every bundled model


def _long_floats(shape: tuple[int, ...]) -> np.ndarray:
    """FP32 values whose JSON text is about the longest a client writes
    (`-1.2345678286116004e-30`: 23 characters)."""
    rng = np.random.default_rng(0)
    return (-(rng.random(shape) + 1.0) * 1e-30).astype(np.float32)


async def test_every_bundled_model_is_served_under_its_limit():
    """JSON (compact and indented), binary and gzip bodies with the longest
    number texts fit each bundled model's derived limit."""
    service = BundledService()
    app = create_api(lambda: service, Metrics())
    limits = RequestLimits(64 << 20)
    async with _client(app) as c:
        for name, config in service.configs.items():
            limit = limits.for_model(config).bytes
            assert limit < 64 << 20, name  # no bundled model falls back
            spec = config.inputs[0]
            shape = (1, *spec.item_shape)
            x = _long_floats(shape)
            v2_json = {
                "id": "r" * 64,
                "inputs": [
                    {
                        "name": spec.name,
                        "shape": list(shape),
                        "datatype": "FP32",
                        "data": x.reshape(-1).tolist(),
                    }
                ],
                "outputs": [{"name": config.outputs[0].name}],
                "parameters": {"slo_ms": 10},
            }
            native = {"model": name, "inputs": {spec.name: x.tolist()}}
            header = {
                "inputs": [
                    {
                        "name": spec.name,
                        "shape": list(shape),
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes},
                    }
                ]
            }
            binary, headers = v2_binary_body(header, x.tobytes())
            cases: list[tuple[str, bytes, dict[str, str]]] = [
                (f"/v2/models/{name}/infer", json.dumps(v2_json).encode(), {}),
                (f"/v2/models/{name}/infer", json.dumps(v2_json, indent=4).encode(), {}),
                ("/infer", json.dumps(native).encode(), {}),
                ("/infer", json.dumps(native, indent=2).encode(), {}),
                (f"/v2/models/{name}/infer", binary, headers),
                (
                    f"/v2/models/{name}/infer",
                    gzip.compress(json.dumps(v2_json).encode()),
                    {"Content-Encoding": "gzip"},
                ),
            ]
            for path, body, extra in cases:
                r = await c.post(path, content=body, headers=extra)
                assert r.status_code == 200, (name, path, len(body), limit, r.text)
                got = service.calls[-1]["inputs"][spec.name]
                assert np.array_equal(got, x), (name, path)
            assert HDR in headers


# ------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("path", "body", "tensor", "datatype"),
    [
        (
            "/v2/models/add_one/infer",
            b'{"inputs": [{"name": "x", "shape": [1, 4], '
            b'"datatype": "FP32", "data": [1, 2, 1e39, 4]}]}',
            "x",
            "FP32",
        ),
        ("/infer", b'{"model": "add_one", "inputs": {"x": [1, 2, -1e39, 4]}}', "x", "FP32"),
        (
            "/v2/models/typed/infer",
            b'{"inputs": ['
            b'{"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}, '
            b'{"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [true, false]}, '
            b'{"name": "c", "shape": [1, 1, 3], "datatype": "FP16", "data": [1, 70000, 2]}]}',
            "c",
            "FP16",
        ),
        (
            "/v2/models/typed/infer",
            b'{"inputs": ['
            b'{"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}, '
            b'{"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [true, false]}, '
            b'{"name": "c", "shape": [1, 1, 3], "datatype": "FP16", "data": [1, 65520.0, 2]}]}',
            "c",
            "FP16",
        ),
    ],
)
async def test_floats_beyond_the_datatypes_range_are_400_naming_the_tensor(
    client, service, path, body, tensor, datatype
):
    r = await client.post(path, content=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"input '{tensor}'" in error and f"out of range for {datatype}" in error
    assert service.calls == []


async def test_nan_infinity_and_the_largest_finite_values_are_accepted(client, service):
    body = (
        b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
        b'"data": [NaN, Infinity, -Infinity, 3.4028234663852886e38]}]}'
    )
    r = await client.post("/v2/models/add_one/infer", content=body)
    assert r.status_code == 200, r.text
    x = service.calls[-1]["inputs"]["x"][0]
    assert math.isnan(x[0]) and x[1] == np.inf and x[2] == -np.inf
    assert x[3] == np.finfo(np.float32).max
    typed = {
        "inputs": [
            {"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]},
            {"name": "b", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
            {"name": "c", "shape": [1, 1, 3], "datatype": "FP16", "data": [65504, -65504, 1e-9]},
        ]
    }
    r = await client.post("/v2/models/typed/infer", json=typed)
    assert r.status_code == 200, r.text
    assert service.calls[-1]["inputs"]["c"].reshape(-1).tolist() == [65504.0, -65504.0, 0.0]


# -------------------------------------------------------------- JSON parsing


async def test_big_json_is_parsed_in_a_worker_thread_small_json_inline(monkeypatch):
    """mlp's JSON body (4,096 floats, ~80 KB) is over PARSE_IN_THREAD_BYTES:
    parsed off the event loop's thread; resnet50-emulated's (16 floats) inline."""
    threads: list[tuple[int, str]] = []
    real = bodies.parse_model

    def spy(model: Any, data: bytes, what: str = "request body") -> Any:
        threads.append((len(data), threading.current_thread().name))
        return real(model, data, what)

    monkeypatch.setattr(bodies, "parse_model", spy)
    service = BundledService()
    app = create_api(lambda: service, Metrics())
    loop_thread = threading.current_thread().name
    bodies_sent = {}
    async with _client(app) as c:
        for name, width in (("mlp", 4096), ("resnet50-emulated", 16)):
            data = _long_floats((1, width)).reshape(-1).tolist()
            req = {
                "inputs": [{"name": "input", "shape": [1, width], "datatype": "FP32", "data": data}]
            }
            bodies_sent[name] = json.dumps(req).encode()
            r = await c.post(f"/v2/models/{name}/infer", content=bodies_sent[name])
            assert r.status_code == 200, r.text
            r = await c.post("/infer", json={"model": name, "inputs": {"input": [data]}})
            assert r.status_code == 200, r.text
        # an error found in the worker thread is answered as any other
        r = await c.post("/v2/models/mlp/infer", content=bodies_sent["mlp"][:-2])
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"], r.text
    assert len(threads) == 5
    for size, thread in threads:
        if size > bodies.PARSE_IN_THREAD_BYTES:
            assert thread != loop_thread, (size, thread)
        else:
            assert thread == loop_thread, (size, thread)
    big = sum(size > bodies.PARSE_IN_THREAD_BYTES for size, _ in threads)
    assert big == 3  # mlp's v2, native and broken bodies
