"""The data plane's short way through the ASGI stack.

Inference requests are the hot path: at a few thousand requests per second a
single event loop spends about a quarter of its CPU in FastAPI's routing,
dependency solving and response wrappers (profiled with py-spy, BENCHMARKS.md
"Live daemon"). This middleware recognises the three inference routes —
`POST /infer`, `POST /v2/models/{name}/infer` and
`POST /v2/models/{name}/versions/{version}/infer` — and calls the very
endpoint functions FastAPI would, with the same error responses. Everything
else (and any other method on those paths) goes through FastAPI unchanged, so
the OpenAPI schema, 404/405 answers and management routes stay FastAPI's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.received import stamp_if_missing
from app.errors import ServingError

log = logging.getLogger(__name__)

NativeInfer = Callable[[Request], Awaitable[Response]]
V2Infer = Callable[[str, "str | None", Request], Awaitable[Response]]
ErrorResponder = Callable[[Request, ServingError], Response]


@dataclass(frozen=True)
class InferEndpoints:
    """The endpoint functions of the inference routes (built by build_router)."""

    native: NativeInfer
    v2: V2Infer
    on_error: ErrorResponder


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


class InferFastPath:
    """Pure ASGI middleware; see the module docstring."""

    def __init__(self, app: ASGIApp, endpoints: InferEndpoints) -> None:
        self.app = app
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        route = match_infer_path(scope["path"])
        if route is None:
            await self.app(scope, receive, send)
            return
        stamp_if_missing(scope)
        request = Request(scope, receive)
        name, version = route
        try:
            if name:
                response = await self.endpoints.v2(name, version, request)
            else:
                response = await self.endpoints.native(request)
        except ServingError as exc:
            response = self.endpoints.on_error(request, exc)
        # Any other exception propagates to Starlette's ServerErrorMiddleware,
        # which answers with the app's JSON 500 handler and logs the traceback.
        await response(scope, receive, send)


def install_fast_path(app: Any, endpoints: InferEndpoints) -> None:
    """Add the middleware to a Starlette/FastAPI app (inside its error handling)."""
    app.add_middleware(InferFastPath, endpoints=endpoints)
