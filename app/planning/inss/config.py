"""An InSS placement problem from YAML (`python -m app plan inss CONFIG`).

    share_step: 0.1                      # optional; --share-step wins
    devices:
      - name: gpu0
        kind: rtx2060s                   # optional (default: the name); the
                                         # models' latency fits are per kind
        memory_mb: 8000                  # M_k, 10^6 bytes
        bandwidth_gb_per_s: 12           # host link B, 10^9 bytes/s
        alpha_s_us: 0.5                  # scheduling interference α_s, β_s,
        beta_s_us: 1.0                   # µs per kernel (optional, default 0)
    models:
      - name: resnet50
        rate: 150                        # λ, requests/s
        slo_ms: 80
        memory_mb: {base: 300, per_item: 12}   # m(b) = base + per_item·b
        # or memory_mb: {1: 310, 8: 400, 32: 700} (interpolated; caps b)
        input_bytes: 602112              # p_d, per item (optional, 0)
        output_bytes: 4000               # p_f, per item (optional, 0)
        latency:                         # the same fit on every kind, or
        # latency_per_kind: {rtx2060s: {...}, rtx2060: {...}}
          running_time:
            linear_ms: {alpha: 1.3, beta: 1.2}       # (α·b + β)/ρ ms
            # optional: saturation: {share_at_b1: 0.2, full_at_batch: 16}
            #   (a batch cannot use more of the device: problem.py Saturation), or
            # points_ms: [[b, share, ms], ...]       # LWR over profiled points
            # bandwidth: 1.0                         # LWR's h (optional)
            # log_space: false                       # (optional)
            # or measured: {source: gpulet, gpu: "3080", model: mnasnet1_0}
            #   t₁(b)·max(1, u(b)/ρ) from the bundled data (measured.py);
            #   source ppipe: {source: ppipe, gpu: T4, model: repvgg-b3};
            #   optional directory: DIR (default: the bundled data/…),
            #   gpulet only: duration_unit: ms | s (default ms, the header's)
          kernels: 0                     # n kernels per batch (optional, 0)
          sched_per_kernel_us: 0         # o_sch (optional, 0)
          alpha_u: 0.2                   # L2 use α_u·ρ + β_u (optional, 0)
          beta_u: 0.0
          alpha_cache: 0.3               # (optional, 0)

Every key is checked: an unknown or missing one, a wrong type or a value
out of range is an `InputError` naming where it is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from app.planning.config_input import InputError, mapping, only
from app.planning.inss import gpulet_data
from app.planning.inss.latency import DeviceLatency, L2Use, ModelLatency
from app.planning.inss.lwr import LocallyWeightedRegression
from app.planning.inss.measured import MeasuredRunningTime, from_gpulet, from_ppipe
from app.planning.inss.problem import (
    Device,
    LinearRunningTime,
    MemoryUse,
    ModelSpec,
    Problem,
    Saturation,
)
from app.planning.ppipe import profiles as ppipe_profiles

MB = 1e6
GB = 1e9


def load_problem(path: Path, share_step: float | None = None) -> Problem:
    """The problem `path` describes; `share_step` (the flag) wins over the file's."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {error}") from error
    return problem_from_dict(raw, str(path), share_step)


def problem_from_dict(raw: Any, where: str, share_step: float | None = None) -> Problem:
    body = mapping(raw, where)
    only(body, {"share_step", "devices", "models"}, where)
    step = share_step if share_step is not None else _number(body, "share_step", where, 0.1)
    devices = [
        _device(d, f"{where}: devices[{i}]") for i, d in enumerate(_list(body, "devices", where))
    ]
    kinds = sorted({d.kind for d in devices})
    models = [
        _model(m, f"{where}: models[{i}]", kinds)
        for i, m in enumerate(_list(body, "models", where))
    ]
    try:
        return Problem(tuple(devices), tuple(models), step)
    except ValueError as error:
        raise InputError(f"{where}: {error}") from error


