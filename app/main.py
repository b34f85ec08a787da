"""The ASGI app: `uvicorn app.main:app` (settings from the environment) or
`python -m app serve …`. Its lifespan starts the service, then the KServe v2
gRPC endpoint on GRPC_PORT (app/grpc/), and, while it serves, hooks SIGTERM
and SIGINT so that the shutdown's grace period starts at the signal under
either (app/server/stop_signals.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api.connection import guard_running_uvicorn
from app.api.routes import settings_api
from app.api.security import exposure_warning
from app.errors import ModelNotReady
from app.grpc.lifecycle import start_grpc_endpoint
from app.server.live import LiveService
from app.server.loop_watchdog import LoopWatchdog
from app.server.metrics import Metrics
from app.server.one_process import refuse_several_workers
from app.server.settings import Settings
from app.server.startup import StartupFailed
from app.server.stop_signals import StopSignals, uvicorn_server
from app.server.triton_metrics import MetricsEndpoint

log = logging.getLogger("app.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    refuse_several_workers()  # one scheduler per box (app/server/one_process.py)
    settings = settings or Settings.from_env()
    _ensure_logging()
    # ACCESS_LOG: uvicorn's line per request, off unless asked for (under
    # `python -m app serve` uvicorn is told; under plain uvicorn, its logger).
    logging.getLogger("uvicorn.access").disabled = not settings.access_log
    uvicorn_error = logging.getLogger("uvicorn.error")
    if _STARTUP_TRACEBACK not in uvicorn_error.filters:
        uvicorn_error.addFilter(_STARTUP_TRACEBACK)
    if settings.api_workers:
        log.warning(
            "API_WORKERS=%d applies under `python -m app serve`: this process serves alone",
            settings.api_workers,
        )
    warning = exposure_warning(settings.admin_token, settings.host)
    if warning:
        log.warning(warning)
    metrics = Metrics(settings.metrics_prefix)
    holder: dict[str, LiveService] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Plain `uvicorn app.main:app`: its connections get the guarded
        # protocol too (app/api/connection.py), or a warning says why not.
        guard_running_uvicorn(settings, uvicorn_server())
        service = LiveService(settings, metrics)
        holder["service"] = service
        try:
            await service.start()
            grpc_endpoint = await start_grpc_endpoint(settings, lambda: service, metrics)
        except BaseException:
            await service.stop()
            raise
        metrics_endpoint = await start_metrics_endpoint(settings, service, metrics)
        # From here a signal starts the drain at once (app/server/stop_signals.py),
        # and a wedged loop cannot keep the process from ending (app/server/loop_watchdog.py).
        loop = asyncio.get_running_loop()
        watchdog = LoopWatchdog(
            loop, grace_s=settings.shutdown_grace_s, on_exit=service.emergency_stop
        )
        signals = StopSignals(
            loop,
            settings.shutdown_grace_s,
            on_first=service.begin_shutdown,
            on_again=service.hurry,
            on_received=watchdog.signalled,
        )
        signals.install()
        watchdog.start()
        try:
            yield
        finally:
            try:
                await service.stop()
            finally:
                await grpc_endpoint.stop()  # after the drain (app/grpc/lifecycle.py)
                if metrics_endpoint is not None:
                    await metrics_endpoint.stop()
                signals.restore()
                watchdog.stop()

    def get_service() -> LiveService:
        service = holder.get("service")
        if service is None:
            raise ModelNotReady("server is starting")
        return service

    return settings_api(get_service, metrics, settings, lifespan=lifespan, title="deadline-serve")


async def start_metrics_endpoint(
    settings: Settings, service: LiveService, metrics: Metrics
) -> MetricsEndpoint | None:
    """Triton's metrics port (METRICS_PORT; app/server/triton_metrics.py), or
    None when it is 0 or cannot be bound (a warning: serving goes on)."""
    if settings.metrics_port == 0:
        return None
    endpoint = MetricsEndpoint(metrics.registry, service.model_statistics, service.pending_of)
    try:
        port = await endpoint.start(settings.host, settings.metrics_port)
    except OSError as exc:
        log.warning(
            "METRICS_PORT %d cannot be bound (%s): Triton's metrics are not served "
            "(METRICS_PORT=0 turns this endpoint off)",
            settings.metrics_port,
            exc,
        )
        return None
    log.info("Triton-compatible metrics on http://%s:%d/metrics", settings.host, port)
    return endpoint


class _StartupTraceback(logging.Filter):
    """uvicorn logs a failed start-up's traceback (Starlette hands it over).
    A StartupFailed was said in one line already ("start-up stopped: …"):
    its traceback is dropped; any other error is cut to its last line, the
    exception and its message. With debug logging the traceback stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Traceback") or log.isEnabledFor(logging.DEBUG):
            return True
        lines = message.rstrip().splitlines()
        if any(line.startswith(_stopped_prefixes()) for line in lines):
            return False
        last = lines[-1]
        record.msg, record.args, record.exc_info = f"start-up failed: {last}", (), None
        return True


_STARTUP_TRACEBACK = _StartupTraceback()


def _stopped_prefixes() -> tuple[str, ...]:
    """How a traceback names a StartupFailed (or a kind of it) it ends with:
    its message may span lines (a plan's mismatches)."""
    kinds, todo = [], [StartupFailed]
    while todo:
        kind = todo.pop()
        kinds.append(f"{kind.__module__}.{kind.__qualname__}: ")
        todo.extend(kind.__subclasses__())
    return tuple(kinds)


def _ensure_logging() -> None:
    """Under plain `uvicorn app.main:app` nothing configures the root logger;
    give our loggers a handler so start-up says what was loaded where."""
    app_logger = logging.getLogger("app")
    if not logging.getLogger().handlers and not app_logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        app_logger.addHandler(handler)
        app_logger.setLevel(logging.INFO)


def __getattr__(name: str) -> FastAPI:
    # `uvicorn app.main:app` builds the app on first access, so importing this
    # module (e.g. for create_app) does not read settings or start anything.
    if name == "app":
        return create_app()
    raise AttributeError(name)
