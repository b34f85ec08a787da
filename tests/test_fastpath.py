"""The inference routes' short way through the ASGI stack (app.api.fastpath):
which paths it takes, that it bypasses FastAPI (its own __call__ and router)
for them and only for them, and that its answers are the routed ones (tests/test_api.py runs every
inference case through it)."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api import create_api
from app.api.fastpath import ServingAPI, match_infer_path
from app.api.routes import install
from app.server.metrics import Metrics
from tests.fakes import GOOD_V2, FakeService

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/infer", ("", None)),
        ("/v2/models/add_one/infer", ("add_one", None)),
        ("/v2/models/add_one/versions/3/infer", ("add_one", "3")),
        ("/v2/models//infer", None),
        ("/v2/models/a/b/infer", None),
        ("/v2/models/a/versions//infer", None),
        ("/v2/models/a/version/1/infer", None),
        ("/v2/models/add_one", None),
        ("/v2/models/add_one/ready", None),
        ("/infer/", None),
        ("/v2/infer", None),
    ],
)
def test_match_infer_path(path, expected):
    assert match_infer_path(path) == expected


def _record_http_paths(monkeypatch, owner: type, method: str) -> list[str]:
    """Patch the ASGI method `owner.method` to record, in order, the path of
    every HTTP request that enters it."""
    calls: list[str] = []
    original = getattr(owner, method)

    async def recording(self, scope, receive, send):
        if scope["type"] == "http":
            calls.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(owner, method, recording)
    return calls


def _client(app, *, raise_app_exceptions: bool = False) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


@pytest.fixture
def routed_calls(monkeypatch):
    """Paths FastAPI's router handled (APIRoute.handle), in order."""
    return _record_http_paths(monkeypatch, APIRoute, "handle")


async def test_inference_bypasses_the_router_and_the_rest_does_not(routed_calls):
    service = FakeService()
    app = create_api(lambda: service, Metrics(), max_body_bytes=1 << 20)
    async with _client(app) as client:
        r = await client.post("/v2/models/add_one/infer", json=GOOD_V2)
        assert r.status_code == 200
        assert r.json()["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]
        r = await client.post("/v2/models/add_one/versions/1/infer", json=GOOD_V2)
        assert r.status_code == 200
        r = await client.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
        assert r.status_code == 200 and r.json()["outputs"]["y"]["data"] == [[2.0, 3.0, 4.0, 5.0]]
        assert routed_calls == []

        # Errors from the fast path are the API's JSON errors.
        r = await client.post("/v2/models/nope/infer", json=GOOD_V2)
        assert r.status_code == 404 and "nope" in r.json()["error"]
        r = await client.post("/v2/models/busy/infer", json=GOOD_V2)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        r = await client.post("/infer", json={"model": "broken", "inputs": {"x": [1, 2, 3, 4]}})
        assert r.status_code == 500 and r.json()["reason"] == "internal"
        assert routed_calls == []

        # Other methods on an inference path, and other routes, are FastAPI's.
        r = await client.get("/v2/models/add_one/infer")
        assert r.status_code == 405 and r.json()["reason"] == "method_not_allowed"
        r = await client.get("/v2/models/add_one")
        assert r.status_code == 200
        assert routed_calls == ["/v2/models/add_one/infer", "/v2/models/add_one"]


@pytest.fixture
def fastapi_calls(monkeypatch):
    """Paths that entered FastAPI's own __call__ (its telemetry check, middleware)."""
    return _record_http_paths(monkeypatch, FastAPI, "__call__")


async def test_inference_skips_fastapi_itself_and_logs_unexpected_errors(fastapi_calls, caplog):
    service = FakeService()
    app = create_api(lambda: service, Metrics(), max_body_bytes=1 << 20)
    assert isinstance(app, ServingAPI)
    async with _client(app, raise_app_exceptions=True) as client:
        r = await client.post("/v2/models/add_one/infer", json=GOOD_V2)
        assert r.status_code == 200
        with caplog.at_level(logging.ERROR, logger="app.api.fastpath"):
            r = await client.post("/infer", json={"model": "broken", "inputs": {"x": [1, 2, 3, 4]}})
        # Answered, not raised to the server: the short way is outside
        # Starlette's ServerErrorMiddleware, so it logs the traceback itself.
        assert r.status_code == 500 and r.json()["reason"] == "internal"
        assert [rec.exc_info is not None for rec in caplog.records] == [True]
        assert fastapi_calls == []
        r = await client.get("/v2/models/add_one")
        assert r.status_code == 200
        assert fastapi_calls == ["/v2/models/add_one"]


async def test_a_plain_fastapi_app_gets_the_short_way_as_a_middleware(routed_calls):
    service = FakeService()
    app = install(FastAPI(), lambda: service, Metrics(), max_body_bytes=1 << 20)
    async with _client(app) as client:
        r = await client.post("/v2/models/add_one/infer", json=GOOD_V2)
        assert r.status_code == 200
        assert r.json()["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]
        r = await client.post("/v2/models/nope/infer", json=GOOD_V2)
        assert r.status_code == 404
        r = await client.get("/v2/models/add_one")
        assert r.status_code == 200
        assert routed_calls == ["/v2/models/add_one"]
