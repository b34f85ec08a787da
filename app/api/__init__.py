"""The HTTP API: native `/infer`, KServe v2 (binary tensor extension included), `/metrics`.

from app.api import Metrics, create_api
app = create_api(lambda: service, metrics, lifespan=lifespan)
"""

from app.api.metrics import Metrics
from app.api.routes import DEFAULT_MAX_BODY_BYTES, build_router, create_api, install

__all__ = ["DEFAULT_MAX_BODY_BYTES", "Metrics", "build_router", "create_api", "install"]
