"""Two reference servers that split the daemon's CPU per request into layers
(`python -m bench.cpu_per_request --layers asgi-floor,api-noop`):

- `asgi_floor`: uvicorn (httptools and uvloop, as the daemon runs it) with
  an ASGI app that reads each request's body and sends one fixed JSON
  answer: what uvicorn alone costs a request;
- `api_noop`: the daemon's HTTP API (`app.api`, its inference fast path
  included) in front of `NoopService`, which answers every inference at once
  with zeros of the model's outputs — no scheduling core, executor, arena,
  timer, metrics of the service or statistics: what the API layer adds.

The daemon's figure less `api_noop`'s is what serving (the service,
dispatcher, core, executors and their messages) costs; `api_noop`'s less
`asgi_floor`'s is the API layer's (parsing, checks, tensors, the answer's
JSON). Both serve the models of the repository named by
`CPU_LAYERS_REPOSITORY` (the setup's; `bench.cpu_per_request` sets it), so
that the load generator's requests are the daemon's.

    python -m uvicorn bench.cpu_layers:asgi_floor
    export CPU_LAYERS_REPOSITORY=bench/repositories/live
    python -m uvicorn --factory bench.cpu_layers:api_noop
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.api import Metrics, create_api
from app.errors import ModelNotFound
from app.repository.config import ModelConfig
from app.repository.loader import load_repository
from app.server.service import InferResult

REPOSITORY_ENV = "CPU_LAYERS_REPOSITORY"


@dataclass(frozen=True)
class Layer:
    app: tuple[str, ...]  # uvicorn's arguments naming the app
    label: str  # its row in bench.cpu_per_request's table


# --layers name → the reference server
LAYERS = {
    "asgi-floor": Layer(("bench.cpu_layers:asgi_floor",), "uvicorn alone (a fixed answer)"),
    "api-noop": Layer(
        ("--factory", "bench.cpu_layers:api_noop"), "the daemon's HTTP API, no-op service"
    ),
}

_ANSWER = b'{"outputs":[]}'
_ANSWER_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_ANSWER)).encode()),
]


async def asgi_floor(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the body, answer 200 with a fixed JSON body (lifespan ignored)."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _ANSWER_HEADERS})
    await send({"type": "http.response.body", "body": _ANSWER})


class NoopService:
    """The models of a repository, every inference answered at once with
    zeros of its outputs' shapes (batch dimension as the request's)."""

    def __init__(self, repository: Path) -> None:
        self.configs: dict[str, ModelConfig] = load_repository(repository).models

    def model_names(self) -> list[str]:
        return list(self.configs)

    def model_config(self, name: str, version: str | None = None) -> ModelConfig:
        try:
            return self.configs[name]
        except KeyError:
            raise ModelNotFound(f"unknown model {name!r}") from None

    def model_ready(self, name: str) -> bool:
        return name in self.configs

    def server_ready(self) -> bool:
        return True

    async def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        *,
        slo_ms: float | None = None,
        request_id: str | None = None,
        received_at: float | None = None,
        app: str = "",
    ) -> InferResult:
        config = self.configs[model]
        items = len(next(iter(inputs.values())))
        outputs = {
            spec.name: np.zeros((items, *(max(d, 1) for d in spec.item_shape)), spec.dtype)
            for spec in config.outputs
        }
        return InferResult(model, request_id, outputs, 0.0, 0.0, items, "none", app=app)


def api_noop() -> Any:
    """The API over `NoopService` (a uvicorn `--factory`)."""
    repository = os.environ.get(REPOSITORY_ENV)
    if not repository:
        raise SystemExit(f"{REPOSITORY_ENV} must name the model repository to serve")
    service = NoopService(Path(repository))
    return create_api(lambda: service, Metrics())
