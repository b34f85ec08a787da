"""What the planners' YAML readers share (`python -m app plan ppipe|inss`):
the error a wrong input raises, and the checks of a mapping's shape."""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """The command's input is wrong; the message says where and how."""


def mapping(value: Any, where: str) -> dict[str, Any]:
    """`value`, which must be a mapping."""
    if not isinstance(value, dict):
        raise InputError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def only(body: dict[str, Any], allowed: set[str], where: str) -> None:
    """`body` has no key outside `allowed`."""
    unknown = set(body) - allowed
    if unknown:
        raise InputError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(allowed)})")
