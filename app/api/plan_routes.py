"""The plan the daemon serves (`PLAN=FILE`; app/server/plans.py), and a
plan taken up while serving (app/server/plan_switch.py).

    GET /v2/plan    {"in_force": true, "kind": "inss-plan", "version": 2,
                     "made_from": {...}, "loaded_at": "…", "plan": {...}}
    POST /v2/plan   a plan file's JSON (admin) →
                    {"kind": "herd-plan", "groups": [{"models": [...], "devices": [...]}],
                     "loaded": {...}, "handed_over": 3, "switch_ms": 0.4, "total_ms": 51.0}

`{"in_force": false}` when the daemon serves no plan. A posted plan that
does not fit is answered 409 naming every mismatch, one of a kind taken up
only at start-up (InSS, PPipe) 501.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from app.api.bodies import read_body
from app.api.context import ApiContext
from app.api.device_routes import DeviceControlDisabled
from app.api.errors import MalformedRequest
from app.api.limits import BodyLimit
from app.api.models import ErrorResponse, PlanInForce
from app.api.openapi import ERROR_RESPONSES
from app.planning.plan_files import FORMAT_VERSION, KINDS, LEGACY_VERSION

# A plan file's envelope (app/planning/plan_files.py); `plan` is its planner's.
PLAN_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["kind", "version"],
    "properties": {
        "kind": {"enum": list(KINDS)},
        "version": {"type": "integer", "enum": [LEGACY_VERSION, FORMAT_VERSION]},
        "made_from": {"type": "object"},
        "plan": {"type": "object", "description": "The planner's plan."},
    },
}


def add_plan_routes(
    router: APIRouter, ctx: ApiContext, guard: Callable[..., Awaitable[None]]
) -> None:
    """Add `GET /v2/plan` and `POST /v2/plan` (behind `guard`)."""
    optional: dict[str, Any] = (
        {"security": [{}, {"HTTPBearer": []}]} if getattr(guard, "open", False) else {}
    )

    @router.get(
        "/v2/plan",
        name="plan",
        response_model=PlanInForce,
        response_model_exclude_none=True,
        responses={503: ERROR_RESPONSES[503]},
        tags=["v2"],
        summary="The plan in force: its kind, version, what it was made from, its body",
        operation_id="v2_plan",
    )
    async def get_plan() -> dict[str, Any]:
        in_force = getattr(ctx.get_service(), "plan_in_force", None)
        plan = in_force() if in_force is not None else None
        return {"in_force": False} if plan is None else {"in_force": True, **plan}

    @router.post(
        "/v2/plan",
        name="plan_apply",
        response_model=dict[str, Any],
        responses={
            **{k: ERROR_RESPONSES[k] for k in (400, 413, 415, 422, 503)},
            409: {"model": ErrorResponse, "description": "The plan does not fit this server."},
            501: {
                "model": ErrorResponse,
                "description": "A plan taken up only at start-up (InSS, PPipe), or a "
                "service that cannot take up plans.",
            },
        },
        dependencies=[Depends(guard)],
        tags=["v2"],
        summary="Take up a HERD or partition plan while serving (admin)",
        operation_id="v2_plan_apply",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": PLAN_FILE_SCHEMA}},
                "description": "A plan file (`python -m app plan herd|partition … --out FILE`).",
            },
            **optional,
        },
    )
    async def post_plan(request: Request) -> dict[str, Any]:
        body = await read_body(request, BodyLimit(ctx.max_json_bytes, "the limit of a plan"))
        if not body.strip():
            raise MalformedRequest("POST /v2/plan needs a plan file's JSON as its body")
        apply_plan = getattr(ctx.get_service(), "apply_plan", None)
        if apply_plan is None:
            raise DeviceControlDisabled("this server cannot take up a plan while serving")
        return await apply_plan(body)
