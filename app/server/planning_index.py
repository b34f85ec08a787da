"""What a planner reads of a serving daemon (`GET /v2/profiles`; `python -m
app plan SYSTEM --from URL`): each model's SLO, batch cap, tensors, weights
and the latency profile its core plans with, with the device it was
measured on. Devices are `GET /v2/devices`' and rates are measured from
`/metrics` (app/cluster_sources/daemon.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.repository.config import TensorSpec
from app.runtime.devices import ExecutorDevice
from app.server.startup import ModelState


def profile_index(
    models: Mapping[str, ModelState], devices: Sequence[ExecutorDevice]
) -> list[dict[str, Any]]:
    """Every served model (default versions) with a profile, by name."""
    by_id = {d.id: d for d in devices}
    out = []
    for name, state in sorted(models.items()):
        config = state.config
        if state.profile is None or config.name != config.model_name:
            continue
        device = by_id.get(state.devices[0]) if state.devices else None
        weights = None
        if config.model_file is not None and config.model_file.is_file():
            weights = config.model_file.stat().st_size
        out.append(
            {
                "name": name,
                "slo_ms": config.slo_ms,
                "max_batch_size": config.max_batch_size,
                "allowed_devices": None if config.devices is None else list(config.devices),
                "devices": sorted(by_id[i].name for i in state.devices if i in by_id),
                "measured_on": None
                if device is None
                else {"name": device.name, "kind": device.kind, "share": device.share},
                "latency_ms": {
                    str(b): state.profile.latency(b) * 1e3
                    for b in range(1, state.profile.max_batch + 1)
                },
                "memory_bytes": weights,
                "input_bytes": sum(item_bytes(s) for s in config.inputs),
                "output_bytes": sum(item_bytes(s) for s in config.outputs),
            }
        )
    return out


def item_bytes(spec: TensorSpec) -> int:
    """One request's bytes of a tensor; 0 when a dimension is unbounded."""
    if any(d < 0 for d in spec.slot_shape):
        return 0
    return spec.item_nbytes
