"""The cluster file: one schema for every planner (docs/architecture.md,
"Planning"). With `--repository DIR` or `--from URL` it adds to what the
repository and the server say; alone (`kind: cluster`) it declares all.

    kind: cluster                # only needed when the file is used alone
    devices:                     # optional: the server's (its settings, or
      - {name: emulated:0, kind: emulated, memory_mb: 11264}   # GET /v2/devices)
      - {name: emulated:1, kind: emulated, class: fast, node: 10.0.0.2}
    models:                      # per model, over the repository's
      resnet50-emulated:
        slo_ms: 27               # the config's slo_ms
        max_batch: 32            # the config's max_batch_size
        memory_mb: 98            # weights (default: the model file's size)
        input_bytes: 64          # one request's tensors (default: the config's)
        output_bytes: 64
        devices: [emulated]      # kinds or names (default: the config's)
        profile: {alpha_ms: 2.05, beta_ms: 5.378}   # or {latency_ms: {1: 7, 8: 20}};
        # profiles: {emulated: {...}, cpu: {...}}   # or one per device kind
        exclude: true            # leave it out of the plan
    rates: {resnet50-emulated: 300}   # requests/s, over measured ones
    partition: {sub_clusters: 2, r_max: 5000}   # each planner's own section:
    herd: {max_group_size: 2}                   # the keys of app/planning/*/from_cluster.py
    inss: {share_step: 0.1}
    ppipe: {timings: DIR, classes: {fast: 1, slow: 2}}

Every key is checked: an unknown one, a wrong type or a model or rate that
names no model is an `InputError` naming where it is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from app.planning.cluster import MB, ClusterDescription, ClusterDevice, ClusterModel
from app.planning.config_input import InputError, mapping, only
from app.scheduling.profile import LatencyProfile

KIND = "cluster"
SECTIONS = ("partition", "herd", "inss", "ppipe")
_TOP = {"kind", "devices", "models", "rates", *SECTIONS}
_DEVICE = {"name", "kind", "share", "class", "node", "memory_mb"}
_MODEL = {
    "slo_ms",
    "max_batch",
    "memory_mb",
    "input_bytes",
    "output_bytes",
    "devices",
    "profile",
    "profiles",
    "exclude",
}


def read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {error}") from error


def is_cluster_file(path: Path) -> bool:
    """Whether `path` is a cluster file used alone (`kind: cluster`), not
    one of the planners' own YAML inputs."""
    if path.suffix not in (".yaml", ".yml", ".json") or not path.is_file():
        return False
    try:
        body = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(body, dict) and body.get("kind") == KIND


def apply_cluster_file(raw: Any, where: str, base: ClusterDescription | None) -> ClusterDescription:
    """`base` (from a repository or a daemon; None: the file declares
    everything) with the file's devices, models, rates and sections."""
    body = mapping(raw if raw is not None else {}, where)
    only(body, _TOP, where)
    if base is None and body.get("kind") != KIND:
        raise InputError(f"{where}: a cluster file used alone says `kind: {KIND}`")
    devices = base.devices if base is not None else ()
    if "devices" in body:
        devices = tuple(
            _device(d, f"{where}: devices[{i}]")
            for i, d in enumerate(_list(body, "devices", where))
        )
    if not devices:
        raise InputError(f"{where}: no devices: list them under `devices`")
    kinds = list(dict.fromkeys(d.kind for d in devices))
    models = {m.name: m for m in (base.models if base is not None else ())}
    excluded: list[str] = []
    for name, raw_model in mapping(body.get("models", {}), f"{where}: models").items():
        at = f"{where}: models: {name}"
        spec = mapping(raw_model if raw_model is not None else {}, at)
        only(spec, _MODEL, at)
        if spec.get("exclude"):
            if str(name) not in models:
                raise InputError(f"{at}: excludes a model the cluster does not have")
            excluded.append(str(name))
            continue
        models[str(name)] = _model(str(name), spec, models.get(str(name)), kinds, at)
    for name in excluded:
        del models[name]
    for name, rate in mapping(body.get("rates", {}), f"{where}: rates").items():
        if str(name) not in models:
            raise InputError(f"{where}: rates: no model {name!r} (models: {sorted(models)})")
        models[str(name)] = dataclasses.replace(
            models[str(name)], rate=_number(rate, f"{where}: rates: {name}")
        )
    if not models:
        raise InputError(f"{where}: no models to plan")
    sections = {k: mapping(body[k] or {}, f"{where}: {k}") for k in SECTIONS if k in body}
    base_sections = dict(base.sections) if base is not None else {}
    return ClusterDescription(
        devices,
        tuple(models.values()),
        {**base_sections, **sections},
        source=where if base is None else f"{base.source} + {where}",
        notes=base.notes if base is not None else (),
    )


