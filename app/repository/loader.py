"""Load the model repository: `<root>/<name>/config.yaml` plus the model file,
or a Triton model directory (`config.pbtxt` and version directories, see
app/repository/triton_config.py), which is read into the same document.

A model's directory name is its name. `config.yaml` keys (defaults in brackets)::

    backend:             onnx | torch | emulated               (required)
    model_file:          path relative to the model directory  (onnx, torch: required;
                                                                emulated: not allowed)
    inputs:              [{name, datatype, shape, ...}, ...]    (required, non-empty)
    outputs:             [{name, datatype, shape, ...}, ...]    (required, non-empty)
    max_batch_size:      integer ≥ 1                            (required)
    slo_ms:              number > 0                             (required)
    allow_slo_loosening: bool                                   [false]
    profile:             {alpha_ms, beta_ms} or {latency_ms: {batch size: ms}}
    devices:             [device kind or name, ...] e.g. [cpu], [cuda], [emulated]
    version:             string                                 ["1"]
    description:         string                                 [""]
    parameters:          free-form mapping, kept as ModelConfig.extra; backend
                         options: torch `exit_points` (pin the number of exit
                         points), emulated `preemption_delay_ms`
    dynamic_batching:    Triton's keys (max_queue_delay_microseconds, ...), the
                         `triton` policy's options for this model
    instance_group:      Triton's [{kind, count, gpus}, ...] → devices (not
                         with `devices`); app/repository/triton_fields.py
    dynamic:             true | false | {probes: FILE}: execution time depends
                         on the input; FILE (.npz, default probes.npz) holds
                         representative inputs measured at start-up
                         (app/repository/dynamic_fields.py)      [false]

`datatype` is a KServe v2 name (FP32, INT64, ..., BYTES; config.DATATYPES).
A `shape` may be written with or without the leading batch dimension -1
(`[4096]` and `[-1, 4096]` mean the same); another dimension is a positive
integer, or -1 (variable, e.g. a sequence length) bounded by the tensor's
`max_shape`. A tensor's other keys — `max_shape`, `pad` (inputs: pad
requests of different lengths into one batch), `follows` (outputs: cut a
padded answer back to each request's length), `max_bytes` (BYTES) — are
app/repository/tensor_fields.py's; e.g.::

    inputs:
      - {name: tokens, datatype: FP32, shape: [-1, -1], max_shape: [-1, 128],
         pad: [false, true]}
    outputs:
      - {name: scores, datatype: FP32, shape: [-1, -1], max_shape: [-1, 128],
         follows: [null, "tokens:1"]}

Variable dimensions and BYTES tensors are served by the onnx backend. Every
error names the file and the field.

A model without a `profile` is measured by the profiler at load; the measured
table is cached in the profile cache directory (app/repository/profiles.py).

A field that has no effect here (a Triton field we do not support) is a
warning naming the model and the field, logged at load and kept in
RepositoryIndex.warnings; a subdirectory with neither config file is one too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.config_fields import FieldReader, read_yaml
from app.repository.config import ModelConfig, ProfileSpec, version_key
from app.repository.dynamic_fields import parse_dynamic
from app.repository.tensor_fields import check_backend, check_follows, parse_tensors
from app.repository.triton_config import (
    NO_SLO_NOTE,
    TRITON_CONFIG_FILE,
    auto_completes,
    triton_document,
)
from app.repository.triton_fields import parse_dynamic_batching, parse_instance_groups
from app.scheduling.profile import LatencyProfile

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
BACKENDS = ("onnx", "torch", "emulated")
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

_CONFIG_KEYS = frozenset(
    {
        "backend",
        "model_file",
        "inputs",
        "outputs",
        "max_batch_size",
        "slo_ms",
        "allow_slo_loosening",
        "profile",
        "devices",
        "version",
        "description",
        "parameters",
        "dynamic_batching",
        "instance_group",
        "dynamic",
    }
)
_REQUIRED_KEYS = ("backend", "inputs", "outputs", "max_batch_size", "slo_ms")
_PROFILE_KEYS = frozenset({"alpha_ms", "beta_ms", "latency_ms"})


# --------------------------------------------------------------------------- names


def validate_model_name(name: str) -> str:
    """Return `name` if it is a safe model name (a single path component of
    letters, digits, `_`, `.`, `-`, not `.`/`..`), else raise ValueError.
    Use it on names that come from URLs before touching the file system."""
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
        raise ValueError(f"invalid model name {name!r}: use letters, digits, '_', '.', '-' only")
    if name in (".", "..") or ".." in name:
        raise ValueError(f"invalid model name {name!r}: must not contain '..'")
    return name


# --------------------------------------------------------------------------- config


Warn = Callable[[str], None]


def load_model_config(directory: Path, warn: Warn | None = None) -> ModelConfig:
    """Parse and validate `<directory>/config.yaml` or `<directory>/config.pbtxt`
    (one of them); the model's name is the directory's name. Fields without
    effect go to `warn` (default: logged). Raises ValueError naming the file
    and the field. The model's default version; `load_model_versions` gives
    every version served."""
    return load_model_versions(directory, warn)[0]


def load_model_versions(directory: Path, warn: Warn | None = None) -> list[ModelConfig]:
    """Every version of the model in `directory` that is served, the default
    one (served under the model's name) first, then the others its version
    policy selects (a config.pbtxt's), each named `version_key(name, v)`
    and reading `<v>/<model file>`. Errors as `load_model_config`."""
    directory = Path(directory)
    yaml_path, pbtxt_path = directory / CONFIG_FILE, directory / TRITON_CONFIG_FILE
    path = pbtxt_path if pbtxt_path.is_file() and not yaml_path.is_file() else yaml_path
    if not yaml_path.is_file() and not pbtxt_path.is_file() and auto_completes(directory):
        path = pbtxt_path  # read as an empty config.pbtxt: all from the model file
    try:
        validate_model_name(directory.name)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if warn is None:
        warn = _log_warning(directory.name)
    if yaml_path.is_file() and pbtxt_path.is_file():
        raise ValueError(f"{directory}: has both {CONFIG_FILE} and {TRITON_CONFIG_FILE}; keep one")
    if path == pbtxt_path:
        doc, others = triton_document(directory, warn)
        config = parse_model_config(doc, directory, source=str(path), warn=warn)
        if not others:
            return [config]
        versions = tuple(sorted((config.version, *others), key=int))
        configs = [replace(config, versions=versions)]
        filename = doc["model_file"].partition("/")[2]
        for version in others:
            other_doc = dict(doc, model_file=f"{version}/{filename}", version=version)
            other = parse_model_config(other_doc, directory, source=str(path), warn=warn)
            key = version_key(config.name, version)
            configs.append(replace(other, name=key, versions=versions))
        return configs
    doc = read_yaml(path, "model config")
    return [parse_model_config(doc, directory, source=str(path), warn=warn)]


def _log_warning(model: str) -> Warn:
    return lambda message: log.warning("model %s: %s", model, message)


def parse_model_config(
    doc: Any, directory: Path, source: str | None = None, warn: Warn | None = None
) -> ModelConfig:
    """Validate a parsed config document for the model in `directory`."""
    directory = Path(directory)
    ctx = FieldReader(source or str(directory / CONFIG_FILE))
    name = directory.name
    warn = warn or _log_warning(name)
    if doc is None:
        ctx.fail("top level", "the file is empty")
    ctx.keys(doc, "top level", _CONFIG_KEYS, required=_REQUIRED_KEYS)

    backend = doc["backend"]
    if backend not in BACKENDS:
        ctx.fail("backend", f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")

    model_file = _parse_model_file(ctx, doc, backend, directory)
    inputs = parse_tensors(ctx, doc["inputs"], "inputs")
    outputs = parse_tensors(ctx, doc["outputs"], "outputs")
    check_follows(ctx, inputs, outputs)
    check_backend(ctx, backend, inputs + outputs)
    max_batch = ctx.number(doc, "max_batch_size", "max_batch_size", at_least=1, integer=True)
    slo_ms = ctx.number(doc, "slo_ms", "slo_ms", above=0.0)

    loosen = doc.get("allow_slo_loosening", False)
    if not isinstance(loosen, bool):
        ctx.fail("allow_slo_loosening", f"must be true or false, got {loosen!r}")

    profile = None
    if doc.get("profile") is not None:
        profile = parse_profile(ctx, doc["profile"], "profile", max_batch)

    devices = None
    if doc.get("devices") is not None:
        raw = doc["devices"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw:
            ctx.fail("devices", f"must be a non-empty list like [cpu] or [cuda], got {raw!r}")
        for i, d in enumerate(raw):
            if not isinstance(d, str) or not d.strip():
                ctx.fail(f"devices[{i}]", f"must be a non-empty string, got {d!r}")
        devices = tuple(d.strip() for d in raw)
        if len(set(devices)) != len(devices):
            ctx.fail("devices", f"duplicate entries in {list(devices)}")
    if doc.get("instance_group") is not None:
        if devices is not None:
            ctx.fail("instance_group", "give either devices or instance_group, not both")
        devices = parse_instance_groups(ctx, doc["instance_group"], warn)
    batching = None
    if "dynamic_batching" in doc:
        batching = parse_dynamic_batching(ctx, doc["dynamic_batching"], warn)
        too_big = [p for p in batching.preferred_batch_sizes if p > max_batch]
        if too_big:
            ctx.fail(
                "dynamic_batching.preferred_batch_size",
                f"{too_big} exceed max_batch_size {max_batch}",
            )

    version = doc.get("version", "1")
    if isinstance(version, bool) or not isinstance(version, (str, int)) or str(version) == "":
        ctx.fail("version", f"must be a non-empty string or integer, got {version!r}")
    version = str(version)
    if not MODEL_NAME_RE.fullmatch(version):
        ctx.fail("version", f"use letters, digits, '_', '.', '-' only, got {version!r}")

    description = doc.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        ctx.fail("description", f"must be a string, got {description!r}")

    extra = doc.get("parameters") or {}
    if not isinstance(extra, Mapping):
        ctx.fail("parameters", f"must be a mapping, got {type(extra).__name__}")
    dynamic = parse_dynamic(ctx, doc.get("dynamic"), backend, directory, inputs)

    return ModelConfig(
        name=name,
        backend=backend,
        directory=directory.resolve(),
        inputs=inputs,
        outputs=outputs,
        max_batch_size=max_batch,
        slo_ms=slo_ms,
        model_file=model_file,
        profile=profile,
        allow_slo_loosening=loosen,
        devices=devices,
        version=version,
        description=description.strip(),
        extra=dict(extra),
        batching=batching,
        dynamic=dynamic,
    )


def _parse_model_file(ctx: FieldReader, doc: Mapping, backend: str, directory: Path) -> Path | None:
    raw = doc.get("model_file")
    if backend == "emulated":
        if raw is not None:
            ctx.fail("model_file", "emulated models have no model file; remove the key")
        return None
    if raw is None:
        ctx.fail("model_file", f"missing required key 'model_file' for backend {backend!r}")
    if not isinstance(raw, str) or not raw:
        ctx.fail("model_file", f"must be a file name relative to the model directory, got {raw!r}")
    rel = Path(raw)
    if rel.is_absolute() or ".." in rel.parts:
        ctx.fail("model_file", f"must be a relative path inside {directory}, got {raw!r}")
    base = directory.resolve()
    path = (base / rel).resolve()
    if not path.is_relative_to(base):
        ctx.fail("model_file", f"{raw!r} resolves to {path}, outside the model directory")
    if not path.is_file():
        ctx.fail("model_file", f"model file not found: {path}")
    return path


def parse_profile(
    ctx: FieldReader,
    raw: Any,
    where: str,
    max_batch: int,
    *,
    incomplete: str = "needs both alpha_ms and beta_ms (or a latency_ms table)",
) -> ProfileSpec:
    """A `profile` section, of a model config or of a workload file: α/β
    (ℓ(b) = α·b + β ms) or a `latency_ms` table {batch size: ms}, checked
    against `max_batch`. `incomplete` is the message when it has neither
    (each file format words its own hint)."""
    ctx.keys(raw, where, _PROFILE_KEYS)
    if "latency_ms" in raw:
        if "alpha_ms" in raw or "beta_ms" in raw:
            ctx.fail(where, "give either alpha_ms/beta_ms or latency_ms, not both")
        table_raw = raw["latency_ms"]
        if not isinstance(table_raw, Mapping) or not table_raw:
            ctx.fail(f"{where}.latency_ms", "must be a non-empty mapping {batch size: ms}")
        table: dict[int, float] = {}
        for b in table_raw:
            try:
                size = int(b)
            except (TypeError, ValueError):
                ctx.fail(f"{where}.latency_ms", f"batch size {b!r} is not an integer")
            if isinstance(b, bool) or size < 1 or str(size) != str(b).strip():
                ctx.fail(f"{where}.latency_ms", f"batch size {b!r} must be an integer ≥ 1")
            table[size] = ctx.number(table_raw, b, f"{where}.latency_ms[{size}]", above=0.0)
        try:
            LatencyProfile.from_table(table, max_batch)
        except ValueError as exc:
            ctx.fail(f"{where}.latency_ms", str(exc))
        return ProfileSpec(latency_ms=dict(sorted(table.items())))
    if "alpha_ms" not in raw or "beta_ms" not in raw:
        ctx.fail(where, incomplete)
    alpha = ctx.number(raw, "alpha_ms", f"{where}.alpha_ms", at_least=0.0)
    beta = ctx.number(raw, "beta_ms", f"{where}.beta_ms", at_least=0.0)
    if alpha + beta <= 0:
        ctx.fail(where, "alpha_ms and beta_ms cannot both be 0")
    return ProfileSpec(alpha_ms=alpha, beta_ms=beta)


# --------------------------------------------------------------------------- repository


@dataclass
class RepositoryIndex:
    """The models of a repository that loaded, and why the others did not."""

    root: Path
    # served model key → config: a model's name for its default version,
    # `version_key(name, version)` for each other version it serves
    models: dict[str, ModelConfig] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # model name → error message
    # model name (or skipped directory) → fields without effect, as logged
    warnings: dict[str, list[str]] = field(default_factory=dict)
    # Failed models that are optional: the bundled models an uninstalled
    # extra would build (not failures for EXIT_ON_ERROR or readiness).
    optional: set[str] = field(default_factory=set)

    def index(self) -> list[dict[str, str]]:
        """KServe v2 repository index entries, sorted by name; UNAVAILABLE
        entries carry the load error as `reason`."""
        rows = [
            {"name": c.model_name, "version": c.version, "state": "READY", "reason": ""}
            for c in self.models.values()
        ]
        rows += [
            {"name": n, "version": "", "state": "UNAVAILABLE", "reason": e}
            for n, e in self.errors.items()
        ]
        return sorted(rows, key=lambda r: (r["name"], r["version"]))


def load_repository(root: Path) -> RepositoryIndex:
    """Load every subdirectory of `root` that holds a config.yaml or a
    config.pbtxt. A model that fails to load is recorded in `.errors` (and
    logged); the others load. Raises ValueError only when `root` itself is
    not a directory."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"model repository {root} is not a directory")
    index = RepositoryIndex(root.resolve())
    no_slo: list[str] = []  # the models on DEFAULT_SLO_MS, warned about once
    for sub in sorted(root.iterdir(), key=lambda p: p.name):
        if not sub.is_dir() or sub.name.startswith("."):
            continue
        notes = index.warnings.setdefault(sub.name, [])

        def warn(message: str, model: str = sub.name, notes: list[str] = notes) -> None:
            notes.append(message)
            if message == NO_SLO_NOTE:  # said once for all such models, below
                no_slo.append(model)
            else:
                log.warning("model %s: %s", model, message)

        if not (sub / CONFIG_FILE).is_file() and not (sub / TRITON_CONFIG_FILE).is_file():
            if auto_completes(sub):
                log.info(
                    "model %s: no %s, its config completed from the model file",
                    sub.name,
                    TRITON_CONFIG_FILE,
                )
            else:
                warn(
                    f"skipped: the directory has no {CONFIG_FILE} or {TRITON_CONFIG_FILE} "
                    "(nor a version directory with a model.onnx to complete one from)"
                )
                continue
        try:
            versions = load_model_versions(sub, warn)
        except ValueError as exc:
            index.errors[sub.name] = str(exc)
            log.debug("model %s is unavailable: %s", sub.name, exc)  # the caller reports it
            continue
        index.models.update((config.name, config) for config in versions)
    if no_slo:
        log.warning("model(s) %s: %s", ", ".join(sorted(set(no_slo))), NO_SLO_NOTE)
    index.warnings = {name: notes for name, notes in index.warnings.items() if notes}
    return index


__all__ = [
    "BACKENDS",
    "CONFIG_FILE",
    "RepositoryIndex",
    "load_model_config",
    "load_model_versions",
    "load_repository",
    "parse_model_config",
    "validate_model_name",
]
