"""Connection hygiene (app/api/connection.py, app/server/connection_limits.py):
header and body timeouts, the header-size cap, the budget of request bodies
held over all connections, the connection cap below the open-file limit, and
how `python -m app serve` hands them to uvicorn.

The servers here run `GuardedProtocol` under uvicorn in a thread with small
timeouts; a raw socket plays the client. A refusal is sent to clients that
have stopped sending (one still sending may see a reset instead)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import select
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.server import ServerState

from app.api import connection
from app.api.connection import (
    GuardedProtocol,
    guarded_protocol,
    uvicorn_connection_options,
)
from app.api.connection_share import BufferBudget
from app.server.connection_limits import (
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
    choose_max_connections,
    connection_limits,
    fd_plan,
)
from app.server.settings import Settings
from bench.overload import executor_pids, write_repository

QUICK = 0.5  # the timeouts of the servers here, in seconds
GRACE = 2.0  # how much later than its timeout a close may come


class RecordingApp:
    """Reads each request's body to the end (or a disconnect), records the
    ASGI messages it received, answers 200 with the body's size."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen: list[str] = []
        self.requests.append(seen)
        size = 0
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.dumps({"size": size}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _settings(**changes: Any) -> Settings:
    quick = {"header_timeout_s": QUICK, "body_timeout_s": QUICK, "keep_alive_timeout_s": 5.0}
    return Settings(**{**quick, **changes})


@pytest.fixture(scope="module")
def serve(uvicorn_in_thread: Callable[..., str]) -> Callable[..., tuple[str, int]]:
    """`serve(app, **settings)`: `app` under uvicorn with the connection
    options of those settings; (host, port)."""

    def start(app: Any, **changes: Any) -> tuple[str, int]:
        options = uvicorn_connection_options(_settings(**changes), devices=0, models=0)
        host, port = uvicorn_in_thread(app, **options).rsplit(":", 1)
        return host, int(port)

    return start


def _connect(address: tuple[str, int], timeout: float = QUICK + GRACE) -> socket.socket:
    return socket.create_connection(address, timeout=timeout)


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout (the
    server kept the connection open) fails the test."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.02)
    return True


# ------------------------------------------------------------------ timeouts


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(serve):
    address = serve(RecordingApp())
    with _connect(address) as sock:
        opened = time.monotonic()
        assert _read_to_close(sock) == b""  # closed, nothing to answer
        assert time.monotonic() - opened >= QUICK * 0.8


@pytest.mark.slow
def test_a_header_dribbler_gets_408_and_is_closed(serve):
    app = RecordingApp()
    address = serve(app)
    with _connect(address) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(0.1)
        answer = b""
        give_up = time.monotonic() + QUICK + GRACE
        while time.monotonic() < give_up:  # a header byte every 0.1 s, never the end
            try:
                answer = sock.recv(65536)
                break
            except TimeoutError:
                sock.sendall(b"X")
        assert answer, "the server still reads a head it got a byte of every 0.1 s"
        sock.settimeout(GRACE)
        answer += _read_to_close(sock)
    assert _status_and_body(answer) == (
        408,
        {"error": f"request head not received within {QUICK:g} s", "reason": "request_timeout"},
    )
    assert app.requests == []  # the app never saw it


@pytest.mark.slow
def test_a_stalled_body_gets_408_the_connection_closes_and_the_app_sees_a_disconnect(serve):
    app = RecordingApp()
    address = serve(app)
    with _connect(address) as sock:
        sock.sendall(
            b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"a" * 400
        )
        answer = _read_to_close(sock)
    assert _status_and_body(answer) == (
        408,
        {"error": f"request body not received within {QUICK:g} s", "reason": "request_timeout"},
    )
    assert _wait_for(lambda: app.requests and app.requests[0][-1:] == ["http.disconnect"])
    assert app.requests[0][0] == "http.request"
    # The server goes on serving.
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        assert client.post("/infer", content=b"b" * 1000).json() == {"size": 1000}


@pytest.mark.slow
def test_a_body_sent_in_time_is_served_and_the_connection_kept(serve):
    address = serve(RecordingApp())
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        for size in (0, 10, 100_000):
            assert client.post("/infer", content=b"x" * size).json() == {"size": size}
        # Idle for more than the header and body timeouts, less than keep-alive:
        time.sleep(QUICK * 2)
        assert client.post("/infer", content=b"y").json() == {"size": 1}


# ------------------------------------------------------------------ header size


@pytest.mark.slow
def test_a_head_over_max_header_bytes_gets_431_and_is_closed(serve):
    app = RecordingApp()
    address = serve(app, max_header_bytes=4096)
    with _connect(address) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 6000 + b"\r\n\r\n")
        answer = _read_to_close(sock)
    assert _status_and_body(answer) == (
        431,
        {"error": "request head exceeds 4096 bytes", "reason": "headers_too_large"},
    )
    assert app.requests == []
    with _connect(address) as sock:  # a head just under the cap is served
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4000 + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