def _device(raw: Any, where: str) -> ClusterDevice:
    body = mapping(raw, where)
    only(body, _DEVICE, where)
    if not isinstance(body.get("name"), str) or not body["name"]:
        raise InputError(f"{where}: name must be a non-empty string")
    name = body["name"]
    memory = body.get("memory_mb")
    return ClusterDevice(
        name=name,
        kind=str(body.get("kind", name.partition(":")[0])),
        share=_number(body.get("share", 1.0), f"{where}: share"),
        device_class=None if body.get("class") is None else str(body["class"]),
        node=None if body.get("node") is None else str(body["node"]),
        memory_mb=None if memory is None else _number(memory, f"{where}: memory_mb"),
    )


def _model(
    name: str, spec: dict[str, Any], known: ClusterModel | None, kinds: list[str], where: str
) -> ClusterModel:
    """`known` (the repository's) with what `spec` says over it; a model
    the cluster does not know needs slo_ms and a profile."""
    if known is None and ("slo_ms" not in spec or not {"profile", "profiles"} & set(spec)):
        raise InputError(
            f"{where}: a model the repository (or server) does not have needs slo_ms and a "
            "profile (or profiles)"
        )
    max_batch = known.max_batch if known is not None else 0
    if "max_batch" in spec:
        max_batch = spec["max_batch"]
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InputError(f"{where}: max_batch must be an integer ≥ 1, got {max_batch!r}")
    profiles = _profiles(spec, kinds, max_batch or None, where)
    if not max_batch:
        max_batch = next(iter(profiles.values())).max_batch
    if known is None:
        known = ClusterModel(name, _number(spec["slo_ms"], where) / 1e3, max_batch, profiles)
    changes: dict[str, Any] = {"max_batch": max_batch}
    if profiles:
        changes["profiles"] = profiles
    if "slo_ms" in spec:
        changes["slo_s"] = _number(spec["slo_ms"], f"{where}: slo_ms") / 1e3
    if "memory_mb" in spec:
        changes["memory_bytes"] = _number(spec["memory_mb"], f"{where}: memory_mb") * MB
    for key in ("input_bytes", "output_bytes"):
        if key in spec:
            changes[key] = _number(spec[key], f"{where}: {key}")
    if "devices" in spec:
        devices = spec["devices"]
        if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
            raise InputError(f"{where}: devices must be a list of kinds or names")
        changes["devices"] = tuple(devices)
    try:
        return dataclasses.replace(known, **changes)
    except ValueError as error:
        raise InputError(f"{where}: {error}") from error


def _profiles(
    spec: dict[str, Any], kinds: list[str], max_batch: int | None, where: str
) -> dict[str, LatencyProfile]:
    if "profile" in spec and "profiles" in spec:
        raise InputError(f"{where}: give profile (every kind) or profiles (per kind), not both")
    if "profile" in spec:
        one = _profile(spec["profile"], max_batch, f"{where}: profile")
        return dict.fromkeys(kinds, one)
    per_kind = mapping(spec.get("profiles", {}), f"{where}: profiles")
    return {str(k): _profile(v, max_batch, f"{where}: profiles: {k}") for k, v in per_kind.items()}


def _profile(raw: Any, max_batch: int | None, where: str) -> LatencyProfile:
    body = mapping(raw, where)
    only(body, {"alpha_ms", "beta_ms", "latency_ms"}, where)
    try:
        if "latency_ms" in body:
            table = {int(b): float(v) for b, v in mapping(body["latency_ms"], where).items()}
            return LatencyProfile.from_table(table, max_batch or max(table))
        if set(body) != {"alpha_ms", "beta_ms"}:
            raise InputError(f"{where}: needs alpha_ms and beta_ms, or latency_ms")
        return LatencyProfile.linear(
            _number(body["alpha_ms"], where), _number(body["beta_ms"], where), max_batch or 32
        )
    except (TypeError, ValueError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"{where}: {error}") from error


def _number(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw or raw < 0:
        raise InputError(f"{where} must be a number ≥ 0, got {raw!r}")
    return float(raw)


def _list(body: dict[str, Any], key: str, where: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: {key} must be a non-empty list")
    return value
