"""Start-up failures contained (app/server/startup.py, measure_models): a
model that fails to profile is marked failed with its reason, in one ERROR
line without a traceback, and the others are served (EXIT_ON_ERROR=0); the
profiler's synthetic inputs suit models that parse their strings as numbers
(Triton's simple_string)."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from app.errors import ExecutorFailed
from app.repository.loader import load_repository
from app.runtime.devices import ExecutorDevice
from app.runtime.executor import synthetic_inputs
from app.runtime.onnx_backend import OnnxBackend
from app.server import startup
from app.server.settings import Settings
from app.server.startup import ModelState, StartupFailed
from tests.triton_models import SIMPLE_STRING_PBTXT, triton_model, triton_string_model

GOOD = {1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5}
CAST_FAILURE = (
    "profiling simple_string on cpu:0 failed: RuntimeException: [ONNXRuntimeError] : 6 :\n"
    "RUNTIME_EXCEPTION : Non-zero status code returned while running Cast node. Name:''\n"
    "Status Message: stoll"
)


def test_synthetic_strings_are_numbers_a_cast_takes(tmp_path: Path) -> None:
    triton_string_model(tmp_path)
    config = load_repository(tmp_path).models["simple_string"]
    inputs = synthetic_inputs(config, 3)
    assert inputs["INPUT0"].shape == (3, 16) and inputs["INPUT0"][0, 0] == b"0"
    backend = OnnxBackend()
    backend.load(config)
    out = backend.run(inputs)
    assert out["OUTPUT0"].shape == (3, 16)
    assert {bytes(v) if isinstance(v, bytes) else str(v).encode() for v in out["OUTPUT0"].flat} == {
        b"0"
    }


class _Pool:
    """Profiles `simple` (GOOD); profiling `simple_string` fails as ORT's
    Cast does on strings that are no numbers."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.model_changes = self

    async def profile(self, device_id: int, model: str, batch_sizes: list[int]) -> dict[int, float]:
        if model == "simple_string":
            raise ExecutorFailed(CAST_FAILURE)
        return {b: GOOD[b] for b in batch_sizes}

    async def remove_model(self, name: str) -> None:
        self.removed.append(name)


@pytest.mark.anyio
async def test_a_model_that_fails_to_profile_is_let_go_with_one_error_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    triton_model(tmp_path / "models")
    triton_string_model(tmp_path / "models")
    index = load_repository(tmp_path / "models")
    settings = Settings(
        repository=tmp_path / "models",
        profile_cache_dir=tmp_path / "cache",
        profile_batch_sizes=(1, 2, 4, 8),
    )
    models = {
        name: ModelState(config, arena=None, devices=(0,))  # type: ignore[arg-type]
        for name, config in index.models.items()
    }
    pool = _Pool()
    device = ExecutorDevice(0, "cpu", "cpu:0")
    with caplog.at_level(logging.INFO):
        failed = await startup.measure_models(settings, pool, models, lambda _: device)  # type: ignore[arg-type]
    reason = " ".join(CAST_FAILURE.split())
    assert failed == {"simple_string": f"failed to profile: {reason}"}
    assert list(models) == ["simple"] and models["simple"].profile is not None
    assert pool.removed == ["simple_string"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    assert errors[0].getMessage() == f"model 'simple_string' failed to profile: {reason}"
    # then, as for a model that failed to load: served under EXIT_ON_ERROR=0 only
    startup.check_loaded(Settings(exit_on_error=False), models, failed)
    with pytest.raises(StartupFailed, match="simple_string: failed to profile"):
        startup.check_loaded(Settings(), models, failed)


def _batch_of_one_model(path: Path) -> None:
    """Loads (its outputs are [batch, 4]) but reshapes to [1, 4]: any batch
    of more than one fails, as the profiler finds at batch 2."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "S"], ["OUTPUT0"])],
        "one",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("S", TensorProto.INT64, [2], [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)


@pytest.mark.slow
def test_exit_on_error_0_serves_the_others_when_one_fails_to_profile(
    tmp_path: Path, launch_daemon
) -> None:
    repo = tmp_path / "models"
    triton_model(repo)
    _batch_of_one_model(repo / "one" / "1" / "model.onnx")
    (repo / "one" / "config.pbtxt").write_text(
        SIMPLE_STRING_PBTXT.replace("simple_string", "one")
        .replace("TYPE_STRING", "TYPE_FP32")
        .replace("dims: [ 16 ]", "dims: [ 4 ]")
        .replace('{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }', "")
        .replace('{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }', "")
        .replace("},\n", "}\n")
    )
    handle = launch_daemon(
        repo,
        extra_env={
            "EXIT_ON_ERROR": "0",
            "STRICT_READINESS": "0",
            "PROFILE_CACHE_DIR": str(tmp_path / "cache"),
        },
        log_level="info",
    )
    with urllib.request.urlopen(
        urllib.request.Request(handle.url + "/v2/repository/index", data=b"", method="POST")
    ) as r:
        index = {e["name"]: e for e in json.load(r)}
    assert index["simple"]["state"] == "READY"
    assert index["one"]["state"] == "UNAVAILABLE"
    assert index["one"]["reason"].startswith("failed to profile: profiling one on ")
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }
    req = urllib.request.Request(
        handle.url + "/v2/models/simple/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        assert json.load(r)["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
    log = handle.log_path.read_text()
    lines = [line for line in log.splitlines() if "'one' failed to profile" in line]
    assert len(lines) == 1 and "ERROR" in lines[0]
    assert "Traceback" not in log
