"""The scheduler process of API_WORKERS ≥ 1: the service, the receiver, the workers.

`serve` starts the service (executors, profiles, scheduling cores, as the
single process does), Triton's metrics port (served here, as before), the
`Receiver`, then the API workers, which bind HTTP's HOST:PORT and gRPC's
HOST:GRPC_PORT with SO_REUSEPORT. This process holds both ports bound (not
listening) so that PORT=0 or GRPC_PORT=0 picks one port for all of them.

A worker that exits while the daemon serves is started again under its
number (the receiver tells it which of its slots are still taken); its
clients saw their connections fail, and its requests in flight are
answered into the void, their entries removed. One that cannot start
(status 3, or exited before it ever served twice in a row) stops the daemon.

Shutdown, at SIGTERM or SIGINT: the service refuses new requests (503) and
drains for SHUTDOWN_GRACE_S; the workers are sent SIGTERM, stop accepting
and exit once their connections are answered; then the service stops. A
second signal ends the grace at once. If this process is killed, every
worker answers what it has waiting with 503 and exits
(app/frontdoor/worker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import time
from dataclasses import replace
from multiprocessing.process import BaseProcess

from app.frontdoor import worker as worker_main
from app.frontdoor.channel import new_address, remove_address
from app.frontdoor.receiver import Receiver
from app.main import start_metrics_endpoint
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from app.server.startup import StartupFailed
from app.server.stop_signals import safety_net_s

log = logging.getLogger("app.frontdoor")

# uvicorn.config.STARTUP_FAILURE, as a worker that cannot start exits.
STARTUP_FAILURE = 3
# A worker that exits within this long of its start has not served.
EARLY_EXIT_S = 5.0
WATCH_S = 0.2


class Workers:
    """The API worker processes: started, watched, started again, stopped."""

    def __init__(self, settings: Settings, address: str, log_level: str) -> None:
        self.settings = settings
        self.address = address
        self.log_level = log_level
        self.processes: dict[int, BaseProcess] = {}
        self.started_at: dict[int, float] = {}
        self.early_exits: dict[int, int] = {}
        self.restarts = 0
        self.stopping = False
        self._context = multiprocessing.get_context("spawn")

    def start(self, number: int) -> None:
        process = self._context.Process(
            target=worker_main.main,
            args=(self.settings, number, self.address, self.log_level, os.getpid()),
            name=f"api-worker-{number}",
            daemon=False,
        )
        process.start()
        self.processes[number] = process
        self.started_at[number] = time.monotonic()

    def check(self) -> str | None:
        """Start again a worker that exited; the reason to stop the daemon
        when one cannot start."""
        for number, process in list(self.processes.items()):
            if process.is_alive() or self.stopping:
                continue
            code = process.exitcode
            early = time.monotonic() - self.started_at[number] < EARLY_EXIT_S
            self.early_exits[number] = self.early_exits.get(number, 0) + 1 if early else 0
            if code == STARTUP_FAILURE or self.early_exits[number] >= 2:
                return f"API worker {number} cannot start (exit status {code})"
            log.warning("API worker %d exited (status %s): starting it again", number, code)
            self.restarts += 1
            self.start(number)
        return None

    def signal(self, signum: int) -> None:
        for process in self.processes.values():
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    async def wait(self, timeout_s: float) -> None:
        """Wait for every worker to exit; kill those left after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in self.processes.values()):
            if time.monotonic() > deadline:
                log.warning("API workers still running after %.1f s: killed", timeout_s)
                self.signal(signal.SIGKILL)
                break
            await asyncio.sleep(0.05)
        for process in self.processes.values():
            process.join(timeout=1.0)


def hold_port(host: str, port: int) -> socket.socket:
    """HOST:PORT bound with SO_REUSEPORT and not listening: the workers'
    port (PORT=0: the one the system picked), kept for them."""
    try:
        return worker_main.listening_socket(host, port)
    except OSError as exc:
        raise StartupFailed(f"cannot bind {host}:{port} ({exc.strerror or exc}; in use?)") from None


def check_settings(settings: Settings) -> None:
    if settings.ppipe_plan is not None:
        raise StartupFailed(
            "API_WORKERS does not serve PPIPE_PLAN's pipelines yet: set API_WORKERS=0"
        )


def serve(settings: Settings, log_level: str = "info") -> int:
    """Run the daemon with API_WORKERS worker processes; its exit status.
    On uvloop where it is installed, as uvicorn runs the single process."""
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    try:
        return asyncio.run(_serve(settings, log_level))
    except StartupFailed as exc:
        log.error("start-up stopped: %s", exc)
        return STARTUP_FAILURE


async def _serve(settings: Settings, log_level: str) -> int:
    check_settings(settings)
    holders = [hold_port(settings.host, settings.port)]
    if settings.grpc_port:
        try:
            holders.append(hold_port(settings.host, settings.grpc_port))
        except StartupFailed:
            holders[0].close()
            raise
    metrics = Metrics(settings.metrics_prefix)
    service = LiveService(settings, metrics)
    address = new_address()
    try:
        try:
            await service.start()
        except BaseException:
            await service.stop()
            raise
        ports = [holder.getsockname()[1] for holder in holders]
        # The workers' settings: the ports picked for PORT=0 or GRPC_PORT=0.
        shared = replace(settings, port=ports[0], grpc_port=ports[1] if settings.grpc_port else 0)
        return await _run(shared, log_level, service, address)
    finally:
        remove_address(address)
        for holder in holders:
            holder.close()


async def _run(settings: Settings, log_level: str, service: LiveService, address: str) -> int:
    """Serve from the workers until a signal (or a worker that cannot
    start), then shut down in order (module docstring); the exit status."""
    metrics_endpoint = await start_metrics_endpoint(settings, service, service.metrics)
    receiver = Receiver(service, address)
    receiver.start()
    workers = Workers(settings, address, log_level)
    try:
        for number in range(settings.api_workers):
            workers.start(number)
        log.info(
            "HTTP on http://%s:%d%s from %d API worker processes",
            settings.host,
            settings.port,
            f", gRPC on port {settings.grpc_port}" if settings.grpc_port else "",
            settings.api_workers,
        )
        status = await _until_stopped(service, workers)
        await workers.wait(safety_net_s(settings.shutdown_grace_s) + 1.0)
    finally:
        workers.stopping = True
        workers.signal(signal.SIGKILL)  # none is left but after an error
        try:
            await service.stop()
        finally:
            await receiver.stop()
            if metrics_endpoint is not None:
                await metrics_endpoint.stop()
    return status


async def _until_stopped(service: LiveService, workers: Workers) -> int:
    """Watch the workers until the first signal (0) or until one cannot
    start (1); the service then refuses new requests and drains, and the
    workers are told to stop. A second signal ends the grace at once."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(name: str) -> None:
        if stop.is_set():
            service.hurry(name)
            return
        service.begin_shutdown(name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum.name)
    status = 0
    while not stop.is_set():
        reason = workers.check()
        if reason is not None:
            log.error("%s: stopping", reason)
            service.begin_shutdown(reason)
            status = 1
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), WATCH_S)
    workers.stopping = True
    workers.signal(signal.SIGTERM)
    return status