class FakeTransport(asyncio.Transport):
    """What the protocol writes, and whether it closed; connection_lost
    follows close as with a real transport."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.written = b""
        self.closed = False
        self.eof = False  # write_eof: the answer sent, then a FIN
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _protocol(
    app: Any, limits: ConnectionLimits, state: ServerState | None = None
) -> tuple[Any, FakeTransport]:
    config = uvicorn.Config(app, lifespan="off", log_level="warning")
    loop = asyncio.get_running_loop()
    protocol = guarded_protocol(limits)(
        config=config, server_state=state or ServerState(), app_state={}, _loop=loop
    )
    transport = FakeTransport(loop)
    transport.protocol = protocol
    protocol.connection_made(transport)
    return protocol, transport


def test_a_megabyte_of_headers_feeds_the_parser_no_more_than_max_header_bytes(monkeypatch):
    """...and the 431 is sent with a FIN, the rest of the flood read and
    discarded until the socket is closed LINGER_S later (no reset that could
    destroy the answer before the client reads it)."""
    monkeypatch.setattr(connection, "LINGER_S", 0.05)

    async def scenario() -> None:
        protocol, transport = _protocol(RecordingApp(), ConnectionLimits(max_header_bytes=4096))
        fed: list[int] = []
        parser = protocol.parser

        class CountingParser:
            def feed_data(self, data: bytes) -> None:
                fed.append(len(data))
                parser.feed_data(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(parser, name)

        protocol.parser = CountingParser()
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(16):  # 1 MiB of one header, 64 KiB a read
            protocol.data_received(b"a" * 65536)
        assert sum(fed) == 4096  # what the parser (httptools) may have buffered
        assert transport.written.startswith(b"HTTP/1.1 431 ") and transport.eof
        assert not transport.closed  # lingering: the flood is read and dropped
        await asyncio.sleep(0.2)
        assert transport.closed  # LINGER_S later
        await asyncio.sleep(0)  # connection_lost

    asyncio.run(scenario())


# ------------------------------------------------------------------ buffered bytes


def test_buffer_budget_counts_bytes_and_lets_one_body_alone_pass_it():
    budget = BufferBudget(1000)
    assert budget.fits(1500)  # alone: always fits
    assert budget.grow(1500, held=0) and budget.used == 1500
    assert not budget.fits(1)
    budget.release(1500)
    assert budget.grow(800, held=0)
    assert budget.fits(200) and not budget.fits(201)
    # Another body growing: over the limit only while others are held.
    assert budget.grow(100, held=0) and budget.used == 900
    assert not budget.grow(300, held=100) and budget.used == 1200
    budget.release(400)
    assert budget.grow(5000, held=800) and budget.used == 5800


@pytest.mark.slow
def test_bodies_over_max_buffered_bytes_get_503_until_the_held_ones_are_answered(serve):
    app = RecordingApp()
    address = serve(app, max_buffered_bytes=1000, body_timeout_s=30.0)
    with _connect(address) as held:
        # 800 of 1000 bytes come, the rest later: 800 held.
        held.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        held.sendall(b"a" * 800)
        assert _wait_for(lambda: len(app.requests) == 1)
        time.sleep(0.2)  # all 800 read
        with _connect(address) as refused:
            refused.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 201\r\n\r\n")
            answer = _read_to_close(refused)
        assert _status_and_body(answer) == (
            503,
            {
                "error": "the server holds too many request bodies; retry later",
                "reason": "server_busy",
            },
        )
        assert len(app.requests) == 1  # the refused body was never read
        with _connect(address) as small:  # what fits, and requests without a body, go in
            small.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
            small.sendall(b"b" * 200 + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b'{"size": 200}' in small.recv(65536)
        held.sendall(b"a" * 200)
        assert held.recv(65536).endswith(b'{"size": 1000}')
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        assert client.post("/infer", content=b"c" * 900).json() == {"size": 900}


@pytest.mark.slow
def test_a_client_that_declares_a_body_and_sends_nothing_holds_nothing(serve):
    address = serve(RecordingApp(), max_buffered_bytes=1000, body_timeout_s=30.0)
    with _connect(address) as idle:
        idle.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
            assert client.post("/infer", content=b"c" * 900).json() == {"size": 900}


def test_a_chunked_body_growing_past_the_budget_is_answered_503_and_its_app_disconnected():
    async def scenario() -> None:
        app = RecordingApp()
        state = ServerState()
        limits = ConnectionLimits(max_buffered_bytes=1000)
        first, _ = _protocol(app, limits, state)
        first.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        first.data_received(b"f" * 800)
        second, transport = _protocol(app, limits, state)
        second.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        second.data_received(b"64\r\n" + b"x" * 100 + b"\r\n")  # 900 held
        assert not transport.eof and second.budget.used == 900
        second.data_received(b"c8\r\n" + b"x" * 200 + b"\r\n")  # 1100 > 1000
        assert transport.eof  # answered, FIN sent (then lingering)
        assert transport.written.startswith(b"HTTP/1.1 503 ")
        assert b'"reason": "server_busy"' in transport.written
        for _ in range(5):
            await asyncio.sleep(0)
        assert second.budget.used == 800  # the chunked body's bytes were given back
        assert ["http.disconnect"] in [r[-1:] for r in app.requests]
        first.transport.close()
        await asyncio.sleep(0)
        assert first.budget.used == 0

    asyncio.run(scenario())


def test_a_chunked_body_over_max_body_bytes_is_answered_413():
    async def scenario() -> None:
        app = RecordingApp()
        protocol, transport = _protocol(app, ConnectionLimits(max_body_bytes=150))
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        protocol.data_received(b"64\r\n" + b"x" * 100 + b"\r\n")
        assert not transport.eof
        # Over the cap, and a pipelined request in the same read: not started.
        protocol.data_received(
            b"64\r\n" + b"x" * 100 + b"\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert transport.eof and transport.written.startswith(b"HTTP/1.1 413 ")
        assert b'"reason": "payload_too_large"' in transport.written
        for _ in range(5):
            await asyncio.sleep(0)
        assert protocol.budget.used == 0
        assert app.requests == [["http.disconnect"]]

    asyncio.run(scenario())


def test_at_shutdown_a_request_still_arriving_is_answered_503_and_idle_ones_closed(monkeypatch):
    """uvicorn's graceful shutdown calls shutdown() on every connection: an
    idle one is closed without an answer; one whose head or body is still
    arriving gets 503 shutting_down (its app sees a disconnect) instead of
    being cut silently; one being answered finishes first."""
    monkeypatch.setattr(connection, "SHUTDOWN_LINGER_S", 0.05)

    async def scenario() -> None:
        app = RecordingApp()
        idle, idle_transport = _protocol(app, ConnectionLimits())
        half_head, head_transport = _protocol(app, ConnectionLimits())
        half_head.data_received(b"POST / HTTP/1.1\r\nHost: x\r\n")
        mid_body, body_transport = _protocol(app, ConnectionLimits())
        mid_body.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        mid_body.data_received(b"b" * 40)
        for _ in range(3):
            await asyncio.sleep(0)  # the app reads the first 40 bytes
        for protocol in (idle, half_head, mid_body):
            protocol.shutdown()
        assert idle_transport.closed and idle_transport.written == b""
        for transport in (head_transport, body_transport):
            assert transport.written.startswith(b"HTTP/1.1 503 ")
            assert b'"reason": "shutting_down"' in transport.written and transport.eof
        assert not body_transport.closed  # lingering, SHUTDOWN_LINGER_S
        await asyncio.sleep(0.15)
        assert head_transport.closed and body_transport.closed
        assert app.requests == [["http.request", "http.disconnect"]]

    asyncio.run(scenario())


# ------------------------------------------------------------------ connections


@pytest.mark.slow
def test_at_max_connections_a_new_connection_replaces_the_longest_idle_one(serve):
    """MAX_CONNECTIONS 3: idle connections cannot lock a new client out —
    the one idle longest is closed to admit it, and a connection in the
    middle of a request is never the one closed."""
    address = serve(RecordingApp(), max_connections=3, header_timeout_s=30.0)
    first, second = _connect(address), _connect(address)  # idle: opened, nothing sent
    try:
        time.sleep(0.2)  # let the server take them in first
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
            # the third connection fills the limit; the fourth replaces `first`
            assert client.post("/infer", content=b"x").json() == {"size": 1}
            second.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12")
            time.sleep(0.2)  # `second` now has a request in progress: not idle
            with _connect(address) as newcomer:
                newcomer.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert newcomer.recv(65536).startswith(b"HTTP/1.1 200 ")
            assert _read_to_close(first) == b""  # closed without an answer: it asked nothing
            second.sendall(b"34567890")  # its request completes as if nothing happened
            assert second.recv(65536).startswith(b"HTTP/1.1 200 ")
            # `client` was idle longer than `second` (answered before it sent
            # its request): the newcomer took its place; it reconnects.
            assert client.post("/infer", content=b"yy").json() == {"size": 2}
    finally:
        first.close()
        second.close()


@pytest.mark.slow
def test_at_max_connections_with_every_connection_busy_a_new_one_is_refused_503(serve):
    address = serve(RecordingApp(), max_connections=2, header_timeout_s=30.0)
    busy = [_connect(address) for _ in range(2)]
    try:
        for sock in busy:  # a head, part of the body: a request in progress
            sock.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n12")
        time.sleep(0.2)
        with _connect(address) as refused:
            status, body = _status_and_body(_read_to_close(refused))
        assert (status, body["reason"]) == (503, "too_many_connections")
        for sock in busy:  # the open ones are served as before
            sock.sendall(b"34")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in busy:
            sock.close()


@pytest.mark.slow
def test_idle_clients_holding_every_connection_leave_descriptors_to_respawn_an_executor(
    launch_daemon, tmp_path
):
    """`python -m app serve` at `ulimit -n 256`: clients that open more idle
    connections than the process has file descriptors never hold more than
    the cap (each one above it replaces the one idle longest), a client is
    still served, and an executor killed meanwhile is respawned."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the daemon inherits it
    try:
        handle = launch_daemon(
            write_repository(tmp_path / "repo"),
            emulated_devices=2,
            extra_env={"CPU_SLICES": "0", "HEADER_TIMEOUT_S": "120", "KEEP_ALIVE_TIMEOUT_S": "120"},
            log_level="info",
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    chosen = re.search(r"connections: at most (\d+) open", handle.log_path.read_text())
    assert chosen, handle.log_path.read_text()[-2000:]
    cap = int(chosen.group(1))
    # 256 less 64 + 2·8 + 1 reserved less a backlog of 21: 154.
    assert cap == fd_plan(256, devices=2, models=1).ceiling == 154
    host, port = handle.url.removeprefix("http://").split(":")
    idle: list[socket.socket] = []
    with httpx.Client(base_url=handle.url, timeout=10) as client:
        assert client.get("/v2/health/ready").status_code == 200  # connected first
        try:
            for _ in range(300):  # more than the daemon has file descriptors
                idle.append(socket.create_connection((host, int(port)), timeout=10))
            time.sleep(1.0)  # the replaced ones are closed at once
            readable, _, _ = select.select(idle, [], [], 0)
            closed = [s for s in readable if s.recv(65536) == b""]
            # each connection above the cap replaced the one idle longest:
            # the client's (idle since its answer), then the oldest of these
            assert len(closed) == len(readable) == 300 - cap
            assert client.get("/v2/health/ready").json()["devices_alive"] == 2
            os.kill(executor_pids(handle.process.pid)["emulated:0"], signal.SIGKILL)

            def respawned() -> bool:
                return client.get("/v2/health/ready").json().get("devices_alive") == 2

            time.sleep(0.5)
            assert _wait_for(respawned, timeout=30.0), handle.log_path.read_text()[-3000:]
        finally:
            for sock in idle:
                sock.close()
    log = handle.log_path.read_text()
    assert "respawned" in log and "Too many open files" not in log, log[-3000:]


def test_the_connection_cap_leaves_file_descriptors_for_executors_and_the_backlog():
    # ulimit -n 1024, three executors, five models: 64 + 3·8 + 5 reserved,
    # an eighth of the rest for the accept backlog, the rest for clients.
    plan = fd_plan(1024, devices=3, models=5)
    assert (plan.reserve, plan.backlog, plan.ceiling) == (93, 116, 815)
    assert plan.reserve + plan.backlog + plan.ceiling == 1024
    # A generous limit: uvicorn's backlog of 2048.
    plan = fd_plan(65536, devices=4, models=10)
    assert (plan.reserve, plan.backlog, plan.ceiling) == (106, 2048, 63382)
    # A tight one: the backlog has a floor of 16.
    plan = fd_plan(128, devices=1, models=0)
    assert (plan.reserve, plan.backlog, plan.ceiling) == (72, 16, 40)
    with pytest.raises(ValueError, match="ulimit -n"):
        fd_plan(80, devices=1, models=0)  # 72 reserved, 16 backlog: none for clients
    # MAX_CONNECTIONS: auto is the ceiling up to DEFAULT_MAX_CONNECTIONS; an
    # explicit value is kept under the ceiling.
    small, large = fd_plan(1024, 3, 5), fd_plan(65536, 4, 10)
    assert choose_max_connections(None, small)[0] == 815
    assert choose_max_connections(None, large)[0] == DEFAULT_MAX_CONNECTIONS == 4096
    assert choose_max_connections(500, small)[0] == 500
    assert choose_max_connections(2000, small) == (
        815,
        "MAX_CONNECTIONS 2000 capped to the file-descriptor ceiling",
    )


def test_connection_limits_come_from_the_settings_and_the_open_file_limit(caplog):
    settings = Settings(
        header_timeout_s=3.0,
        body_timeout_s=7.0,
        keep_alive_timeout_s=2.0,
        max_header_bytes=8192,
        max_body_bytes=1 << 20,
        max_buffered_bytes=1 << 24,
        max_connections=2000,
    )
    with caplog.at_level("INFO", logger="app.server"):
        limits = connection_limits(settings, devices=3, models=5, nofile=1024)
    assert limits == ConnectionLimits(
        header_timeout_s=3.0,
        body_timeout_s=7.0,
        keep_alive_timeout_s=2.0,
        max_header_bytes=8192,
        max_body_bytes=1 << 20,
        max_buffered_bytes=1 << 24,
        max_connections=815,
        backlog=116,
    )
    assert "at most 815 open (MAX_CONNECTIONS 2000 capped" in caplog.text
    assert "RLIMIT_NOFILE 1024 less 93" in caplog.text


# ------------------------------------------------------------------ uvicorn options


def test_uvicorn_options_carry_the_protocol_keep_alive_backlog_and_h11_header_cap():
    settings = Settings(keep_alive_timeout_s=2.5, max_header_bytes=8192, header_timeout_s=4.0)
    options = uvicorn_connection_options(settings, devices=1, models=2)
    protocol = options.pop("http")
    assert issubclass(protocol, GuardedProtocol)
    assert protocol.limits.header_timeout_s == 4.0
    assert protocol.limits.max_header_bytes == 8192
    assert options == {
        "timeout_keep_alive": 2.5,
        "backlog": protocol.limits.backlog,
        "h11_max_incomplete_event_size": 8192,
    }
    assert not {"host", "port"} & set(options)  # the caller's


def test_python_m_app_serve_passes_the_connection_options_to_uvicorn(monkeypatch):
    import app.__main__ as cli
    import app.main

    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: runs.append(kw))
    monkeypatch.setattr(app.main, "create_app", lambda settings: None)
    for name in ("HEADER_TIMEOUT_S", "BODY_TIMEOUT_S", "MAX_CONNECTIONS", "REALTIME_PRIORITY"):
        monkeypatch.delenv(name, raising=False)
    argv = ["serve", "--header-timeout-s", "3", "--body-timeout-s", "9", "--max-connections", "7"]
    assert cli.main([*argv, "--keep-alive-timeout-s", "4"]) == 0
    (options,) = runs
    limits = options["http"].limits
    assert (limits.header_timeout_s, limits.body_timeout_s, limits.max_connections) == (3, 9, 7)
    assert options["timeout_keep_alive"] == 4
    assert options["backlog"] == limits.backlog
    assert options["server_header"] is False  # answers do not name the server software


