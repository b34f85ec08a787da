"""BentoML serving a model repository with adaptive batching (the BentoML peer).

Run by `bench/peers/bentoml_launcher.py` as ``bentoml serve
bench.peers.bentoml_service:PeerService`` with the peer's own interpreter
(BentoML's pins conflict with the server's packages; see the launcher). The
service is built at import from the JSON file named by ``BENTOML_PEER_CONFIG``
(the launcher writes it; `bentoml_launcher.plan_service` makes its content):

- **API**: one batchable endpoint per model, ``POST /infer/<model>`` taking
  ``{"<input name>": [[...]]}`` (one request = a batch of rows along dim 0) and
  answering the output array as nested lists, BentoML's own numpy-over-JSON
  form. The load generator's body comes from `bench.peers.bentoml_grid.
  bentoml_request`. One input and one output per model: a batchable BentoML
  API takes exactly one argument.
- **Batching**: ``@bentoml.api(batchable=True, max_batch_size=…,
  max_latency_ms=…)``. BentoML's dispatcher fits ℓ(b) = a·b + c online from the
  batches it runs, waits for more requests while it predicts the oldest still
  finishes within ``max_latency_ms``, and cancels (sheds) the oldest request
  when it predicts it would not: the client gets **503** ("process is
  overloaded"). With ``max_concurrency`` set (``traffic``), requests over it
  get **429**; past ``timeout`` **504**. So BentoML is the one deadline-aware
  peer, with a single deadline per endpoint (``max_latency_ms``) instead of a
  per-request SLO.
- **Devices**: one worker process per device (``workers=``); worker *w*
  (BentoML's 1-based ``server_context.worker_index``) holds device w − 1 and
  serves every model on it. Emulated models hold the device for ℓ(b) with the
  daemon's own `EmulatedBackend` (same profile, same sleep + spin, same echo);
  ONNX models run the daemon's `OnnxBackend` (CPU EP, ``intra_op_num_threads =
  threads``, sequential) on one CPU slice per worker. Each endpoint has its own
  dispatcher, so two models on one device could run batches at once: a
  per-device lock serialises them (and ``threads=1`` gives the worker one
  thread for sync APIs anyway), as the Ray Serve peer's file lock does.
- **Kept light** as a careful user would: access log off; metrics left on
  (BentoML's default).
"""

from __future__ import annotations

import inspect
import json
import os
import threading
from pathlib import Path
from typing import Any

import bentoml
import numpy as np
from bentoml.exceptions import InvalidArgument

from app.repository.config import TensorSpec
from app.repository.loader import load_model_config
from app.runtime.backends import make_backend

CONFIG_ENV = "BENTOML_PEER_CONFIG"


def _read_config() -> dict[str, Any]:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise RuntimeError(
            f"{CONFIG_ENV} is not set: start the service with "
            "`python -m bench.peers.bentoml_launcher` (it writes the configuration)"
        )
    return json.loads(Path(path).read_text())


CONFIG = _read_config()


def _make_api(model: dict[str, Any]) -> Any:
    """The batchable API method of one model; its one parameter is named after
    the model's input, so the JSON field is the input's name."""
    name = model["name"]

    def infer(self: Any, batch: np.ndarray) -> np.ndarray:
        return self.run(name, batch)

    infer.__name__ = model["api"]
    infer.__qualname__ = f"PeerService.{model['api']}"
    params = [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter(
            model["input"], inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=np.ndarray
        ),
    ]
    infer.__signature__ = inspect.Signature(params, return_annotation=np.ndarray)  # type: ignore[attr-defined]
    infer.__annotations__ = {model["input"]: np.ndarray, "return": np.ndarray}
    return bentoml.api(
        route=model["route"],
        batchable=True,
        max_batch_size=int(model["max_batch_size"]),
        max_latency_ms=round(model["max_latency_ms"]),  # whole ms, BentoML's type
    )(infer)


class _Peer:
    """One worker: every model of the plan, loaded on this worker's device."""

    def __init__(self) -> None:
        worker = int(bentoml.server_context.worker_index or 1)
        self.device_index = worker - 1
        self.device = f"{CONFIG['device_kind']}:{self.device_index}"
        self.lock = threading.Lock()  # the device: one batch at a time, any model
        self.backends: dict[str, Any] = {}
        self.inputs: dict[str, TensorSpec] = {}
        for model in CONFIG["models"]:
            config = load_model_config(Path(model["directory"]))
            backend = make_backend(
                config, CONFIG["device_kind"], self.device_index, int(CONFIG["threads"])
            )
            backend.load(config)
            self.backends[config.name] = backend
            self.inputs[config.name] = config.inputs[0]

    def run(self, model: str, batch: np.ndarray) -> np.ndarray:
        spec = self.inputs[model]
        try:
            batch = np.asarray(batch, dtype=spec.dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"input {spec.name!r}: not {spec.datatype}: {exc}") from None
        if batch.ndim != len(spec.shape) or batch.shape[1:] != spec.item_shape:
            raise InvalidArgument(
                f"input {spec.name!r}: shape {list(batch.shape)}, expected [n, "
                + ", ".join(str(d) for d in spec.item_shape)
                + "]"
            )
        with self.lock:
            outputs = self.backends[model].run({spec.name: batch})
        return next(iter(outputs.values()))


def build_service() -> Any:
    """The BentoML service class for CONFIG."""
    namespace: dict[str, Any] = {"__module__": __name__, "__init__": _Peer.__init__}
    namespace["run"] = _Peer.run
    for model in CONFIG["models"]:
        namespace[model["api"]] = _make_api(model)
    cls = type("PeerService", (), namespace)
    options: dict[str, Any] = {
        "name": CONFIG.get("service_name", "deadline_serve_peer"),
        "workers": int(CONFIG["workers"]),
        "threads": 1,
        "logging": {"access": {"enabled": False}},
    }
    traffic = {k: v for k, v in CONFIG.get("traffic", {}).items() if v is not None}
    if traffic:
        options["traffic"] = traffic
    return bentoml.service(**options)(cls)


PeerService = build_service()
