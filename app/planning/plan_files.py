"""The planners' plan files (`python -m app plan SYSTEM … --out FILE`), one
format for every planner, which the daemon loads with `PLAN=FILE`
(app/server/plans.py) and the simulator reads too.

A plan file is JSON, an envelope around the planner's own plan:

    {"kind": "inss-plan",            # which planner's plan (KINDS)
     "version": 2,                   # the envelope's version (FORMAT_VERSION)
     "made_from": {                  # what it was made from (MadeFrom; null: not said)
        "planner": "inss", "inputs": ["/abs/cluster.yaml"],
        "command": "python -m app plan inss cluster.yaml --out plan.json",
        "rates": {"resnet50": 150.0},   # requests/s per model it was made for
        "made_at": "2026-11-28T19:50:00Z"},
     "plan": {…}}                    # the planner's plan (its plan.py)

Files of version 1, written before the envelope, are read as well: the
planner's plan with `kind` and `version` beside its fields, no `made_from`.
A reader checks `kind` and `version` before anything else.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FORMAT_VERSION = 2
LEGACY_VERSION = 1  # the planner's fields beside kind and version, no envelope
# A plan's kind → the planner (`python -m app plan PLANNER`) that writes it.
KINDS = {
    "symphony-partition": "partition",
    "herd-plan": "herd",
    "inss-plan": "inss",
    "ppipe-plan": "ppipe",
}


@dataclass(frozen=True)
class MadeFrom:
    """What a plan was made from: the planner, its input files (or URLs),
    the command line, the request rates it planned for (requests/s per
    model; empty when it plans by other figures) and when (UTC, ISO 8601)."""

    planner: str
    inputs: tuple[str, ...] = ()
    command: str = ""
    rates: dict[str, float] = field(default_factory=dict)
    made_at: str = ""

    @classmethod
    def now(
        cls,
        planner: str,
        inputs: Sequence[Path | str | None],
        argv: Sequence[str],
        rates: Mapping[str, float] | None = None,
    ) -> MadeFrom:
        """Made now by `python -m app plan PLANNER argv…` from `inputs`
        (files, made absolute, or URLs; None: not given)."""
        made_at = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
        return cls(
            planner,
            tuple(str(Path(p).resolve()) if isinstance(p, Path) else p for p in inputs if p),
            shlex.join(["python", "-m", "app", "plan", planner, *argv]),
            {str(k): float(v) for k, v in (rates or {}).items()},
            made_at.replace("+00:00", "Z"),
        )

    @classmethod
    def replanned(cls, planner: str, command: str, rates: Mapping[str, float]) -> MadeFrom:
        """Made now while serving (`REPLAN_S`: `command` names the settings)
        from the rates the server measured."""
        made_at = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
        return cls(
            planner,
            ("REPLAN_S",),
            command,
            {str(k): float(v) for k, v in rates.items()},
            made_at.replace("+00:00", "Z"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "planner": self.planner,
            "inputs": list(self.inputs),
            "command": self.command,
            "rates": dict(self.rates),
            "made_at": self.made_at,
        }

    @classmethod
    def from_dict(cls, body: Any, source: str) -> MadeFrom:
        if not isinstance(body, dict) or not isinstance(body.get("planner"), str):
            raise ValueError(f"{source}: made_from must be an object naming its planner")
        try:
            return cls(
                body["planner"],
                tuple(str(p) for p in body.get("inputs", ())),
                str(body.get("command", "")),
                {str(k): float(v) for k, v in dict(body.get("rates", {})).items()},
                str(body.get("made_at", "")),
            )
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source}: malformed made_from: {error}") from error


@dataclass(frozen=True)
class PlanFile:
    """A plan file as read: its kind, version, what it was made from (None
    when the file does not say: version 1) and the planner's plan."""

    kind: str
    version: int
    made_from: MadeFrom | None
    body: dict[str, Any]

    @property
    def planner(self) -> str:
        return KINDS[self.kind]


def inputs_of(args: Any, *more: str) -> list[Path | str | None]:
    """A planner command's inputs: its CONFIG, the repository or daemon it
    read (`--repository`, `--from`), and the further file arguments named."""
    names = ("config", "repository", "from_url", *more)
    return [getattr(args, name, None) for name in names]


def envelope(kind: str, body: Mapping[str, Any], made_from: MadeFrom | None) -> dict[str, Any]:
    """The file's JSON: the planner's plan `body` in the envelope."""
    return {
        "kind": kind,
        "version": FORMAT_VERSION,
        "made_from": None if made_from is None else made_from.to_dict(),
        "plan": dict(body),
    }


def parse_plan_file(doc: Any, source: str) -> PlanFile:
    """A plan file's JSON of any kind and version this build reads;
    ValueError naming what is wrong otherwise."""
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: not a plan file (a JSON object with a kind and a version)")
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(
            f"{source}: kind {kind!r} is not a plan of this build's planners "
            f"({', '.join(map(repr, KINDS))})"
        )
    version = doc.get("version")
    if version == LEGACY_VERSION:
        body = {k: v for k, v in doc.items() if k not in ("kind", "version")}
        return PlanFile(kind, version, None, body)
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{source}: plan version {version!r}, this build reads {LEGACY_VERSION} and "
            f"{FORMAT_VERSION}"
        )
    body = doc.get("plan")
    if not isinstance(body, dict):
        raise ValueError(f"{source}: the plan file has no `plan` object")
    made_from = doc.get("made_from")
    return PlanFile(
        kind,
        version,
        None if made_from is None else MadeFrom.from_dict(made_from, source),
        body,
    )


def unwrap(doc: Any, kind: str, what: str, source: str) -> dict[str, Any]:
    """The planner's plan in a file's JSON; ValueError unless it is a `kind`
    plan (`what` names the kind for a person: "a PPipe plan")."""
    if isinstance(doc, dict) and doc.get("kind") != kind:
        raise ValueError(f"{source}: not {what} (kind {doc.get('kind')!r}, want {kind!r})")
    return parse_plan_file(doc, source).body


def write_json(body: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(body, indent=2) + "\n")


def read_json(path: Path) -> Any:
    """The JSON of `path`; ValueError naming the file when it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON plan file ({error})") from None


def read_plan_file(path: Path) -> PlanFile:
    """The plan file at `path`, of any kind."""
    return parse_plan_file(read_json(path), str(path))
