"""One syntax for a policy and its options, in the daemon and the simulator.

A policy is named `NAME` or `NAME:OPTIONS`; OPTIONS, here and in the
daemon's `POLICY_OPTIONS`, is either form:

    key=value,key=value          e.g. pruning=prefix,stagger_slack=2
    {"key": value, ...}          a JSON object, e.g. {"pruning": "prefix"}

In `key=value` a value reads as a boolean (true/false, yes/no, on/off), as
none (none, null), as an integer, as a float, else as the string. Both forms
give the same options: `symphony:stagger_slack=2` and
`symphony:{"stagger_slack": 2}` are one policy. Whether the policy has the
options is checked where it is built (`registry.policy_options`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PolicySpec:
    """A policy's name and its options."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """`NAME` or `NAME:key=value,…`: how the simulator names a run."""
        if not self.options:
            return self.name
        return self.name + ":" + format_options(self.options)


def parse_value(text: str) -> Any:
    """A `key=value` option's value: bool, None, int, float, else the string."""
    low = text.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_options(text: str, label: str = "policy options") -> dict[str, Any]:
    """OPTIONS in either form (module docstring); `label` names where the
    text came from in the ValueError a bad one raises."""
    if text.strip()[:1] in ("{", "[", '"'):  # JSON (an object, or a mistake named as one)
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{label}={text!r} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{label} must be a JSON object, got {text!r}")
        return value
    options: dict[str, Any] = {}
    if not text.strip():
        return options
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(
                f"{label}={text!r}: options must look like key=value,key=value "
                'or a JSON object {"key": value}'
            )
        if key in options:
            raise ValueError(f"{label}={text!r}: option {key!r} given twice")
        options[key] = parse_value(value)
    return options


def parse_policy(text: str, label: str = "policy") -> PolicySpec:
    """`NAME` or `NAME:OPTIONS` (either form). The name is not checked
    against the registry here."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"{label}={text!r}: no policy name")
    return PolicySpec(name, parse_options(rest, label) if sep else {})


def merge_options(inline: dict[str, Any], separate: dict[str, Any], label: str) -> dict[str, Any]:
    """The options given with the policy's name and those given apart (the
    daemon's POLICY_OPTIONS); a key given in both is a ValueError."""
    both = sorted(set(inline) & set(separate))
    if both:
        raise ValueError(f"{label}: option {', '.join(map(repr, both))} given twice")
    return {**separate, **inline}


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)


def format_options(options: dict[str, Any]) -> str:
    """`key=value,…`; a value that this form cannot carry (a list, a
    mapping, a string with `,` or `=`) makes the whole JSON instead."""
    plain = all(
        not isinstance(v, list | dict) and not (isinstance(v, str) and ("," in v or "=" in v))
        for v in options.values()
    )
    if not plain:
        return json.dumps(options, sort_keys=True)
    return ",".join(f"{k}={format_value(v)}" for k, v in options.items())
