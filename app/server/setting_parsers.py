"""How a setting's text — an environment variable's value or a flag's — becomes
its value.

Each parser turns the text into a value, checks its bounds, and on bad input
raises ValueError naming where the text came from (`label`: the variable or
the flag, e.g. `MAX_QUEUE` or `--max-queue`) and the bad value. Nothing is
guessed: a boolean is one of a few spellings, a list has no empty items, a
number is finite. `show` writes a value back the way a user would type it (the
defaults in the settings table (docs/settings.md) and in `--help`); `describe` says what is
accepted, for `--help`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.repository.device_class import DeviceClass
from app.runtime.realtime import MAX_PRIORITY, check_priority
from app.runtime.shares import parse_device_shares, show_device_shares
from app.scheduling.policy_spec import parse_options, parse_policy
from app.scheduling.registry import policy_names


class Parser(Protocol):
    metavar: str

    def parse(self, text: str, label: str) -> object: ...

    def show(self, value: object) -> str: ...

    def describe(self) -> str: ...


def _integer(text: str, label: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{label}={text!r} is not an integer") from None


@dataclass(frozen=True)
class Integer:
    minimum: int = 0
    maximum: int | None = None
    metavar: str = "N"

    def parse(self, text: str, label: str) -> int:
        value = _integer(text, label)
        if self.maximum is not None and not self.minimum <= value <= self.maximum:
            raise ValueError(f"{label} must be {self.minimum} to {self.maximum}, got {value}")
        if value < self.minimum:
            raise ValueError(f"{label} must be ≥ {self.minimum}, got {value}")
        return value

    def show(self, value: object) -> str:
        return str(value)

    def describe(self) -> str:
        if self.maximum is not None:
            return f"integer {self.minimum} to {self.maximum}"
        return f"integer ≥ {self.minimum}"


@dataclass(frozen=True)
class Number:
    """A finite float ≥ `minimum` (NaN and infinity are refused: a NaN
    compares false with everything and would switch a check off silently)."""

    minimum: float = 0.0
    metavar: str = "X"
    maximum: float | None = None

    def parse(self, text: str, label: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"{label}={text!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{label}={text!r} is not a finite number")
        if self.maximum is not None and not self.minimum <= value <= self.maximum:
            raise ValueError(f"{label} must be {self.minimum:g} to {self.maximum:g}, got {value:g}")
        if value < self.minimum:
            raise ValueError(f"{label} must be ≥ {self.minimum:g}, got {value:g}")
        return value

    def show(self, value: object) -> str:
        assert isinstance(value, float | int)
        return f"{value:g}"

    def describe(self) -> str:
        if self.maximum is not None:
            return f"number {self.minimum:g} to {self.maximum:g}"
        return f"number ≥ {self.minimum:g}"


TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Boolean:
    metavar: str = "BOOL"

    def parse(self, text: str, label: str) -> bool:
        word = text.strip().lower()
        if word in TRUE:
            return True
        if word in FALSE:
            return False
        raise ValueError(
            f"{label}={text!r} is not a boolean; use one of {'/'.join(TRUE)} or {'/'.join(FALSE)}"
        )

    def show(self, value: object) -> str:
        return "1" if value else "0"

    def describe(self) -> str:
        return f"{'/'.join(TRUE)} or {'/'.join(FALSE)}"


@dataclass(frozen=True)
class Text:
    metavar: str = "TEXT"

    def parse(self, text: str, label: str) -> str:
        return text

    def show(self, value: object) -> str:
        return str(value)

    def describe(self) -> str:
        return "text"


@dataclass(frozen=True)
class RayAddress:
    """A Ray cluster to join: `auto`, `HOST:PORT` (the GCS) or `ray://HOST:PORT`."""

    metavar: str = "ADDRESS"

    def parse(self, text: str, label: str) -> str:
        address = text.strip()
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if address != "auto" and not (host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(
                f"{label}={text!r} is not a Ray address: use auto, HOST:PORT or ray://HOST:PORT"
            )
        return address

    def show(self, value: object) -> str:
        return str(value)

    def describe(self) -> str:
        return "a Ray address"


@dataclass(frozen=True)
class RayNodes:
    """Which Ray node each executor runs on: `DEVICE=NODE,…`, DEVICE an
    executor index, NODE a node ID (hex) or a node's IP address."""

    metavar: str = "DEVICE=NODE,…"

    def parse(self, text: str, label: str) -> dict[int, str]:
        nodes: dict[int, str] = {}
        for item in text.split(","):
            device, sep, node = (part.strip() for part in item.partition("="))
            if not sep or not device.isdigit() or not node:
                raise ValueError(
                    f"{label}={text!r}: {item.strip()!r} is not DEVICE=NODE "
                    "(an executor index, then a Ray node ID or IP address)"
                )
            if int(device) in nodes:
                raise ValueError(f"{label}={text!r} names executor {device} twice")
            nodes[int(device)] = node
        return nodes

    def show(self, value: object) -> str:
        assert isinstance(value, dict)
        return ",".join(f"{device}={node}" for device, node in sorted(value.items()))

    def describe(self) -> str:
        return "executor=node pairs, comma-separated (node: a Ray node ID, IP address or `local`)"


@dataclass(frozen=True)
class FilePath:
    metavar: str = "PATH"

    def parse(self, text: str, label: str) -> Path:
        if not text.strip():
            raise ValueError(f"{label}={text!r} is not a path")
        return Path(text)

    def show(self, value: object) -> str:
        return str(value)

    def describe(self) -> str:
        return "path"


