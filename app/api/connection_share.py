"""What the guarded connections of one server share, and the answers they
write themselves (app.api.connection): a refused connection or a request cut
short is answered outside any app, in the JSON error body of app.api.errors."""

from __future__ import annotations

import http
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from app.server.connection_limits import ConnectionLimits

log = logging.getLogger("app.api.connection")

NOTICE_INTERVAL_S = 10.0


def error_body(message: str, reason: str) -> bytes:
    """The JSON error body every answer of this server has."""
    return json.dumps({"error": message, "reason": reason}).encode()


def error_response(
    status: int, message: str, reason: str, default_headers: list[tuple[bytes, bytes]]
) -> bytes:
    """A whole HTTP/1.1 error answer that closes the connection, for when
    no request (or no ASGI cycle) is there to answer through."""
    body = error_body(message, reason)
    phrase = http.HTTPStatus(status).phrase.encode()
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, phrase)]
    lines += [name + b": " + value + b"\r\n" for name, value in default_headers]
    lines += [
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
        b"\r\n",
        body,
    ]
    return b"".join(lines)


def error_app(status: int, message: str, reason: str) -> Callable[..., Any]:
    """An ASGI app answering every request with this error, closing the
    connection, without reading the body."""
    body = error_body(message, reason)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class BufferBudget:
    """Bytes of request bodies received and not yet answered, over all
    connections of one server."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        """`nbytes` more would fit, or nothing is held."""
        return not self.used or self.used + nbytes <= self.limit

    def grow(self, nbytes: int, held: int) -> bool:
        """Take `nbytes` more for a body that already holds `held`; False
        (and taken all the same) when that passes the limit while other
        bodies are held too."""
        self.used += nbytes
        return self.used <= self.limit or self.used == held + nbytes

    def release(self, nbytes: int) -> None:
        self.used -= nbytes


class Notices:
    """Warnings about refused clients, at most one line per kind every
    `NOTICE_INTERVAL_S`, with how many there were."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def note(self, kind: str, message: str) -> None:
        self._counts[kind] = self._counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self._logged_at.get(kind, -NOTICE_INTERVAL_S) >= NOTICE_INTERVAL_S:
            log.warning("%s (%d since the last such warning)", message, self._counts[kind])
            self._counts[kind] = 0
            self._logged_at[kind] = now


class ServerShare:
    """What the connections of one uvicorn server share."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.budget = BufferBudget(limits.max_buffered_bytes)
        self.notices = Notices()
