"""Shared parts of the connection tests (tests/test_connections.py,
tests/test_connection_cap.py): an app that records what it receives, raw
socket helpers, and a fake transport to drive `GuardedProtocol` directly."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from app.api.connection import guarded_protocol
from app.server.connection_limits import ConnectionLimits
from app.server.settings import Settings

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


def quick_settings(**changes: Any) -> Settings:
    quick = {"header_timeout_s": QUICK, "body_timeout_s": QUICK, "keep_alive_timeout_s": 5.0}
    return Settings(**{**quick, **changes})


def connect(address: tuple[str, int], timeout: float = QUICK + GRACE) -> socket.socket:
    return socket.create_connection(address, timeout=timeout)


def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout (the
    server kept the connection open) fails the test."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def status_and_body(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    give_up = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.02)
    return True


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


def fake_protocol(
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
