"""What the endpoints are given: `ApiContext`, built once by `install`.

Every endpoint function (app.api.native, app.api.v2_routes) takes the context
as its first argument; the routers bind it, and the inference fast path
(app.api.fastpath) passes the same context to the same functions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from app.api.errors import hide_paths
from app.api.limits import DEFAULT_MAX_JSON_BYTES, RequestLimits
from app.api.security import check_model_name, short_repr
from app.errors import ModelNotFound, ModelNotReady, ModelUnloaded
from app.repository.config import ModelConfig
from app.server.metrics import Metrics
from app.server.service import InferenceService

SERVER_NAME = "deadline-serve"

ServiceProvider = Callable[[], InferenceService]


def server_version() -> str:
    """The installed package's version (server metadata, OpenAPI info)."""
    try:
        from importlib.metadata import version

        return version(SERVER_NAME)
    except Exception:
        return "0.1.0"


@dataclass(frozen=True)
class ApiContext:
    """The server as the endpoints see it: `get_service()`, called on every
    request (app.api.routes: why), the metrics `/metrics` serves, the cap on
    request bodies and each model's own limit under it (`limits`,
    app.api.limits) and the version the server reports."""

    get_service: ServiceProvider
    metrics: Metrics
    max_body_bytes: int
    server_version: str
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES
    server_name: str = SERVER_NAME  # server metadata's `name` (SERVER_NAME)
    # the guard of management routes (app.api.security.require_token); None:
    # the default guard, management from loopback only
    admin_guard: Callable[..., Awaitable[None]] | None = None
    limits: RequestLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        limits = RequestLimits(self.max_body_bytes, self.max_json_bytes)
        object.__setattr__(self, "limits", limits)


def unknown_model(name: str, version: str | None = None) -> str:
    """Triton's words for a model or version it does not serve
    (triton-inference-server/core, model_repository_manager.cc and
    model_lifecycle.cc), which Triton's example clients look for."""
    if version is None:
        return f"Request for unknown model: {short_repr(name)} is not found"
    shown = version if version.isdigit() and len(version) < 20 else short_repr(version)
    return f"Request for unknown model: {short_repr(name)} version {shown} is not found"


def lookup_model(service: InferenceService, name: str, version: str | None = None) -> ModelConfig:
    """The model's config; `name` is checked to be a safe model name first, so
    the service is never asked about `../x`, absolute paths or NUL bytes.

    The answers name only the model asked for: not the other models (a 404
    is no directory listing), in Triton's words (`unknown_model`). Why a
    model failed to load is told as the service words it (files relative to
    the repository), with any absolute path left cut to its last component;
    the log has the whole text.

    `version` None is the model's default version (the highest it serves);
    the config's `name` is the served model's key, which the service's
    `infer` and `model_ready` take (app/repository/config.py: version_key)."""
    check_model_name(name)
    try:
        config = service.model_config(name)
    except (KeyError, ModelNotFound):
        raise ModelNotFound(unknown_model(name)) from None
    except ModelUnloaded:
        raise  # unloaded on request: its message names only the model
    except ModelNotReady as exc:
        raise ModelNotReady(hide_paths(exc.message)) from None
    if version is None or version == config.version:
        return config
    if version not in config.served_versions:
        raise ModelNotFound(unknown_model(name, version))
    try:
        return service.model_config(name, version)
    except ModelUnloaded:
        raise
    except ModelNotReady as exc:
        raise ModelNotReady(hide_paths(exc.message)) from None
