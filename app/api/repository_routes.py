"""Triton's model-repository extension: load and unload a model without a restart.

    POST /v2/repository/models/{name}/load     [{"parameters": {"config": "<JSON>"}}]
    POST /v2/repository/models/{name}/unload   [{"parameters": {"unload_dependents": b}}]

Both answer 200 with an empty JSON object once done (the unload once every
request the model had accepted is answered and its executors let go of it;
the service says how: app/server/model_control.py). Both are management
routes: the admin guard (app.api.security.require_token) runs first — 401
without the right bearer token when ADMIN_TOKEN is set, 403 when it is not
and the server is bound to a non-loopback address. A load's `config`
parameter is a model-config override as JSON; a field that does not map onto
the server's model config is a 400 naming it, as is any other parameter a
422 naming it (Triton's `file:` overrides included: the repository is read as
it is).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from app.api.bodies import parse_model, read_body
from app.api.context import ApiContext
from app.api.errors import MalformedRequest
from app.api.limits import HEADER_ALLOWANCE, BodyLimit
from app.api.models import ErrorResponse, RepositoryLoadRequest, RepositoryUnloadRequest
from app.api.openapi import ERROR_RESPONSES, json_body
from app.api.security import check_model_name
from app.errors import ServingError

M = TypeVar("M", bound=BaseModel)


class ModelControlDisabled(ServingError):
    """The service behind the API cannot load or unload models."""

    status = 501
    reason = "not_supported"


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "Invalid model name, malformed body, an override or parameter that is "
        "not supported, or the model failed to load (`reason` load_failed).",
    },
    401: {"model": ErrorResponse, "description": "ADMIN_TOKEN is set: a bearer token is needed."},
    403: {
        "model": ErrorResponse,
        "description": "No ADMIN_TOKEN and a non-loopback bind: management is off.",
    },
    404: {"model": ErrorResponse, "description": "No such model in the repository."},
    413: ERROR_RESPONSES[413],
    415: ERROR_RESPONSES[415],
    422: ERROR_RESPONSES[422],
    501: {"model": ErrorResponse, "description": "This server cannot load or unload models."},
    503: {"model": ErrorResponse, "description": "The server is starting or shutting down."},
}


def _limit(ctx: ApiContext) -> BodyLimit:
    return BodyLimit(
        min(HEADER_ALLOWANCE, ctx.max_body_bytes), "the limit of a model-control request"
    )


async def _body(ctx: ApiContext, request: Request, model: type[M]) -> M | None:
    body = await read_body(request, _limit(ctx))
    if not body:
        return None
    if not body.strip():
        raise MalformedRequest("request body is not valid JSON (only whitespace)")
    return parse_model(model, body)


async def load_model(ctx: ApiContext, name: str, request: Request) -> dict[str, Any]:
    check_model_name(name)
    req = await _body(ctx, request, RepositoryLoadRequest)
    override = req.parameters.config if req is not None and req.parameters else None
    load = getattr(ctx.get_service(), "load_model", None)
    if load is None:
        raise ModelControlDisabled("this server cannot load models")
    await load(name, override)
    return {}


async def unload_model(ctx: ApiContext, name: str, request: Request) -> dict[str, Any]:
    check_model_name(name)
    await _body(ctx, request, RepositoryUnloadRequest)  # nothing to act on: validated
    unload = getattr(ctx.get_service(), "unload_model", None)
    if unload is None:
        raise ModelControlDisabled("this server cannot unload models")
    await unload(name)
    return {}


def add_repository_routes(
    router: APIRouter, ctx: ApiContext, guard: Callable[..., Awaitable[None]]
) -> None:
    """Add the load and unload routes, behind `guard` (the admin token)."""
    # Without a token on a loopback bind the guard lets every request in: the
    # document says so (the bearer token optional), as it says what is enforced.
    optional = {"security": [{}, {"HTTPBearer": []}]} if getattr(guard, "open", False) else {}

    @router.post(
        "/v2/repository/models/{name}/load",
        name="repository_model_load",
        response_model=dict[str, Any],
        responses=_RESPONSES,
        dependencies=[Depends(guard)],
        tags=["v2"],
        summary="Load or reload a model from the repository (admin)",
        operation_id="v2_repository_model_load",
        openapi_extra={
            **json_body(RepositoryLoadRequest, "Optional config override.", False),
            **optional,
        },
    )
    async def post_load(name: str, request: Request) -> dict[str, Any]:
        return await load_model(ctx, name, request)

    @router.post(
        "/v2/repository/models/{name}/unload",
        name="repository_model_unload",
        response_model=dict[str, Any],
        responses=_RESPONSES,
        dependencies=[Depends(guard)],
        tags=["v2"],
        summary="Unload a model (admin)",
        operation_id="v2_repository_model_unload",
        openapi_extra={
            **json_body(RepositoryUnloadRequest, "Optional parameters.", False),
            **optional,
        },
    )
    async def post_unload(name: str, request: Request) -> dict[str, Any]:
        return await unload_model(ctx, name, request)
