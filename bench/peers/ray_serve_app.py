"""Ray Serve serving a model repository with the daemon's native HTTP API.

The peer a careful Ray Serve user would build for the comparison (issue 4):

- **API**: ``POST /infer`` with the daemon's request and response JSON
  (``{"model", "inputs", "slo_ms"?, "id"?}`` → ``{"model", "id", "outputs":
  {name: {"shape", "datatype", "data"}}, "timing": {"queue_ms", "exec_ms",
  "batch_size", "device"}}``), so one load generator drives both. Inputs are
  decoded and validated by the daemon's own `app.api.tensors` functions. Errors
  are ``{"error", "reason"}`` with 400 (invalid_input), 404 (model_not_found) or
  500. ``slo_ms`` is accepted and ignored: Ray Serve has no deadlines, so a
  request is never dropped; it finishes late instead.
- **Ingress**: Serve's HTTP ingress, no FastAPI. With one model the model's
  deployment *is* the ingress (``__call__`` takes the Starlette request): one
  hop from the HTTP front to the replica. With several models a thin router
  deployment reads ``model`` from the body and forwards decoded numpy inputs
  through a ``DeploymentHandle`` (front → router → replica). ``ingress="fastapi"``
  puts a FastAPI app (``@serve.ingress``) on the router instead; it is no
  faster, so it is not the default. The HTTP front itself is chosen by the
  launcher's ``mode``: Ray ≥ 2.55's documented high-throughput mode (HAProxy
  in front of replicas that serve HTTP themselves; the default here, since it
  cuts the added latency about threefold on this box) or Serve's classic Python
  proxy actor (see `bench/peers/ray_serve_launcher.py`).
- **Batching**: one deployment per model; its batch method is
  ``@serve.batch(max_batch_size=…, batch_wait_timeout_s=…)`` (``max_concurrent_batches
  = 1``: a replica runs one batch at a time, as a device does); the values of the
  run are applied in ``__init__`` with the documented ``set_max_batch_size`` /
  ``set_batch_wait_timeout_s``. ``max_ongoing_requests`` defaults to twice the
  batch size, so the next batch can gather while one runs (Serve's default of 5
  would cap every batch at 5).
- **Devices**: one replica per device. Emulated models: replica *r* holds
  emulated device ``device_ids[r]`` for ℓ(b) with the daemon's own
  `EmulatedBackend` (same profile, same sleep + spin, same echo). ONNX models:
  one replica per CPU slice running the daemon's `OnnxBackend` (CPU EP,
  ``intra_op_num_threads = cpu_threads``, sequential). When several models are
  served, ``device_sharing="shared"`` (default) gives every model a replica on
  every device and serialises replicas of different models on the same device
  with a per-device file lock — the same devices the daemon shares, as with
  fractional ``num_gpus`` in Ray; ``"partition"`` splits the devices among the
  models instead (the static split a user would otherwise make).
- Every replica asks Ray for ``num_cpus=0``: placement is ours (rank → device),
  and Ray's logical CPU count must not cap the replica count on a 2-core box.

Client timeouts: Serve honours a per-request ``x-request-timeout-seconds``
header and a server-wide ``http_options.request_timeout_s`` (launcher
``request_timeout_s``): past it the request is cancelled (HTTP 408) and
``@serve.batch`` leaves cancelled requests out of the next batch. With the
classic proxy a client that merely disconnects is cancelled too; behind
HAProxy it is not (HAProxy does not abort a request already sent to a
replica), so give the load generator's client timeout to Serve as
``request_timeout_s`` (or send the header).
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from app.api.tensors import check_shape, datatype_name, decode_json_tensor
from app.errors import InvalidInput, ServingError
from app.repository.config import ModelConfig
from app.repository.loader import load_model_config, load_repository
from app.runtime.backends import make_backend

INGRESS_MODES = ("auto", "direct", "router", "fastapi")
DEVICE_SHARING = ("shared", "partition")
MAX_BODY_BYTES = 64 << 20


# ----------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class ModelPlan:
    """How one model is deployed: its replicas, their devices and batching."""

    name: str
    directory: str
    device_kind: str  # "emulated" | "cpu"
    device_ids: tuple[int, ...]  # replica rank r runs on device_ids[r]
    threads: int
    max_batch_size: int
    batch_wait_timeout_s: float
    max_ongoing_requests: int

    @property
    def num_replicas(self) -> int:
        return len(self.device_ids)


def _per_model(value: Any, name: str, default: Any) -> Any:
    if isinstance(value, Mapping):
        return value.get(name, default)
    return default if value is None else value


def plan_models(
    repository: Path,
    *,
    devices: int,
    max_batch_size: int | Mapping[str, int] | None = None,
    batch_wait_timeout_s: float | Mapping[str, float] = 0.0,
    cpu_threads: int = 1,
    cpu_slices: int = 1,
    models: Sequence[str] | None = None,
    device_sharing: str = "shared",
    max_ongoing_requests: int | None = None,
) -> list[ModelPlan]:
    """The deployments for `repository` (only `models`, when given).

    `max_batch_size` / `batch_wait_timeout_s` are one value for every model or a
    mapping by model name; a batch size is capped at the model's configured
    ``max_batch_size`` (the daemon never runs larger batches either), None means
    that maximum. `max_ongoing_requests` defaults to 2 × the batch size.
    """
    if device_sharing not in DEVICE_SHARING:
        raise ValueError(f"device_sharing must be one of {DEVICE_SHARING}, got {device_sharing!r}")
    index = load_repository(Path(repository))
    if models is not None:
        missing = [m for m in models if m not in index.models]
        if missing:
            raise ValueError(
                f"models {missing} are not in {repository} "
                f"(it has {sorted(index.models)}; errors: {index.errors})"
            )
        configs = [index.models[m] for m in models]
    else:
        configs = list(index.models.values())
    if not configs:
        raise ValueError(f"no servable model in {repository} (errors: {index.errors})")

    kinds: dict[str, list[ModelConfig]] = {}
    for config in configs:
        if config.backend == "emulated":
            kind = "emulated"
        elif config.backend == "onnx":
            kind = "cpu"
        else:  # pragma: no cover - the loader rejects other backends
            raise ValueError(f"model {config.name!r}: unsupported backend {config.backend!r}")
        kinds.setdefault(kind, []).append(config)

    pools = {"emulated": int(devices), "cpu": int(cpu_slices)}
    plans: list[ModelPlan] = []
    for kind, group in kinds.items():
        pool = pools[kind]
        if pool < 1:
            raise ValueError(
                f"models {[c.name for c in group]} need {kind} devices, but there are none "
                f"({'devices' if kind == 'emulated' else 'cpu_slices'}={pool})"
            )
        for k, config in enumerate(group):
            if device_sharing == "partition" and len(group) <= pool:
                ids = tuple(d for d in range(pool) if d % len(group) == k)
            else:
                ids = tuple(range(pool))
            mbs = _per_model(max_batch_size, config.name, config.max_batch_size)
            mbs = max(1, min(int(mbs), config.max_batch_size))
            wait = float(_per_model(batch_wait_timeout_s, config.name, 0.0))
            if wait < 0:
                raise ValueError(f"batch_wait_timeout_s must be ≥ 0, got {wait}")
            ongoing = max_ongoing_requests if max_ongoing_requests else 2 * mbs
            plans.append(
                ModelPlan(
                    name=config.name,
                    directory=str(config.directory),
                    device_kind=kind,
                    device_ids=ids,
                    threads=int(cpu_threads) if kind == "cpu" else 1,
                    max_batch_size=mbs,
                    batch_wait_timeout_s=wait,
                    max_ongoing_requests=max(int(ongoing), mbs),
                )
            )
    return plans


# ----------------------------------------------------------------- request codec


class NotFound(ServingError):
    status = 404
    reason = "model_not_found"


def error_response(exc: ServingError) -> Response:
    body = orjson.dumps({"error": exc.message, "reason": exc.reason})
    return Response(body, status_code=exc.status, media_type="application/json")


def parse_request(body: bytes) -> tuple[str, str | None, dict[str, Any]]:
    """(model, id, raw inputs) of a native request body; raises InvalidInput."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    extra = set(doc) - {"model", "inputs", "slo_ms", "id"}
    if extra:
        raise InvalidInput(f"unknown fields in the request body: {sorted(extra)}")
    model = doc.get("model")
    if not isinstance(model, str):
        raise InvalidInput("'model' must be a string")
    inputs = doc.get("inputs")
    if not isinstance(inputs, dict):
        raise InvalidInput("'inputs' must be an object of named tensors")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    slo = doc.get("slo_ms")  # accepted for API compatibility; Ray Serve has no deadlines
    if slo is not None and (isinstance(slo, bool) or not isinstance(slo, int | float)):
        raise InvalidInput("'slo_ms' must be a number")
    return model, request_id, inputs


