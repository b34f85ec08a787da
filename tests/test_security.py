"""Security of the HTTP layer (issue 6, item 6).

- The server binds 127.0.0.1 unless a host is given (Settings, env HOST, CLI).
- No route reads or writes paths outside the model repository: model names
  with `../`, absolute paths, URL-encoded `%2e%2e%2f`, NUL bytes, ... in
  /v2/models/{name}/* and /infer get 400/404 and never reach the service (the
  names are checked with `validate_model_name` before any lookup), and no file
  is opened on their behalf (audit hook).
- Nothing from the network is unpickled or evaluated: no pickle/marshal/eval/
  exec in app/api (AST scan), binary tensor data is read only as the numeric
  dtypes of the model config, and a pickle payload sent as tensor bytes stays
  bytes.
- Limits from the model config: one item per request (the scheduler batches up
  to max_batch_size), tensor shapes and byte sizes fixed by the config.
- Management routes: `require_token` (bearer ADMIN_TOKEN; off on a non-loopback
  host without a token), on a dummy route mounted here.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import sys
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from fastapi import APIRouter, Depends

from app.api import create_api, require_token
from app.api.security import check_model_name, is_loopback, management_enabled
from app.repository.config import DATATYPES
from app.repository.loader import validate_model_name
from app.server.metrics import Metrics
from app.server.settings import Settings
from tests.fakes import FakeService, api_config

pytestmark = pytest.mark.anyio

API_DIR = Path(__file__).resolve().parent.parent / "app" / "api"
HDR = "Inference-Header-Content-Length"


# ------------------------------------------------------------------ binding


def test_settings_bind_loopback_unless_told():
    assert Settings().host == "127.0.0.1"
    assert Settings.from_env({}).host == "127.0.0.1"
    assert Settings.from_env({"PORT": "9000"}).host == "127.0.0.1"
    assert Settings.from_env({"HOST": "0.0.0.0"}).host == "0.0.0.0"
    assert is_loopback(Settings().host)


def test_cli_binds_loopback_unless_told(monkeypatch):
    import uvicorn

    import app.__main__ as cli
    import app.main

    monkeypatch.delenv("HOST", raising=False)
    monkeypatch.delenv("REALTIME_PRIORITY", raising=False)
    binds: list[str] = []
    hosts: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, host, **kw: binds.append(host))
    monkeypatch.setattr(app.main, "create_app", lambda settings: hosts.append(settings.host))
    assert cli.main(["serve"]) == 0
    assert cli.main(["serve", "--host", "0.0.0.0"]) == 0
    assert binds == hosts == ["127.0.0.1", "0.0.0.0"]
    assert "HOST" not in os.environ  # the flag went to the settings, not the environment


@pytest.mark.parametrize(
    "host,loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
    assert management_enabled(None, host) is loopback
    assert management_enabled("", host) is loopback
    assert management_enabled("tok", host) is True


# ------------------------------------------------------------------ paths


class RecordingService(FakeService):
    """Records every model name the HTTP layer asks about; fails the request
    (500) if one is not a safe model name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def _seen(self, name: str) -> None:
        self.names.append(name)
        validate_model_name(name)  # ValueError → 500 → the test fails

    def model_config(self, name):
        self._seen(name)
        return super().model_config(name)

    def model_ready(self, name):
        self._seen(name)
        return super().model_ready(name)

    async def infer(self, model, inputs, *, slo_ms=None, request_id=None, received_at=None, app=""):
        self._seen(model)
        return await super().infer(model, inputs, slo_ms=slo_ms, request_id=request_id)


@pytest.fixture
def service():
    """conftest's `app` and `client` over this service instead."""
    return RecordingService()


class _FileOpens:
    """An audit hook (hooks cannot be removed: it records only while on)."""

    def __init__(self) -> None:
        self.on = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.on and event in ("open", "os.listdir", "os.scandir", "os.remove", "os.rename"):
            self.paths.append(str(args[0]) if args else "")


_OPENS = _FileOpens()

