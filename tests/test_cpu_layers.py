"""bench/cpu_layers.py: the reference servers that split the daemon's CPU
per request (uvicorn alone; the daemon's API over a no-op service), and
their place in bench.cpu_per_request."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from app.workloads.spec import load_workload
from bench.compare import SETUPS
from bench.cpu_layers import REPOSITORY_ENV, NoopService, api_noop, asgi_floor
from bench.cpu_per_request import layer_targets, main
from bench.loadgen.targets import prepare_targets

SETUP = SETUPS["a"].on_devices(1)


URL = "http://127.0.0.1:8000"  # the load generator sends to loopback only


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=URL)


@pytest.mark.anyio
async def test_the_floor_reads_each_body_and_answers_the_same(monkeypatch) -> None:
    async with _client(asgi_floor) as client:
        posted = await client.post("/infer", content=b'{"x": ' + b"1," * 10_000 + b"1}")
        ready = await client.get("/v2/health/ready")
    assert posted.status_code == ready.status_code == 200
    assert posted.content == ready.content == b'{"outputs":[]}'


@pytest.mark.anyio
async def test_the_noop_api_answers_the_daemons_requests_with_zeros(monkeypatch) -> None:
    monkeypatch.setenv(REPOSITORY_ENV, str(SETUP.repository))
    workload = SETUP.workload_on_devices(load_workload(SETUP.workload))
    async with _client(api_noop()) as client:
        # The requests made from the repository are those made from the API's metadata.
        asked = await prepare_targets(URL, workload, client=client)
        (target,) = layer_targets(SETUP, workload)
        assert [target] == asked
        answer = await client.post(target.path, content=target.body)
    assert answer.status_code == 200, answer.text
    outputs = answer.json()["outputs"]
    assert outputs == {"output": {"shape": [1, 16], "datatype": "FP32", "data": [[0.0] * 16]}}


def test_the_noop_service_knows_only_the_repositorys_models() -> None:
    service = NoopService(Path(SETUP.repository))
    assert "resnet50-t4" in service.model_names() and service.server_ready()
    with pytest.raises(Exception, match="nope"):
        service.model_config("nope")


def test_the_noop_api_needs_its_repository(monkeypatch) -> None:
    monkeypatch.delenv(REPOSITORY_ENV, raising=False)
    with pytest.raises(SystemExit, match=REPOSITORY_ENV):
        api_noop()


def test_an_unknown_layer_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "cpu.json"
    argv = ["--systems", "none", "--peers", "none", "--layers", "nginx", "--out", str(out)]
    assert main(argv) == 2
    assert "nginx" in capsys.readouterr().err and not out.exists()


@pytest.mark.slow
def test_both_layers_are_served_by_uvicorn_and_measured(tmp_path, capsys) -> None:
    out = tmp_path / "cpu.json"
    argv = ["--systems", "none", "--peers", "none", "--layers", "asgi-floor,api-noop",
            "--rates", "80", "--duration", "0.5", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    floor, api = json.loads(out.read_text())["systems"]
    assert (floor["system"], api["system"]) == ("asgi-floor", "api-noop")
    for layer in (floor, api):
        (row,) = layer["cpu_per_request"]
        assert row["answered"] >= 30  # 80 r/s for 0.5 s, every request answered 200
        # uvicorn's own process, no children; a few ms of CPU may read as 0
        # ticks of /proc (the counting itself: tests/test_cpu_per_request.py)
        (process,) = row["processes"]
        assert process["role"] == "main" and process["cpu_s"] >= 0
        assert row["cpu_ms_per_request"] is not None
    text = capsys.readouterr().out
    assert "| uvicorn alone (a fixed answer) | 80 |" in text
    assert "| the daemon's HTTP API, no-op service | 80 |" in text
