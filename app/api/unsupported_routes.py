"""Triton's extensions this server does not offer, answered as Triton answers
them when it runs without them (triton-inference-server/server,
src/http_server.cc), so that Triton's clients get the reply they know
rather than a 404 `no such route`:

    GET  /v2/systemsharedmemory[/region/{r}]/status    200 [] (no region registered;
                                                       a named one: 404 not found)
    POST /v2/systemsharedmemory[/region/{r}]/register  501 client shared memory is
    POST /v2/systemsharedmemory[/region/{r}]/unregister     disabled (Triton without
                                                       --allow-client-shm)
    the same under /v2/cudasharedmemory
    GET|POST /v2/trace/setting, /v2/models/{m}[/versions/{v}]/trace/setting
                                                       503 the server does not support tracing
    GET|POST /v2/logging                               503 the server does not support
                                                       dynamic logging

The errors are Triton's JSON body, `{"error": ...}`. They stay out of the
OpenAPI document (nothing there to call). gRPC answers alike
(app/grpc/extensions.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.security import short_repr

# Triton's texts (src/common.h, src/http_server.cc, src/grpc/grpc_server.cc)
SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
NO_TRACING = "the server does not support tracing"
NO_LOGGING = "the server does not support dynamic logging"


def shm_region_missing(kind: str, region: str) -> str:
    return f"Unable to find {kind} shared memory region: {short_repr(region)}"


def _region_status(kind: str) -> Callable[[str], Awaitable[JSONResponse]]:
    async def region_status(region: str) -> JSONResponse:
        return JSONResponse({"error": shm_region_missing(kind, region)}, status_code=404)

    return region_status


def add_unsupported_routes(router: APIRouter) -> None:
    """Add the routes above to `router`."""
    for prefix, kind in (("systemsharedmemory", "system"), ("cudasharedmemory", "cuda")):

        async def status() -> JSONResponse:
            return JSONResponse([])

        region_status = _region_status(kind)

        async def disabled() -> JSONResponse:
            return JSONResponse({"error": SHM_DISABLED}, status_code=501)

        async def region_disabled(region: str) -> JSONResponse:
            return JSONResponse({"error": SHM_DISABLED}, status_code=501)

        router.add_api_route(
            f"/v2/{prefix}/status", status, methods=["GET"], include_in_schema=False
        )
        router.add_api_route(
            f"/v2/{prefix}/region/{{region}}/status",
            region_status,
            methods=["GET"],
            include_in_schema=False,
        )
        for action in ("register", "unregister"):
            router.add_api_route(
                f"/v2/{prefix}/{action}", disabled, methods=["POST"], include_in_schema=False
            )
            router.add_api_route(
                f"/v2/{prefix}/region/{{region}}/{action}",
                region_disabled,
                methods=["POST"],
                include_in_schema=False,
            )

    async def no_tracing() -> JSONResponse:
        return JSONResponse({"error": NO_TRACING}, status_code=503)

    async def no_model_tracing(name: str) -> JSONResponse:
        return JSONResponse({"error": NO_TRACING}, status_code=503)

    async def no_version_tracing(name: str, version: str) -> JSONResponse:
        return JSONResponse({"error": NO_TRACING}, status_code=503)

    async def no_logging() -> JSONResponse:
        return JSONResponse({"error": NO_LOGGING}, status_code=503)

    both = ["GET", "POST"]
    router.add_api_route("/v2/trace/setting", no_tracing, methods=both, include_in_schema=False)
    router.add_api_route(
        "/v2/models/{name}/trace/setting", no_model_tracing, methods=both, include_in_schema=False
    )
    router.add_api_route(
        "/v2/models/{name}/versions/{version}/trace/setting",
        no_version_tracing,
        methods=both,
        include_in_schema=False,
    )
    router.add_api_route("/v2/logging", no_logging, methods=both, include_in_schema=False)