EVIL_NAMES = [
    "..",
    ".",
    "../etc/passwd",
    "../../../../etc/passwd",
    "/etc/passwd",
    "add_one/../../etc/passwd",
    "..\\..\\windows\\win.ini",
    "C:\\Windows\\win.ini",
    "add_one\x00",
    "a\x00../etc/passwd",
    "%2e%2e%2fetc%2fpasswd",  # double-encoded: arrives as this literal text
    "~root",
    "add one",
    "add_one\n",
    "",
    "x" * 300,
    "mod\u00e8le",
    "..add_one",
]


def _safe(name: str) -> bool:
    try:
        check_model_name(name)
    except Exception:
        return False
    return True


def test_evil_names_are_not_model_names():
    for name in EVIL_NAMES:
        assert not _safe(name), name
    for name in ("add_one", "resnet50-emulated", "bert.v2", "A_1"):
        assert _safe(name), name


def _assert_refused(r: httpx.Response, what: str) -> None:
    assert r.status_code in (400, 404), (what, r.status_code, r.text)
    body = r.json()
    assert isinstance(body["error"], str) and body["error"], what
    assert body["reason"] in ("invalid_model_name", "not_found", "model_not_found"), (what, body)


GOOD_V2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


async def test_model_names_from_urls_and_bodies_never_reach_the_service(client, service):
    # warm up every route (lazy imports open files the first time)
    for path in ("/v2/models/add_one", "/v2/models/add_one/config", "/v2/models/add_one/ready"):
        assert (await client.get(path)).status_code == 200
    assert (await client.post("/v2/models/add_one/infer", json=GOOD_V2)).status_code == 200
    # (the native route's body limit asks the service for its own models' configs, once)
    r = await client.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
    assert r.status_code == 200, r.text
    service.names.clear()
    _OPENS.paths.clear()
    _OPENS.on = True
    try:
        for name in EVIL_NAMES:
            # '/' → %2F, NUL → %00, '%' → %25, '.' → %2E (httpx would drop dot segments)
            enc = quote(name, safe="").replace(".", "%2E")
            for path in (
                f"/v2/models/{enc}",
                f"/v2/models/{enc}/config",
                f"/v2/models/{enc}/ready",
                f"/v2/models/{enc}/versions/1",
                f"/v2/models/{enc}/versions/1/config",
                f"/v2/models/{enc}/versions/1/ready",
                f"/v2/models/add_one/versions/{enc}/config",
            ):
                _assert_refused(await client.get(path), path)
            for path in (f"/v2/models/{enc}/infer", f"/v2/models/{enc}/versions/1/infer"):
                _assert_refused(await client.post(path, json=GOOD_V2), path)
            r = await client.post("/infer", json={"model": name, "inputs": {"x": [1, 2, 3, 4]}})
            _assert_refused(r, f"/infer model={name!r}")
            if name.isprintable() and "/" not in name and len(name) < 100:
                # the way a client that does not encode would send it
                _assert_refused(await client.get(f"/v2/models/{name}/config"), name)
        opened = list(_OPENS.paths)
        with open(__file__, "rb"):  # the hook does see file opens
            pass
        assert _OPENS.paths[-1] == __file__
    finally:
        _OPENS.on = False
    assert opened == [], opened
    # only safe names reached the service: add_one (asked about an evil version),
    # and "config" (a client collapsed /v2/models/./config)
    assert set(service.names) <= {"add_one", "config"}, service.names


async def _raw_asgi(app, method: str, raw_path: str, body: bytes = b"") -> tuple[int, dict]:
    """Call the app with an un-normalised path (httpx would remove the dot segments)."""
    from urllib.parse import unquote

    sent: list[dict] = []
    done = False

    async def receive():
        nonlocal done
        if done:
            return {"type": "http.disconnect"}
        done = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(raw_path),
        "raw_path": raw_path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1234),
        "server": ("test", 80),
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload)


