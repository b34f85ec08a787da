"""Triton's extensions over gRPC, each a mixin of the servicer
(app.grpc.servicer), and the RPCs this endpoint does not serve, answered
UNIMPLEMENTED with a message saying what is missing.

- Statistics (`ModelStatistics`): the HTTP route's report
  (app.api.statistics_routes.model_statistics), as Triton's message.
- Model control (`RepositoryModelLoad`, `RepositoryModelUnload`): the live
  service's load and unload, behind the same admin rule as the HTTP routes
  (app.api.security.check_management): the bearer token comes in the call's
  `authorization` metadata (`Bearer <ADMIN_TOKEN>`); 401 → UNAUTHENTICATED,
  403 → PERMISSION_DENIED. A load's config override is the `config`
  parameter (a JSON string), as tritonclient's `load_model(config=...)`
  sends it.

A mixin's RPCs reach the server through `self.get_service()` and answer
through app.grpc.status.answer. The shared-memory, streaming, trace and log
RPCs are answered as Triton without them answers (`UnsupportedRpcs`).
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from app.api.security import check_management, check_model_name
from app.api.statistics_routes import model_statistics
from app.api.unsupported_routes import NO_LOGGING, SHM_DISABLED, shm_region_missing
from app.errors import InvalidInput, ServingError
from app.grpc.status import RpcError, answer, unimplemented

Context = grpc.aio.ServicerContext


class ModelControlDisabled(ServingError):
    """The service behind the endpoint cannot load or unload models."""

    status = 501
    reason = "not_supported"


class StatisticsRpcs:
    """Triton's statistics extension."""

    get_service: Any

    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        async def work() -> pb.ModelStatisticsResponse:
            service = self.get_service()
            refresh = getattr(service, "refresh_statistics", None)
            if refresh is not None:  # an API worker's: the scheduler's figures now
                await refresh()
            report = model_statistics(service, request.name or None, request.version or None)
            return json_format.ParseDict(report, pb.ModelStatisticsResponse())

        return await answer(context, "ModelStatistics", work)


class ModelControlRpcs:
    """Triton's model-control extension."""

    get_service: Any
    admin_token: str | None
    bind_host: str

    def _check_admin(self, context: Context) -> None:
        presented = None
        for key, value in context.invocation_metadata() or ():
            if key.lower() == "authorization":
                scheme, _, credentials = str(value).partition(" ")
                presented = credentials.strip() if scheme.lower() == "bearer" else ""
        check_management(self.admin_token, self.bind_host, presented)

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        async def work() -> pb.RepositoryModelLoadResponse:
            self._check_admin(context)
            name = check_model_name(request.model_name)
            override = None
            for key, parameter in request.parameters.items():
                if key != "config":
                    raise InvalidInput(
                        f"load parameter {key!r} is not supported (only 'config', a JSON model "
                        "config override)"
                    )
                if parameter.WhichOneof("parameter_choice") != "string_param":
                    raise InvalidInput("load parameter 'config' must be a string (JSON)")
                override = parameter.string_param
            load = getattr(self.get_service(), "load_model", None)
            if load is None:
                raise ModelControlDisabled("this server cannot load models")
            await load(name, override)
            return pb.RepositoryModelLoadResponse()

        return await answer(context, "RepositoryModelLoad", work)

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        async def work() -> pb.RepositoryModelUnloadResponse:
            self._check_admin(context)
            name = check_model_name(request.model_name)
            # tritonclient always sends unload_dependents; with no ensembles
            # here no model depends on another, so either value means the same.
            unknown = sorted(set(request.parameters) - {"unload_dependents"})
            if unknown:
                raise InvalidInput(
                    f"unload parameters {unknown} are not supported (only unload_dependents)"
                )
            unload = getattr(self.get_service(), "unload_model", None)
            if unload is None:
                raise ModelControlDisabled("this server cannot unload models")
            await unload(name)
            return pb.RepositoryModelUnloadResponse()

        return await answer(context, "RepositoryModelUnload", work)


def _unavailable(what: str) -> RpcError:
    return RpcError(grpc.StatusCode.UNAVAILABLE, f"{what} (reason: unsupported)", "unsupported")


class UnsupportedRpcs:
    """RPCs of extensions this server does not offer, answered as Triton
    answers them when it runs without them (src/grpc/grpc_server.cc): no
    shared-memory region is registered (the status is empty) and client
    shared memory is disabled (UNIMPLEMENTED, Triton's UNSUPPORTED);
    tracing and dynamic logging are UNAVAILABLE; streaming inference is
    UNIMPLEMENTED."""

    async def ModelStreamInfer(self, request_iterator: Any, context: Context) -> Any:
        await unimplemented("ModelStreamInfer: streaming inference is not supported").abort(context)

    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        if request.name:
            await RpcError(
                grpc.StatusCode.NOT_FOUND,
                f"{shm_region_missing('system', request.name)} (reason: not_found)",
                "not_found",
            ).abort(context)
        return pb.SystemSharedMemoryStatusResponse()

    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        await unimplemented(SHM_DISABLED).abort(context)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        await unimplemented(SHM_DISABLED).abort(context)

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        if request.name:
            await RpcError(
                grpc.StatusCode.NOT_FOUND,
                f"{shm_region_missing('cuda', request.name)} (reason: not_found)",
                "not_found",
            ).abort(context)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        await unimplemented(SHM_DISABLED).abort(context)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        await unimplemented(SHM_DISABLED).abort(context)

    async def TraceSetting(self, request: Any, context: Context) -> Any:
        await _unavailable("the server does not support trace").abort(context)

    async def LogSettings(self, request: Any, context: Context) -> Any:
        await _unavailable(NO_LOGGING).abort(context)
