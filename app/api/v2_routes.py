"""The KServe v2 (Open Inference Protocol) REST endpoints.

Server metadata and health, model metadata, configuration (Triton-style) and
readiness (each also under `/versions/{version}`), inference with the binary
tensor data extension (codec: app.api.v2) and the repository index.

A health or readiness check that answers "no" is a 400 (`NotReady`), as KServe
asks: `/v2/health/ready` and `/v2/models/{name}/ready` answer 200 or 400 (and
404 for an unknown model), never 503, whether the model has no live device,
failed to load, or the server is starting or shutting down. The other model
routes answer 503 for a model that is unavailable.

Nothing in an answer names a server path: the index gives a model's load error
with its paths cut (app.api.errors.hide_paths; the service gives them relative
to the repository), the log has the whole text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api import models as m
from app.api import v2
from app.api.bodies import parse_body, parse_model, read_body
from app.api.context import ApiContext, lookup_model
from app.api.errors import (
    MalformedRequest,
    NotReady,
    PayloadTooLarge,
    RequestSchemaError,
    hide_paths,
)
from app.api.openapi import (
    ERROR_RESPONSES,
    NOT_FOUND_RESPONSES,
    V2_INFER_EXTRA,
    V2_INFER_RESPONSES,
    json_body,
)
from app.api.received import received_at
from app.api.request_params import note_unused
from app.api.security import short_repr
from app.errors import ModelNotReady, ServingError
from app.repository.triton_config import config_parameters, triton_backend, triton_platform

# Triton's extension names for what this server serves (shared memory,
# trace, logging, classification, sequences and scheduling policies are
# not: app/api/unsupported_routes.py answers theirs as Triton without them).
EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
    "parameters",
]


def server_metadata(ctx: ApiContext) -> m.ServerMetadata:
    return m.ServerMetadata(
        name=ctx.server_name, version=ctx.server_version, extensions=EXTENSIONS
    )


def health_ready(ctx: ApiContext) -> m.ReadyResponse:
    try:
        service = ctx.get_service()
        ready = bool(service.server_ready())
    except ServingError as e:
        raise NotReady(f"server not ready: {hide_paths(e.message)}") from None
    capacity_of = getattr(service, "capacity", None)
    capacity = capacity_of() if callable(capacity_of) else {}
    if not ready:
        failed = capacity.get("models_failed")
        if failed:
            raise NotReady(
                f"server not ready: {', '.join(failed)} failed to load "
                "(the repository index gives the reason)"
            )
        missing = capacity.get("models_unavailable")
        if missing:
            raise NotReady(
                f"server not ready: no live device for {', '.join(missing)} "
                f"({capacity.get('devices_alive')}/{capacity.get('devices_total')} "
                "devices alive)"
            )
        raise NotReady("server not ready")
    return m.ReadyResponse(
        ready=True,
        devices_alive=capacity.get("devices_alive"),
        devices_total=capacity.get("devices_total"),
    )


def model_metadata(ctx: ApiContext, name: str, version: str | None) -> m.ModelMetadata:
    config = lookup_model(ctx.get_service(), name, version)

    def tensors(specs: Sequence[Any]) -> list[m.TensorMetadata]:
        return [
            m.TensorMetadata(name=s.name, datatype=s.datatype, shape=list(s.shape)) for s in specs
        ]

    return m.ModelMetadata(
        name=config.model_name,
        versions=list(config.served_versions),
        platform=triton_platform(config.backend),
        inputs=tensors(config.inputs),
        outputs=tensors(config.outputs),
    )


def model_config(ctx: ApiContext, name: str, version: str | None) -> m.ModelConfigResponse:
    config = lookup_model(ctx.get_service(), name, version)

    def tensors(specs: Sequence[Any]) -> list[m.ModelConfigTensor]:
        return [
            m.ModelConfigTensor(
                name=s.name, data_type=f"TYPE_{s.datatype}", dims=list(s.item_shape)
            )
            for s in specs
        ]

    return m.ModelConfigResponse(
        name=config.model_name,
        platform=triton_platform(config.backend),
        backend=triton_backend(config.backend),
        runtime=config.backend,
        version=config.version,
        max_batch_size=config.max_batch_size,
        slo_ms=config.slo_ms,
        allow_slo_loosening=config.allow_slo_loosening,
        devices=list(config.devices) if config.devices is not None else None,
        description=config.description,
        input=tensors(config.inputs),
        output=tensors(config.outputs),
        parameters={
            name: m.ModelConfigParameter(string_value=value)
            for name, value in config_parameters(config).items()
        },
    )


def model_ready(ctx: ApiContext, name: str, version: str | None) -> m.ModelReadyResponse:
    """200 ready; 400 not ready (unavailable, or the server starting or
    stopping); 404 unknown model or version."""
    try:
        service = ctx.get_service()
        config = lookup_model(service, name, version)
    except ModelNotReady as e:
        raise NotReady(e.message) from None
    except ServingError as e:
        if e.status < 500:
            raise
        raise NotReady(f"model {short_repr(name)} is not ready: {hide_paths(e.message)}") from None
    if not service.model_ready(config.name):
        raise NotReady(f"model {short_repr(name)} is not ready")
    return m.ModelReadyResponse(name=name, ready=True)


async def infer(ctx: ApiContext, name: str, version: str | None, request: Request) -> Response:
    """Run one inference (the routes' endpoint and the fast path's)."""
    service = ctx.get_service()
    config = lookup_model(service, name, version)
    limit = ctx.limits.for_model(config)
    header_value = request.headers.get(v2.HEADER_LENGTH)
    # all JSON text, or a JSON header before binary tensor data: the text is
    # held to MAX_JSON_BYTES too (app.api.limits)
    body = await read_body(request, ctx.limits.as_json(limit) if header_value is None else limit)
    header, binary = v2.split_body(body, header_value)
    if len(header) > ctx.limits.json.bytes:
        raise PayloadTooLarge(ctx.limits.json.exceeded(f"JSON header of {len(header)} bytes"))
    what = (
        "request body"
        if header_value is None
        else f"JSON header (the first {len(header)} bytes, per {v2.HEADER_LENGTH})"
    )
    try:
        req = await parse_body(m.V2InferRequest, header, what)
    except RequestSchemaError as exc:
        if request.headers.get("content-type", "").startswith("application/octet-stream"):
            # A binary body (any bytes, as its schema says) whose JSON header
            # is not a request cannot be read: 400, as Triton answers it.
            raise MalformedRequest(f"{what}: {exc.message}") from None
        raise
    call = v2.v2_call(
        config, req, binary, None if header_value is None else len(header), limit.bytes
    )
    for where, name in call.unused:
        note_unused(ctx.metrics, (name,), where)
    result = await service.infer(
        config.name,
        call.inputs,
        slo_ms=call.slo_ms,
        request_id=call.request_id,
        received_at=received_at(request.scope),
        app=call.app,
    )
    return v2.build_response(config, req, result, call.outputs)


async def repository_index(ctx: ApiContext, request: Request) -> list[m.RepositoryModel]:
    """Every model (an empty body) or the ready ones (`{"ready": true}`); a
    body that is not JSON, whitespace only included, is a 400 like any other."""
    body = await read_body(request, ctx.limits.index)
    ready_only = False
    if body:
        if not body.strip():
            raise MalformedRequest("request body is not valid JSON (only whitespace)")
        req = parse_model(m.RepositoryIndexRequest, body)
        ready_only = bool(req.ready)
    entries = [m.RepositoryModel.model_validate(e) for e in ctx.get_service().repository_index()]
    for entry in entries:
        if entry.reason:
            entry.reason = hide_paths(entry.reason)
    if ready_only:
        entries = [e for e in entries if e.state == "READY"]
    return entries


_READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": m.ErrorResponse,
        "description": "Not ready (`reason` not_ready: unavailable, or the server is starting "
        "or shutting down), or not a valid model name.",
    },
    404: NOT_FOUND_RESPONSES[404],
}


def add_v2_routes(router: APIRouter, ctx: ApiContext) -> None:
    """Add the v2 routes to `router`, each calling a function above with `ctx`.
    A route is named after the function it calls (`name=` where the adapter's
    own name differs so as not to shadow that function)."""

    # -- server ---------------------------------------------------------------------

    @router.get(
        "/v2",
        name="server_metadata",
        response_model=m.ServerMetadata,
        tags=["v2"],
        summary="Server metadata",
        operation_id="v2_server_metadata",
    )
    async def get_server_metadata() -> m.ServerMetadata:
        return server_metadata(ctx)

    @router.get(
        "/v2/health/live",
        response_model=m.LiveResponse,
        tags=["v2"],
        summary="Liveness (200: live)",
        operation_id="v2_health_live",
    )
    async def health_live() -> m.LiveResponse:
        return m.LiveResponse(live=True)

    @router.get(
        "/v2/health/ready",
        name="health_ready",
        response_model=m.ReadyResponse,
        response_model_exclude_none=True,
        responses={400: {"model": m.ErrorResponse, "description": "Not ready."}},
        tags=["v2"],
        summary="Readiness (200: ready, 400: not ready)",
        operation_id="v2_health_ready",
    )
    async def get_health_ready() -> m.ReadyResponse:
        return health_ready(ctx)

    # -- models ---------------------------------------------------------------------

    @router.get(
        "/v2/models/{name}",
        response_model=m.ModelMetadata,
        responses=NOT_FOUND_RESPONSES,
        tags=["v2"],
        summary="Model metadata",
        operation_id="v2_model_metadata",
    )
    async def get_model_metadata(name: str) -> m.ModelMetadata:
        return model_metadata(ctx, name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}",
        response_model=m.ModelMetadata,
        responses=NOT_FOUND_RESPONSES,
        tags=["v2"],
        summary="Model metadata (one version)",
        operation_id="v2_model_version_metadata",
    )
    async def get_model_version_metadata(name: str, version: str) -> m.ModelMetadata:
        return model_metadata(ctx, name, version)

    @router.get(
        "/v2/models/{name}/config",
        response_model=m.ModelConfigResponse,
        responses=NOT_FOUND_RESPONSES,
        tags=["v2"],
        summary="Model configuration (Triton-style)",
        operation_id="v2_model_config",
    )
    async def get_model_config(name: str) -> m.ModelConfigResponse:
        return model_config(ctx, name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}/config",
        response_model=m.ModelConfigResponse,
        responses=NOT_FOUND_RESPONSES,
        tags=["v2"],
        summary="Model configuration (one version)",
        operation_id="v2_model_version_config",
    )
    async def get_model_version_config(name: str, version: str) -> m.ModelConfigResponse:
        return model_config(ctx, name, version)

    @router.get(
        "/v2/models/{name}/ready",
        response_model=m.ModelReadyResponse,
        responses=_READY_RESPONSES,
        tags=["v2"],
        summary="Model readiness (200: ready, 400: not ready)",
        operation_id="v2_model_ready",
    )
    async def get_model_ready(name: str) -> m.ModelReadyResponse:
        return model_ready(ctx, name, None)

    @router.get(
        "/v2/models/{name}/versions/{version}/ready",
        response_model=m.ModelReadyResponse,
        responses=_READY_RESPONSES,
        tags=["v2"],
        summary="Model readiness (one version)",
        operation_id="v2_model_version_ready",
    )
    async def get_model_version_ready(name: str, version: str) -> m.ModelReadyResponse:
        return model_ready(ctx, name, version)

    # -- inference ------------------------------------------------------------------

    @router.post(
        "/v2/models/{name}/infer",
        response_model=m.V2InferResponse,
        responses=V2_INFER_RESPONSES,
        tags=["v2"],
        summary="Run one inference (KServe v2, JSON or binary tensor data)",
        operation_id="v2_infer",
        openapi_extra=V2_INFER_EXTRA,
    )
    async def infer_v2(name: str, request: Request) -> Response:
        return await infer(ctx, name, None, request)

    @router.post(
        "/v2/models/{name}/versions/{version}/infer",
        response_model=m.V2InferResponse,
        responses=V2_INFER_RESPONSES,
        tags=["v2"],
        summary="Run one inference on a model version",
        operation_id="v2_infer_version",
        openapi_extra=V2_INFER_EXTRA,
    )
    async def infer_v2_version(name: str, version: str, request: Request) -> Response:
        return await infer(ctx, name, version, request)

    # -- repository -----------------------------------------------------------------

    @router.post(
        "/v2/repository/index",
        name="repository_index",
        response_model=list[m.RepositoryModel],
        responses={code: ERROR_RESPONSES[code] for code in (400, 413, 415, 422, 503)},
        tags=["v2"],
        summary="Models in the repository",
        operation_id="v2_repository_index",
        openapi_extra=json_body(
            m.RepositoryIndexRequest, "Optional filter; an empty body lists every model.", False
        ),
    )
    async def post_repository_index(request: Request) -> list[m.RepositoryModel]:
        return await repository_index(ctx, request)
