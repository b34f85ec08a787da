"""Triton's statistics extension: `GET /v2/models[/{name}[/versions/{version}]]/stats`.

The body is Triton's `$stats_model_response` as the service reports it
(app/server/statistics.py says how our timings map onto Triton's fields).
`/v2/models/stats` is added before `/v2/models/{name}`, so it is never read
as the metadata of a model named "stats"; that name is reserved
(app.api.security.check_model_name refuses it, and the OpenAPI pattern of
model names leaves it out).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.context import ApiContext, lookup_model
from app.api.openapi import NOT_FOUND_RESPONSES
from app.errors import ModelNotReady
from app.server.service import InferenceService


class StatDuration(BaseModel):
    count: int = Field(description="How many.")
    ns: int = Field(description="Their cumulative duration in nanoseconds.")


class InferStatistics(BaseModel):
    success: StatDuration = Field(description="Requests answered with outputs; arrival → answer.")
    fail: StatDuration = Field(description="Requests answered with an error; arrival → error.")
    queue: StatDuration = Field(description="Arrival → the start of the request's batch.")
    compute_input: StatDuration = Field(description="Arrival → inputs handed to the scheduler.")
    compute_infer: StatDuration = Field(description="The execution of the request's batch.")
    compute_output: StatDuration = Field(description="Batch end → outputs read, answer ready.")
    cache_hit: StatDuration = Field(description="Always zero: no response cache.")
    cache_miss: StatDuration = Field(description="Always zero: no response cache.")


class BatchStatistics(BaseModel):
    batch_size: int = Field(description="Items in the batch.")
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration


class ModelStatistics(BaseModel):
    name: str
    version: str
    last_inference: int = Field(description="The last answer's time, ms since the epoch.")
    inference_count: int = Field(description="Items answered with outputs.")
    execution_count: int = Field(description="Batches run to their end.")
    inference_stats: InferStatistics
    batch_stats: list[BatchStatistics]


class ModelStatisticsResponse(BaseModel):
    model_stats: list[ModelStatistics]


def model_statistics(
    service: InferenceService, name: str | None, version: str | None
) -> dict[str, Any]:
    """Every loaded model's statistics, or one model's (404 unknown model or
    version, 503 a model that is unavailable); HTTP's and gRPC's."""
    if name is None:
        return service.model_statistics()
    config = lookup_model(service, name, version)
    # No version: every version the model serves, as Triton reports it.
    report = service.model_statistics(config.model_name, version)
    if not report["model_stats"]:
        # Known but not counted: a model that is not loaded (being unloaded).
        raise ModelNotReady(f"model {config.model_name!r} is not loaded")
    return report


def add_statistics_routes(router: APIRouter, ctx: ApiContext) -> None:
    """Add the statistics routes; before the /v2/models/{name} routes."""

    @router.get(
        "/v2/models/stats",
        name="model_statistics",
        response_model=ModelStatisticsResponse,
        responses={503: NOT_FOUND_RESPONSES[503]},
        tags=["v2"],
        summary="Statistics of every loaded model (Triton's statistics extension)",
        operation_id="v2_models_stats",
    )
    async def get_models_stats() -> dict[str, Any]:
        return model_statistics(ctx.get_service(), None, None)

    @router.get(
        "/v2/models/{name}/stats",
        response_model=ModelStatisticsResponse,
        responses=NOT_FOUND_RESPONSES,
        tags=["v2"],
        summary="A model's statistics",
        operation_id="v2_model_stats",
    )
    async def get_model_stats(name: str) -> dict[str, Any]:
        return model_statistics(ctx.get_service(), name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}/stats",
        response_model=ModelStatisticsResponse,
        responses=NOT_FOUND_RESPONSES,
        tags=["v2"],
        summary="A model version's statistics",
        operation_id="v2_model_version_stats",
    )
    async def get_model_version_stats(name: str, version: str) -> dict[str, Any]:
        return model_statistics(ctx.get_service(), name, version)
