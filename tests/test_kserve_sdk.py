"""The KServe Python SDK (its own venv: its pins are not the server's) over
REST and gRPC, JSON and binary tensors, against a real uvicorn server and a
real gRPC endpoint in front of the fake service: outputs right, the answer's
times readable through the SDK's proto (bool, int64 and string parameters
only: the `*_us` int64 ones), Triton's `priority` and a custom parameter
accepted. The SDK runs tests/kserve_sdk_client.py in its interpreter:
KSERVE_PYTHON, or `.venv-peers/kserve` (`python -m venv .venv-peers/kserve &&
.venv-peers/kserve/bin/pip install kserve==0.21.0`)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from app.api import create_api
from app.grpc.lifecycle import start_grpc_endpoint
from app.server.metrics import Metrics
from app.server.settings import Settings
from bench.daemon_launcher import free_port
from tests.conftest import peer_missing
from tests.fakes import FakeService

REPO_ROOT = Path(__file__).resolve().parent.parent
CLIENT = REPO_ROOT / "tests" / "kserve_sdk_client.py"
TIMES_US = {"queue_us": 1250, "exec_us": 3500, "intake_us": 500, "answer_us": 750}


def kserve_python() -> Path:
    given = os.environ.get("KSERVE_PYTHON")
    path = Path(given) if given else REPO_ROOT / ".venv-peers" / "kserve" / "bin" / "python"
    if not path.is_file():
        peer_missing(f"the KServe SDK's interpreter {path} is missing (see this module)")
    return path


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_kserve_sdk_over_rest_and_grpc(uvicorn_in_thread) -> None:
    python = kserve_python()
    service, metrics = FakeService(), Metrics()
    address = uvicorn_in_thread(create_api(lambda: service, metrics))
    endpoint = await start_grpc_endpoint(Settings(grpc_port=free_port()), lambda: service, metrics)
    try:
        process = await asyncio.create_subprocess_exec(
            str(python),
            str(CLIENT),
            f"http://{address}",
            endpoint.address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
    finally:
        await endpoint.stop()
    assert process.returncode == 0, err.decode()[-3000:]
    got = json.loads(out.decode().strip().splitlines()[-1])
    for key in ("rest_binary_False", "rest_binary_True", "grpc_binary_False", "grpc_binary_True"):
        assert got[key] == [[2.0, 3.0, 4.0, 5.0]], key
    assert got["rest_params_True"]["queue_ms"] == 1.25
    for binary in (False, True):
        params = got[f"grpc_params_{binary}"]
        assert {k: params[k] for k in TIMES_US} == TIMES_US
        assert params["batch_size"] == 4
    assert got["grpc_ready"] is True
    assert len(service.calls) == 4
    sample = metrics.prefix + "ignored_parameters_total"
    assert metrics.registry.get_sample_value(sample, {"name": "tenant"}) == 2.0