@pytest.mark.parametrize(
    "method,raw_path",
    [
        ("GET", "/v2/models/../config"),
        ("GET", "/v2/models/.."),
        ("GET", "/v2/models/../../etc/passwd"),
        ("GET", "/v2/models/%2e%2e/config"),
        ("GET", "/v2/models/%2e%2e%2f%2e%2e%2fetc%2fpasswd/config"),
        ("GET", "/v2/models/%2Fetc%2Fpasswd"),
        ("GET", "/v2/models/add_one%00/ready"),
        ("GET", "/v2/models/add_one/versions/../config"),
        ("POST", "/v2/models/../infer"),
        ("POST", "/v2/models/..%2f..%2fetc%2fpasswd/infer"),
        ("POST", "/v2/models/%00/infer"),
        ("GET", "//etc/passwd"),
        ("GET", "/../../etc/passwd"),
    ],
)
async def test_raw_traversal_paths(app, service, method, raw_path):
    body = json.dumps(GOOD_V2).encode() if method == "POST" else b""
    status, payload = await _raw_asgi(app, method, raw_path, body)
    assert status in (400, 404), (status, payload)
    assert payload["error"]
    assert all(_safe(n) for n in service.names), service.names
    assert "add_one\x00" not in service.names


# ------------------------------------------------------------------ nothing evaluated

_FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve",
                      "joblib", "subprocess", "pty"}  # fmt: skip
_FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "execfile", "input"}
_FORBIDDEN_ATTRS = {
    ("pickle", "loads"), ("pickle", "load"), ("marshal", "loads"), ("yaml", "load"),
    ("yaml", "unsafe_load"), ("yaml", "full_load"), ("np", "load"), ("numpy", "load"),
    ("os", "system"), ("os", "popen"), ("importlib", "import_module"),
}  # fmt: skip


def _api_modules() -> list[Path]:
    files = sorted(API_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"routes.py", "tensors.py", "models.py", "security.py"}
    return files


# The one function that builds object arrays (BYTES elements, each a bytes
# object a parser made), with the file it is in.
_OBJECT_ARRAY_BUILDER = ("tensors.py", "bytes_elements")


def _lines_of(tree: ast.AST, function: str) -> range:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return range(node.lineno, (node.end_lineno or node.lineno) + 1)
    return range(0)


def test_api_never_unpickles_or_evaluates():
    problems = []
    for path in _api_modules():
        tree = ast.parse(path.read_text(), filename=str(path))
        allowed = range(0)
        if path.name == _OBJECT_ARRAY_BUILDER[0]:
            allowed = _lines_of(tree, _OBJECT_ARRAY_BUILDER[1])
            assert allowed, "tensors.bytes_elements is gone: update this test"
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in _FORBIDDEN_MODULES:
                        problems.append(f"{where} imports {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                if (node.module or "").split(".")[0] in _FORBIDDEN_MODULES:
                    problems.append(f"{where} imports from {node.module}")
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in _FORBIDDEN_CALLS:
                    problems.append(f"{where} calls {func.id}()")
                if (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and (func.value.id, func.attr) in _FORBIDDEN_ATTRS
                ):
                    problems.append(f"{where} calls {func.value.id}.{func.attr}()")
                for kw in node.keywords:
                    if kw.arg == "allow_pickle":
                        problems.append(f"{where} passes allow_pickle")
                    if kw.arg == "dtype" and isinstance(kw.value, ast.Name | ast.Constant):
                        value = getattr(kw.value, "id", getattr(kw.value, "value", None))
                        if value in ("object", "O") and node.lineno not in allowed:
                            problems.append(f"{where} builds an object array")
    assert problems == []


def test_binary_data_is_only_ever_numeric():
    """decode_binary_tensor reads `np.frombuffer(buf, dtype=spec.dtype)`; the
    config's datatypes are plain numbers (no object or structured dtypes),
    but BYTES, whose elements are sliced out by their length prefixes as
    bytes objects (decode_binary_bytes), never read with frombuffer."""
    for name, dtype in DATATYPES.items():
        if name == "BYTES":
            continue
        assert not dtype.hasobject and dtype.fields is None, name
        assert dtype.kind in "biuf", name
    source = (API_DIR / "tensors.py").read_text()
    assert "np.frombuffer(buf, dtype=spec.dtype" in source
    binary = source[source.index("def decode_binary_tensor(") :]
    binary = binary[: binary.index("\ndef ", 1)]
    assert binary.index("return decode_binary_bytes(") < binary.index("np.frombuffer(")


class _Boom:
    """Unpickling this sets a flag: the proof that bytes were unpickled."""

    fired = False

    def __reduce__(self):
        return (_fire, ())


def _fire():
    _Boom.fired = True
    return "fired"


async def test_pickle_and_code_payloads_stay_data():
    payload = pickle.dumps(_Boom())
    svc = RecordingService()
    svc.configs["raw"] = api_config(
        "raw", [("x", "UINT8", (-1, len(payload)))], [("y", "FP32", (-1, len(payload)))]
    )
    app = create_api(lambda: svc, Metrics())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        header = {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, len(payload)],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": len(payload)},
                }
            ]
        }
        js = json.dumps(header).encode()
        r = await c.post(
            "/v2/models/raw/infer",
            content=js + payload,
            headers={HDR: str(len(js)), "content-type": "application/octet-stream"},
        )
        assert r.status_code == 200, r.text
        got = svc.calls[-1]["inputs"]["x"]
        assert got.dtype == np.uint8 and got.tobytes() == payload
        # code in JSON is a string, and strings are not numbers
        for code in ("__import__('os').system('true')", "eval('1+1')", payload.hex()):
            r = await c.post("/infer", json={"model": "add_one", "inputs": {"x": [code] * 4}})
            assert r.status_code == 400 and "strings" in r.json()["error"], r.text
            v2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                              "data": [code] * 4}]}  # fmt: skip
            r = await c.post("/v2/models/add_one/infer", json=v2)
            assert r.status_code == 400, r.text
        # a model named like code is just an unknown, invalid name
        r = await c.post("/infer", json={"model": "__import__('os')", "inputs": {}})
        assert r.status_code == 400 and r.json()["reason"] == "invalid_model_name"
    assert not _Boom.fired


