"""The RPCs of `inference.GRPCInferenceService` over the live service.

Each RPC does what its HTTP v2 route does (app.api.v2_routes) with the same
functions: `lookup_model` (model-name checks; an unknown model is NOT_FOUND
naming only that model), each model's request limit (app.api.limits), the
tensor checks of app.api.tensors (through app.grpc.tensors), and inference
through `InferenceService.infer`, the call the HTTP route makes — so gRPC
requests join the same queues as HTTP ones and may share their batches.

Health and readiness answer with a boolean, as the protocol says: a model
that failed to load or has no live device is `ready: false`, an unknown one
NOT_FOUND; the server is not ready while starting or shutting down.

A request's SLO clock starts when its handler starts (the message has been
received and parsed by then; HTTP stamps the first byte, app.api.received).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from app.api.context import SERVER_NAME, lookup_model
from app.api.errors import PayloadTooLarge, hide_paths
from app.api.limits import RequestLimits
from app.api.request_params import note_unused, request_slo
from app.errors import InvalidInput, ModelNotReady, ServingError
from app.grpc import metadata, tensors
from app.grpc.extensions import ModelControlRpcs, StatisticsRpcs, UnsupportedRpcs
from app.grpc.status import answer
from app.server.metrics import Metrics
from app.server.service import InferenceService

# Triton extensions this endpoint serves (binary tensor data is HTTP's: gRPC
# always carries raw bytes; `parameters`: request parameters, as Triton's).
EXTENSIONS = ["model_configuration", "statistics", "model_repository", "parameters"]

Context = grpc.aio.ServicerContext


class InferenceServicer(
    StatisticsRpcs,
    ModelControlRpcs,
    UnsupportedRpcs,
    service_pb2_grpc.GRPCInferenceServiceServicer,
):
    """`get_service()` is called on every request, as the HTTP routes do
    (the service may be replaced); `limits` holds each model's request limit."""

    def __init__(
        self,
        get_service: Callable[[], InferenceService],
        limits: RequestLimits,
        server_version: str,
        *,
        admin_token: str | None = None,
        bind_host: str = "127.0.0.1",
        metrics: Metrics | None = None,
        server_name: str = SERVER_NAME,
    ) -> None:
        self.get_service = get_service
        self.server_name = server_name
        self.metrics = metrics  # counts parameters accepted without effect
        self.limits = limits
        self.server_version = server_version
        self.admin_token = admin_token  # model control (app.grpc.extensions)
        self.bind_host = bind_host

    # -- server -------------------------------------------------------------------------

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> object:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> object:
        async def work() -> pb.ServerReadyResponse:
            try:
                ready = bool(self.get_service().server_ready())
            except ServingError:  # starting
                ready = False
            return pb.ServerReadyResponse(ready=ready)

        return await answer(context, "ServerReady", work)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> object:
        return pb.ServerMetadataResponse(
            name=self.server_name, version=self.server_version, extensions=EXTENSIONS
        )

    # -- models -------------------------------------------------------------------------

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> object:
        async def work() -> pb.ModelReadyResponse:
            service = self.get_service()
            try:
                config = lookup_model(service, request.name, request.version or None)
            except ModelNotReady:  # known, and failed to load or no device can run it
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=bool(service.model_ready(config.name)))

        return await answer(context, "ModelReady", work)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> object:
        async def work() -> pb.ModelMetadataResponse:
            config = lookup_model(self.get_service(), request.name, request.version or None)
            return metadata.model_metadata(config)

        return await answer(context, "ModelMetadata", work)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> object:
        async def work() -> pb.ModelConfigResponse:
            config = lookup_model(self.get_service(), request.name, request.version or None)
            return pb.ModelConfigResponse(config=metadata.model_config(config))

        return await answer(context, "ModelConfig", work)

    # -- inference ----------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> object:
        received_at = time.monotonic()

        async def work() -> pb.ModelInferResponse:
            service = self.get_service()
            name = request.model_name
            config = lookup_model(service, name, request.model_version or None)
            limit = self.limits.for_model(config)
            size = request.ByteSize()
            if size > limit.bytes:
                raise PayloadTooLarge(limit.exceeded(f"request of {size} bytes"))
            params = tensors.request_parameters(request)
            inputs = tensors.decode_inputs(config, request, limit.bytes)
            chosen = tensors.requested_outputs(config, request)
            for where, parameter in tensors.unused_parameters(request, params):
                note_unused(self.metrics, (parameter,), where)
            result = await service.infer(
                config.name,
                inputs,
                slo_ms=request_slo(config, params),
                request_id=request.id or None,
                received_at=received_at,
                app=params.app_id,
            )
            return tensors.build_response(config, request, result, chosen)

        return await answer(context, "ModelInfer", work)

    # -- repository ---------------------------------------------------------------------

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> object:
        async def work() -> pb.RepositoryIndexResponse:
            if request.repository_name:
                raise InvalidInput(
                    "repository_name must be empty: this server serves one repository"
                )
            response = pb.RepositoryIndexResponse()
            for entry in self.get_service().repository_index():
                if request.ready and entry["state"] != "READY":
                    continue
                response.models.add(
                    name=entry["name"],
                    version=entry["version"],
                    state=entry["state"],
                    reason=hide_paths(entry.get("reason") or ""),
                )
            return response

        return await answer(context, "RepositoryIndex", work)
