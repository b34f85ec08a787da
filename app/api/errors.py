"""HTTP errors: every error body is `{"error": message, "reason": code}`.

Error mapping: a `ServingError` → its `.status` (InvalidInput 400,
ModelNotFound 404, Dropped 503 with its reason, Overloaded 429 with
Retry-After, ...); malformed bodies (bad JSON, truncated or lying binary
sizes, bad headers) 400; bodies that do not fit the schema 422; body over
`max_body_bytes` 413; unsupported Content-Encoding 415; a model name that
cannot be a model's (`../x`, NUL bytes, ...) 400 before the service is asked;
management routes without a valid token 401, or 403 when they are off (see
app.api.security); anything unexpected 500 (logged).

An answer names no file or host detail: a 500 says only that the log has the
details (an exception's text may name files), and the message of a server-side
error (5xx: a model's load error, an executor's failure) has its absolute
paths cut to their last component (`hide_paths`); the log keeps the whole
message. Messages of 4xx errors are about the request and echo only what the
client sent.

`install_error_handlers` gives a FastAPI app these answers; without them errors
would get FastAPI's default bodies. The inference fast path answers with the
same functions (`serving_error_response`, `unexpected_error_response`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.api import models as m
from app.api.security import short_repr
from app.errors import Overloaded, ServingError, hide_paths

log = logging.getLogger(__name__)


class MalformedRequest(ServingError):
    """The body cannot be read: bad JSON, truncated or lying binary sizes."""

    status = 400
    reason = "malformed_request"


class RequestSchemaError(ServingError):
    """Well-formed JSON that does not fit the request schema."""

    status = 422
    reason = "invalid_request"


class PayloadTooLarge(ServingError):
    status = 413
    reason = "payload_too_large"


class UnsupportedEncoding(ServingError):
    status = 415
    reason = "unsupported_encoding"


class NotReady(ServingError):
    """A health or readiness check that answers "no" (KServe: a 4xx status)."""

    status = 400
    reason = "not_ready"


def error_response(
    status: int, message: str, reason: str | None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"error": message}
    if reason is not None:
        body["reason"] = reason
    return JSONResponse(body, status_code=status, headers=headers)


def serving_error_response(request: Request, exc: ServingError) -> Response:
    """The JSON error answer to a ServingError (FastAPI's handler and the fast path)."""
    headers = dict(getattr(exc, "headers", None) or {})
    if isinstance(exc, Overloaded):
        headers.setdefault("Retry-After", "1")
    message = exc.message
    if exc.status >= 500:
        if exc.status != 503:
            log.error("%s %s: %s", request.method, request.url.path, message)
        message = hide_paths(message)
    return error_response(exc.status, message, exc.reason, headers or None)


def unexpected_error_response(exc: Exception) -> JSONResponse:
    """500; the exception goes to the log (its text may name files), not to the client."""
    return error_response(
        500, f"internal error ({type(exc).__name__}); the server log has the details", "internal"
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error raised in `app`'s routes with the API's JSON error body."""
    app.add_exception_handler(ServingError, _serving_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler)


async def _serving_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServingError)
    return serving_error_response(request, exc)


async def _validation_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "request body is not valid JSON", MalformedRequest.reason)
    return error_response(422, format_validation_errors(errors), RequestSchemaError.reason)


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = str(exc.detail)
    headers = exc.headers
    if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
        what = "no such route" if exc.status_code == 404 else "method not allowed"
        message = f"{what}: {request.method} {short_repr(request.url.path)}"
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    return error_response(exc.status_code, message, reason, headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method a route of this path takes (Starlette's 405 names only
    the first route's, where a path has one route per method)."""
    methods: set[str] = set()
    routes = list(request.app.router.routes)
    while routes:
        route = routes.pop()
        included = getattr(route, "original_router", None)  # a router included whole
        if included is not None:
            routes.extend(included.routes)
            continue
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


async def _unexpected_error_handler(request: Request, exc: Exception) -> Response:
    # Starlette re-raises after sending this, so the server logs the traceback.
    return unexpected_error_response(exc)


# ------------------------------------------------------------------ validation messages


def format_validation_errors(errors: Sequence[Any], raw: Any = None, *, limit: int = 5) -> str:
    """pydantic errors → one line naming each field (and the v2 tensor by name)."""
    parts: list[str] = []
    for err in errors[:limit]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        msg = err.get("msg", "invalid")
        if len(loc) == 3 and loc[0] == "inputs" and loc[2] in _NATIVE_UNION_TAGS:
            # native tensor that is neither a list nor {data, shape}: one message
            loc, msg = loc[:2], "expected a (nested) list of numbers or an object {data, shape}"
        if loc and loc[-1] == "slo_ms":
            msg += f" (milliseconds: more than 0, at most {m.MAX_SLO_MS:.0f} = 1 hour)"
        text = _loc_text(loc, raw)
        line = f"{text}: {msg}" if text else msg
        if line not in parts:
            parts.append(line)
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return "; ".join(parts)


_NATIVE_UNION_TAGS = ("list[any]", "TensorData")


def _loc_text(loc: list[Any], raw: Any) -> str:
    # v2: ("inputs", 0, "shape", 1) → "input 'x' (inputs[0]).shape[1]"
    if (
        len(loc) >= 2
        and loc[0] in ("inputs", "outputs")
        and isinstance(loc[1], int)
        and isinstance(raw, dict)
    ):
        items = raw.get(loc[0])
        name = None
        if isinstance(items, list) and loc[1] < len(items) and isinstance(items[loc[1]], dict):
            name = items[loc[1]].get("name")
        head = f"{loc[0]}[{loc[1]}]"
        if isinstance(name, str):
            head = f"{loc[0][:-1]} '{name}' ({head})"
        return head + _path(loc[2:])
    # native: ("inputs", "x", "list[any]") → "input 'x'"
    if len(loc) >= 2 and loc[0] == "inputs" and isinstance(loc[1], str):
        rest = [p for p in loc[2:] if p not in _NATIVE_UNION_TAGS]
        return f"input '{loc[1]}'" + _path(rest)
    return _path(loc).lstrip(".")


def _path(loc: Sequence[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
