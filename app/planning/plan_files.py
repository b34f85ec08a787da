"""What the planners' plan files share (`python -m app plan ppipe|inss
--out FILE`): JSON with a `kind` and a `version` that a reader checks
before anything else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def tagged(kind: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its kind and version first."""
    return {"kind": kind, "version": version, **body}


def check_tag(body: dict[str, Any], kind: str, version: int, what: str, source: str) -> None:
    """Raise ValueError unless `body` is a `kind` plan of `version`; `what`
    names the kind for a person ("a PPipe plan")."""
    if body.get("kind") != kind:
        raise ValueError(f"{source}: not {what} (kind {body.get('kind')!r}, want {kind!r})")
    if body.get("version") != version:
        raise ValueError(
            f"{source}: plan version {body.get('version')!r}, this build reads {version}"
        )


def write_json(body: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(body, indent=2) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
