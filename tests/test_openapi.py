"""The OpenAPI document says what the server does (issue 19, item 6).

tests/test_fuzz.py checks answers against the document with schemathesis;
these check the document's own claims where they are rules of the server:
model names (pattern and length, as `check_model_name` enforces them), the
statuses of the readiness routes (KServe: "no" is a 400, never 503), no 422
on routes that cannot answer one, integers that JSON Schema calls integers,
and the links a stateful client follows from the index to real models. And
schemathesis' CLI, every phase and check, finds nothing against a real daemon
whose torch model did not load.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api import create_api
from app.api.security import MAX_MODEL_NAME_LENGTH, check_model_name
from app.errors import InvalidInput
from app.server.metrics import Metrics
from app.server.settings import BUNDLED_REPOSITORY
from tests.fakes import FakeService

DOC: dict[str, Any] = create_api(lambda: FakeService(), Metrics()).openapi()
OPERATIONS = [
    (path, method, op) for path, ops in DOC["paths"].items() for method, op in ops.items()
]


def _model_name_declarations() -> list[dict[str, Any]]:
    declared = [
        param["schema"]
        for path, _, op in OPERATIONS
        for param in op.get("parameters", [])
        if param["in"] == "path" and param["name"] == "name"
    ]
    declared.append(DOC["components"]["schemas"]["InferRequest"]["properties"]["model"])
    return declared


def test_model_names_declare_what_the_server_takes():
    """A name the pattern allows is looked up (404 when unknown); any other
    is a 400 before any lookup."""
    declared = _model_name_declarations()
    assert len(declared) == 12 + 1  # ten /v2/models/{name}..., two load/unload, /infer's body
    assert {d["maxLength"] for d in declared} == {MAX_MODEL_NAME_LENGTH}
    (pattern,) = {d["pattern"] for d in declared}
    names = ["".join(t) for n in range(1, 5) for t in itertools.product("a.-_/\0%", repeat=n)]
    names += ["x" * 255, "x" * 256, "resnet50.v2", ".hidden", "a.", "a..b", "..", ".", ""]
    for name in names:
        allowed = re.fullmatch(pattern, name) is not None and len(name) <= MAX_MODEL_NAME_LENGTH
        try:
            check_model_name(name)
            taken = True
        except InvalidInput:
            taken = False
        assert taken == allowed, name


def test_readiness_answers_200_400_404_only():
    for path in ("/v2/models/{name}/ready", "/v2/models/{name}/versions/{version}/ready"):
        assert set(DOC["paths"][path]["get"]["responses"]) == {"200", "400", "404"}
    assert set(DOC["paths"]["/v2/health/ready"]["get"]["responses"]) == {"200", "400"}


def test_422_only_where_a_body_is_validated():
    for path, method, op in OPERATIONS:
        assert ("422" in op["responses"]) == ("requestBody" in op), (method, path)
    for path in ("/infer", "/v2/models/{name}/infer", "/v2/repository/index"):
        codes = set(DOC["paths"][path]["post"]["responses"])
        assert {"200", "400", "413", "415", "422", "503"} <= codes, path


def test_links_lead_from_the_index_to_the_models():
    links = DOC["paths"]["/v2/repository/index"]["post"]["responses"]["200"]["links"]
    assert links["ModelReady"] == {
        "operationId": "v2_model_ready",
        "parameters": {"name": "$response.body#/0/name"},
    }
    assert links["NativeInfer"]["requestBody"] == {"model": "$response.body#/0/name"}
    operation_ids = {op["operationId"] for _, _, op in OPERATIONS}
    for source in ("/v2/repository/index", "/v2/models/{name}"):
        ops = DOC["paths"][source]
        (op,) = ops.values()
        for link in op["responses"]["200"]["links"].values():
            assert link["operationId"] in operation_ids, link


@pytest.mark.anyio
@pytest.mark.parametrize(
    "size,status", [(2, 200), (2.0, 200), (2.5, 422), ("2", 422), (True, 422), (-2.0, 422)]
)
async def test_integers_are_json_schema_integers(size, status):
    """The schema says "integer", and in JSON Schema 2.0 is one: accepted."""
    schema = DOC["components"]["schemas"]["V2InputParameters"]["properties"]["binary_data_size"]
    assert {"type": "integer", "minimum": 0} in schema["anyOf"]
    service = FakeService()
    app = create_api(lambda: service, Metrics())
    header = (
        '{"inputs": [{"name": "a", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}, '
        '{"name": "b", "shape": [1.0, 2.0], "datatype": "BOOL", "parameters": '
        f'{{"binary_data_size": {str(size).lower() if size is True else repr(size)}}}}}, '
        '{"name": "c", "shape": [1, 1, 3], "datatype": "FP16", "data": [1, 2, 3]}]}'
    ).replace("'", '"')
    body = header.encode() + b"\x01\x00"
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post(
            "/v2/models/typed/infer",
            content=body,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
    assert r.status_code == status, r.text
    if status == 422:
        assert "binary_data_size" in r.json()["error"]


@pytest.mark.slow
def test_schemathesis_cli_against_a_daemon_without_torch(launch_daemon, tmp_path):
    """The CLI, every phase and check, against a real daemon whose torch model
    did not load: torch hidden as on an install without the extra, the model
    file not built (the bundled repository's state there)."""
    repository = tmp_path / "models"
    for name in ("resnet50-emulated", "torchcnn"):
        skip = shutil.ignore_patterns("*.pt", "profile.*")
        shutil.copytree(BUNDLED_REPOSITORY / name, repository / name, ignore=skip)
    (tmp_path / "hidden" / "torch").mkdir(parents=True)
    (tmp_path / "hidden" / "torch" / "__init__.py").write_text("raise ImportError('hidden')\n")
    # A failed model is served around (not an exit, still ready).
    hidden = {
        "PYTHONPATH": str(tmp_path / "hidden"),
        "EXIT_ON_ERROR": "0",
        "STRICT_READINESS": "0",
    }
    daemon = launch_daemon(repository, emulated_devices=1, cpu_slices=0, extra_env=hidden)
    index = {e["name"]: e for e in httpx.post(f"{daemon.url}/v2/repository/index").json()}
    assert index["torchcnn"]["state"] == "UNAVAILABLE"
    reason = "torchcnn/config.yaml: model_file: model file not found: torchcnn/model.pt"
    assert index["torchcnn"]["reason"] == reason  # relative to the repository
    config = Path(__file__).with_name("schemathesis.toml")  # tests/test_fuzz.py's
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config)]
    options = ["--checks", "all", "--max-examples", "5", "--seed", "1", "--workers", "1"]
    result = subprocess.run(
        [*command, "run", f"{daemon.url}/openapi.json", *options],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert counts and counts[1] == counts[2] and int(counts[1]) > 100, result.stdout[-2000:]
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in result.stdout, phase
