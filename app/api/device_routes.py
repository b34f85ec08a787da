"""The executor devices, and a device's share reallocated while serving.

    GET  /v2/devices                       {"devices": [{name, kind, share, ...}]}
    GET  /v2/profiles                      {"models": [{name, slo_ms, latency_ms, ...}]}
    POST /v2/devices/reshare               {"device": "cpu:0/1", "share": 0.3}

Both profiles and reshare are management routes (the admin guard first, as
for model load and unload: app.api.repository_routes). The profiles are
what `python -m app plan SYSTEM --from URL` reads: each model's SLO, batch
cap, tensors, weights and the latency profile its core plans with
(app/server/planning_index.py). A reshare: a shadow executor at the new share
takes over the device's traffic, the old one finishes what it holds, and the
answer says how long each phase took (app/server/reallocation.py). 400 for
a share out of (0, 1] or a device's shares summing to more than 1, 404 for
an unknown device, 409 when the device is being reshared or restarted or
the policy cannot take a new share while serving, 503 when the shadow did
not come up (the old executor serves on).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from app.api.bodies import parse_model, read_body
from app.api.context import ApiContext
from app.api.errors import MalformedRequest
from app.api.limits import HEADER_ALLOWANCE, BodyLimit
from app.api.models import DeviceIndex, ErrorResponse, ReshareRequest
from app.api.openapi import ERROR_RESPONSES, json_body
from app.errors import ServingError


class DeviceControlDisabled(ServingError):
    """The service behind the API has no executor devices to reallocate."""

    status = 501
    reason = "not_supported"


_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "Malformed body, a share out of (0, 1] or shares summing to more than 1.",
    },
    401: {"model": ErrorResponse, "description": "ADMIN_TOKEN is set: a bearer token is needed."},
    403: {
        "model": ErrorResponse,
        "description": "No ADMIN_TOKEN and a non-loopback bind: management is off.",
    },
    404: {"model": ErrorResponse, "description": "No such device."},
    409: {
        "model": ErrorResponse,
        "description": "The device is being reshared or restarted, or the policy plans with "
        "fixed device speeds (`reason` reshare_refused).",
    },
    413: ERROR_RESPONSES[413],
    415: ERROR_RESPONSES[415],
    422: ERROR_RESPONSES[422],
    501: {"model": ErrorResponse, "description": "This server has no devices to reshare."},
    503: {
        "model": ErrorResponse,
        "description": "Starting or shutting down, or the shadow executor did not come up "
        "(`reason` reshare_failed; the old executor serves on).",
    },
}


async def reshare(ctx: ApiContext, request: Request) -> dict[str, Any]:
    limit = BodyLimit(min(HEADER_ALLOWANCE, ctx.max_body_bytes), "the limit of a reshare request")
    body = await read_body(request, limit)
    if not body.strip():
        raise MalformedRequest('a reshare needs a JSON body {"device": NAME, "share": S}')
    req = parse_model(ReshareRequest, body)
    service = ctx.get_service()
    reshare_device = getattr(service, "reshare_device", None)
    if reshare_device is None:
        raise DeviceControlDisabled("this server cannot reshare devices")
    return await reshare_device(req.device, req.share)


def add_device_routes(
    router: APIRouter, ctx: ApiContext, guard: Callable[..., Awaitable[None]]
) -> None:
    """Add the device index and the reshare route (behind `guard`)."""
    optional = {"security": [{}, {"HTTPBearer": []}]} if getattr(guard, "open", False) else {}

    @router.get(
        "/v2/devices",
        name="devices",
        response_model=DeviceIndex,
        responses={503: ERROR_RESPONSES[503]},
        tags=["v2"],
        summary="The executor devices: kind, share, cores, models",
        operation_id="v2_devices",
    )
    async def get_devices() -> dict[str, Any]:
        index = getattr(ctx.get_service(), "device_index", None)
        return {"devices": index() if index is not None else []}

    @router.get(
        "/v2/profiles",
        name="profiles",
        response_model=dict[str, Any],
        responses={k: v for k, v in _RESPONSES.items() if k in (401, 403, 501, 503)},
        dependencies=[Depends(guard)],
        tags=["v2"],
        summary="Each model's latency profile, SLO and tensors, for the planners (admin)",
        operation_id="v2_profiles",
        openapi_extra=optional,
    )
    async def get_profiles() -> dict[str, Any]:
        index = getattr(ctx.get_service(), "profile_index", None)
        if index is None:
            raise DeviceControlDisabled("this server has no profiles to show")
        return {"models": index()}

    @router.post(
        "/v2/devices/reshare",
        name="device_reshare",
        response_model=dict[str, Any],
        responses=_RESPONSES,
        dependencies=[Depends(guard)],
        tags=["v2"],
        summary="Give a device a new share through a shadow executor (admin)",
        operation_id="v2_device_reshare",
        openapi_extra={**json_body(ReshareRequest, "The device and its new share."), **optional},
    )
    async def post_reshare(request: Request) -> dict[str, Any]:
        return await reshare(ctx, request)
