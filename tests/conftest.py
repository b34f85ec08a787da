"""Fixtures shared by the test files. Plain fakes and builders (models,
requests, configs, the fake inference service, fake clocks and executors)
live in tests/fakes.py; a test module imports from there, never from another
test module.

What starts something real is here, each with its clean-up: the HTTP layer
over the fake service, a uvicorn server in a thread, daemons
(`python -m app serve`), commands run as subprocesses, and the check that
executors leave no shared memory behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import httpx
import pytest

from app.api import create_api
from app.api.connection import uvicorn_connection_options
from app.server.metrics import Metrics
from app.server.settings import SETTINGS
from bench.daemon_launcher import DaemonHandle, free_port, start_daemon, stop_daemon
from tests.fakes import FakeService, our_segments, segments_of
from tests.guarded_server import quick_settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """XDG_CACHE_HOME in a temporary directory for the whole run (the
    daemons started inherit it): measured profiles are cached there, never
    in the user's cache. One for every xdist worker of the run, so that the
    bundled models are profiled once, not once per worker (cache files are
    written atomically)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = shared / "cache-home"
    path.mkdir(exist_ok=True)
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(path)
    yield path
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests (`pytest.mark.anyio`) run on asyncio only, the daemon's loop."""
    return "asyncio"


# ----------------------------------------------------------------- the HTTP layer


@pytest.fixture
def service() -> FakeService:
    """The inference service behind `app`; a test file may override it."""
    return FakeService()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


class _Serving:
    """What the shared test app serves: the current test's service and
    metrics (`app` rebinds them before each test)."""

    def __init__(self) -> None:
        self.service: Any = None
        self.metrics: Metrics | None = None


class _CurrentMetrics:
    """The current test's `Metrics`, for the shared app's context."""

    def __init__(self, serving: _Serving) -> None:
        self._serving = serving

    def __getattr__(self, name: str) -> Any:
        return getattr(self._serving.metrics, name)


_SERVING = _Serving()
_SHARED_APP: list[Any] = []


@pytest.fixture
def app(service: FakeService, metrics: Metrics) -> Any:
    """The real HTTP API (app.api) in front of `service`. One app per test
    process, rebound to each test's service and metrics: building one costs
    FastAPI ~26 ms, ~4 s of the fast loop when every test built its own."""
    _SERVING.service, _SERVING.metrics = service, metrics
    if not _SHARED_APP:
        proxy: Any = _CurrentMetrics(_SERVING)
        _SHARED_APP.append(create_api(lambda: _SERVING.service, proxy, max_body_bytes=1 << 20))
    return _SHARED_APP[0]


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that calls `app` in-process (ASGI); a server error is a
    500 reply, not an exception in the test."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


@pytest.fixture(scope="module")
def uvicorn_in_thread() -> Iterator[Callable[..., str]]:
    """`serve(app, start_timeout_s=10, **config)` runs `app` under a real
    uvicorn server in a thread on an ephemeral loopback port and returns its
    "host:port"; every server started stops at the end of the module.
    uvicorn binds the port itself: a socket made with socket.socket()
    (proto 0) would miss asyncio's TCP_NODELAY and add ~40 ms per response."""
    import uvicorn

    running: list[tuple[Any, threading.Thread]] = []

    def serve(app: Any, start_timeout_s: float = 10.0, **config: Any) -> str:
        options = {"host": "127.0.0.1", "port": 0, "log_level": "warning", "lifespan": "off"}
        server = uvicorn.Server(uvicorn.Config(app, **{**options, **config}))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread))
        give_up = time.monotonic() + start_timeout_s
        while not server.started:
            assert thread.is_alive(), "uvicorn exited while starting"
            assert time.monotonic() < give_up, f"uvicorn did not start in {start_timeout_s} s"
            time.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    yield serve
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=10.0)


# ------------------------------------------------------------------ processes


@pytest.fixture(scope="module")
def live_server(uvicorn_in_thread: Callable[..., str]) -> tuple[str, FakeService]:
    """The HTTP API over a fake service under a real uvicorn server: (its
    "host:port", the service)."""
    service = FakeService()
    return uvicorn_in_thread(create_api(lambda: service, Metrics())), service


@pytest.fixture(scope="module")
def triton(live_server: tuple[str, FakeService]) -> Iterator[Any]:
    """A `tritonclient.http` client of `live_server`."""
    import tritonclient.http  # the `test` extra's

    client = tritonclient.http.InferenceServerClient(live_server[0], network_timeout=10)
    yield client
    client.close()


@pytest.fixture
def no_leftover_segments() -> Iterator[None]:
    """For a test that creates arenas or starts executors in this process:
    every shared-memory segment it made is gone when it ends."""
    before = set(our_segments())
    yield
    leftover = set(our_segments()) - before
    assert not leftover, f"shared memory left over: {sorted(leftover)}"


@pytest.fixture(scope="module")
def launch_daemon() -> Iterator[Callable[..., DaemonHandle]]:
    """`launch(repository, **options)` starts `python -m app serve` on a free
    loopback port (bench.daemon_launcher.start_daemon's options) and returns
    once it is ready. Every daemon started is stopped at the end of the
    module (a no-op for one a test has stopped), and none may leave shared
    memory behind."""
    handles: list[DaemonHandle] = []

    def launch(repository: Path, **options: Any) -> DaemonHandle:
        options.setdefault("startup_timeout_s", 60)
        handle = start_daemon(repository, free_port(), **options)
        handles.append(handle)
        return handle

    yield launch
    for handle in handles:
        stop_daemon(handle)
    leaked = {name for handle in handles for name in segments_of(handle.process.pid)}
    assert not leaked, f"a daemon left shared memory behind: {sorted(leaked)}"


@pytest.fixture
def cli_env() -> dict[str, str]:
    """The environment for a command a test runs: this process's, less the
    daemon's settings variables, so that a POLICY or EMULATED_DEVICES in the
    developer's shell does not change what the test sees; and GRPC_PORT 0,
    so that daemons started side by side do not all bind the fixed default
    gRPC port (a test of gRPC gives a free port)."""
    ours = {setting.env for setting in SETTINGS}
    env = {name: value for name, value in os.environ.items() if name not in ours}
    return {**env, "GRPC_PORT": "0"}


@pytest.fixture
def run_module(cli_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run(module, *args, env=None, timeout=60)`: `python -m module args` in
    the repository root with `cli_env` (plus `env`); its output captured."""

    def run(
        module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env={**cli_env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture(scope="module")
def guarded_serve(uvicorn_in_thread: Callable[..., str]) -> Callable[..., tuple[str, int]]:
    """`guarded_serve(app, **settings)`: `app` under uvicorn with the connection
    options of those settings; (host, port)."""

    def start(app: Any, **changes: Any) -> tuple[str, int]:
        options = uvicorn_connection_options(quick_settings(**changes), devices=0, models=0)
        host, port = uvicorn_in_thread(app, **options).rsplit(":", 1)
        return host, int(port)

    return start


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    """Raise TimeoutError in the test past `seconds` (SIGALRM): for tests that
    start processes that could hang."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"{what} ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def peer_missing(why: str) -> NoReturn:
    """A peer's install is missing: skip saying why, but fail under CI, which
    installs it (.ci/run)."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def require_peer(name: str) -> None:
    """bench.compare's peer `name` (ray, tritonserver, bentoml) is installed,
    else `peer_missing` with its one message (what is missing, the command
    that installs it)."""
    from bench.compare.peers import PEERS, PeerUnavailable

    try:
        PEERS[name].check()
    except PeerUnavailable as exc:
        peer_missing(str(exc))
