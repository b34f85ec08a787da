"""Connection hygiene: how long a client may take, how much it may make the
server hold, and how many clients may be connected.

uvicorn's httptools protocol reads whatever a client sends: a connection
that never sends a byte stays open, a gigabyte of headers is buffered by the
parser, a body that stops one byte short holds everything before it for
good, and clients can open connections until the process has no file
descriptor left (not even to respawn a crashed executor). `GuardedProtocol`
is that protocol (with `ReceiveStampingProtocol`'s arrival stamp) plus:

- **Header timeout** (`HEADER_TIMEOUT_S`): a connection must deliver a
  complete request head within that long of opening, of its previous answer
  or of the head's first byte. Else it is closed, with a 408 if part of a
  head came. Between requests uvicorn's keep-alive timeout
  (`KEEP_ALIVE_TIMEOUT_S`) closes an idle connection sooner.
- **Body timeout** (`BODY_TIMEOUT_S`): a request's body must have arrived
  within that long of the request's turn (its head, or the previous answer
  on a pipelined connection). Else it is answered 408 `request_timeout`
  (when its answer has not started) and the connection closed; the app's
  `receive()` returns `http.disconnect` (the body reader raises
  `ClientDisconnect` → its error answer goes nowhere), so nothing lingers.
- **Header size** (`MAX_HEADER_BYTES`): the parser is fed at most that many
  bytes of one request head; a longer head is answered 431
  `headers_too_large` and the connection closed. (A head that starts in the
  same read as the previous request's end may reach twice that.)
- **Body size per connection** (`MAX_BODY_BYTES`): a body, chunked ones
  included, that passes it while arriving is answered 413
  `payload_too_large` and the connection closed (the app's per-request limits
  answer first where they are smaller). uvicorn stops reading a connection
  whose app does not read (64 KiB buffered) and after a complete pipelined
  head, so a connection holds at most one body, one head and one read
  (256 KiB) beyond them.
- **Bodies over all connections** (`MAX_BUFFERED_BYTES`): the bytes of
  request bodies received and not yet answered are counted as they arrive,
  until the answer is sent or the connection closes. A request whose
  `Content-Length` does not fit in what is left is answered 503
  `server_busy` at its head, before its body is read, and the connection
  closed; a body that passes the limit while arriving (several admitted at
  once, or chunked) is answered so then. A body alone always fits (up to
  `MAX_BODY_BYTES`). Bytes are counted, not declarations: a client that
  declares a large body and sends nothing holds nothing (and is cut off by
  the body timeout). Refusing rather than pausing the read: a paused upload
  still holds its bytes and its client, and a client told 503 can retry
  elsewhere or later.
- **Connections** (`MAX_CONNECTIONS`, capped below the open-file limit by
  app.server.connection_limits): a connection opened at the limit takes the
  place of the open connection that has waited longest for a request head
  (nothing of it being answered; idle, or sending a head slowly), which is
  closed — as nginx reuses idle keep-alive connections — so that idle
  connections cannot lock new clients out. Only when every open connection
  has a request in progress is the new one answered 503
  `too_many_connections` and closed; the connections already open, and their
  requests, are served as before. (uvicorn's own `limit_concurrency` is not
  used: it answers 503 to every request, on old connections too, while too
  many are open — so idle connections would lock out working clients.)
- **Shutdown**: at the signal, a request whose head or body is still
  arriving was not accepted: it is answered 503 `shutting_down` (as the app
  answers one that completes later), an idle connection is closed, and
  requests being answered finish (the app's drain bounds them).

A connection closed with an answer (408, 413, 431, 503) is closed the way
HTTP servers linger (RFC 9112 §9.6): the answer is sent with a FIN, what the
client still sends is read and discarded for up to `LINGER_S` (0.25 s while
shutting down), then the socket is closed. Closed at once, a client still
sending would get a reset, which can destroy the answer before it is read.

These are logged as warnings, at most one line per kind every 10 s, with
counts.

**Where it applies.** `python -m app serve` runs this protocol with the
settings (`uvicorn_connection_options`, which also passes the keep-alive
timeout, the accept backlog and h11's header cap to uvicorn). Under plain
`uvicorn app.main:app` the app's lifespan finds the running uvicorn server
and, where it runs uvicorn's httptools protocol (the default with
httptools installed), has it build every connection with this protocol and
the settings' limits instead (`guard_running_uvicorn`; uvicorn builds a
connection's protocol from its config when the connection opens, and none
opens before the lifespan has started). Only the accept backlog, already
listened with, cannot change: one larger than the open-file limit leaves
room for is warned about, with the `--backlog` to pass. `--http
app.api.connection:GuardedProtocol` does the same from the start (limits
read from the environment at the first connection). Under another protocol
(`--http h11`, no httptools) or another ASGI server, start-up warns that
these protections do not apply and how to get them; then only uvicorn's own
limits hold (`--timeout-keep-alive`, `--limit-concurrency`, `--backlog`,
`--h11-max-incomplete-event-size`) and the app's per-request body limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from typing import Any, ClassVar

from app.api.connection_share import ServerShare, error_app, error_response
from app.api.received import ReceiveStampingProtocol
from app.server.connection_limits import ConnectionLimits, connection_limits
from app.server.settings import Settings

log = logging.getLogger(__name__)

LINGER_S = 2.0  # how long a connection answered for the last time discards input
SHUTDOWN_LINGER_S = 0.25  # the same while shutting down: uvicorn waits for every connection
SHUTTING_DOWN = "the server is shutting down: the request was not accepted"


_SERVER_BUSY = error_app(
    503, "the server holds too many request bodies; retry later", "server_busy"
)

# Keyed by uvicorn's ServerState: one share per server, also when several
# servers in one process (tests) use the same protocol class.
_shares: weakref.WeakKeyDictionary[Any, ServerShare] = weakref.WeakKeyDictionary()


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The request's Content-Length (0 if none; httptools has checked it)."""
    for name, value in headers:
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return 0


