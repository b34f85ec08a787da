"""The cluster of a serving daemon (`python -m app plan SYSTEM --from URL`):
its devices (`GET /v2/devices`), each model's profile, SLO and tensors
(`GET /v2/profiles`, a management route: `--admin-token` or ADMIN_TOKEN
where the daemon has one) and each model's arrival rate, measured over
`--window S` seconds from the `requests_total{model}` counter of
`/metrics` (read at the start and at the end of the window; 0: no rates
measured, the cluster file declares them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.planning.cluster import ClusterDescription
from app.planning.config_input import InputError
from app.planning.daemon_index import cluster_from_index

COUNTER = "requests_total"  # after the daemon's METRICS_PREFIX


def cluster_from_daemon(
    url: str,
    window_s: float,
    token: str | None = None,
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ClusterDescription:
    """What the daemon at `url` serves, with rates measured over `window_s`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    http = httpx.Client(base_url=url, timeout=30.0) if client is None else client
    try:
        devices_raw = _get(http, url, "/v2/devices", headers)["devices"]
        before, began = _counts(http, url), clock()
        body = _get(http, url, "/v2/profiles", headers)
        if window_s > 0:
            sleep(window_s)
            after, elapsed = _counts(http, url), clock() - began
            rates = {
                str(m["name"]): (after.get(m["name"], 0.0) - before.get(m["name"], 0.0)) / elapsed
                for m in body["models"]
            }
        else:
            rates = {}
    finally:
        if own:
            http.close()
    notes = ()
    if window_s > 0:
        notes = (f"rates measured over {elapsed:.1f} s of {url}/metrics",)
    return cluster_from_index(devices_raw, body["models"], rates, url, notes)


def _get(http: httpx.Client, url: str, path: str, headers: dict[str, str]) -> Any:
    try:
        reply = http.get(path, headers=headers)
    except httpx.HTTPError as exc:
        raise InputError(f"--from {url}: GET {path} failed: {exc}") from exc
    if reply.status_code in (401, 403):
        raise InputError(
            f"--from {url}: GET {path} answered {reply.status_code}: give the daemon's admin "
            "token (--admin-token or ADMIN_TOKEN)"
        )
    if reply.status_code != 200:
        raise InputError(f"--from {url}: GET {path} answered {reply.status_code}: {reply.text}")
    return reply.json()


def _counts(http: httpx.Client, url: str) -> dict[str, float]:
    """Requests accepted so far, per model."""
    text = _text(http, url)
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(COUNTER) and set(sample.labels) == {"model"}:
                model = sample.labels["model"]
                counts[model] = counts.get(model, 0.0) + sample.value
    return counts


def _text(http: httpx.Client, url: str) -> str:
    try:
        reply = http.get("/metrics")
    except httpx.HTTPError as exc:
        raise InputError(f"--from {url}: GET /metrics failed: {exc}") from exc
    if reply.status_code != 200:
        raise InputError(f"--from {url}: GET /metrics answered {reply.status_code}")
    return reply.text
