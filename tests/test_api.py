"""HTTP API (app.api) against a fake InferenceService: native /infer, KServe v2
(JSON and binary tensor data, by hand), metadata and health routes, /metrics
and the OpenAPI document. Malformed requests and error mapping:
tests/test_api_errors.py; tritonclient.http against a real server:
tests/test_tritonclient.py."""

from __future__ import annotations

import gzip
import json
import math
import zlib

import numpy as np
import pytest

from app.server.metrics import Metrics
from tests.fakes import HDR, parse_v2_binary, v2_binary_body

# service, metrics, app and client: tests/conftest.py
pytestmark = pytest.mark.anyio


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
        "app_id": "",
    }
    assert service.calls[-1]["id"] == "r1" and service.calls[-1]["slo_ms"] is None
    assert service.calls[-1]["app"] == ""


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


# ------------------------------------------------------------------ metrics


async def test_metrics(client, metrics):
    metrics.request_received("add_one")
    metrics.request_received("add_one")
    metrics.request_answered("add_one")
    metrics.request_finished("add_one", 0.012, 0.002, 8, True)
    metrics.request_finished("add_one", 0.080, 0.050, 8, False)
    metrics.request_dropped("add_one", "deadline")
    metrics.batch_executed("add_one", "cpu:0", 8, 0.004)
    metrics.batch_executed("add_one", "cpu:0", 2, 0.0015)
    metrics.set_device_busy("cpu:0", 0.75)
    metrics.set_autoscale(bad_rate=0.125, idle_fraction=0.25, advised_change=2)
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in (
        'deadline_serve_requests_total{model="add_one"} 2.0',
        'deadline_serve_pending_requests{model="add_one"} 1.0',
        'deadline_serve_goodput_total{model="add_one"} 1.0',
        'deadline_serve_late_total{model="add_one"} 1.0',
        'deadline_serve_dropped_total{model="add_one",reason="deadline"} 1.0',
        'deadline_serve_queue_delay_seconds_count{model="add_one"} 2.0',
        'deadline_serve_latency_seconds_bucket{le="0.015",model="add_one"} 1.0',
        'deadline_serve_batch_size_count{model="add_one"} 2.0',
        'deadline_serve_batch_size_sum{model="add_one"} 10.0',
        'deadline_serve_request_batch_size_sum{model="add_one"} 16.0',
        'deadline_serve_batches_total{device="cpu:0",model="add_one"} 2.0',
        'deadline_serve_compute_seconds_total{device="cpu:0",model="add_one"} 0.0055',
        'deadline_serve_batch_compute_seconds_bucket{le="0.0025",model="add_one"} 1.0',
        'deadline_serve_batch_compute_seconds_count{model="add_one"} 2.0',
        'deadline_serve_busy_fraction{device="cpu:0"} 0.75',
        "deadline_serve_bad_rate 0.125",
        "deadline_serve_idle_fraction 0.25",
        "deadline_serve_advised_device_change 2.0",
    ):
        assert line in text, line
    om = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    for body in (text, om.text):
        assert "_created" not in body


def test_metrics_prefix_and_isolation():
    a, b, bare = Metrics("dserve_"), Metrics(), Metrics("")
    a.request_received("m")
    text_a, text_b = a.render()[0].decode(), b.render()[0].decode()
    assert 'dserve_requests_total{model="m"} 1.0' in text_a
    assert "deadline_serve_" not in text_a
    assert 'requests_total{model="m"}' not in text_b  # another registry
    assert "# TYPE deadline_serve_requests_total counter" in text_b
    assert "# TYPE requests_total counter" in bare.render()[0].decode()


@pytest.mark.parametrize("prefix", ["1x_", "dead-line_", "a b"])
def test_metrics_prefix_must_start_a_metric_name(prefix):
    with pytest.raises(ValueError, match="cannot start a metric name"):
        Metrics(prefix)


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
        "/v2/models/stats": {"get"},
        "/v2/models/{name}/stats": {"get"},
        "/v2/models/{name}/versions/{version}/stats": {"get"},
        "/v2/repository/index": {"post"},
        "/v2/repository/models/{name}/load": {"post"},
        "/v2/repository/models/{name}/unload": {"post"},
        "/v2/devices": {"get"},
        "/v2/devices/reshare": {"post"},
        "/v2/plan": {"get", "post"},
        "/v2/profiles": {"get"},
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