if ReceiveStampingProtocol is not None:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    class GuardedProtocol(ReceiveStampingProtocol):
        """uvicorn's httptools protocol with the limits of the module
        docstring. `limits` None: from the environment's settings at the
        first connection (`uvicorn app.main:app --http
        app.api.connection:GuardedProtocol`); `guarded_protocol(limits)`
        makes a class with given ones."""

        limits: ClassVar[ConnectionLimits | None] = None

        @classmethod
        def limits_in_force(cls, backlog: int | None = None) -> ConnectionLimits:
            """The limits; from the environment when not given, where
            `backlog` is uvicorn's (its `--backlog`), checked against them."""
            if cls.limits is None:
                cls.limits = connection_limits(Settings.from_env())
                if backlog is not None and backlog > cls.limits.backlog:
                    log.warning(
                        "uvicorn's accept backlog %d is more than the open-file limit leaves "
                        "room for beside %d connections: pass --backlog %d",
                        backlog,
                        cls.limits.max_connections,
                        cls.limits.backlog,
                    )
            return cls.limits

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.guard = self.limits_in_force(self.config.backlog)
            self.timeout_keep_alive = self.guard.keep_alive_timeout_s  # type: ignore[assignment]
            share = _shares.get(self.server_state)
            if share is None:
                share = _shares[self.server_state] = ServerShare(self.guard)
            self.budget = share.budget
            self.notices = share.notices
            self.refused = False  # over the connection limit: answered and closed
            self.lingering = False  # answered for the last time: input discarded
            self.active_at = self.loop.time()  # last byte received or answer sent
            self.head_bytes = 0  # of the head being read, fed to the parser
            self._in_head = True
            self._head_begun = False
            self._header_timer: asyncio.TimerHandle | None = None
            self._body_timer: asyncio.TimerHandle | None = None
            self._held: dict[RequestResponseCycle, int] = {}  # bytes counted in the budget
            self._rejected: set[RequestResponseCycle] = set()  # answered without their body

        # ------------------------------------------------------ the connection

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            full = len(self.connections) >= self.guard.max_connections
            if full:
                victim = self._longest_waiting()
                if victim is not None and victim.transport is not None:
                    self.notices.note(
                        "evictions",
                        f"connection limit {self.guard.max_connections} reached: connections "
                        "waiting longest for a request are closed to admit new ones",
                    )
                    self.connections.discard(victim)
                    victim.transport.close()
                    full = False
            super().connection_made(transport)
            if full:
                self.refused = True
                self.connections.discard(self)  # closing: not one of those served
                self.notices.note(
                    "connections",
                    f"connection limit {self.guard.max_connections} reached: "
                    "new connections are answered 503 and closed",
                )
                self._close_with(
                    503,
                    f"the server has {self.guard.max_connections} connections open",
                    "too_many_connections",
                )
                return
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            for held in self._held.values():
                self.budget.release(held)
            self._held.clear()
            self._rejected.clear()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.refused or self.lingering:
                return
            self.active_at = self.loop.time()
            while data:
                if not self._in_head:  # a body: the parser hands it on
                    super().data_received(data)
                    return
                room = self.guard.max_header_bytes - self.head_bytes
                if room <= 0:
                    self._head_too_large()
                    return
                part, data = data[:room], data[room:]
                self.head_bytes += len(part)
                super().data_received(part)
                if self._ending():
                    return

        # ----------------------------------------------------- parser callbacks

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_begun = True
            if self._waiting_for_head():
                self._arm_header_timer()  # the head's own time, from its first byte

        def on_headers_complete(self) -> None:
            if self._ending():
                return  # refused earlier in this read: start nothing more
            self._in_head = False
            self._head_begun = False
            self._cancel_header_timer()
            declared = _declared_length(self.headers)
            # Above MAX_BODY_BYTES the app answers 413 from Content-Length
            # without reading: the body is discarded as it comes.
            admitted = declared > self.guard.max_body_bytes or self.budget.fits(declared)
            pipelined = len(self.pipeline)
            previous = self.cycle
            if admitted:
                super().on_headers_complete()
            else:
                self.notices.note(
                    "budget",
                    f"request bodies held reached MAX_BUFFERED_BYTES "
                    f"({self.guard.max_buffered_bytes}): new bodies are answered 503",
                )
                app = self.app
                self.app = _SERVER_BUSY
                try:
                    super().on_headers_complete()
                finally:
                    self.app = app
            cycle = self.cycle
            if cycle is previous:  # an upgrade: no request cycle
                return
            if not admitted:
                self._rejected.add(cycle)
            if len(self.pipeline) == pipelined:  # started now, not queued
                self._arm_body_timer(cycle)

        def on_body(self, body: bytes) -> None:
            cycle = self.cycle
            if cycle in self._rejected or self._ending():
                return  # answered without it, or refused: not buffered
            if not (cycle.response_complete or cycle.disconnected):
                held = self._held.get(cycle, 0)
                self._held[cycle] = held + len(body)
                if held + len(body) > self.guard.max_body_bytes:
                    self.budget.grow(len(body), held)
                    self._abort(
                        cycle,
                        413,
                        f"request body exceeds {self.guard.max_body_bytes} bytes",
                        "payload_too_large",
                    )
                    return
                if not self.budget.grow(len(body), held):
                    self._abort(
                        cycle,
                        503,
                        "the server holds too many request bodies; retry later",
                        "server_busy",
                    )
                    return
            super().on_body(body)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head = True
            self.head_bytes = 0
            self._cancel_body_timer()  # bodies come in order: the one timed is complete

        def on_response_complete(self) -> None:
            self.active_at = self.loop.time()
            queued = list(self.pipeline)
            super().on_response_complete()
            for cycle in [c for c in self._held if c.response_complete]:
                self.budget.release(self._held.pop(cycle))
            self._rejected = {c for c in self._rejected if not c.response_complete}
            self._cancel_body_timer()
            if self._ending():
                return
            if len(self.pipeline) < len(queued):  # the next pipelined request started
                self._arm_body_timer(queued[-1][0])
            elif self._waiting_for_head():
                self._arm_header_timer()

        def _longest_waiting(self) -> GuardedProtocol | None:
            """The open connection that has waited longest for a request head
            with nothing of it being answered (None if every one is busy)."""
            waiting = [
                c
                for c in self.connections
                if isinstance(c, GuardedProtocol)
                and c.transport is not None
                and not c.transport.is_closing()
                and (c.lingering or (not c.refused and c._waiting_for_head()))
            ]
            # lingering ones first: they have had their answer
            return min(waiting, key=lambda c: (not c.lingering, c.active_at), default=None)

        def shutdown(self) -> None:
            """uvicorn's graceful shutdown, at the signal: a request not yet
            whole — its head or its body still arriving — is not accepted, so
            it is answered 503 `shutting_down` (the app refuses one that
            becomes whole later the same way) instead of being cut without an
            answer or holding the shutdown until it is cut."""
            if self.lingering:
                self.transport.close()
                return
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and not self.pipeline:
                if self._head_begun:
                    self._close_with(503, SHUTTING_DOWN, "shutting_down", SHUTDOWN_LINGER_S)
                else:
                    self.transport.close()
                return
            if cycle is not None and cycle.more_body and not cycle.response_started:
                self._abort(cycle, 503, SHUTTING_DOWN, "shutting_down", SHUTDOWN_LINGER_S)
                return
            super().shutdown()

        # ------------------------------------------------------------ timers

        def _waiting_for_head(self) -> bool:
            """No request of this connection is being answered or queued."""
            return not self.pipeline and (self.cycle is None or self.cycle.response_complete)

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            if self.guard.header_timeout_s > 0:
                self._header_timer = self.loop.call_later(
                    self.guard.header_timeout_s, self._header_timeout
                )

        def _arm_body_timer(self, cycle: RequestResponseCycle) -> None:
            self._cancel_body_timer()
            if cycle.more_body and self.guard.body_timeout_s > 0 and cycle not in self._rejected:
                self._body_timer = self.loop.call_later(
                    self.guard.body_timeout_s, self._body_timeout, cycle
                )

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _cancel_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _cancel_timers(self) -> None:
            self._cancel_header_timer()
            self._cancel_body_timer()

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self._ending() or not self._waiting_for_head():
                return
            if not self._head_begun:  # idle: nothing to answer
                self.transport.close()
                return
            self.notices.note("header_timeout", "request heads not complete in time: 408, closed")
            self._close_with(
                408,
                f"request head not received within {self.guard.header_timeout_s:g} s",
                "request_timeout",
            )

        def _body_timeout(self, cycle: RequestResponseCycle) -> None:
            self._body_timer = None
            if not cycle.more_body or cycle.response_complete or cycle.disconnected:
                return
            self.notices.note("body_timeout", "request bodies not complete in time: 408, closed")
            self._abort(
                cycle,
                408,
                f"request body not received within {self.guard.body_timeout_s:g} s",
                "request_timeout",
            )

        # ------------------------------------------------------------ refusals

        def _head_too_large(self) -> None:
            self.notices.note("header_size", "request heads over MAX_HEADER_BYTES: 431, closed")
            message = f"request head exceeds {self.guard.max_header_bytes} bytes"
            if self._waiting_for_head():
                self._close_with(431, message, "headers_too_large")
            else:  # a pipelined head while another request is answered: no room to say so
                self._abort(self.cycle, 431, message, "headers_too_large")

        def _close_with(
            self, status: int, message: str, reason: str, linger_s: float | None = None
        ) -> None:
            """Answer outside any request cycle and close."""
            default_headers = self.server_state.default_headers
            self.transport.write(error_response(status, message, reason, default_headers))
            self._linger(linger_s)

        def _abort(
            self,
            cycle: RequestResponseCycle,
            status: int,
            message: str,
            reason: str,
            linger_s: float | None = None,
        ) -> None:
            """End a request being read: answer it if its answer has not
            started, let its app see a disconnect, close the connection."""
            if not cycle.response_started and not cycle.response_complete:
                default_headers = self.server_state.default_headers
                self.transport.write(error_response(status, message, reason, default_headers))
            if not cycle.response_complete:
                cycle.disconnected = True  # receive() → http.disconnect; its sends go nowhere
            cycle.message_event.set()
            self._linger(linger_s)

        def _ending(self) -> bool:
            return self.lingering or self.transport.is_closing()

        def _linger(self, linger_s: float | None = None) -> None:
            """Close after the last answer without resetting a client that is
            still sending (module docstring): FIN, discard, close."""
            transport = self.transport
            if self.lingering or transport.is_closing():
                return
            self.lingering = True
            self._cancel_timers()
            for held in self._held.values():  # nothing more of this connection is served
                self.budget.release(held)
            self._held.clear()
            if not transport.can_write_eof():
                transport.close()
                return
            transport.write_eof()
            with contextlib.suppress(RuntimeError):  # uvicorn's flow control may have paused it
                transport.resume_reading()
            self.loop.call_later(LINGER_S if linger_s is None else linger_s, transport.close)

    def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
        """A `GuardedProtocol` class enforcing `limits` (uvicorn's `http=`)."""
        return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})

