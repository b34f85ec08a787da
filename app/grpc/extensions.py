"""The RPCs this endpoint does not serve (yet), each answered UNIMPLEMENTED
with a message saying what is missing.

Statistics (`ModelStatistics`) and model control (`RepositoryModelLoad`,
`RepositoryModelUnload`) are Triton extensions still to come: each is a
mixin of its own, so that an implementation replaces its mixin here and the
servicer (app.grpc.servicer) stays as it is. A mixin's RPCs reach the server
through `self.get_service()` and answer through app.grpc.status.answer.
The shared-memory, streaming, trace and log RPCs are not supported.
"""

from __future__ import annotations

from typing import Any

import grpc

from app.grpc.status import unimplemented

Context = grpc.aio.ServicerContext


class StatisticsRpcs:
    """Triton's statistics extension: not implemented yet."""

    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        await unimplemented("ModelStatistics: model statistics are not implemented yet").abort(
            context
        )


class ModelControlRpcs:
    """Triton's model-control extension: not implemented yet."""

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        await unimplemented(
            "RepositoryModelLoad: loading models at run time is not implemented yet"
        ).abort(context)

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        await unimplemented(
            "RepositoryModelUnload: unloading models at run time is not implemented yet"
        ).abort(context)


_SHARED_MEMORY = "the shared-memory extension is not supported"


class UnsupportedRpcs:
    """RPCs of the service that this server does not offer."""

    async def ModelStreamInfer(self, request_iterator: Any, context: Context) -> Any:
        await unimplemented("ModelStreamInfer: streaming inference is not supported").abort(context)

    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        await unimplemented(f"SystemSharedMemoryStatus: {_SHARED_MEMORY}").abort(context)

    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        await unimplemented(f"SystemSharedMemoryRegister: {_SHARED_MEMORY}").abort(context)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        await unimplemented(f"SystemSharedMemoryUnregister: {_SHARED_MEMORY}").abort(context)

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        await unimplemented(f"CudaSharedMemoryStatus: {_SHARED_MEMORY}").abort(context)

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        await unimplemented(f"CudaSharedMemoryRegister: {_SHARED_MEMORY}").abort(context)

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        await unimplemented(f"CudaSharedMemoryUnregister: {_SHARED_MEMORY}").abort(context)

    async def TraceSetting(self, request: Any, context: Context) -> Any:
        await unimplemented("TraceSetting: tracing is not supported").abort(context)

    async def LogSettings(self, request: Any, context: Context) -> Any:
        await unimplemented("LogSettings: log settings cannot be changed over gRPC").abort(context)
