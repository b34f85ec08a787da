"""Errors as gRPC statuses: the one table from a `ServingError` to a status code.

A `ServingError` carries the HTTP status the HTTP API answers with
(app.api.errors); gRPC answers the same error with the code this table gives
for that status, so both protocols classify every error alike:

    400 bad input (names the tensor), 422    INVALID_ARGUMENT
    404 unknown model or version             NOT_FOUND
    413 request over its model's limit       RESOURCE_EXHAUSTED
    429 queue or arena full                  RESOURCE_EXHAUSTED
    503 not ready, shutting down, dropped    UNAVAILABLE
        for its deadline, executor failed
    anything else (500)                      INTERNAL

The details are the error's message followed by its stable reason code, e.g.
`server is shutting down (reason: shutting_down)`; the reason also goes in the
trailing metadata under `reason`. As over HTTP, the message of a server-side
error has its absolute paths cut (app.api.errors.hide_paths) and anything
unexpected is INTERNAL with a message that points to the log, never the
exception's text.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from app.api.errors import hide_paths
from app.errors import ServingError

log = logging.getLogger(__name__)

T = TypeVar("T")

CODE_OF_HTTP_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True)
class RpcError:
    """How a call ends when it fails: code, details and the reason code."""

    code: grpc.StatusCode
    details: str
    reason: str

    async def abort(self, context: grpc.aio.ServicerContext) -> None:
        """End the call with this status (raises, as `context.abort` does)."""
        context.set_trailing_metadata((("reason", self.reason),))
        await context.abort(self.code, self.details)


def serving_error(exc: ServingError, rpc: str) -> RpcError:
    """The status of a `ServingError` raised while answering `rpc`."""
    message = exc.message
    if exc.status >= 500:
        if exc.status != 503:
            log.error("gRPC %s: %s", rpc, message)
        message = hide_paths(message)
    code = CODE_OF_HTTP_STATUS.get(exc.status, grpc.StatusCode.INTERNAL)
    return RpcError(code, f"{message} (reason: {exc.reason})", exc.reason)


def unexpected_error(exc: BaseException, rpc: str) -> RpcError:
    """INTERNAL; the exception goes to the log (its text may name files)."""
    log.error("gRPC %s failed", rpc, exc_info=exc)
    return RpcError(
        grpc.StatusCode.INTERNAL,
        f"internal error ({type(exc).__name__}); the server log has the details",
        "internal",
    )


def unimplemented(what: str) -> RpcError:
    return RpcError(
        grpc.StatusCode.UNIMPLEMENTED, f"{what} (reason: unimplemented)", "unimplemented"
    )


async def answer(
    context: grpc.aio.ServicerContext, rpc: str, work: Callable[[], Awaitable[T]]
) -> T:
    """`work()`'s result, or the call ended with the status of what it raised:
    every call that reaches a handler gets exactly one answer, and no
    exception escapes to the server (a cancelled call stays cancelled)."""
    try:
        return await work()
    except ServingError as exc:
        error = serving_error(exc, rpc)
    except Exception as exc:
        error = unexpected_error(exc, rpc)
    await error.abort(context)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort raises