else:  # uvicorn without the [standard] extra (no httptools)
    GuardedProtocol = None  # type: ignore[assignment,misc]
    guarded_protocol = None  # type: ignore[assignment]


def uvicorn_connection_options(
    settings: Settings, *, devices: int | None = None, models: int | None = None
) -> dict[str, Any]:
    """uvicorn's `Config`/`run` keyword arguments for the connection limits
    of `settings` (not host, port or logging): the protocol, the keep-alive
    timeout, the accept backlog, h11's header cap. `devices` and `models`
    as for `connection_limits`. ValueError when the open-file limit leaves
    no room for client connections."""
    limits = connection_limits(settings, devices=devices, models=models)
    options: dict[str, Any] = {
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "backlog": limits.backlog,
        "h11_max_incomplete_event_size": limits.max_header_bytes,
    }
    if GuardedProtocol is None:
        log.warning(
            "httptools not installed: only the keep-alive timeout, the accept backlog and "
            "the header size are enforced on connections (uvicorn's h11 protocol)"
        )
        options["http"] = "h11"
    else:
        options["http"] = guarded_protocol(limits)
    return options


def guard_running_uvicorn(settings: Settings, server: Any) -> str:
    """Under plain `uvicorn app.main:app` (uvicorn's own httptools protocol),
    make the running `server` (a uvicorn Server, or None under another ASGI
    server) create `GuardedProtocol` connections with the limits of
    `settings` from now on: uvicorn builds each connection's protocol from
    its config when the connection opens, after the app's lifespan has
    started, so every client connection gets it. Returns what was done; a
    server whose protocol cannot be guarded is warned about, naming what is
    missing and how to get it."""
    how = (
        "run `python -m app serve`, or `uvicorn app.main:app --http "
        "app.api.connection:GuardedProtocol` (needs httptools: pip install 'uvicorn[standard]')"
    )
    if server is None:
        log.warning(
            "no uvicorn server found (in the main thread): no header or body timeouts "
            "(408), header cap (431), buffered-bytes budget or connection cap below the "
            "open-file limit; %s",
            how,
        )
        return "unguarded"
    config = server.config
    current = getattr(config, "http_protocol_class", None)
    if GuardedProtocol is not None and isinstance(current, type):
        if issubclass(current, GuardedProtocol):
            return "guarded"  # `serve`, or --http app.api.connection:GuardedProtocol
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        if current in (HttpToolsProtocol, ReceiveStampingProtocol):
            limits = connection_limits(settings)
            config.http_protocol_class = guarded_protocol(limits)
            config.timeout_keep_alive = limits.keep_alive_timeout_s
            log.info(
                "uvicorn's httptools protocol replaced by the guarded one: header timeout "
                "%g s, body timeout %g s, headers up to %d bytes, at most %d connections",
                limits.header_timeout_s,
                limits.body_timeout_s,
                limits.max_header_bytes,
                limits.max_connections,
            )
            if config.backlog > limits.backlog:
                log.warning(
                    "uvicorn's accept backlog %d is more than the open-file limit leaves room "
                    "for beside %d connections: pass --backlog %d (or run `python -m app serve`)",
                    config.backlog,
                    limits.max_connections,
                    limits.backlog,
                )
            return "replaced"
    log.warning(
        "uvicorn runs the HTTP protocol %s: the connection protections (header and body "
        "timeouts → 408, header cap → 431, buffered-bytes budget, connection cap below the "
        "open-file limit) do NOT apply; %s",
        getattr(current, "__name__", current),
        how,
    )
    return "unguarded"
