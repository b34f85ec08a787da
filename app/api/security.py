"""Access control for management routes, and safe model names from URLs.

Management routes (repository load/unload, policy or settings changes) are
guarded by `require_token`, a FastAPI dependency::

    guard = require_token(admin_token, host=bind_host)
    router = APIRouter(prefix="/v2/repository", dependencies=[Depends(guard)])

or, on an app built by `create_api(..., admin_token=..., bind_host=...)`, the
guard it made: `Depends(app.state.require_admin)`.

| token configured | bound to          | a request to a management route               |
|------------------|-------------------|-----------------------------------------------|
| yes              | anything          | needs `Authorization: Bearer <token>` (else 401) |
| no               | loopback (default)| allowed: only local processes can connect       |
| no               | non-loopback      | 403: management is off until ADMIN_TOKEN is set |

The token is the `ADMIN_TOKEN` setting (`Settings.admin_token`, also
`--admin-token`); the comparison is constant-time. Inference, health, metadata,
repository index, statistics and metrics routes never need the token; the
management routes are model load and unload (app.api.repository_routes).
`exposure_warning` is the
line the server logs at start when it binds a non-loopback address without a
token, so that an operator sees the server is reachable from other machines and
that management is off.

`check_model_name` is applied to every model name that comes from a request
(URL path or body) before the service is asked about it, so a name can never
name a path outside the model repository (`../x`, `/etc/passwd`, `a%2Fb`,
NUL bytes, ...).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from fastapi import Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.errors import InvalidInput, ServingError
from app.repository.loader import validate_model_name

ADMIN_TOKEN_ENV = "ADMIN_TOKEN"
MAX_MODEL_NAME_LENGTH = 255  # one path component on every common file system
# GET /v2/models/stats is Triton's statistics route, not a model's metadata.
RESERVED_MODEL_NAMES = frozenset({"stats"})


class Unauthorized(ServingError):
    """A management route without a valid bearer token (RFC 6750: 401 + WWW-Authenticate)."""

    status = 401
    reason = "unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        super().__init__(message)
        challenge = 'Bearer realm="management"'
        if invalid_token:
            challenge += ', error="invalid_token"'
        self.headers = {"WWW-Authenticate": challenge}


class ManagementDisabled(ServingError):
    """Management routes are off: bound to a non-loopback host without a token."""

    status = 403
    reason = "management_disabled"


class InvalidModelName(InvalidInput):
    reason = "invalid_model_name"


def short_repr(text: str, limit: int = 80) -> str:
    """`repr(text)`, cut to about `limit` characters (error messages echo client input)."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"... ({len(text)} characters)"


def check_model_name(name: str) -> str:
    """`name` if it can be a model's name (one safe path component), else 400."""
    if len(name) > MAX_MODEL_NAME_LENGTH:
        raise InvalidModelName(
            f"invalid model name {short_repr(name)}: longer than {MAX_MODEL_NAME_LENGTH} characters"
        )
    if name in RESERVED_MODEL_NAMES:
        raise InvalidModelName(
            f"invalid model name {short_repr(name)}: reserved (/v2/models/{name} is the "
            "statistics route)"
        )
    try:
        return validate_model_name(name)
    except ValueError:
        raise InvalidModelName(
            f"invalid model name {short_repr(name)}: a model name is one path component of "
            "letters, digits, '_', '.' and '-', without '..'"
        ) from None


def is_loopback(host: str) -> bool:
    """Whether binding to `host` accepts connections from this machine only."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume reachable from outside


def management_enabled(token: str | None, host: str) -> bool:
    """Management routes are on with a token, or without one on a loopback host."""
    return bool(token) or is_loopback(host)


def exposure_warning(token: str | None, host: str) -> str | None:
    """What to log at start when binding `host` without a token exposes the
    server beyond this machine (None on a loopback host or with a token)."""
    if management_enabled(token, host):
        return None
    return (
        f"binding {host!r}, which is not a loopback address: the server is reachable from "
        f"other machines, and without {ADMIN_TOKEN_ENV} management routes are off "
        f"(403); set {ADMIN_TOKEN_ENV} to enable them, or HOST=127.0.0.1 to serve this "
        "machine only"
    )


_bearer = HTTPBearer(
    auto_error=False,
    description=f"Management routes: `Authorization: Bearer <{ADMIN_TOKEN_ENV}>`.",
)


def check_management(token: str | None, host: str, presented: str | None) -> None:
    """Whether a management request may go on: `token` is ADMIN_TOKEN (None
    or "" for none), `host` the bind address, `presented` the request's
    bearer token (None for none). ManagementDisabled (403) or Unauthorized
    (401) when not; the HTTP guard and the gRPC endpoint share this."""
    if not token:
        if is_loopback(host):
            return
        raise ManagementDisabled(
            f"management routes are disabled: the server is bound to {host!r}, which is not "
            f"a loopback address, and no {ADMIN_TOKEN_ENV} is set"
        )
    if presented is None:
        raise Unauthorized(
            "this route needs an 'Authorization: Bearer <token>' header "
            f"(the server's {ADMIN_TOKEN_ENV})"
        )
    if not hmac.compare_digest(presented.encode(), token.encode()):
        raise Unauthorized("invalid bearer token", invalid_token=True)


def require_token(token: str | None, *, host: str = "127.0.0.1") -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency guarding management routes (see the module docstring).

    `token` is the configured ADMIN_TOKEN (None or "" for none), `host` the
    address the server binds. Errors are `ServingError`s, answered as
    `{"error", "reason"}` JSON by the handlers `install` adds.
    """
    expected = token or None
    loopback = is_loopback(host)

    async def guard(
        credentials: HTTPAuthorizationCredentials | None = Security(_bearer),  # noqa: B008
    ) -> None:
        check_management(expected, host, credentials.credentials if credentials else None)

    # Whether a request needs no token (loopback, none set): the OpenAPI
    # document then says the bearer token is optional (app.api.repository_routes).
    guard.open = expected is None and loopback  # type: ignore[attr-defined]
    return guard


__all__ = [
    "ADMIN_TOKEN_ENV",
    "RESERVED_MODEL_NAMES",
    "InvalidModelName",
    "ManagementDisabled",
    "Unauthorized",
    "check_management",
    "check_model_name",
    "exposure_warning",
    "is_loopback",
    "management_enabled",
    "require_token",
    "short_repr",
]
