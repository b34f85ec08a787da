"""Load the model repository: `<root>/<name>/config.yaml` plus the model file.

A model's directory name is its name. `config.yaml` keys (defaults in brackets)::

    backend:             onnx | torch | emulated               (required)
    model_file:          path relative to the model directory  (onnx, torch: required;
                                                                emulated: not allowed)
    inputs:              [{name, datatype, shape}, ...]         (required, non-empty)
    outputs:             [{name, datatype, shape}, ...]         (required, non-empty)
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

`datatype` is a KServe v2 name (FP32, INT64, ... see config.DATATYPES). A
`shape` may be written with or without the leading batch dimension -1 (`[4096]`
and `[-1, 4096]` mean the same); every other dimension must be a positive
integer. Every error names the file and the field.

A model without a `profile` is measured by the profiler at load; the measured
table is cached next to the model as `profile.<device>.json` together with the
device, the ONNX Runtime version and the model file's SHA-256, and ignored once
the model file changes (`write_profile_cache`, `read_profile_cache`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import platform
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.config_fields import FieldReader, read_yaml
from app.repository.config import DATATYPES, ModelConfig, ProfileSpec, TensorSpec
from app.scheduling.profile import LatencyProfile

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
BACKENDS = ("onnx", "torch", "emulated")
CACHE_FORMAT = 1
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
    }
)
_REQUIRED_KEYS = ("backend", "inputs", "outputs", "max_batch_size", "slo_ms")
_TENSOR_KEYS = frozenset({"name", "datatype", "shape"})
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


def load_model_config(directory: Path) -> ModelConfig:
    """Parse and validate `<directory>/config.yaml`; the model's name is the
    directory's name. Raises ValueError naming the file and the field."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    try:
        validate_model_name(directory.name)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    doc = read_yaml(path, "model config")
    return parse_model_config(doc, directory, source=str(path))


def parse_model_config(doc: Any, directory: Path, source: str | None = None) -> ModelConfig:
    """Validate a parsed config document for the model in `directory`."""
    directory = Path(directory)
    ctx = FieldReader(source or str(directory / CONFIG_FILE))
    name = directory.name
    if doc is None:
        ctx.fail("top level", "the file is empty")
    ctx.keys(doc, "top level", _CONFIG_KEYS, required=_REQUIRED_KEYS)

    backend = doc["backend"]
    if backend not in BACKENDS:
        ctx.fail("backend", f"unknown backend {backend!r}; expected one of {list(BACKENDS)}")

    model_file = _parse_model_file(ctx, doc, backend, directory)
    inputs = _parse_tensors(ctx, doc["inputs"], "inputs")
    outputs = _parse_tensors(ctx, doc["outputs"], "outputs")
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


