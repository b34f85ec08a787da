"""The plan the daemon serves (`PLAN=FILE`; app/server/plans.py).

    GET /v2/plan    {"in_force": true, "kind": "inss-plan", "version": 2,
                     "made_from": {...}, "loaded_at": "…", "plan": {...}}

`{"in_force": false}` when the daemon serves no plan. Read-only: a plan is
taken up at start-up; applying one while serving is not built yet.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.context import ApiContext
from app.api.models import PlanInForce
from app.api.openapi import ERROR_RESPONSES


def add_plan_routes(router: APIRouter, ctx: ApiContext) -> None:
    """Add `GET /v2/plan`."""

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
