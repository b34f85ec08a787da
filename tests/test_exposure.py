"""What the server tells the world (issue 19, item 5): nothing about its host.

- Binding a non-loopback address without ADMIN_TOKEN logs a warning at start
  naming the host and saying that management routes are off.
- No answer carries an absolute server path: not a model's load error (model
  routes, readiness, the repository index), not an executor's failure (5xx),
  not an unexpected exception (500, whose text stays in the log).
- The 404 for an unknown model names the model asked for, not the others.

The answers come from the real HTTP layer in front of a real `LiveService`
(not started: its model tables are filled in by hand, as start-up would), so
the service's own messages are what is checked.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx
import pytest

from app.api import create_api
from app.api.errors import hide_paths
from app.api.security import exposure_warning
from app.errors import ExecutorFailed
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from app.server.startup import ModelState
from tests.fakes import FakeService, api_config

pytestmark = pytest.mark.anyio

X = [("x", "FP32", (-1, 4))]
Y = [("y", "FP32", (-1, 4))]
GOOD = {"model": "alpha", "inputs": {"x": [1, 2, 3, 4]}}
# The start of an absolute path on a server ("/srv/...", "/tmp/pytest-...", ...).
ABSOLUTE = re.compile(r"(?<![\w.:/])/(srv|usr|tmp|dev|home|root|work|etc|opt|var)\b")


def _live_service(repository: Path) -> LiveService:
    """A LiveService as start-up leaves it with models alpha and beta loaded
    (no executor: they are not ready) and torchcnn failed to load."""
    service = LiveService(Settings(repository=repository), Metrics())
    for name in ("alpha", "beta"):
        service.models[name] = ModelState(api_config(name, X, Y), arena=None, devices=(0,))  # type: ignore[arg-type]
    service.unavailable["torchcnn"] = (
        f"{repository}/torchcnn/config.yaml: model_file 'model.pt' does not exist "
        f"({repository}/torchcnn/model.pt); /usr/lib/python3/site-packages/torch is missing"
    )
    return service


@pytest.fixture
async def live(tmp_path: Path):
    service = _live_service(tmp_path / "models")
    app = create_api(lambda: service, Metrics())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        client.repository = str(tmp_path)  # type: ignore[attr-defined]
        yield client


def _no_host_detail(r: httpx.Response, repository: str) -> None:
    assert repository not in r.text, r.text
    assert not ABSOLUTE.search(r.text), r.text


# ------------------------------------------------------------------ the start-up warning


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "server.example.com"])
def test_public_host_without_token_warns_at_start(caplog, host):
    from app.main import create_app

    with caplog.at_level(logging.WARNING, logger="app"):
        create_app(Settings(host=host))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert repr(host) in warnings[0] and "not a loopback address" in warnings[0]
    assert "management routes are off" in warnings[0] and "ADMIN_TOKEN" in warnings[0]


@pytest.mark.parametrize(
    "host,token", [("127.0.0.1", None), ("::1", ""), ("localhost", None), ("0.0.0.0", "tok")]
)
def test_loopback_or_token_does_not_warn(caplog, host, token):
    from app.main import create_app

    assert exposure_warning(token, host) is None
    with caplog.at_level(logging.WARNING, logger="app"):
        create_app(Settings(host=host, admin_token=token or None))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ------------------------------------------------------------------ unknown models


async def test_unknown_model_404_names_only_that_model(live):
    for r in (
        await live.get("/v2/models/nope"),
        await live.get("/v2/models/nope/config"),
        await live.get("/v2/models/nope/ready"),
        await live.post("/v2/models/nope/infer", json={"inputs": []}),
        await live.post("/infer", json={**GOOD, "model": "nope"}),
    ):
        assert r.status_code == 404, r.text
        assert r.json() == {
            "error": "Request for unknown model: 'nope' is not found",
            "reason": "model_not_found",
        }


# ------------------------------------------------------------------ load errors


async def test_unavailable_model_answers_name_no_path(live):
    r = await live.get("/v2/models/torchcnn")
    assert r.status_code == 503 and r.json()["reason"] == "model_not_ready", r.text
    assert "'torchcnn' is unavailable" in r.json()["error"]
    _no_host_detail(r, live.repository)
    r = await live.post("/infer", json={**GOOD, "model": "torchcnn"})
    assert r.status_code == 503, r.text
    _no_host_detail(r, live.repository)


async def test_unavailable_model_is_not_ready_400(live):
    """KServe: readiness "no" is a 400, for a model that failed to load too."""
    for path in ("/v2/models/torchcnn/ready", "/v2/models/torchcnn/versions/1/ready"):
        r = await live.get(path)
        assert r.status_code == 400 and r.json()["reason"] == "not_ready", r.text
        _no_host_detail(r, live.repository)
    r = await live.get("/v2/models/alpha/ready")  # loaded, no live device
    assert r.status_code == 400 and r.json()["reason"] == "not_ready", r.text


async def test_repository_index_gives_load_errors_relative_to_the_repository(live):
    r = await live.post("/v2/repository/index")
    assert r.status_code == 200, r.text
    _no_host_detail(r, live.repository)
    entries = {e["name"]: e for e in r.json()}
    assert set(entries) == {"alpha", "beta", "torchcnn"}
    reason = entries["torchcnn"]["reason"]
    assert reason.startswith("torchcnn/config.yaml: model_file 'model.pt' does not exist")
    assert "(torchcnn/model.pt)" in reason and "torch is missing" in reason


async def test_health_ready_no_host_detail(live):
    r = await live.get("/v2/health/ready")
    assert r.status_code == 400 and r.json()["reason"] == "not_ready", r.text
    _no_host_detail(r, live.repository)


# ------------------------------------------------------------------ server errors


class LeakyService(FakeService):
    """Fails the way real code does: with exception texts that name files."""

    def model_config(self, name):
        if name == "explodes":
            raise OSError(2, "No such file or directory", "/srv/secret/models/explodes/model.onnx")
        return super().model_config(name)

    async def infer(self, model, inputs, *, slo_ms=None, request_id=None, received_at=None, app=""):
        raise ExecutorFailed("executor failed: cannot map /dev/shm/ds-1234-add_one (errno 12)")


async def test_server_errors_name_no_path(caplog):
    service = LeakyService()
    app = create_api(lambda: service, Metrics())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        # 500 through FastAPI's handler and through the inference fast path
        for r in (
            await c.get("/v2/models/explodes"),
            await c.post("/infer", json={**GOOD, "model": "explodes"}),
        ):
            assert r.status_code == 500 and r.json()["reason"] == "internal", r.text
            assert "server log" in r.json()["error"]
            assert "/srv" not in r.text and "secret" not in r.text, r.text
        # a 5xx ServingError: the message stays, its paths are cut
        r = await c.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
        assert r.status_code == 503 and r.json()["reason"] == "executor_failed", r.text
        assert r.json()["error"] == "executor failed: cannot map ds-1234-add_one (errno 12)"


@pytest.mark.parametrize(
    "text,shown",
    [
        ("/srv/models/x/config.yaml: bad", "config.yaml: bad"),
        ("file '/etc/passwd' missing", "file 'passwd' missing"),
        ("(/a/b.txt)", "(b.txt)"),
        ("1/2 devices alive", "1/2 devices alive"),
        ("see http://host/x and a/b", "see http://host/x and a/b"),
        ("dir /tmp/ gone", "dir <path> gone"),
    ],
)
def test_hide_paths(text, shown):
    assert hide_paths(text) == shown
