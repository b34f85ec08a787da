"""Reading fields of a parsed YAML document with errors that name the file
and the field (`path: models[0].rate: must be ≥ 0, got -5`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

_MISSING: Any = object()


def read_yaml(path: Path, what: str) -> Any:
    """The parsed YAML document at `path`; ValueError naming the file (and
    `what` it is) when it cannot be read or is not YAML."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read {what}: {exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc


class FieldReader:
    """Error reporting and typed field access for YAML configs: every message
    starts with the file and the field's path in it. Shared by the workload
    files and the model repository."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, msg: str) -> NoReturn:
        raise ValueError(f"{self.source}: {where}: {msg}")

    def keys(
        self, raw: Any, where: str, allowed: frozenset[str], required: tuple[str, ...] = ()
    ) -> None:
        if not isinstance(raw, Mapping):
            self.fail(where, f"must be a mapping, got {type(raw).__name__}")
        unknown = sorted(str(k) for k in raw if k not in allowed)
        if unknown:
            self.fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        for key in required:
            if key not in raw:
                self.fail(where, f"missing required key '{key}'")

    def number(
        self,
        raw: Mapping,
        key: Any,
        where: str,
        *,
        default: Any = _MISSING,
        above: float | None = None,
        at_least: float | None = None,
        integer: bool = False,
    ) -> Any:
        if key not in raw or raw[key] is None:
            if default is _MISSING:
                self.fail(where, "missing required value")
            return default
        value = raw[key]
        # PyYAML reads `5e3` (no dot) as a string; accept numeric strings.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                self.fail(where, f"must be a number, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(where, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            self.fail(where, f"must be finite, got {value}")
        if integer:
            if value != int(value):
                self.fail(where, f"must be an integer, got {value}")
            value = int(value)
        else:
            value = float(value)
        if above is not None and not value > above:
            self.fail(where, f"must be > {above:g}, got {value:g}")
        if at_least is not None and value < at_least:
            self.fail(where, f"must be ≥ {at_least:g}, got {value:g}")
        return value
