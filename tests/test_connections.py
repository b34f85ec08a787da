"""Connection hygiene (app/api/connection.py, app/server/connection_limits.py):
header and body timeouts, the header-size cap, the budget of request bodies
held over all connections, the connection cap below the open-file limit, and
how `python -m app serve` hands them to uvicorn.

The servers here run `GuardedProtocol` under uvicorn in a thread with small
timeouts; a raw socket plays the client. A refusal is sent to clients that
have stopped sending (one still sending may see a reset instead)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from uvicorn.server import ServerState

from app.api import connection
from app.api.connection_share import BufferBudget
from app.server.connection_limits import (
    ConnectionLimits,
)
from tests.guarded_server import (
    GRACE,
    QUICK,
    RecordingApp,
    connect,
    fake_protocol,
    read_to_close,
    status_and_body,
    wait_for,
)

# ------------------------------------------------------------------ timeouts


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(guarded_serve):
    address = guarded_serve(RecordingApp())
    with connect(address) as sock:
        opened = time.monotonic()
        assert read_to_close(sock) == b""  # closed, nothing to answer
        assert time.monotonic() - opened >= QUICK * 0.8


@pytest.mark.slow
def test_a_header_dribbler_gets_408_and_is_closed(guarded_serve):
    app = RecordingApp()
    address = guarded_serve(app)
    with connect(address) as sock:
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
        answer += read_to_close(sock)
    assert status_and_body(answer) == (
        408,
        {"error": f"request head not received within {QUICK:g} s", "reason": "request_timeout"},
    )
    assert app.requests == []  # the app never saw it


@pytest.mark.slow
def test_a_stalled_body_gets_408_the_connection_closes_and_the_app_sees_a_disconnect(guarded_serve):
    app = RecordingApp()
    address = guarded_serve(app)
    with connect(address) as sock:
        sock.sendall(
            b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"a" * 400
        )
        answer = read_to_close(sock)
    assert status_and_body(answer) == (
        408,
        {"error": f"request body not received within {QUICK:g} s", "reason": "request_timeout"},
    )
    assert wait_for(lambda: app.requests and app.requests[0][-1:] == ["http.disconnect"])
    assert app.requests[0][0] == "http.request"
    # The server goes on serving.
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        assert client.post("/infer", content=b"b" * 1000).json() == {"size": 1000}


@pytest.mark.slow
def test_a_body_sent_in_time_is_served_and_the_connection_kept(guarded_serve):
    address = guarded_serve(RecordingApp())
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        for size in (0, 10, 100_000):
            assert client.post("/infer", content=b"x" * size).json() == {"size": size}
        # Idle for more than the header and body timeouts, less than keep-alive:
        time.sleep(QUICK * 2)
        assert client.post("/infer", content=b"y").json() == {"size": 1}


# ------------------------------------------------------------------ header size


@pytest.mark.slow
def test_a_head_over_max_header_bytes_gets_431_and_is_closed(guarded_serve):
    app = RecordingApp()
    address = guarded_serve(app, max_header_bytes=4096)
    with connect(address) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 6000 + b"\r\n\r\n")
        answer = read_to_close(sock)
    assert status_and_body(answer) == (
        431,
        {"error": "request head exceeds 4096 bytes", "reason": "headers_too_large"},
    )
    assert app.requests == []
    with connect(address) as sock:  # a head just under the cap is served
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4000 + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_a_megabyte_of_headers_feeds_the_parser_no_more_than_max_header_bytes(monkeypatch):
    """...and the 431 is sent with a FIN, the rest of the flood read and
    discarded until the socket is closed LINGER_S later (no reset that could
    destroy the answer before the client reads it)."""
    monkeypatch.setattr(connection, "LINGER_S", 0.05)

    async def scenario() -> None:
        protocol, transport = fake_protocol(RecordingApp(), ConnectionLimits(max_header_bytes=4096))
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
def test_bodies_over_max_buffered_bytes_get_503_until_the_held_ones_are_answered(guarded_serve):
    app = RecordingApp()
    address = guarded_serve(app, max_buffered_bytes=1000, body_timeout_s=30.0)
    with connect(address) as held:
        # 800 of 1000 bytes come, the rest later: 800 held.
        held.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        held.sendall(b"a" * 800)
        assert wait_for(lambda: len(app.requests) == 1)
        time.sleep(0.2)  # all 800 read
        with connect(address) as refused:
            refused.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 201\r\n\r\n")
            answer = read_to_close(refused)
        assert status_and_body(answer) == (
            503,
            {
                "error": "the server holds too many request bodies; retry later",
                "reason": "server_busy",
            },
        )
        assert len(app.requests) == 1  # the refused body was never read
        with connect(address) as small:  # what fits, and requests without a body, go in
            small.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n")
            small.sendall(b"b" * 200 + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b'{"size": 200}' in small.recv(65536)
        held.sendall(b"a" * 200)
        assert held.recv(65536).endswith(b'{"size": 1000}')
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
        assert client.post("/infer", content=b"c" * 900).json() == {"size": 900}


@pytest.mark.slow
def test_a_client_that_declares_a_body_and_sends_nothing_holds_nothing(guarded_serve):
    address = guarded_serve(RecordingApp(), max_buffered_bytes=1000, body_timeout_s=30.0)
    with connect(address) as idle:
        idle.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
            assert client.post("/infer", content=b"c" * 900).json() == {"size": 900}


def test_a_chunked_body_growing_past_the_budget_is_answered_503_and_its_app_disconnected():
    async def scenario() -> None:
        app = RecordingApp()
        state = ServerState()
        limits = ConnectionLimits(max_buffered_bytes=1000)
        first, _ = fake_protocol(app, limits, state)
        first.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        first.data_received(b"f" * 800)
        second, transport = fake_protocol(app, limits, state)
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
        protocol, transport = fake_protocol(app, ConnectionLimits(max_body_bytes=150))
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
        idle, idle_transport = fake_protocol(app, ConnectionLimits())
        half_head, head_transport = fake_protocol(app, ConnectionLimits())
        half_head.data_received(b"POST / HTTP/1.1\r\nHost: x\r\n")
        mid_body, body_transport = fake_protocol(app, ConnectionLimits())
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
