"""A repository built like Triton's docs/examples/model_repository, served by
the daemon unchanged (docs/triton.md): Triton's `simple_string` config
(TYPE_STRING without max_bytes; profiled on numeric strings), a model
directory without config.pbtxt (completed from its ONNX file), and one with
`max_batch_size: 0` (served unbatched) — each answered through tritonclient
over HTTP and gRPC, the metadata in Triton's names, and the `nv_inference_*`
families on the metrics port."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bench.daemon_launcher import free_port
from tests.triton_models import scale_model, triton_string_model

UNBATCHED = """
name: "unbatched"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
parameters { key: "slo_ms" value { string_value: "200" } }
"""


@pytest.mark.slow
def test_tritons_example_layout_is_served_unchanged(tmp_path: Path, launch_daemon) -> None:
    import tritonclient.grpc as tg
    import tritonclient.http as th

    repo = tmp_path / "models"
    triton_string_model(repo)
    scale_model(repo / "bare" / "1" / "model.onnx", 3.0)  # no config.pbtxt
    scale_model(repo / "unbatched" / "1" / "model.onnx", 2.0)
    (repo / "unbatched" / "config.pbtxt").write_text(UNBATCHED)
    grpc_port, metrics_port = free_port(), free_port()
    handle = launch_daemon(
        repo,
        extra_env={
            "GRPC_PORT": str(grpc_port),
            "METRICS_PORT": str(metrics_port),
            "PROFILE_CACHE_DIR": str(tmp_path / "cache"),
            "PROFILE_BATCH_SIZES": "1,2,4",
        },
    )
    host = handle.url.removeprefix("http://")
    http = th.InferenceServerClient(host)
    grpc_client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        # simple_string: sums and differences of numeric strings
        a = np.array([[str(i).encode() for i in range(16)]], dtype=object)
        b = np.array([[b"1"] * 16], dtype=object)
        for module, client in ((th, http), (tg, grpc_client)):
            inputs = [module.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer("simple_string", inputs)
            sums = [int(v) for v in result.as_numpy("OUTPUT0").reshape(-1)]
            diffs = [int(v) for v in result.as_numpy("OUTPUT1").reshape(-1)]
            assert sums == [i + 1 for i in range(16)] and diffs == [i - 1 for i in range(16)]
        # bare (auto-completed, batched: max_batch_size 4) and unbatched
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        inp = th.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(http.infer("bare", [inp]).as_numpy("OUTPUT0"), 3 * x)
        one = tg.InferInput("INPUT0", [1, 4], "FP32")
        one.set_data_from_numpy(x[:1])
        result = grpc_client.infer("unbatched", [one])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), 2 * x[:1])
        assert http.get_model_metadata("bare")["platform"] == "onnxruntime_onnx"
        assert grpc_client.get_model_config("unbatched").config.max_batch_size == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            text = r.read().decode()
        assert 'nv_inference_count{model="simple_string",version="1"} 2' in text
        assert 'nv_inference_request_success{model="bare",version="1"} 1' in text
    finally:
        http.close()
        grpc_client.close()
