"""The daemon serving a Triton user's repository (tests/triton_models.py)
to the real `tritonclient` over HTTP and gRPC: the served versions, requests
of several items, statistics per version; and a model that fails to load
stopping start-up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as tritongrpc
import tritonclient.http as tritonhttp

from bench.daemon_launcher import free_port
from tests.triton_models import SIMPLE_PBTXT, triton_model


def _serve(repo: Path, launch_daemon: Callable[..., Any], pbtxt: str) -> dict[str, Any]:
    """The daemon (one CPU executor, HTTP and gRPC) on `simple` with `pbtxt`."""
    directory = triton_model(repo, pbtxt)
    grpc_port = free_port()
    handle = launch_daemon(
        repo,
        cpu_slices=1,
        threads_per_slice=1,
        emulated_devices=0,
        extra_env={"PROFILE_BATCH_SIZES": "1,8", "GRPC_PORT": str(grpc_port)},
    )
    return {"url": handle.url, "grpc": f"127.0.0.1:{grpc_port}", "model": directory}


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory, launch_daemon):
    return _serve(tmp_path_factory.mktemp("triton-repo"), launch_daemon, SIMPLE_PBTXT)


@pytest.mark.slow
def test_tritonclient_infers_on_the_served_version(triton_server):
    server = triton_server
    client = tritonhttp.InferenceServerClient(server["url"].removeprefix("http://"))
    try:
        assert client.is_server_ready() and client.is_model_ready("simple")
        metadata = client.get_model_metadata("simple")
        assert metadata["versions"] == ["2"]
        x = np.arange(16, dtype=np.float32).reshape(4, 4)  # a request of 4 items
        expected = onnxruntime.InferenceSession(str(server["model"] / "2" / "model.onnx")).run(
            None, {"INPUT0": x}
        )[0]
        for version in ("", "2"):
            tensor = tritonhttp.InferInput("INPUT0", [4, 4], "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            result = client.infer("simple", [tensor], model_version=version)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
        np.testing.assert_array_equal(expected, 2 * x)
    finally:
        client.close()
    grpc_client = tritongrpc.InferenceServerClient(server["grpc"])
    try:
        tensor = tritongrpc.InferInput("INPUT0", [4, 4], "FP32")
        tensor.set_data_from_numpy(x)
        result = grpc_client.infer("simple", [tensor], model_version="2")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
        assert result.get_response().parameters["batch_size"].int64_param >= 4
    finally:
        grpc_client.close()
    index = httpx.post(f"{server['url']}/v2/repository/index").json()
    assert {(e["version"], e["state"]) for e in index if e["name"] == "simple"} == {("2", "READY")}
    r = httpx.get(f"{server['url']}/v2/models/simple/versions/1/ready")
    assert r.status_code == 404, r.text


@pytest.fixture(scope="module")
def all_versions_server(tmp_path_factory, launch_daemon):
    pbtxt = SIMPLE_PBTXT + "version_policy: { all { } }"
    return _serve(tmp_path_factory.mktemp("triton-versions"), launch_daemon, pbtxt)


@pytest.mark.slow
def test_tritonclient_infers_on_every_version_served(all_versions_server):
    """`all {}`: version 1 answers x, version 2 and no version 2x; each
    version is listed, ready and counted on its own."""
    server = all_versions_server
    url = server["url"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    sent = {"1": 0, "2": 0}
    client = tritonhttp.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert client.is_server_ready()
        assert client.is_model_ready("simple", "1") and client.is_model_ready("simple", "2")
        assert client.get_model_metadata("simple")["versions"] == ["1", "2"]
        assert client.get_model_metadata("simple", "1")["name"] == "simple"
        for version, factor in (("1", 1), ("2", 2), ("", 2)):
            tensor = tritonhttp.InferInput("INPUT0", [2, 4], "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            result = client.infer("simple", [tensor], model_version=version)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), factor * x)
            assert result.get_response()["model_name"] == "simple"
            assert result.get_response()["model_version"] == (version or "2")
            sent[version or "2"] += 1
    finally:
        client.close()
    grpc_client = tritongrpc.InferenceServerClient(server["grpc"])
    try:
        assert grpc_client.get_model_metadata("simple").versions == ["1", "2"]
        assert grpc_client.get_model_config("simple", "1").config.name == "simple"
        tensor = tritongrpc.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(x)
        result = grpc_client.infer("simple", [tensor], model_version="1")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
        assert (result.get_response().model_name, result.get_response().model_version) == (
            "simple",
            "1",
        )
        sent["1"] += 1
    finally:
        grpc_client.close()
    index = httpx.post(f"{url}/v2/repository/index").json()
    assert sorted((e["name"], e["version"], e["state"]) for e in index) == [
        ("simple", "1", "READY"),
        ("simple", "2", "READY"),
    ]
    stats = httpx.get(f"{url}/v2/models/simple/stats").json()["model_stats"]
    assert [(s["name"], s["version"], s["inference_count"]) for s in stats] == [
        ("simple", "1", 2 * sent["1"]),
        ("simple", "2", 2 * sent["2"]),
    ]
    one = httpx.get(f"{url}/v2/models/simple/versions/1/stats").json()["model_stats"]
    assert [(s["version"], s["inference_stats"]["success"]["count"]) for s in one] == [
        ("1", sent["1"])
    ]
    r = httpx.get(f"{url}/v2/models/simple/versions/3/ready")
    assert r.status_code == 404, r.text
    assert r.json()["error"] == "Request for unknown model: 'simple' version 3 is not found"
    metrics = httpx.get(f"{url}/metrics").text
    assert "simple@" not in metrics

    # Model control acts on every version of the model.
    assert httpx.post(f"{url}/v2/repository/models/simple/unload").status_code == 200
    index = httpx.post(f"{url}/v2/repository/index").json()
    assert sorted((e["version"], e["state"], e["reason"]) for e in index) == [
        ("1", "UNAVAILABLE", "unloaded"),
        ("2", "UNAVAILABLE", "unloaded"),
    ]
    for path in ("simple/versions/1", "simple"):
        r = httpx.post(f"{url}/v2/models/{path}/infer", json=_json_body(x))
        assert r.status_code == 503 and r.json()["error"] == "model 'simple' is unloaded", r.text
    assert httpx.post(f"{url}/v2/repository/models/simple/load").status_code == 200
    index = httpx.post(f"{url}/v2/repository/index").json()
    assert sorted((e["version"], e["state"]) for e in index) == [("1", "READY"), ("2", "READY")]
    for version, factor in (("1", 1), ("2", 2)):
        r = httpx.post(f"{url}/v2/models/simple/versions/{version}/infer", json=_json_body(x))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == (factor * x).ravel().tolist()


def _json_body(x: np.ndarray) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ]
    }


@pytest.mark.slow
def test_a_model_that_fails_to_load_stops_start_up(tmp_path: Path, run_module):
    triton_model(tmp_path / "repo")
    triton_model(
        tmp_path / "repo",
        SIMPLE_PBTXT.replace("dims: [ 4 ] } ]\noutput", "dims: [ 5 ] } ]\noutput").replace(
            'name: "simple"', ""
        ),
        name="broken",
    )
    env = {"EMULATED_DEVICES": "0", "CPU_SLICES": "1", "THREADS_PER_SLICE": "1"}
    done = run_module(
        "app", "serve", "--port", "0", "--repository", str(tmp_path / "repo"), env=env, timeout=120
    )
    assert done.returncode != 0
    assert (
        "start-up stopped: failed to load 1 model(s) (broken: failed to load on cpu:0"
        in done.stderr
    )
    assert "INPUT0" in done.stderr.split("start-up stopped:", 1)[1].splitlines()[0]
