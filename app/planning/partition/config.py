"""A partitioning problem from YAML (`python -m app plan partition CONFIG`).

    sub_clusters: 4                # l
    r_max: 5000                    # requests/s one scheduling core dispatches
    s_max_mb: 11000                # a backend's memory, 10^6 bytes
    w: 1.0                         # optional: weight of memory balance (default 1;
                                   # on normalised terms, see milp.py)
    c_max: 4                       # optional: bound on the change cost (11)
    current: {resnet50: 0, bert: 1}   # optional: the assignment in force
    models:
      - name: resnet50
        rate: 300                  # requests/s
        static_mb: 98              # weights, loaded on every backend
        dynamic_mb: 40             # optional (0): a batch's run-time memory
        load_cost: 1               # optional (1): cost of loading or unloading it

`--current PLAN` (a plan file written by `--out`) replaces `current`.
Every key is checked: an unknown or missing one, a wrong type or a value
out of range is an `InputError` naming where it is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from app.planning.config_input import InputError, mapping, only
from app.planning.partition.problem import PartitionModel, PartitionProblem

MB = 1e6

_TOP = {"sub_clusters", "r_max", "s_max_mb", "w", "c_max", "current", "models"}
_MODEL = {"name", "rate", "static_mb", "dynamic_mb", "load_cost"}


def load_problem(path: Path, current: dict[str, int] | None = None) -> PartitionProblem:
    """The problem `path` describes; `current` (from `--current PLAN`)
    replaces the file's current assignment."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not valid YAML: {error}") from error
    return problem_from_dict(raw, str(path), current)


def problem_from_dict(
    raw: Any, where: str, current: dict[str, int] | None = None
) -> PartitionProblem:
    body = mapping(raw, where)
    only(body, _TOP, where)
    for key in ("sub_clusters", "r_max", "s_max_mb", "models"):
        if key not in body:
            raise InputError(f"{where}: missing key {key!r}")
    sub_clusters = body["sub_clusters"]
    if not isinstance(sub_clusters, int) or isinstance(sub_clusters, bool) or sub_clusters < 1:
        raise InputError(f"{where}: sub_clusters must be an integer ≥ 1, got {sub_clusters!r}")
    models_raw = body["models"]
    if not isinstance(models_raw, list) or not models_raw:
        raise InputError(f"{where}: models must be a non-empty list")
    models = tuple(_model(m, f"{where}: models[{i}]") for i, m in enumerate(models_raw))
    if current is None:
        current = _current(body.get("current", {}), f"{where}: current", sub_clusters)
    c_max = None if body.get("c_max") is None else _number(body, "c_max", where)
    try:
        return PartitionProblem(
            models=models,
            sub_clusters=sub_clusters,
            r_max=_number(body, "r_max", where, positive=True),
            s_max_bytes=_number(body, "s_max_mb", where, positive=True) * MB,
            w=_number(body, "w", where, 1.0),
            current=current,
            c_max=c_max,
        )
    except ValueError as error:
        raise InputError(f"{where}: {error}") from error


def _model(raw: Any, where: str) -> PartitionModel:
    body = mapping(raw, where)
    only(body, _MODEL, where)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: name must be a non-empty string, got {name!r}")
    return PartitionModel(
        name,
        _number(body, "rate", where),
        _number(body, "static_mb", where) * MB,
        _number(body, "dynamic_mb", where, 0.0) * MB,
        _number(body, "load_cost", where, 1.0),
    )


def _current(raw: Any, where: str, sub_clusters: int) -> dict[str, int]:
    body = mapping(raw, where)
    for model, index in body.items():
        if not isinstance(index, int) or isinstance(index, bool):
            raise InputError(f"{where}: {model}: a sub-cluster index, got {index!r}")
        if not 0 <= index < sub_clusters:
            raise InputError(f"{where}: {model}: sub-cluster {index} outside 0..{sub_clusters - 1}")
    return {str(k): v for k, v in body.items()}


def _number(
    body: dict[str, Any], key: str, where: str, default: float | None = None, positive: bool = False
) -> float:
    if key not in body:
        if default is None:
            raise InputError(f"{where}: missing key {key!r}")
        return default
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{where}: {key} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InputError(f"{where}: {key} must be {'> 0' if positive else '≥ 0'}, got {value!r}")
    return float(value)