def _device(raw: Any, where: str) -> Device:
    body = mapping(raw, where)
    only(
        body, {"name", "kind", "memory_mb", "bandwidth_gb_per_s", "alpha_s_us", "beta_s_us"}, where
    )
    name = _text(body, "name", where)
    try:
        latency = DeviceLatency(
            name,
            _number(body, "bandwidth_gb_per_s", where) * GB,
            _number(body, "alpha_s_us", where, 0.0) * 1e-6,
            _number(body, "beta_s_us", where, 0.0) * 1e-6,
        )
        return Device(
            name, str(body.get("kind", name)), _number(body, "memory_mb", where) * MB, latency
        )
    except ValueError as error:
        raise InputError(f"{where}: {error}") from error


def _model(raw: Any, where: str, kinds: list[str]) -> ModelSpec:
    body = mapping(raw, where)
    allowed = {"name", "rate", "slo_ms", "memory_mb", "input_bytes", "output_bytes"}
    only(body, allowed | {"latency", "latency_per_kind"}, where)
    name = _text(body, "name", where)
    if ("latency" in body) == ("latency_per_kind" in body):
        raise InputError(f"{where}: give exactly one of latency and latency_per_kind")
    io = (_number(body, "input_bytes", where, 0.0), _number(body, "output_bytes", where, 0.0))
    try:
        if "latency" in body:  # one fit for every kind
            fit = _latency(name, io, body["latency"], f"{where}: latency")
            latency = dict.fromkeys(kinds, fit)
        else:
            per_kind = mapping(body["latency_per_kind"], f"{where}: latency_per_kind")
            latency = {
                str(kind): _latency(name, io, raw_fit, f"{where}: latency_per_kind[{kind}]")
                for kind, raw_fit in per_kind.items()
            }
            unknown = set(latency) - set(kinds)
            if unknown:
                raise InputError(
                    f"{where}: latency_per_kind names kinds {sorted(unknown)} "
                    f"that no device has (kinds: {kinds})"
                )
        spec = ModelSpec(
            name,
            _number(body, "rate", where),
            _number(body, "slo_ms", where) * 1e-3,
            _memory(body.get("memory_mb"), f"{where}: memory_mb"),
            latency,
        )
    except ValueError as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"{where}: {error}") from error
    return spec


def _latency(name: str, io: tuple[float, float], raw: Any, where: str) -> ModelLatency:
    body = mapping(raw, where)
    keys = {"running_time", "kernels", "sched_per_kernel_us", "alpha_u", "beta_u", "alpha_cache"}
    only(body, keys, where)
    kernels = body.get("kernels", 0)
    if not isinstance(kernels, int) or isinstance(kernels, bool):
        raise InputError(f"{where}: kernels must be an integer, got {kernels!r}")
    return ModelLatency(
        name=name,
        input_bytes=io[0],
        output_bytes=io[1],
        sched_per_kernel_s=_number(body, "sched_per_kernel_us", where, 0.0) * 1e-6,
        kernels=kernels,
        running_time=_running_time(body.get("running_time"), f"{where}: running_time"),
        l2=L2Use(_number(body, "alpha_u", where, 0.0), _number(body, "beta_u", where, 0.0)),
        alpha_cache=_number(body, "alpha_cache", where, 0.0),
    )


