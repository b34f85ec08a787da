"""The HTTP API: native `/infer`, KServe v2 (binary tensor extension included), `/metrics`.

from app.api import create_api
from app.server.metrics import Metrics
app = create_api(lambda: service, metrics, lifespan=lifespan,
                 max_body_bytes=settings.max_body_bytes,      # env MAX_BODY_BYTES
                 max_json_bytes=settings.max_json_bytes,      # env MAX_JSON_BYTES
                 admin_token=settings.admin_token,            # env ADMIN_TOKEN
                 bind_host=settings.host)                     # env HOST

Management routes take `Depends(app.state.require_admin)` (app.api.security).

The modules, from the wire inwards:

    connection  the uvicorn protocol: timeouts, size caps, the connection cap
    routes      create_api / install / build_router: every route, mounted on an app
    fastpath    the inference routes' short way past FastAPI's own stack
    context     ApiContext: what every endpoint function is given
    native      the native `POST /infer`
    v2_routes   the KServe v2 endpoints (metadata, health, readiness, infer, index)
    statistics_routes  Triton's statistics extension (/v2/models[/{m}]/stats)
    repository_routes  Triton's model load / unload (management: admin token)
    device_routes      the executor devices; a share reallocated (management)
    unsupported_routes shared memory, trace and logging, answered as Triton without them
    v2          the v2 codec: binary tensor data extension, requested outputs
    bodies      request bodies under the limit, parsing, JSON rendering of tensors
    limits      each model's request-body limit, derived from its input shapes
    tensors     tensors: decoding, checks against the model config, encoding
    models      the pydantic request and response models
    errors      error classes, the JSON error body, exception handlers
    openapi     request schemas and error documentation in the OpenAPI document
    security    model-name checks and the management-route token
    received    the time each request was received, stamped by the protocol

`Metrics` (app.server.metrics) is re-exported here.
"""

from app.api.routes import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_BYTES_ENV,
    build_router,
    create_api,
    install,
)
from app.api.security import ADMIN_TOKEN_ENV, require_token
from app.server.metrics import Metrics

__all__ = [
    "ADMIN_TOKEN_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_BYTES_ENV",
    "Metrics",
    "build_router",
    "create_api",
    "install",
    "require_token",
]
