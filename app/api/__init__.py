"""The HTTP API: native `/infer`, KServe v2 (binary tensor extension included), `/metrics`.

from app.api import Metrics, create_api
app = create_api(lambda: service, metrics, lifespan=lifespan,
                 max_body_bytes=settings.max_body_bytes,      # env MAX_BODY_BYTES
                 admin_token=settings.admin_token,            # env ADMIN_TOKEN
                 bind_host=settings.host)                     # env HOST

Management routes take `Depends(app.state.require_admin)` (app.api.security).
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
