"""The API's routes and their assembly on a FastAPI app.

Mounting::

    app = create_api(get_service, metrics, lifespan=...)   # a new FastAPI app
    # or, on an app you already have:
    install(app, get_service, metrics)

`get_service()` is called on every request and returns the `InferenceService`
(so the service may be created in a lifespan handler after the app); it may
raise a `ServingError` (e.g. `ShuttingDown`), which is answered as usual.
`install` adds the routes, the exception handlers (every error body is
`{"error": message, "reason": code}`; app.api.errors) and the request schemas
to the OpenAPI document (app.api.openapi), and gives the inference routes
their short way through the ASGI stack (app.api.fastpath). `build_router`
gives the bare router; without `install`'s exception handlers errors would get
FastAPI's default bodies, so prefer `install`.

The routes, by protocol: the native `/infer` (app.api.native), KServe v2
(app.api.v2_routes over the codec app.api.v2) and `/metrics` (below). Each
router binds one `ApiContext` (app.api.context) to module-level endpoint
functions; the fast path calls the same functions with the same context.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from app.api.bodies import DEFAULT_MAX_BODY_BYTES, MAX_BODY_BYTES_ENV
from app.api.context import SERVER_NAME, ApiContext, ServiceProvider, server_version
from app.api.device_routes import add_device_routes
from app.api.errors import error_response, install_error_handlers
from app.api.fastpath import ServingAPI, install_fast_path
from app.api.limits import DEFAULT_MAX_JSON_BYTES
from app.api.native import add_native_routes
from app.api.openapi import add_request_schemas
from app.api.plan_routes import add_plan_routes
from app.api.repository_routes import add_repository_routes
from app.api.security import require_token
from app.api.statistics_routes import add_statistics_routes
from app.api.unsupported_routes import add_unsupported_routes
from app.api.v2_routes import add_v2_routes
from app.server.metrics import Metrics
from app.server.settings import Settings


def add_metrics_route(router: APIRouter, ctx: ApiContext) -> None:
    """Add `GET /metrics`, the server's Prometheus metrics (app.server.metrics)."""

    @router.get(
        "/metrics",
        tags=["metrics"],
        summary="Prometheus metrics",
        operation_id="metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition format (OpenMetrics if Accept asks).",
                "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    "application/openmetrics-text": {"schema": {"type": "string"}},
                },
            }
        },
    )
    async def get_metrics(request: Request) -> Response:
        data, content_type = ctx.metrics.render(request.headers.get("accept"))
        return Response(data, media_type=content_type)


def api_router(ctx: ApiContext) -> APIRouter:
    """Every route of the API, bound to `ctx`, on one router."""
    router = APIRouter()
    add_native_routes(router, ctx)
    add_statistics_routes(router, ctx)  # before /v2/models/{name}: see its module
    add_v2_routes(router, ctx)
    add_repository_routes(router, ctx, ctx.admin_guard or require_token(None))
    add_device_routes(router, ctx, ctx.admin_guard or require_token(None))
    add_plan_routes(router, ctx, ctx.admin_guard or require_token(None))
    add_metrics_route(router, ctx)
    add_unsupported_routes(router)  # shared memory, trace, logging: as Triton without them
    return router


def build_router(
    get_service: ServiceProvider,
    metrics: Metrics,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> APIRouter:
    """The API's routes on a bare router (no error handlers, no fast path)."""
    ctx = ApiContext(get_service, metrics, max_body_bytes, server_version(), max_json_bytes)
    return api_router(ctx)


def install(
    app: FastAPI,
    get_service: ServiceProvider,
    metrics: Metrics,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    admin_token: str | None = None,
    bind_host: str = "127.0.0.1",
    server_name: str = SERVER_NAME,
) -> FastAPI:
    """Add the API's routes, exception handlers and OpenAPI request schemas to `app`.

    `max_body_bytes` caps request bodies (413 above it; settings: MAX_BODY_BYTES),
    `max_json_bytes` their JSON text (settings: MAX_JSON_BYTES; app.api.limits).
    `admin_token` (settings: ADMIN_TOKEN) and `bind_host` (HOST) configure the
    guard of management routes, `app.state.require_admin`: a dependency for
    `Depends(...)` (see app.api.security.require_token).
    """
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int):
        raise TypeError(f"max_body_bytes must be an int, got {max_body_bytes!r}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be ≥ 1, got {max_body_bytes}")
    if isinstance(max_json_bytes, bool) or not isinstance(max_json_bytes, int):
        raise TypeError(f"max_json_bytes must be an int, got {max_json_bytes!r}")
    if max_json_bytes < 1:
        raise ValueError(f"max_json_bytes must be ≥ 1, got {max_json_bytes}")
    app.state.max_body_bytes = max_body_bytes
    app.state.require_admin = require_token(admin_token, host=bind_host)
    ctx = ApiContext(
        get_service,
        metrics,
        max_body_bytes,
        server_version(),
        max_json_bytes,
        server_name=server_name,
        admin_guard=app.state.require_admin,
    )
    app.include_router(api_router(ctx))
    install_fast_path(app, ctx)
    install_error_handlers(app)
    add_request_schemas(app)
    return app


def settings_api(
    get_service: ServiceProvider, metrics: Metrics, settings: Settings, **fastapi_kwargs: Any
) -> FastAPI:
    """`create_api` with the daemon's settings' limits, admin token and host:
    the one-process daemon's app and each API worker's (app/frontdoor/)."""
    return create_api(
        get_service,
        metrics,
        max_body_bytes=settings.max_body_bytes,
        max_json_bytes=settings.max_json_bytes,
        admin_token=settings.admin_token,
        bind_host=settings.host,
        server_name=settings.server_name,
        **fastapi_kwargs,
    )


def create_api(
    get_service: ServiceProvider,
    metrics: Metrics,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
    admin_token: str | None = None,
    bind_host: str = "127.0.0.1",
    server_name: str = SERVER_NAME,
    **fastapi_kwargs: Any,
) -> FastAPI:
    """A FastAPI app serving the API. `fastapi_kwargs` go to FastAPI (e.g. lifespan);
    the other options are `install`'s."""
    fastapi_kwargs.setdefault("title", SERVER_NAME)
    fastapi_kwargs.setdefault("version", server_version())
    fastapi_kwargs.setdefault(
        "description",
        "Deadline-aware DNN inference server: native JSON API and the KServe v2 / Open "
        "Inference Protocol REST API with the binary tensor data extension.",
    )
    return install(
        ServingAPI(**fastapi_kwargs),
        get_service,
        metrics,
        max_body_bytes=max_body_bytes,
        max_json_bytes=max_json_bytes,
        admin_token=admin_token,
        bind_host=bind_host,
        server_name=server_name,
    )


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_BYTES_ENV",
    "Metrics",
    "build_router",
    "create_api",
    "error_response",
    "install",
]
