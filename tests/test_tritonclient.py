"""HTTP API (app.api) through `tritonclient.http` against a real uvicorn
server over a fake InferenceService: JSON and binary tensors both ways,
datatypes, versions, compression, SLO parameters, errors, metadata, and a
server that survives garbage on the socket."""

from __future__ import annotations

import numpy as np
import pytest

# ------------------------------------------------------------------ real server + tritonclient


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
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'nope' is not found"
    ):
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
