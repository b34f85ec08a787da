"""The cluster of a model repository served with the daemon's settings
(`python -m app plan SYSTEM --repository DIR`): the devices the daemon would
start (CPU_SLICES, EMULATED_DEVICES, DEVICE_SHARES, RAY_NODES, read from the
environment as `python -m app serve` reads them) and each model's profile per
device kind — its config's, else the one measured and cached
(`python -m app profile MODEL`), else it is left out with a note saying so.
Nothing is started or measured here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from app.planning.cluster import ClusterDescription, ClusterDevice, ClusterModel
from app.repository.config import ModelConfig
from app.repository.loader import load_repository
from app.repository.profiles import latency_profile, profile_from_spec
from app.runtime.devices import ExecutorDevice, detect_devices, model_allowed_on
from app.scheduling.profile import LatencyProfile
from app.server.planning_index import item_bytes
from app.server.profiling import device_tag, profile_cache_dir
from app.server.settings import Settings, read_settings


def cluster_from_repository(directory: Path, env: Mapping[str, str]) -> ClusterDescription:
    """The repository at `directory` on the devices `env`'s settings give."""
    settings = read_settings({**env, "MODEL_REPOSITORY": str(directory)})
    index = load_repository(Path(directory))
    executors = detect_devices(
        settings.cpu_slices,
        settings.threads_per_slice,
        settings.emulated_devices,
        shares=settings.device_shares,
    )
    nodes = (settings.ray_nodes or {}) if settings.ray_address else {}
    devices = tuple(ClusterDevice(d.name, d.kind, d.share, node=nodes.get(d.id)) for d in executors)
    models: list[ClusterModel] = []
    notes = [f"{name}: not loaded ({error})" for name, error in sorted(index.errors.items())]
    for config in index.models.values():
        if config.name != config.model_name:
            continue  # a version other than the default one: planned as the model
        profiles = _profiles(config, executors, settings)
        if not profiles:
            notes.append(
                f"{config.name}: no profile (declared or measured) on this server's devices; "
                f"measure it with `python -m app profile {config.name}` or declare one in the "
                "cluster file"
            )
            continue
        models.append(_model(config, profiles))
    return ClusterDescription(devices, tuple(models), source=str(directory), notes=tuple(notes))


def _profiles(
    config: ModelConfig, executors: list[ExecutorDevice], settings: Settings
) -> dict[str, LatencyProfile]:
    """ℓ(b) per device kind the model may run on: declared, else cached."""
    out: dict[str, LatencyProfile] = {}
    for device in executors:
        if device.kind in out or not model_allowed_on(config, device):
            continue
        if config.profile is not None:
            out[device.kind] = profile_from_spec(config.profile, config.max_batch_size)
            continue
        found = latency_profile(config, device_tag(device), profile_cache_dir(settings))
        if found is not None:
            out[device.kind] = found
    return out


def _model(config: ModelConfig, profiles: dict[str, LatencyProfile]) -> ClusterModel:
    weights = 0.0
    if config.model_file is not None and config.model_file.is_file():
        weights = float(config.model_file.stat().st_size)
    return ClusterModel(
        name=config.name,
        slo_s=config.slo_ms / 1e3,
        max_batch=config.max_batch_size,
        profiles=profiles,
        memory_bytes=weights,
        input_bytes=float(sum(item_bytes(s) for s in config.inputs)),
        output_bytes=float(sum(item_bytes(s) for s in config.outputs)),
        devices=config.devices,
    )
