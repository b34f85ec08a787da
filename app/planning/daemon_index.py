"""A cluster as a running daemon describes itself: the entries of its `GET
/v2/devices` and `GET /v2/profiles` with per-model rates, read over HTTP
(app/cluster_sources/daemon.py, `plan SYSTEM --from URL`) or in the daemon
itself (app/server/herd_replanning.py)."""

from __future__ import annotations

from typing import Any

from app.planning.cluster import ClusterDescription, ClusterDevice, ClusterModel
from app.scheduling.profile import LatencyProfile


def cluster_from_index(
    devices: list[dict[str, Any]],
    profiles: list[dict[str, Any]],
    rates: dict[str, float],
    source: str,
    notes: tuple[str, ...] = (),
    sections: dict[str, dict[str, Any]] | None = None,
) -> ClusterDescription:
    """The cluster of `GET /v2/devices`' and `GET /v2/profiles`' entries, with
    `rates` (requests/s per model; a model without one has none): what a
    running daemon describes of itself (also in-process, app/server/replanning.py)."""
    models = tuple(_model(m, rates.get(m["name"])) for m in profiles)
    return ClusterDescription(
        tuple(_device(d) for d in devices), models, sections or {}, source=source, notes=notes
    )


def _device(raw: dict[str, Any]) -> ClusterDevice:
    return ClusterDevice(
        str(raw["name"]),
        str(raw["kind"]),
        float(raw.get("share", 1.0)),
        device_class=raw.get("class"),
        node=raw.get("node"),
    )


def _model(raw: dict[str, Any], rate: float | None) -> ClusterModel:
    """A model of `GET /v2/profiles`; the profile is the whole device's
    (a share's ℓ(b) times its share, as an emulated share holds a batch
    ℓ(b) / share)."""
    measured = raw.get("measured_on") or {}
    share = float(measured.get("share", 1.0))
    table = {int(b): float(ms) * share for b, ms in raw["latency_ms"].items()}
    profile = LatencyProfile.from_table(table, int(raw["max_batch_size"]))
    kind = str(measured.get("kind", "cpu"))
    allowed = raw.get("allowed_devices")
    return ClusterModel(
        name=str(raw["name"]),
        slo_s=float(raw["slo_ms"]) / 1e3,
        max_batch=int(raw["max_batch_size"]),
        profiles={kind: profile},
        memory_bytes=float(raw.get("memory_bytes") or 0.0),
        input_bytes=float(raw.get("input_bytes") or 0.0),
        output_bytes=float(raw.get("output_bytes") or 0.0),
        devices=None if allowed is None else tuple(allowed),
        rate=rate,
    )
