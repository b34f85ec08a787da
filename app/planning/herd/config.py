"""HERD's YAML input (`python -m app plan herd CONFIG`).

    cluster:
      devices: 8              # N
      device_memory_mb: 11264 # per device
      reserve_mb: 1024        # set aside for FLEX (default 0)
      max_group_size: 4       # Ḡ
      groups: 3               # candidate groups J (default ⌈N / Ḡ⌉)
    objective: paper          # paper | shared (plan.py; default paper)
    time_limit_s: 10          # default 10
    max_batch: 64             # profiles' batch cap (default 64)
    models:
      - {name: resnet50, profile: {alpha_ms: 2.05, beta_ms: 5.38}, slo_ms: 27,
         memory_mb: 98, affinity: cnn}      # or profile: {latency_ms: {1: 7, 8: 20}}
    streams:
      - {model: resnet50, rate: 400}        # requests/s; slo_ms: per stream (optional)

Megabytes are 2^20 bytes. Every mistake is an `InputError` naming where.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.planning.config_input import InputError, mapping, only
from app.planning.herd.plan import OBJECTIVES
from app.planning.herd.problem import Cluster, Model, Problem, Stream
from app.scheduling.profile import LatencyProfile

MB = 1 << 20


def load_config(path: Path) -> tuple[Problem, str, float]:
    """The problem, the objective and the time limit the file asks for."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {error}") from error
    return config_from_dict(raw, str(path))


def config_from_dict(raw: Any, where: str) -> tuple[Problem, str, float]:
    body = mapping(raw, where)
    only(body, {"cluster", "objective", "time_limit_s", "max_batch", "models", "streams"}, where)
    for key in ("cluster", "models", "streams"):
        if key not in body:
            raise InputError(f"{where}: missing key {key!r}")
    objective = body.get("objective", "paper")
    if objective not in OBJECTIVES:
        raise InputError(f"{where}: objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    time_limit = _number(body.get("time_limit_s", 10.0), f"{where}: time_limit_s", positive=True)
    max_batch = _integer(body.get("max_batch", 64), f"{where}: max_batch", least=1)
    cluster = _cluster(body["cluster"], f"{where}: cluster")
    models = _list(body["models"], f"{where}: models")
    streams = _list(body["streams"], f"{where}: streams")
    problem_models = tuple(
        _model(m, f"{where}: models[{i}]", max_batch) for i, m in enumerate(models)
    )
    problem_streams = tuple(_stream(s, f"{where}: streams[{i}]") for i, s in enumerate(streams))
    try:
        problem = Problem(problem_models, problem_streams, cluster)
    except ValueError as error:
        raise InputError(f"{where}: {error}") from error
    return problem, objective, time_limit


def _cluster(raw: Any, where: str) -> Cluster:
    body = mapping(raw, where)
    allowed = {"devices", "device_memory_mb", "reserve_mb", "max_group_size", "groups"}
    only(body, allowed, where)
    for key in ("devices", "device_memory_mb", "max_group_size"):
        if key not in body:
            raise InputError(f"{where}: missing key {key!r}")
    memory = _number(body["device_memory_mb"], f"{where}: device_memory_mb", positive=True)
    reserve = _number(body.get("reserve_mb", 0), f"{where}: reserve_mb", positive=False)
    if reserve >= memory:
        raise InputError(f"{where}: reserve_mb {reserve:g} leaves nothing of {memory:g} MB")
    groups = body.get("groups")
    return Cluster(
        devices=_integer(body["devices"], f"{where}: devices", least=1),
        device_memory=round(memory * MB),
        max_group_size=_integer(body["max_group_size"], f"{where}: max_group_size", least=1),
        reserve=round(reserve * MB),
        groups=None if groups is None else _integer(groups, f"{where}: groups", least=1),
    )


def _model(raw: Any, where: str, max_batch: int) -> Model:
    body = mapping(raw, where)
    only(body, {"name", "profile", "slo_ms", "memory_mb", "affinity"}, where)
    for key in ("name", "profile", "slo_ms", "memory_mb"):
        if key not in body:
            raise InputError(f"{where}: missing key {key!r}")
    return Model(
        name=str(body["name"]),
        profile=_profile(body["profile"], f"{where}: profile", max_batch),
        slo=_number(body["slo_ms"], f"{where}: slo_ms", positive=True) / 1000.0,
        memory=round(_number(body["memory_mb"], f"{where}: memory_mb", positive=True) * MB),
        affinity=str(body.get("affinity", "default")),
    )


def _profile(raw: Any, where: str, max_batch: int) -> LatencyProfile:
    body = mapping(raw, where)
    only(body, {"alpha_ms", "beta_ms", "latency_ms"}, where)
    try:
        if "latency_ms" in body:
            if len(body) > 1:
                raise InputError(f"{where}: give latency_ms or alpha_ms and beta_ms, not both")
            table = mapping(body["latency_ms"], f"{where}: latency_ms")
            return LatencyProfile.from_table(
                {int(b): float(v) for b, v in table.items()}, max_batch
            )
        if set(body) != {"alpha_ms", "beta_ms"}:
            raise InputError(f"{where}: needs alpha_ms and beta_ms (or latency_ms)")
        alpha = _number(body["alpha_ms"], f"{where}: alpha_ms", positive=False)
        beta = _number(body["beta_ms"], f"{where}: beta_ms", positive=False)
        return LatencyProfile.linear(alpha, beta, max_batch)
    except (TypeError, ValueError) as error:
        if isinstance(error, InputError):
            raise
        raise InputError(f"{where}: {error}") from error


def _stream(raw: Any, where: str) -> Stream:
    body = mapping(raw, where)
    only(body, {"model", "rate", "slo_ms"}, where)
    for key in ("model", "rate"):
        if key not in body:
            raise InputError(f"{where}: missing key {key!r}")
    slo = body.get("slo_ms")
    return Stream(
        model=str(body["model"]),
        rate=_number(body["rate"], f"{where}: rate", positive=True),
        slo=None if slo is None else _number(slo, f"{where}: slo_ms", positive=True) / 1000.0,
    )


def _list(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where} must be a non-empty list")
    return raw


def _number(raw: Any, where: str, *, positive: bool) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise InputError(f"{where} must be a number, got {raw!r}")
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(f"{where} must be finite, got {raw!r}")
    if (positive and value <= 0) or value < 0:
        raise InputError(f"{where} must be {'> 0' if positive else '≥ 0'}, got {raw!r}")
    return value


def _integer(raw: Any, where: str, *, least: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < least:
        raise InputError(f"{where} must be an integer ≥ {least}, got {raw!r}")
    return raw