def test_plain_uvicorn_takes_the_protocol_by_its_class_path(monkeypatch):
    monkeypatch.setenv("HEADER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("MAX_HEADER_BYTES", "9000")
    monkeypatch.setattr(GuardedProtocol, "limits", None)  # read at the first connection
    config = uvicorn.Config(RecordingApp(), http="app.api.connection:GuardedProtocol")
    config.load()
    assert config.http_protocol_class is GuardedProtocol
    limits = GuardedProtocol.limits_in_force()
    assert (limits.header_timeout_s, limits.max_header_bytes) == (2.5, 9000)


def test_plain_uvicorn_is_told_when_its_backlog_does_not_fit_the_open_file_limit(
    monkeypatch, caplog
):
    import app.server.connection_limits as numbers

    monkeypatch.setattr(numbers, "open_file_limit", lambda: 1024)
    monkeypatch.setenv("EMULATED_DEVICES", "2")
    monkeypatch.setenv("CPU_SLICES", "1")
    monkeypatch.setattr(GuardedProtocol, "limits", None)
    with caplog.at_level("INFO", logger="app"):
        limits = GuardedProtocol.limits_in_force(backlog=2048)  # uvicorn's default
    assert limits.backlog < 2048 and limits.max_connections < 1024 - 64 - 3 * 8
    assert f"pass --backlog {limits.backlog}" in caplog.text
