"""The data-plane HTTP clients: each sends one workload model's request and
returns the reply, calling back the moment the request is out.

By default (`--client raw`) requests go through a small asyncio HTTP/1.1
client: each model's whole request (request line, headers, JSON body) is
built once as bytes and written with one `transport.write` on a pooled
keep-alive connection (enough of them, opened before the start). It costs
~0.1 ms of CPU per request, so one process keeps p99 send lag under 2 ms up
to ~10 000 requests/s on an idle core. `--client httpx` sends through
httpx.AsyncClient instead (send time from httpcore's `trace` extension); it
costs ~1.5-2.5 ms of CPU per request here, too much to share a 2-core box
with the server above a few hundred requests/s.

"Sent" is when the request was written to its socket, so time spent in the
client and waiting for a free pooled connection counts as send lag, not as
server latency.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from bench.loadgen.errors import LoadGenError, RunFailed

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency of the daemon
    _loads = json.loads

CLIENTS = ("raw", "httpx")
NATIVE_PATH = "/infer"


@dataclass
class ClientConfig:
    """How one worker sends (picklable: it crosses to worker processes)."""

    client: str  # one of CLIENTS
    base_url: str
    bodies: list[bytes]  # per workload model: the pre-serialised POST body
    connections: int  # at most, per worker
    warm_connections: int  # opened before the start
    timeout_s: float  # the longest request timeout (httpx's own timeouts back it up)
    # Per body: the path it is POSTed to (None: the daemon's native /infer);
    # a peer speaking another API (KServe v2, BentoML) has a path per model.
    paths: list[str] | None = None


class Reply:
    """One answer: HTTP status, body, and when its last byte arrived."""

    __slots__ = ("body", "end", "status", "timing")

    def __init__(
        self, status: int, body: bytes, end: float, timing: dict[str, Any] | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.end = end  # when the last byte arrived, on the driver's clock
        # A 200's `timing` object when the sender has it already (in-process);
        # else it is read from `body`.
        self.timing = timing


class ConnectionLost(Exception):
    """The connection closed before the whole reply arrived."""

    def __init__(self, message: str, fresh: bool) -> None:
        super().__init__(message)
        self.fresh = fresh  # nothing of the reply had arrived


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. Responses
    are framed by Content-Length or chunked encoding (or the connection's
    end, HTTP/1.0 style)."""

    def __init__(self, pool: _RawPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Reply] | None = None
        self.buf = bytearray()
        self.closed = False
        self.used = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.header_end = -1
        self.length = -1  # Content-Length; -1 unknown
        self.chunked = False
        self.keep_alive = True
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, data: bytes) -> asyncio.Future[Reply]:
        assert self.transport is not None
        self.waiter = self.pool.loop.create_future()
        self._reset()
        self.buf.clear()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None:
            return  # nothing asked: ignore (a reply to a request we gave up on)
        try:
            self._parse()
        except ValueError as exc:
            self._fail(ConnectionLost(f"bad HTTP response: {exc}", fresh=False))
            self.abort()

    def _parse(self) -> None:
        buf = self.buf
        if self.header_end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise ValueError("response headers too long")
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise ValueError(f"bad status line {lines[0][:80]!r}")
            self.status = int(parts[1])
            self.keep_alive = parts[0] != "HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    self.length = int(value)
                elif name == "transfer-encoding":
                    self.chunked = "chunked" in value.lower()
                elif name == "connection":
                    v = value.strip().lower()
                    if v == "close":
                        self.keep_alive = False
                    elif v == "keep-alive":
                        self.keep_alive = True
            self.header_end = end + 4
            del buf[: self.header_end]
        if self.chunked:
            while True:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(bytes(buf[:line_end]).split(b";", 1)[0], 16)
                if size == 0:
                    trailer_end = buf.find(b"\r\n\r\n", line_end)
                    if trailer_end < 0 and buf[line_end : line_end + 4] != b"\r\n\r\n":
                        return
                    self._finish(b"".join(self.chunks))
                    return
                if len(buf) < line_end + 2 + size + 2:
                    return
                self.chunks.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
                del buf[: line_end + 2 + size + 2]
        elif self.length >= 0:
            if len(buf) >= self.length:
                self._finish(bytes(buf[: self.length]))
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._finish(b"")
        # else: read until the server closes (connection_lost finishes it)

    def _finish(self, body: bytes) -> None:
        waiter, self.waiter = self.waiter, None
        self.buf.clear()
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(self.status, body, self.pool.loop.time()))
        if self.keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.abort()

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed, self.closed = self.closed, True
        if self.waiter is not None:
            if self.header_end >= 0 and self.length < 0 and not self.chunked:
                self._finish(bytes(self.buf))  # body delimited by the close
            else:
                fresh = self.header_end < 0 and not self.buf
                self._fail(ConnectionLost(f"connection closed by the server ({exc})", fresh))
        if not was_closed:
            self.pool.discard(self)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.discard(self)
        if self.transport is not None:
            self.transport.abort()