# ------------------------------------------------------------------ limits from the config


async def test_items_up_to_max_batch_size_and_config_tensor_sizes(client, service):
    max_batch = service.configs["add_one"].max_batch_size
    assert max_batch == 32
    cases = [
        # more items than max_batch_size: never accepted (a request is never split)
        ({"shape": [max_batch + 1, 4], "data": [1] * 4 * (max_batch + 1)},
         "batch dimension must be between 1 and the model's max_batch_size (32), got 33"),
        ({"shape": [0, 4], "data": []}, "got 0"),
        # the config fixes the item shape: [1, 4] FP32, i.e. 16 bytes
        ({"shape": [1, 4096], "data": [1] * 4096}, "expected shape [1, 4]"),
        ({"shape": [1, 4, 1], "data": [1] * 4}, "expected shape [1, 4]"),
        ({"shape": [1, 10**15], "data": [1]}, "expected shape [1, 4]"),
    ]  # fmt: skip
    for change, words in cases:
        inp = {"name": "x", "datatype": "FP32", **change}
        r = await client.post("/v2/models/add_one/infer", json={"inputs": [inp]})
        assert r.status_code == 400 and words in r.json()["error"], r.text
    # binary bytes beyond the config's size for the tensor
    big = np.zeros(4096, np.float32).tobytes()
    inp = {"name": "x", "shape": [1, 4], "datatype": "FP32"}
    js = json.dumps({"inputs": [{**inp, "parameters": {"binary_data_size": len(big)}}]}).encode()
    r = await client.post("/v2/models/add_one/infer", content=js + big, headers={HDR: str(len(js))})
    assert r.status_code == 400 and "16 bytes" in r.json()["error"], r.text
    # native nested lists: the same limits
    r = await client.post("/infer", json={"model": "add_one", "inputs": {"x": [[1] * 4] * 33}})
    assert r.status_code == 400 and "max_batch_size (32), got 33" in r.json()["error"]
    assert service.calls == []
    r = await client.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
    assert r.status_code == 200
    assert service.calls[-1]["inputs"]["x"].shape == (1, 4)
    # several items, up to max_batch_size: one request, answered [n, 4]
    r = await client.post("/infer", json={"model": "add_one", "inputs": {"x": [[1] * 4] * 32}})
    assert r.status_code == 200, r.text
    assert service.calls[-1]["inputs"]["x"].shape == (32, 4)
    assert r.json()["outputs"]["y"]["shape"] == [32, 4]
    inp = {"name": "x", "datatype": "FP32", "shape": [3, 4], "data": list(range(12))}
    r = await client.post("/v2/models/add_one/infer", json={"inputs": [inp]})
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["shape"] == [3, 4] and out["data"] == [float(v + 1) for v in range(12)]
    # every input gives the same n
    typed = [
        {"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
        {"name": "b", "datatype": "BOOL", "shape": [1, 2], "data": [True, False]},
        {"name": "c", "datatype": "FP16", "shape": [1, 1, 3], "data": [1, 2, 3]},
    ]
    r = await client.post("/v2/models/typed/infer", json={"inputs": typed})
    assert r.status_code == 400
    assert r.json()["error"] == (
        "the inputs disagree on the batch dimension ('a': 2, 'b': 1, 'c': 1): give one n"
    )


# ------------------------------------------------------------------ management routes

ADMIN_PATH = "/admin/dummy"


def _admin_app(token: str | None, host: str, *, via_state: bool = True):
    service = FakeService()
    app = create_api(lambda: service, Metrics(), admin_token=token, bind_host=host)
    guard = app.state.require_admin if via_state else require_token(token, host=host)
    router = APIRouter(dependencies=[Depends(guard)])

    @router.post(ADMIN_PATH)
    async def dummy() -> dict:
        return {"done": True}

    app.include_router(router)
    return app


async def _call(app, headers: dict | None = None, path: str = ADMIN_PATH) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        return await c.post(path, headers=headers or {})


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "192.168.1.20"])
@pytest.mark.parametrize("via_state", [True, False])
async def test_token_required_when_configured(host, via_state):
    app = _admin_app("s3cret-token", host, via_state=via_state)
    r = await _call(app)
    assert r.status_code == 401 and r.json()["reason"] == "unauthorized"
    assert "Bearer" in r.json()["error"]
    assert r.headers["www-authenticate"].startswith("Bearer")
    for bad in ("Bearer wrong", "Bearer s3cret-token-and-more", "Bearer s3cret",
                "Basic czNjcmV0LXRva2Vu", "s3cret-token", "Bearer", "Bearer  "):  # fmt: skip
        r = await _call(app, {"Authorization": bad})
        assert r.status_code == 401, (bad, r.text)
        assert r.json()["reason"] == "unauthorized"
    r = await _call(app, {"Authorization": "Bearer wrong"})
    assert 'error="invalid_token"' in r.headers["www-authenticate"]
    for good in ("Bearer s3cret-token", "bearer s3cret-token", "Bearer  s3cret-token "):
        r = await _call(app, {"Authorization": good})
        assert r.status_code == 200 and r.json() == {"done": True}, (good, r.text)