def decode_inputs(config: ModelConfig, raw: dict[str, Any]) -> dict[str, np.ndarray]:
    """One request's inputs as arrays of shape (1, *item), validated like the daemon."""
    names = [s.name for s in config.inputs]
    if set(raw) != set(names):
        missing = sorted(set(names) - set(raw))
        unknown = sorted(set(raw) - set(names))
        raise InvalidInput(
            f"model '{config.name}' takes inputs {names}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    out: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        value = raw[spec.name]
        if isinstance(value, dict):
            data, shape = value.get("data"), value.get("shape")
            if not isinstance(data, list) or not isinstance(shape, list):
                raise InvalidInput(f"input '{spec.name}': expected {{data: [...], shape: [...]}}")
            shape = check_shape(spec.name, spec, shape, batch_optional=True)
            out[spec.name] = decode_json_tensor(spec.name, spec, data, shape)
        elif isinstance(value, list):
            out[spec.name] = decode_json_tensor(spec.name, spec, value, None)
        else:
            raise InvalidInput(f"input '{spec.name}': expected a nested array or {{data, shape}}")
    return out


def render_response(
    model: str, request_id: str, outputs: Mapping[str, np.ndarray], timing: Mapping[str, Any]
) -> Response:
    body = {
        "model": model,
        "id": request_id,
        "outputs": {
            name: {
                "shape": [int(d) for d in arr.shape],
                "datatype": datatype_name(arr.dtype),
                "data": arr,
            }
            for name, arr in outputs.items()
        },
        "timing": timing,
    }
    try:
        data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # non-contiguous or exotic arrays
        for out in body["outputs"].values():
            out["data"] = out["data"].tolist()
        data = orjson.dumps(body)
    return Response(data, media_type="application/json")


async def _read_body(request: Request) -> bytes:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise InvalidInput(f"request body exceeds {MAX_BODY_BYTES} bytes")
    return body


_ids = itertools.count(1)


def _new_id() -> str:
    return f"ray-{os.getpid()}-{next(_ids)}"


# ------------------------------------------------------------------ deployments


def _replica_rank() -> int:
    rank: Any = serve.get_replica_context().rank
    return int(getattr(rank, "rank", rank))


class _DeviceLock:
    """An exclusive lock on one device, shared by the replicas (processes) of all
    models placed on it: a model runs a batch only while it holds the device."""

    def __init__(self, path: Path | None):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if path else None

    def __enter__(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


@serve.deployment
class ModelDeployment:
    """One model on one device per replica, with Serve's dynamic batching."""

    def __init__(self, plan: ModelPlan, lock_dir: str | None):
        self.plan = plan
        self.config = load_model_config(Path(plan.directory))
        rank = _replica_rank()
        self.device_index = plan.device_ids[rank % plan.num_replicas]
        self.device = f"{plan.device_kind}:{self.device_index}"
        self.backend = make_backend(self.config, plan.device_kind, self.device_index, plan.threads)
        self.backend.load(self.config)
        self._input_names = [s.name for s in self.config.inputs]
        lock = Path(lock_dir) / f"{self.device}.lock" if lock_dir else None
        self._lock = _DeviceLock(lock)
        # One thread runs the device: the event loop keeps accepting requests
        # and forming the next batch while a batch runs.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"device-{self.device}")
        self.run_batch.set_max_batch_size(plan.max_batch_size)
        self.run_batch.set_batch_wait_timeout_s(plan.batch_wait_timeout_s)

    def _execute(self, batch: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, float]:
        with self._lock:
            start = time.time()
            outputs = self.backend.run(batch)
            return outputs, start, time.time()

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def run_batch(
        self, items: list[tuple[dict[str, np.ndarray], float]]
    ) -> list[tuple[dict[str, np.ndarray], dict[str, Any]]]:
        size = len(items)
        batch = {n: np.concatenate([inputs[n] for inputs, _ in items]) for n in self._input_names}
        loop = asyncio.get_running_loop()
        outputs, start, end = await loop.run_in_executor(self._pool, self._execute, batch)
        exec_ms = (end - start) * 1000.0
        results = []
        for i, (_, arrival) in enumerate(items):
            rows = {name: np.ascontiguousarray(arr[i : i + 1]) for name, arr in outputs.items()}
            timing = {
                "queue_ms": max(0.0, (start - arrival) * 1000.0),
                "exec_ms": exec_ms,
                "batch_size": size,
                "device": self.device,
            }
            results.append((rows, timing))
        return results

    async def infer(
        self, inputs: dict[str, np.ndarray], arrival: float
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Handle entry point (router ingress): decoded inputs in, rows out."""
        return await self.run_batch((inputs, arrival))

    async def __call__(self, request: Request) -> Response:
        """HTTP entry point (direct ingress: this model is the only one served)."""
        try:
            if request.method != "POST" or request.url.path.rstrip("/") != "/infer":
                raise NotFound(f"no route {request.method} {request.url.path}; use POST /infer")
            body = await _read_body(request)
            arrival = time.time()  # as the daemon: once the request is read
            model, request_id, raw = parse_request(body)
            if model != self.config.name:
                raise NotFound(f"unknown model '{model}'")
            inputs = decode_inputs(self.config, raw)
        except ServingError as exc:
            return error_response(exc)
        outputs, timing = await self.run_batch((inputs, arrival))
        return render_response(model, request_id or _new_id(), outputs, timing)


class _RouterCore:
    def __init__(self, repository: str, handles: dict[str, Any]):
        index = load_repository(Path(repository))
        self.configs = {name: index.models[name] for name in handles}
        self.handles = handles

    async def handle(self, body: bytes) -> Response:
        arrival = time.time()
        try:
            model, request_id, raw = parse_request(body)
            config = self.configs.get(model)
            if config is None:
                raise NotFound(f"unknown model '{model}' (served: {sorted(self.configs)})")
            inputs = decode_inputs(config, raw)
        except ServingError as exc:
            return error_response(exc)
        outputs, timing = await self.handles[model].infer.remote(inputs, arrival)
        return render_response(model, request_id or _new_id(), outputs, timing)


@serve.deployment
class Router:
    """Plain Starlette ingress: routes ``POST /infer`` by the body's ``model``."""

    def __init__(self, repository: str, **handles: Any):
        self.core = _RouterCore(repository, handles)

    async def __call__(self, request: Request) -> Response:
        if request.method != "POST" or request.url.path.rstrip("/") != "/infer":
            return error_response(
                NotFound(f"no route {request.method} {request.url.path}; use POST /infer")
            )
        try:
            body = await _read_body(request)
        except ServingError as exc:
            return error_response(exc)
        return await self.core.handle(body)


def _fastapi_router():
    from fastapi import FastAPI

    api = FastAPI()

    class FastAPIRouter:
        def __init__(self, repository: str, **handles: Any):
            self.core = _RouterCore(repository, handles)

        async def infer(self, request: Request) -> Response:
            try:
                body = await _read_body(request)
            except ServingError as exc:
                return error_response(exc)
            return await self.core.handle(body)

        # Real classes, not the strings of `from __future__ import annotations`:
        # Serve rewrites the method's signature, after which FastAPI cannot
        # resolve the strings and takes `request` for a query parameter.
        infer.__annotations__ = {"request": Request, "return": Response}  # noqa: RUF012
        infer = api.post("/infer")(infer)

    return serve.deployment(serve.ingress(api)(FastAPIRouter))


# ------------------------------------------------------------------ application


def build_app(
    repository: Path,
    *,
    devices: int,
    max_batch_size: int | Mapping[str, int] | None = None,
    batch_wait_timeout_s: float | Mapping[str, float] = 0.0,
    cpu_threads: int = 1,
    cpu_slices: int = 1,
    models: Sequence[str] | None = None,
    device_sharing: str = "shared",
    max_ongoing_requests: int | None = None,
    ingress: str = "auto",
    lock_dir: Path | None = None,
) -> tuple[Any, list[ModelPlan]]:
    """The Serve application (to pass to ``serve.run``) and its model plans."""
    if ingress not in INGRESS_MODES:
        raise ValueError(f"ingress must be one of {INGRESS_MODES}, got {ingress!r}")
    plans = plan_models(
        repository,
        devices=devices,
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
        cpu_threads=cpu_threads,
        cpu_slices=cpu_slices,
        models=models,
        device_sharing=device_sharing,
        max_ongoing_requests=max_ongoing_requests,
    )
    lock = str(lock_dir) if lock_dir is not None else None
    bound = {
        plan.name: ModelDeployment.options(
            name=plan.name,
            num_replicas=plan.num_replicas,
            max_ongoing_requests=plan.max_ongoing_requests,
            ray_actor_options={"num_cpus": 0},
        ).bind(plan, lock)
        for plan in plans
    }
    if ingress == "auto":
        ingress = "direct" if len(plans) == 1 else "router"
    if ingress == "direct":
        if len(plans) != 1:
            raise ValueError("ingress='direct' serves one model; use 'router' for several")
        return next(iter(bound.values())), plans
    router_cls = Router if ingress == "router" else _fastapi_router()
    router = router_cls.options(
        name="router",
        num_replicas=1,
        max_ongoing_requests=100_000,
        ray_actor_options={"num_cpus": 0},
    ).bind(str(Path(repository).resolve()), **bound)
    return router, plans
