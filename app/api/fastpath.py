"""The data plane's short way through the ASGI stack.

Inference requests are the hot path: at several hundred requests per second a
single event loop spends a large part of its CPU in FastAPI before any of our
code runs — its per-request OpenTelemetry check (FastAPI 0.165 asks the
tracer, meter and logger providers on every request), middleware, routing,
dependency solving and response wrappers (profiled with py-spy and measured,
docs/benchmark-history.md, 2026-11-23, "inference requests skip FastAPI itself").
`ServingAPI` is a FastAPI app that recognises the
three inference routes — `POST /infer`, `POST /v2/models/{name}/infer` and
`POST /v2/models/{name}/versions/{version}/infer` — before FastAPI's own
`__call__`, and calls the very endpoint functions the routes call
(`app.api.native.infer`, `app.api.v2_routes.infer`) with the same `ApiContext`
and the same error responses (an unexpected exception is logged and answered
with the API's JSON 500). Everything else (and any other method on those
paths) goes through FastAPI unchanged, so the OpenAPI schema, 404/405 answers,
management routes and their telemetry stay FastAPI's. On a plain FastAPI app
the same short way is a middleware inside FastAPI's stack (`install_fast_path`).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api import native, v2_routes
from app.api.context import ApiContext
from app.api.errors import serving_error_response, unexpected_error_response
from app.api.received import stamp_if_missing
from app.errors import ServingError

log = logging.getLogger(__name__)


def match_infer_path(path: str) -> tuple[str, str | None] | None:
    """("", None) for /infer; (name, version) for the v2 inference routes;
    None for any other path. A path segment never contains '/'."""
    if path == "/infer":
        return "", None
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None


async def serve_infer(
    ctx: ApiContext,
    route: tuple[str, str | None],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """Answer one inference request (`route` from match_infer_path)."""
    stamp_if_missing(scope)
    request = Request(scope, receive)
    name, version = route
    try:
        if name:
            response = await v2_routes.infer(ctx, name, version, request)
        else:
            response = await native.infer(ctx, request)
    except ServingError as exc:
        response = serving_error_response(request, exc)
    except Exception as exc:
        log.exception("%s %s failed", scope["method"], scope["path"])
        response = unexpected_error_response(exc)
    await response(scope, receive, send)


class ServingAPI(FastAPI):
    """FastAPI with the inference routes' short way (module docstring); set
    `api_context` (install_fast_path) to enable it."""

    api_context: ApiContext | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = self.api_context
        if ctx is not None and scope["type"] == "http" and scope["method"] == "POST":
            route = match_infer_path(scope["path"])
            if route is not None:
                scope["app"] = self
                await serve_infer(ctx, route, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class InferFastPath:
    """Pure ASGI middleware: the short way inside a plain FastAPI app's stack."""

    def __init__(self, app: ASGIApp, ctx: ApiContext) -> None:
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = match_infer_path(scope["path"])
        if route is None:
            await self.app(scope, receive, send)
        else:
            await serve_infer(self.ctx, route, scope, receive, send)


def install_fast_path(app: FastAPI, ctx: ApiContext) -> None:
    """Give `app` the short way for the API served over `ctx`: outside FastAPI's
    stack on a ServingAPI, as a middleware inside it on any other FastAPI app."""
    if isinstance(app, ServingAPI):
        app.api_context = ctx
    else:
        app.add_middleware(InferFastPath, ctx=ctx)