@dataclass(frozen=True)
class JsonObject:
    """A JSON object; as `options`, also `key=value,…` (a policy's options:
    app/scheduling/policy_spec.py)."""

    metavar: str = "JSON"
    options: bool = False

    def parse(self, text: str, label: str) -> dict[str, object]:
        if self.options:
            return parse_options(text, label)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{label}={text!r} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{label} must be a JSON object, got {text!r}")
        return value

    def show(self, value: object) -> str:
        return json.dumps(value)

    def describe(self) -> str:
        return "JSON object or key=value,…" if self.options else "JSON object"


@dataclass(frozen=True)
class IntegerList:
    """Comma-separated integers, each ≥ `minimum`, at least one."""

    minimum: int = 1
    metavar: str = "N,N,…"

    def parse(self, text: str, label: str) -> tuple[int, ...]:
        try:
            values = tuple(int(item) for item in text.split(","))
        except ValueError:
            raise ValueError(
                f"{label}={text!r} is not a comma-separated list of integers"
            ) from None
        for value in values:
            if value < self.minimum:
                raise ValueError(f"{label} items must be ≥ {self.minimum}, got {value}")
        return values

    def show(self, value: object) -> str:
        assert isinstance(value, tuple)
        return ",".join(str(item) for item in value)

    def describe(self) -> str:
        return f"comma-separated integers ≥ {self.minimum}"


@dataclass(frozen=True)
class DeviceClasses:
    """Comma-separated live CPU device classes, `NAME:THREADS[:SLOWDOWN]`
    each (app/repository/device_class.py), names distinct, at least one."""

    metavar: str = "NAME:THREADS[:SLOWDOWN],…"

    def parse(self, text: str, label: str) -> tuple[DeviceClass, ...]:
        try:
            classes = tuple(DeviceClass.parse(item.strip()) for item in text.split(","))
        except ValueError as exc:
            raise ValueError(f"{label}={text!r}: {exc}") from None
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"{label}={text!r}: class names repeat")
        return classes

    def show(self, value: object) -> str:
        assert isinstance(value, tuple)
        return ",".join(
            f"{c.name}:{c.threads}" + (f":{c.slowdown:g}" if c.slowdown != 1.0 else "")
            for c in value
        )

    def describe(self) -> str:
        return "comma-separated NAME:THREADS[:SLOWDOWN]"


@dataclass(frozen=True)
class DeviceShares:
    """Devices split into shares: `DEVICE=SHARE,SHARE…` items separated by
    `;` (app/runtime/shares.py), each share in (0, 1], a device's summing
    to at most 1."""

    metavar: str = "DEVICE=SHARE,…;…"

    def parse(self, text: str, label: str) -> dict[str, tuple[float, ...]]:
        try:
            return parse_device_shares(text)
        except ValueError as exc:
            raise ValueError(f"{label}={text!r}: {exc}") from None

    def show(self, value: object) -> str:
        assert isinstance(value, dict)
        return show_device_shares(value)

    def describe(self) -> str:
        return "DEVICE=SHARE,SHARE… items separated by ';', e.g. cpu=0.5,0.5"


@dataclass(frozen=True)
class DeviceRange:
    """`MIN:MAX` devices in service, 1 ≤ MIN ≤ MAX (autoscaling's bounds)."""

    metavar: str = "MIN:MAX"

    def parse(self, text: str, label: str) -> tuple[int, int]:
        low, colon, high = text.strip().partition(":")
        try:
            bounds = (int(low), int(high)) if colon else None
        except ValueError:
            bounds = None
        if bounds is None or not 1 <= bounds[0] <= bounds[1]:
            raise ValueError(f"{label}={text!r} is not MIN:MAX devices with 1 ≤ MIN ≤ MAX")
        return bounds

    def show(self, value: object) -> str:
        assert isinstance(value, tuple)
        return f"{value[0]}:{value[1]}"

    def describe(self) -> str:
        return "MIN:MAX devices in service, e.g. 1:8"


@dataclass(frozen=True)
class PolicyName:
    """One of `app.scheduling.registry.policy_names()`, optionally with its
    options after a `:` (app/scheduling/policy_spec.py: `NAME:k=v,…` or
    `NAME:{JSON}`); `read_settings` moves them into POLICY_OPTIONS."""

    metavar: str = "NAME[:OPTIONS]"

    def parse(self, text: str, label: str) -> str:
        spec = parse_policy(text, label)
        if spec.name not in policy_names():
            raise ValueError(
                f"{label}={text!r} is not a policy; choose one of {', '.join(policy_names())}"
            )
        return spec.label

    def show(self, value: object) -> str:
        return str(value)

    def describe(self) -> str:
        return "one of " + ", ".join(policy_names())


@dataclass(frozen=True)
class RealtimePriority:
    """A SCHED_FIFO priority, 0 (off) to 99, checked by `check_priority`.
    Whether the kernel permits it is checked at start-up, not here."""

    metavar: str = "N"

    def parse(self, text: str, label: str) -> int:
        value = _integer(text, label)
        check_priority(value, label)
        return value

    def show(self, value: object) -> str:
        return str(value)

    def describe(self) -> str:
        return f"0 (off) to {MAX_PRIORITY}"


# What may start a Prometheus metric name, and what may follow.
_METRIC_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class MetricPrefix:
    """The start of every metric name: letters, digits, `_` and `:`, not
    starting with a digit (Prometheus's metric-name rule); empty for none."""

    metavar: str = "PREFIX"

    def parse(self, text: str, label: str) -> str:
        if text and not _METRIC_PREFIX.fullmatch(text):
            raise ValueError(
                f"{label}={text!r} cannot start a metric name: use letters, digits, '_' "
                "and ':', not starting with a digit"
            )
        return text

    def show(self, value: object) -> str:
        return str(value) or '""'

    def describe(self) -> str:
        return "a metric name prefix, e.g. deadline_serve_ (empty: none)"