class _RawPool:
    """Keep-alive connections to one server, most recently used first (so
    idle ones the server may time out are the last picked), at most
    `limit`; beyond that, requests wait for a free connection (which shows as
    send lag: the send time is when the request is written)."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port, self.limit = host, port, limit
        self.idle: list[_Connection] = []
        self.count = 0
        self.waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()

    async def _open(self) -> _Connection:
        self.count += 1
        try:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self), self.host, self.port
            )
        except BaseException:
            self.count -= 1
            self._wake(None)
            raise
        return conn

    async def acquire(self) -> _Connection:
        while True:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn
            if self.count < self.limit:
                return await self._open()
            waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
            self.waiters.append(waiter)
            conn = await waiter
            if conn is not None and not conn.closed:
                return conn

    def _wake(self, conn: _Connection | None) -> bool:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def release(self, conn: _Connection) -> None:
        if not self._wake(conn):
            self.idle.append(conn)

    def discard(self, conn: _Connection) -> None:
        self.count -= 1
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self._wake(None)  # a waiter may now open a connection

    async def warm(self, count: int) -> None:
        count = min(count, self.limit) - self.count
        if count <= 0:
            return
        opened = await asyncio.gather(*(self._open() for _ in range(count)), return_exceptions=True)
        ok = [c for c in opened if isinstance(c, _Connection)]
        if not ok:
            raise RunFailed(f"cannot connect to {self.host}:{self.port}: {opened[0]!r}")
        for conn in ok:
            self.release(conn)

    def close(self) -> None:
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()


class RawSender:
    """The default data-plane client: requests are pre-built bytes (request
    line, headers and body), written with one `transport.write` on a pooled
    keep-alive connection; the send time is that write. A fraction of the
    CPU httpx needs per request, which matters when the generator shares a
    small machine with the server."""

    def __init__(
        self,
        base_url: str,
        bodies: list[bytes],
        connections: int,
        paths: Sequence[str] | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        if url.scheme != "http":
            raise LoadGenError("the raw client speaks plain http only (use --client httpx)")
        prefix = url.raw_path.decode().rstrip("/")
        host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        paths = list(paths) if paths is not None else [NATIVE_PATH] * len(bodies)
        if len(paths) != len(bodies):
            raise LoadGenError(f"{len(paths)} paths for {len(bodies)} request bodies")
        self.requests = [
            (
                f"POST {prefix}{path} HTTP/1.1\r\nHost: {host_header}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "User-Agent: bench.loadgen\r\n\r\n"
            ).encode()
            + body
            for body, path in zip(bodies, paths, strict=True)
        ]
        self.pool = _RawPool(host, port, connections)

    async def warm(self, count: int) -> None:
        await self.pool.warm(count)

    async def send(self, m: int, on_sent: Callable[[], None]) -> Reply:
        for attempt in range(2):
            conn = await self.pool.acquire()
            reused = conn.used
            conn.used = True
            waiter = conn.send(self.requests[m])
            on_sent()
            try:
                return await waiter
            except ConnectionLost as exc:
                # A kept-alive connection the server had just closed: retry
                # once on another one (nothing of the reply had arrived).
                if not (exc.fresh and reused and attempt == 0):
                    raise
            except BaseException:
                conn.abort()  # a reply may still come: the connection is unusable
                raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.pool.close()


class HttpxSender:
    """httpx.AsyncClient as the data-plane client (`--client httpx`).

    httpcore's pool scans all its connections for every request, so one big
    pool costs O(connections) per request; the connections are therefore
    spread over clients of at most 8, and each request goes to the client
    with the fewest in flight. The send time is when httpcore finished
    writing the request (its `trace` extension)."""

    PER_CLIENT = 8

    def __init__(
        self,
        base_url: str,
        bodies: list[bytes],
        connections: int,
        timeout_s: float,
        paths: Sequence[str] | None = None,
    ) -> None:
        shards = max(1, math.ceil(connections / self.PER_CLIENT))
        per = math.ceil(connections / shards)
        limits = httpx.Limits(
            max_connections=per, max_keepalive_connections=per, keepalive_expiry=60.0
        )
        # Deadlines are the generator's (from the intended time); httpx's own
        # timeouts only back them up.
        timeout = httpx.Timeout(timeout_s)
        self.clients = [
            httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, trust_env=False)
            for _ in range(shards)
        ]
        self.inflight = [0] * shards
        self.bodies = bodies
        self.paths = list(paths) if paths is not None else [NATIVE_PATH] * len(bodies)
        if len(self.paths) != len(bodies):
            raise LoadGenError(f"{len(self.paths)} paths for {len(bodies)} request bodies")
        self.headers = {"content-type": "application/json"}

    async def warm(self, count: int) -> None:
        if count <= 0:
            return
        per = max(1, math.ceil(count / len(self.clients)))
        replies = await asyncio.gather(
            *(c.get("/v2/health/live") for c in self.clients for _ in range(per)),
            return_exceptions=True,
        )
        failed = [r for r in replies if isinstance(r, BaseException)]
        if len(failed) == len(replies):
            raise RunFailed(f"cannot connect to {self.clients[0].base_url}: {failed[0]!r}")

    async def send(self, m: int, on_sent: Callable[[], None]) -> Reply:
        k = self.inflight.index(min(self.inflight))
        self.inflight[k] += 1

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event == "http11.send_request_body.complete":
                on_sent()

        try:
            response = await self.clients[k].post(
                self.paths[m],
                content=self.bodies[m],
                headers=self.headers,
                extensions={"trace": trace},
            )
            return Reply(response.status_code, response.content, asyncio.get_running_loop().time())
        finally:
            self.inflight[k] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))


class Sender(Protocol):
    """What `bench.loadgen.driver.drive` sends through: `send(m, on_sent)` sends one request for
    workload model `m`, calls `on_sent()` once it is out, and returns the reply."""

    async def send(self, m: int, on_sent: Callable[[], None]) -> Reply: ...


def make_sender(config: ClientConfig) -> RawSender | HttpxSender:
    if config.client == "raw":
        return RawSender(config.base_url, config.bodies, config.connections, config.paths)
    if config.client == "httpx":
        return HttpxSender(
            config.base_url, config.bodies, config.connections, config.timeout_s, config.paths
        )
    raise LoadGenError(f"client must be one of {CLIENTS}, got {config.client!r}")


_TIMING_KEY = b'"timing":'


def reply_timing(content: bytes) -> dict[str, Any] | None:
    """The `timing` object of a 200 reply, without parsing the outputs (it is
    the last key the daemon writes); falls back to a full parse."""
    at = content.rfind(_TIMING_KEY)
    if at >= 0:
        end = content.find(b"}", at)
        if end > at:
            try:
                value = _loads(content[at + len(_TIMING_KEY) : end + 1])
                if isinstance(value, dict):
                    return value
            except ValueError:
                pass
    try:
        doc = _loads(content)
    except ValueError:
        return None
    timing = doc.get("timing") if isinstance(doc, dict) else None
    return timing if isinstance(timing, dict) else None


def reply_reason(status: int, content: bytes) -> str:
    """The `reason` of an error reply; else "overloaded" for 429, "http_<status>"."""
    try:
        doc = _loads(content)
        if isinstance(doc, dict) and isinstance(doc.get("reason"), str):
            return doc["reason"]
    except ValueError:
        pass
    return "overloaded" if status == 429 else f"http_{status}"
