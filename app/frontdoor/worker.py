"""One API worker process: uvicorn serving the HTTP API over `RemoteService`.

It binds HOST:PORT itself with SO_REUSEPORT (the kernel spreads new
connections over the workers) and serves the very API of the single
process (app.api.create_api, the inference fast path and the guarded
connections included), and gRPC's on GRPC_PORT the same way
(app.grpc.lifecycle, `reuse_port`). Its lifespan connects to the scheduler and waits
for its welcome; from then on a watch checks, every WATCH_S, that the
scheduler is still there: once it is gone (this process's parent changed,
or nothing heard for SILENCE_S), every request waiting is answered 503
`shutting_down`, and so is any new one until uvicorn has stopped (at
once); the worker then exits with status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
import zmq
import zmq.asyncio
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.connection import uvicorn_connection_options
from app.api.routes import settings_api
from app.frontdoor.channel import waiting, worker_socket
from app.frontdoor.messages import SILENCE_S, dump, load
from app.frontdoor.remote import ForwardedMetrics, RemoteService
from app.grpc.lifecycle import start_grpc_endpoint
from app.server.settings import Settings
from app.server.stop_signals import safety_net_s

log = logging.getLogger("app.frontdoor")

WATCH_S = 0.1
WELCOME_TIMEOUT_S = 30.0


def listening_socket(host: str, port: int) -> socket.socket:
    """HOST:PORT bound with SO_REUSEPORT (uvicorn listens on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class Link:
    """The worker's ZeroMQ link to the scheduler, and the watch over it."""

    def __init__(self, service: RemoteService, address: str, parent: int) -> None:
        self.service = service
        self.address = address
        self.parent = parent
        self.heard_at = time.monotonic()
        self.server: uvicorn.Server | None = None
        self._context = zmq.asyncio.Context()
        self._socket = worker_socket(self._context, address, service.worker)
        self._welcomed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def send(self, message: tuple[Any, ...]) -> None:
        self._socket.send(dump(message))

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch())]
        self.send(("hello",))
        await asyncio.wait_for(self._welcomed.wait(), WELCOME_TIMEOUT_S)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._socket.close(linger=0)
        self._context.term()

    async def _read(self) -> None:
        while True:
            first = await self._socket.recv_multipart()
            self.heard_at = time.monotonic()
            for (frame,) in (first, *waiting(self._socket)):
                try:
                    message = load(frame)
                    self.service.on_message(message)
                except Exception:  # one message; the link goes on
                    log.exception(
                        "API worker %d: a message could not be handled", self.service.worker
                    )
                    continue
                if message[0] == "welcome":
                    self._welcomed.set()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            if os.getppid() != self.parent:
                self.lost("the scheduler process exited")
            elif time.monotonic() - self.heard_at > SILENCE_S and self._welcomed.is_set():
                self.lost(f"the scheduler process did not answer for {SILENCE_S:.0f} s")

    def lost(self, why: str) -> None:
        if self.service.lost is not None:
            return
        failed = self.service.fail_all(why)
        log.error(
            "API worker %d: %s; answered %d waiting with 503", self.service.worker, why, failed
        )
        if self.server is not None:
            self.server.should_exit = True


class Prefetch:
    """Before `/metrics` and the statistics routes: the scheduler's current
    figures, fetched for the route (app/frontdoor/remote.py)."""

    def __init__(self, app: ASGIApp, service: RemoteService, metrics: ForwardedMetrics) -> None:
        self.app = app
        self.service = service
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            path = scope["path"]
            with contextlib.suppress(Exception):  # the scheduler gone: the route says so
                if path == "/metrics":
                    accept = dict(scope["headers"]).get(b"accept", b"").decode("latin-1")
                    self.metrics.rendered = await self.service.call("metrics", accept)
                elif path.endswith("/stats"):
                    await self.service.refresh_statistics()
        await self.app(scope, receive, send)


def build_app(settings: Settings, link: Link) -> ASGIApp:
    """The worker's ASGI app: the API over `link`'s RemoteService."""
    service = link.service
    metrics = ForwardedMetrics(settings.metrics_prefix, link.send)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await link.start()
        try:
            grpc_endpoint = await start_grpc_endpoint(
                settings, lambda: service, metrics, reuse_port=True
            )
        except BaseException:
            await link.stop()
            raise
        try:
            yield
        finally:
            await grpc_endpoint.stop()  # after HTTP's connections: the drain is over
            await link.stop()

    api = settings_api(
        lambda: service, metrics, settings, lifespan=lifespan, title="deadline-serve"
    )
    return Prefetch(api, service, metrics)


def main(settings: Settings, worker: int, address: str, log_level: str, parent: int) -> None:
    """A worker process's entry (multiprocessing spawn): serve until told to
    stop (SIGTERM, SIGINT) or the scheduler is gone (then exit 1)."""
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[w{worker}]: %(message)s",
    )
    logging.getLogger("uvicorn.access").disabled = not settings.access_log
    link = Link(RemoteService(worker, lambda m: link.send(m)), address, parent)
    config = uvicorn.Config(
        build_app(settings, link),
        log_level=log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=safety_net_s(settings.shutdown_grace_s),
        server_header=False,
        **uvicorn_connection_options(settings),
    )
    server = link.server = uvicorn.Server(config)
    sock = listening_socket(settings.host, settings.port)
    server.run(sockets=[sock])
    if link.service.lost is not None or not server.started:
        sys.exit(1)