def _running_time(
    raw: Any, where: str
) -> LinearRunningTime | LocallyWeightedRegression | MeasuredRunningTime:
    body = mapping(raw, where)
    if "measured" in body:
        only(body, {"measured"}, where)
        return _measured(body["measured"], f"{where}: measured")
    if "linear_ms" in body:
        only(body, {"linear_ms"}, where)
        line = mapping(body["linear_ms"], f"{where}: linear_ms")
        only(line, {"alpha", "beta", "saturation"}, f"{where}: linear_ms")
        saturation = None
        if "saturation" in line:
            at = f"{where}: linear_ms: saturation"
            body = mapping(line["saturation"], at)
            only(body, {"share_at_b1", "full_at_batch"}, at)
            full = body.get("full_at_batch")
            if not isinstance(full, int) or isinstance(full, bool):
                raise InputError(f"{at}: full_at_batch must be an integer, got {full!r}")
            saturation = Saturation(_number(body, "share_at_b1", at), full)
        return LinearRunningTime(
            _number(line, "alpha", f"{where}: linear_ms") * 1e-3,
            _number(line, "beta", f"{where}: linear_ms") * 1e-3,
            saturation,
        )
    if "points_ms" in body:
        only(body, {"points_ms", "bandwidth", "log_space"}, where)
        points = body["points_ms"]
        if not isinstance(points, list) or not all(
            isinstance(p, list) and len(p) == 3 and all(_is_number(v) for v in p) for p in points
        ):
            raise InputError(f"{where}: points_ms must be a list of [batch, share, ms] numbers")
        log_space = body.get("log_space", False)
        if not isinstance(log_space, bool):
            raise InputError(f"{where}: log_space must be true or false")
        return LocallyWeightedRegression.from_arrays(
            [p[0] for p in points],
            [p[1] for p in points],
            [p[2] * 1e-3 for p in points],
            bandwidth=_number(body, "bandwidth", where, 1.0),
            log_space=log_space,
        )
    raise InputError(
        f"{where}: give linear_ms {{alpha, beta}}, points_ms [[b, share, ms], …] "
        "or measured {source, gpu, model}"
    )


DURATION_UNITS = {"ms": 1e-3, "s": 1.0}


def _measured(raw: Any, where: str) -> MeasuredRunningTime:
    body = mapping(raw, where)
    only(body, {"source", "gpu", "model", "directory", "duration_unit"}, where)
    if isinstance(body.get("gpu"), int) and not isinstance(body["gpu"], bool):
        body = {**body, "gpu": str(body["gpu"])}  # `gpu: 3080` unquoted
    source, gpu, model = (_text(body, key, where) for key in ("source", "gpu", "model"))
    if source not in ("gpulet", "ppipe"):
        raise InputError(f"{where}: source must be gpulet or ppipe, got {source!r}")
    unit = body.get("duration_unit", "ms")
    if unit not in DURATION_UNITS or (source == "ppipe" and "duration_unit" in body):
        raise InputError(f"{where}: duration_unit is ms or s, and only for source gpulet")
    try:
        if source == "gpulet":
            directory = Path(body.get("directory", gpulet_data.BUNDLED_DIR))
            return from_gpulet(model, gpu, directory, DURATION_UNITS[unit])
        directory = Path(body.get("directory", ppipe_profiles.BUNDLED_DIR))
        return from_ppipe(model, gpu, directory)
    except (KeyError, FileNotFoundError, ValueError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        raise InputError(f"{where}: {message}") from None


def _memory(raw: Any, where: str) -> MemoryUse:
    body = mapping(raw, where)
    if set(body) <= {"base", "per_item"} and body:
        return MemoryUse(
            _number(body, "base", where, 0.0) * MB, _number(body, "per_item", where, 0.0) * MB
        )
    if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in body):
        raise InputError(
            f"{where}: give {{base, per_item}} or a table {{batch: MB}} with batch ≥ 1"
        )
    if not all(_is_number(v) for v in body.values()):
        raise InputError(f"{where}: memory table values must be numbers (MB)")
    return MemoryUse(table=tuple((int(b), float(v) * MB) for b, v in body.items()))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in body:
        if default is None:
            raise InputError(f"{where}: {key} is missing")
        return default
    value = body[key]
    if not _is_number(value):
        raise InputError(f"{where}: {key} must be a finite number, got {value!r}")
    return float(value)


def _text(body: dict[str, Any], key: str, where: str) -> str:
    if key not in body or not isinstance(body[key], str) or not body[key]:
        raise InputError(f"{where}: {key} must be a non-empty string")
    return body[key]


def _list(body: dict[str, Any], key: str, where: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: {key} must be a non-empty list")
    return value