@pytest.mark.parametrize("token", [None, ""])
@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
async def test_no_token_on_loopback_is_open(token, host):
    app = _admin_app(token, host)
    assert (await _call(app)).status_code == 200
    assert (await _call(app, {"Authorization": "Bearer anything"})).status_code == 200


@pytest.mark.parametrize("token", [None, ""])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "server.example.com"])
async def test_no_token_on_public_host_disables_management(token, host):
    app = _admin_app(token, host)
    for headers in (None, {"Authorization": "Bearer anything"}):
        r = await _call(app, headers)
        assert r.status_code == 403, r.text
        body = r.json()
        assert body["reason"] == "management_disabled"
        assert "ADMIN_TOKEN" in body["error"] and host in body["error"]


async def test_token_does_not_guard_inference_routes():
    app = _admin_app("s3cret-token", "0.0.0.0")
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/infer", json={"model": "add_one", "inputs": {"x": [1, 2, 3, 4]}})
        assert r.status_code == 200
        assert (await c.get("/v2/health/ready")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
        doc = (await c.get("/openapi.json")).json()
    # the guarded route documents its bearer scheme; the others need none
    assert doc["paths"][ADMIN_PATH]["post"]["security"] == [{"HTTPBearer": []}]
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "security" not in doc["paths"]["/infer"]["post"]


def test_max_body_bytes_is_validated():
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_body_bytes"):
            create_api(lambda: None, Metrics(), max_body_bytes=bad)
    for bad in (1.5, "64MiB", True):
        with pytest.raises(TypeError, match="max_body_bytes"):
            create_api(lambda: None, Metrics(), max_body_bytes=bad)