def _parse_tensors(ctx: FieldReader, raw: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or not raw:
        ctx.fail(where, "must be a non-empty list of {name, datatype, shape}")
    specs: list[TensorSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        w = f"{where}[{i}]"
        ctx.keys(entry, w, _TENSOR_KEYS, required=("name", "datatype", "shape"))
        name = entry["name"]
        if not isinstance(name, str) or not name:
            ctx.fail(f"{w}.name", f"must be a non-empty string, got {name!r}")
        if name in seen:
            ctx.fail(f"{w}.name", f"duplicate tensor name {name!r}")
        seen.add(name)
        w = f"{where}[{i}] ({name})"
        datatype = entry["datatype"]
        if not isinstance(datatype, str) or datatype.upper() not in DATATYPES:
            ctx.fail(
                f"{w}.datatype",
                f"unknown datatype {datatype!r}; expected one of {list(DATATYPES)}",
            )
        specs.append(TensorSpec(name, datatype.upper(), _parse_shape(ctx, entry["shape"], w)))
    return tuple(specs)


def _parse_shape(ctx: FieldReader, raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list):
        ctx.fail(f"{where}.shape", f"must be a list of dimensions like [-1, 4096], got {raw!r}")
    dims = list(raw)
    if dims and dims[0] == -1:
        dims = dims[1:]
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            ctx.fail(
                f"{where}.shape",
                f"dimension {d!r} in {raw} must be a positive integer "
                "(only the leading batch dimension may be -1)",
            )
    return (-1, *dims)


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
    models: dict[str, ModelConfig] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # model name → error message

    def index(self) -> list[dict[str, str]]:
        """KServe v2 repository index entries, sorted by name; UNAVAILABLE
        entries carry the load error as `reason`."""
        rows = [
            {"name": n, "version": c.version, "state": "READY", "reason": ""}
            for n, c in self.models.items()
        ]
        rows += [
            {"name": n, "version": "", "state": "UNAVAILABLE", "reason": e}
            for n, e in self.errors.items()
        ]
        return sorted(rows, key=lambda r: r["name"])


def load_repository(root: Path) -> RepositoryIndex:
    """Load every subdirectory of `root` that holds a config.yaml. A model that
    fails to load is recorded in `.errors` (and logged); the others load.
    Raises ValueError only when `root` itself is not a directory."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"model repository {root} is not a directory")
    index = RepositoryIndex(root.resolve())
    for sub in sorted(root.iterdir(), key=lambda p: p.name):
        if not sub.is_dir() or not (sub / CONFIG_FILE).is_file():
            continue
        try:
            index.models[sub.name] = load_model_config(sub)
        except ValueError as exc:
            index.errors[sub.name] = str(exc)
            log.warning("model %s is unavailable: %s", sub.name, exc)
    return index


# --------------------------------------------------------------------------- profiles


def latency_profile(config: ModelConfig, device_kind: str) -> LatencyProfile | None:
    """ℓ(b) for b ≤ max_batch_size on `device_kind`: the config's own profile,
    else the measured profile cached for that device (same key as given to
    write_profile_cache), else None (the model must be profiled)."""
    if config.profile is not None:
        return profile_from_spec(config.profile, config.max_batch_size)
    spec = read_profile_cache(config, device_kind)
    if spec is None:
        return None
    # Measured tables may dip by noise (ℓ(24) < ℓ(16)); from_table rejects that.
    table = monotone_table(spec.latency_ms or {})
    return profile_from_spec(
        ProfileSpec(spec.alpha_ms, spec.beta_ms, table, spec.device), config.max_batch_size
    )


def monotone_table(latency_ms: Mapping[int, float]) -> dict[int, float]:
    """A measured table made non-decreasing in batch size (running maximum),
    as LatencyProfile.from_table requires; measurement noise can break it."""
    out: dict[int, float] = {}
    running = 0.0
    for b, ms in sorted((int(b), float(ms)) for b, ms in latency_ms.items()):
        running = max(running, ms)
        out[b] = running
    return out


def profile_from_spec(spec: ProfileSpec, max_batch: int) -> LatencyProfile:
    """A ProfileSpec as a LatencyProfile (a table wins over α/β when both are set)."""
    if spec.latency_ms:
        return LatencyProfile.from_table(spec.latency_ms, max_batch)
    if spec.alpha_ms is None or spec.beta_ms is None:
        raise ValueError("profile has neither a latency table nor alpha_ms/beta_ms")
    return LatencyProfile.linear(spec.alpha_ms, spec.beta_ms, max_batch)


def fit_linear(latency_ms: Mapping[int, float]) -> tuple[float, float, float]:
    """Least-squares fit ℓ(b) = α·b + β of a measured table: (alpha_ms,
    beta_ms, r2). One point gives α = ℓ/b, β = 0; r2 is 1.0 when the values
    do not vary."""
    if not latency_ms:
        raise ValueError("cannot fit an empty latency table")
    b = np.array([float(k) for k in latency_ms], dtype=np.float64)
    y = np.array([float(v) for v in latency_ms.values()], dtype=np.float64)
    if len(b) == 1:
        return float(y[0] / b[0]), 0.0, 1.0
    a = np.column_stack([b, np.ones_like(b)])
    (alpha, beta), *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - (alpha * b + beta)
    ss_res = float(residual @ residual)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return float(alpha), float(beta), float(r2)


def sanitize_device(device: str) -> str:
    """A device key as a file-name part: `cuda:0` → `cuda-0`, `cpu 2t` → `cpu-2t`."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(device)).strip(".-")
    if not cleaned:
        raise ValueError(f"device name {device!r} has nothing usable for a file name")
    return cleaned


def profile_cache_path(config: ModelConfig, device: str) -> Path:
    return config.directory / f"profile.{sanitize_device(device)}.json"


def write_profile_cache(
    config: ModelConfig,
    device: str,
    latency_ms: Mapping[int, float],
    *,
    fit: Mapping[str, float],
    device_description: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write `<model dir>/profile.<device>.json` (atomically) with the measured
    table, the fit {alpha_ms, beta_ms, r2}, where it was measured and the model
    file's SHA-256; returns the path."""
    if not latency_ms:
        raise ValueError("refusing to cache an empty latency table")
    for key in ("alpha_ms", "beta_ms"):
        if key not in fit:
            raise ValueError(f"fit must contain {key!r}, got keys {sorted(fit)}")
    doc = {
        "format": CACHE_FORMAT,
        "model": config.name,
        "model_version": config.version,
        "device": device,
        "device_description": device_description or describe_host(),
        "onnxruntime_version": _onnxruntime_version(),
        "model_sha256": _model_hash(config),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "latency_ms": {str(int(b)): float(ms) for b, ms in sorted(latency_ms.items())},
        "fit": {k: float(v) for k, v in fit.items()},
    }
    if extra:
        doc["extra"] = dict(extra)
    path = profile_cache_path(config, device)
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    return path


def read_profile_cache(config: ModelConfig, device: str) -> ProfileSpec | None:
    """The cached measured profile of `config` on `device`; None when there is
    none, it cannot be read, or it is stale (the model file changed)."""
    path = profile_cache_path(config, device)
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != CACHE_FORMAT:
            log.info("%s: cache format %r, expected %d; ignoring", path, doc.get("format"), 1)
            return None
        table = {int(b): float(ms) for b, ms in doc["latency_ms"].items()}
        fit = doc.get("fit") or {}
        cached_hash = doc.get("model_sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("%s: unreadable profile cache, ignoring: %s", path, exc)
        return None
    if cached_hash != _model_hash(config):
        log.info("%s: stale (the model file changed since it was measured)", path)
        return None
    if not table:
        return None
    return ProfileSpec(
        alpha_ms=fit.get("alpha_ms"),
        beta_ms=fit.get("beta_ms"),
        latency_ms=dict(sorted(table.items())),
        device=doc.get("device", device),
    )


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, memoised per (path, inode, size, mtime) in the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _HASHES.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    _HASHES[key] = digest
    return digest


_HASHES: dict[tuple[str, int, int, int], str] = {}


def _model_hash(config: ModelConfig) -> str | None:
    if config.model_file is None:
        return None
    try:
        return file_sha256(config.model_file)
    except OSError:
        return None


def _onnxruntime_version() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime.__version__


def describe_host() -> str:
    """A one-line description of this machine's CPU (for cache files and logs)."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory and rename it into
    place, so readers never see a partial file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------- ONNX signature

# ONNX TensorProto element types (and ORT's type strings) → KServe v2 names.
ONNX_TO_V2 = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
}
ORT_TO_V2 = {
    "tensor(float)": "FP32",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(uint16)": "UINT16",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(bool)": "BOOL",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
}

# (name, v2 datatype or None if unsupported, dims with None for symbolic ones)
Signature = list[tuple[str, str | None, list[int | None]]]


def onnx_signature(path: Path) -> tuple[Signature, Signature]:
    """Graph inputs (initializers excluded) and outputs of an ONNX file."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}

    def describe(values: Any) -> Signature:
        out: Signature = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            out.append((v.name, ONNX_TO_V2.get(t.elem_type), dims))
        return out

    return describe(model.graph.input), describe(model.graph.output)


def ort_signature(session: Any) -> tuple[Signature, Signature]:
    """Inputs and outputs of an onnxruntime.InferenceSession."""

    def describe(args: Any) -> Signature:
        return [
            (a.name, ORT_TO_V2.get(a.type), [d if isinstance(d, int) else None for d in a.shape])
            for a in args
        ]

    return describe(session.get_inputs()), describe(session.get_outputs())


def signature_problems(config: ModelConfig, inputs: Signature, outputs: Signature) -> list[str]:
    """How the config's tensors disagree with a model's signature (empty when
    they agree). A symbolic model dimension matches anything; the config's
    batch dimension -1 matches a symbolic one."""
    problems: list[str] = []
    for kind, declared, actual in (
        ("input", config.inputs, inputs),
        ("output", config.outputs, outputs),
    ):
        by_name = {n: (dt, dims) for n, dt, dims in actual}
        for spec in declared:
            if spec.name not in by_name:
                problems.append(
                    f"{kind} {spec.name!r} is not in the model (it has {sorted(by_name)})"
                )
                continue
            dt, dims = by_name.pop(spec.name)
            if dt != spec.datatype:
                problems.append(
                    f"{kind} {spec.name!r}: config says {spec.datatype}, model has {dt}"
                )
            shown = [-1 if d is None else d for d in dims]
            if len(dims) != len(spec.shape) or any(
                d is not None and d != s for s, d in zip(spec.item_shape, dims[1:], strict=True)
            ):
                problems.append(
                    f"{kind} {spec.name!r}: config shape {list(spec.shape)}, model shape {shown}"
                )
            elif dims[0] is not None:
                problems.append(
                    f"{kind} {spec.name!r}: model shape {shown} has a fixed batch dimension; "
                    "batching needs it dynamic"
                )
        if kind == "input" and by_name:
            problems.append(f"model inputs missing from the config: {sorted(by_name)}")
    return problems


__all__ = [
    "BACKENDS",
    "CONFIG_FILE",
    "RepositoryIndex",
    "atomic_write_bytes",
    "describe_host",
    "file_sha256",
    "fit_linear",
    "latency_profile",
    "load_model_config",
    "load_repository",
    "monotone_table",
    "onnx_signature",
    "ort_signature",
    "parse_model_config",
    "profile_cache_path",
    "profile_from_spec",
    "read_profile_cache",
    "sanitize_device",
    "signature_problems",
    "validate_model_name",
    "write_profile_cache",
]
