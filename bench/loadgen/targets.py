"""The target server and what is sent to it: the loopback check, one
pre-serialised request body per workload model, and the control-plane calls
(model metadata and checks, `GET /v2`) made with httpx before a run.

Models named in the workload must be on the server (`GET /v2/models/{name}`;
a missing one is an error before any load is sent). One request body per
model is built from the server's input metadata (random FP32 rows of the
right shape, batch dimension 1), serialised once, with the workload's SLO as
`slo_ms`.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from app.workloads.spec import Workload
from bench.loadgen.errors import LoadGenError, RunFailed


def check_loopback(url: str) -> str:
    """The base URL without a trailing slash, if its host is loopback; else
    LoadGenError. Accepts 127.0.0.0/8, ::1 and localhost (which must resolve
    to loopback addresses only)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise LoadGenError(f"bad --url {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise LoadGenError(f"--url must be http://HOST:PORT, got {url!r}")
    host = parsed.host
    if not host:
        raise LoadGenError(f"--url has no host: {url!r}")
    if host.lower().rstrip(".") == "localhost":
        try:
            infos = socket.getaddrinfo("localhost", parsed.port or 80, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise LoadGenError(f"cannot resolve localhost: {exc}") from None
        addresses = {info[4][0] for info in infos}
        if not addresses or not all(_is_loopback(a) for a in addresses):
            raise LoadGenError(
                f"refusing {url!r}: localhost resolves to non-loopback {sorted(addresses)}"
            )
    elif not _is_loopback(host):
        raise LoadGenError(
            f"refusing to send load to {url!r}: the load generator targets loopback only "
            "(127.0.0.0/8, ::1, localhost)"
        )
    return str(parsed).rstrip("/")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ModelTarget:
    """One workload model as the generator sends it."""

    name: str
    slo_ms: float
    body: bytes  # the pre-serialised POST body
    path: str = "/infer"  # where it is POSTed: the daemon's native API by default


_RANDOM_KINDS = {
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def build_body(name: str, inputs: Sequence[dict[str, Any]], slo_ms: float, seed: int = 0) -> bytes:
    """The native /infer body for one request (batch dimension 1) from v2
    input metadata `[{"name", "datatype", "shape"}]`: random floats in [-1, 1)
    for float inputs, small random integers for integer inputs."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, Any] = {}
    for spec in inputs:
        tname, dtype, shape = spec["name"], str(spec["datatype"]).upper(), spec["shape"]
        dims = [1 if (i == 0 or d < 0) else int(d) for i, d in enumerate(shape)]
        if not shape or shape[0] != -1:
            dims = [1, *[max(int(d), 1) for d in shape]]  # no batch dim in metadata: add one
        if dtype in _RANDOM_KINDS:
            arr = rng.uniform(-1.0, 1.0, dims).astype(_RANDOM_KINDS[dtype]).astype(np.float64)
            data = np.round(arr, 6).tolist()
        elif dtype.startswith(("INT", "UINT")):
            data = rng.integers(0, 10, dims).tolist()
        elif dtype == "BOOL":
            data = (rng.random(dims) < 0.5).tolist()
        else:
            raise LoadGenError(f"model {name!r}: input {tname!r} has datatype {dtype}, unsupported")
        tensors[tname] = data
    doc = {"model": name, "inputs": tensors, "slo_ms": float(slo_ms)}
    return json.dumps(doc, separators=(",", ":")).encode()


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and "error" in body:
            return str(body["error"])
    except ValueError:
        pass
    return response.text[:200]


def build_targets(
    workload: Workload, inputs: dict[str, Sequence[dict[str, Any]]]
) -> list[ModelTarget]:
    """Targets without asking the server: `inputs[model]` is the model's v2
    input metadata (`[{"name", "datatype", "shape"}]`). For servers without
    `GET /v2/models/{name}`; pass the result to `run_load(targets=...)`."""
    missing = [m.name for m in workload.models if m.name not in inputs]
    if missing:
        raise LoadGenError(f"no input metadata for model(s) {missing}")
    return [
        ModelTarget(m.name, float(m.slo_ms), build_body(m.name, inputs[m.name], m.slo_ms, seed=k))
        for k, m in enumerate(workload.models)
    ]


async def prepare_targets(
    url: str, workload: Workload, *, client: httpx.AsyncClient | None = None, check: bool = True
) -> list[ModelTarget]:
    """Check every workload model on the server and build its request body.

    `GET /v2/models/{name}` must answer 200 (else LoadGenError naming the
    model); `GET /v2/models/{name}/config` is consulted when the server has it
    (an SLO tighter than the workload's, without `allow_slo_loosening`, is an
    error); with `check`, one request per model is sent and must not be
    refused as invalid (4xx other than 429)."""
    base = check_loopback(url)
    own = client is None
    if client is None:
        client = httpx.AsyncClient(base_url=base, timeout=10.0, trust_env=False)
    try:
        targets = []
        for k, model in enumerate(workload.models):
            try:
                meta = await client.get(f"/v2/models/{model.name}")
            except httpx.HTTPError as exc:
                raise RunFailed(f"cannot reach the server at {base}: {exc!r}") from None
            if meta.status_code == 404:
                raise LoadGenError(
                    f"model {model.name!r} (named in workload {workload.name!r}) is not on "
                    f"the server at {base}: GET /v2/models/{model.name} -> 404 "
                    f"({_error_text(meta)})"
                )
            if meta.status_code != 200:
                raise LoadGenError(
                    f"GET /v2/models/{model.name} -> {meta.status_code}: {_error_text(meta)}"
                )
            inputs = meta.json().get("inputs") or []
            if not inputs:
                raise LoadGenError(f"model {model.name!r}: the server lists no inputs")
            config = await client.get(f"/v2/models/{model.name}/config")
            if config.status_code == 200:
                cfg = config.json()
                server_slo = cfg.get("slo_ms")
                if (
                    isinstance(server_slo, (int, float))
                    and model.slo_ms > server_slo
                    and not cfg.get("allow_slo_loosening", False)
                ):
                    raise LoadGenError(
                        f"model {model.name!r}: the workload's SLO {model.slo_ms:g} ms is looser "
                        f"than the server's {server_slo:g} ms, which does not allow loosening"
                    )
            body = build_body(model.name, inputs, model.slo_ms, seed=k)
            targets.append(ModelTarget(model.name, float(model.slo_ms), body))
        if check:
            for t in targets:
                reply = await client.post(
                    "/infer", content=t.body, headers={"content-type": "application/json"}
                )
                if 400 <= reply.status_code < 500 and reply.status_code != 429:
                    raise LoadGenError(
                        f"model {t.name!r}: the server refused a test request with "
                        f"{reply.status_code}: {_error_text(reply)}"
                    )
        return targets
    finally:
        if own:
            await client.aclose()


async def server_info(url: str) -> dict[str, Any] | None:
    """`GET /v2` (name, version), when the server has it."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5.0, trust_env=False) as client:
            reply = await client.get("/v2")
        if reply.status_code == 200:
            body = reply.json()
            return {k: body[k] for k in ("name", "version") if k in body}
    except (httpx.HTTPError, ValueError):
        pass
    return None
