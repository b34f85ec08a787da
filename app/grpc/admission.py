"""How many gRPC calls the server takes at once, and what the others get.

grpcio's own cap (`grpc.aio.server(maximum_concurrent_rpcs=N)`) ends every
call beyond N with a bare CANCELLED: no details, nothing logged, nothing
counted, and the client cannot tell a refusal from a cancellation. Under a
burst of 10,000 concurrent calls that was 63 % of them.

`Admission` is a server interceptor that takes its place: a call that
arrives while `limit` calls are in progress is refused at once (before its
message is parsed, or as it starts) with RESOURCE_EXHAUSTED and the reason `overloaded` (in
the details and in the `reason` trailing metadata, as every refusal of the
service is: app/grpc/status.py), the gRPC form of HTTP's `429 overloaded`.
Each refusal is counted in the metrics (`grpc_refused`, by method) and
logged, at most once per `LOG_EVERY_S` with the number refused since.

Health calls (`ServerLive`, `ServerReady`, `ModelReady`) are never refused
nor counted: a liveness probe must get through a burst.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

log = logging.getLogger("app.server")

SERVICE = "/inference.GRPCInferenceService/"
HEALTH = frozenset({"ServerLive", "ServerReady", "ModelReady"})
LOG_EVERY_S = 5.0


class Admission(grpc.aio.ServerInterceptor):
    """Calls in progress at most `limit` (see the module docstring);
    `on_refused(method)` is called for each call refused."""

    def __init__(
        self,
        limit: int,
        on_refused: Callable[[str], None] = lambda method: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError(f"the gRPC call limit must be ≥ 1, got {limit}")
        self.limit = limit
        self.in_progress = 0
        self.refused = 0
        self._on_refused = on_refused
        self._clock = clock
        self._logged_at: float | None = None
        self._unlogged = 0

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        method = str(handler_call_details.method).removeprefix(SERVICE)
        handler = await continuation(handler_call_details)
        if handler is None or method in HEALTH or handler.unary_unary is None:
            return handler
        if self.in_progress >= self.limit:  # its message is not even parsed
            return grpc.unary_unary_rpc_method_handler(self._refuse(method))
        return grpc.unary_unary_rpc_method_handler(
            self._admitted(method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _admitted(
        self, method: str, behaviour: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def admitted(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Counted from here to its answer (a call never started holds
            # nothing); checked again, as calls of one burst all pass the
            # check above before any starts.
            if self.in_progress >= self.limit:
                return await self._refuse(method)(request, context)
            self.in_progress += 1
            try:
                return await behaviour(request, context)
            finally:
                self.in_progress -= 1

        return admitted

    def _refuse(self, method: str) -> Callable[..., Awaitable[Any]]:
        self.refused += 1
        self._on_refused(method)
        self._log(method)
        details = (
            f"server overloaded: {self.limit} calls in progress (MAX_CONNECTIONS); "
            "retry later (reason: overloaded)"
        )

        async def refuse(_request: bytes, context: grpc.aio.ServicerContext) -> Any:
            context.set_trailing_metadata((("reason", "overloaded"),))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, details)

        return refuse

    def _log(self, method: str) -> None:
        now = self._clock()
        self._unlogged += 1
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY_S:
            return
        log.warning(
            "gRPC: refused %d call(s) with RESOURCE_EXHAUSTED overloaded (last: %s): %d calls "
            "in progress, the limit (MAX_CONNECTIONS)",
            self._unlogged,
            method,
            self.limit,
        )
        self._logged_at, self._unlogged = now, 0
