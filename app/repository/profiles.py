"""Latency profiles of a repository's models: from the config, or measured
and cached in a cache directory (PROFILE_CACHE_DIR, by default
`$XDG_CACHE_HOME/deadline-serve/profiles`), never in the model repository,
which may be read-only or shared. A cache file is named after the model, a
content hash of its model file and the device
(`<model>.<hash>.<device>.json`), so two repositories, two versions of a
model file and two devices never share an entry; it records the device, the
ONNX Runtime version and the model file's SHA-256 (ignored once the model
file changes).

A measured profile's quality is judged by `fit_problems`: a linear fit with
r² below a threshold, or latency that falls as the batch grows by more than
measurement noise (MONOTONE_TOLERANCE, NOISE_MS), means the machine was busy
while it was measured (start-up measures it again)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from app.repository.config import ModelConfig, ProfileSpec
from app.repository.files import atomic_write_bytes, file_sha256
from app.scheduling.profile import LatencyProfile

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
# A measured ℓ(b) more than this fraction below a smaller batch's is not noise.
MONOTONE_TOLERANCE = 0.1
# Differences smaller than this are timer noise, whatever the fit says: a
# model this fast has a flat profile, and its r² means nothing.
NOISE_MS = 0.05
CACHE_APP_DIR = Path("deadline-serve") / "profiles"


def default_profile_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/deadline-serve/profiles`, else `~/.cache/deadline-serve/profiles`."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or ""
    root = Path(base) if base.strip() and Path(base).is_absolute() else Path.home() / ".cache"
    return root / CACHE_APP_DIR


def latency_profile(
    config: ModelConfig, device_kind: str, cache_dir: Path | None = None
) -> LatencyProfile | None:
    """ℓ(b) for b ≤ max_batch_size on `device_kind`: the config's own profile,
    else the measured profile cached for that device (same key as given to
    write_profile_cache), else None (the model must be profiled)."""
    if config.profile is not None:
        return profile_from_spec(config.profile, config.max_batch_size)
    spec = read_profile_cache(config, device_kind, cache_dir)
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


def fit_problems(latency_ms: Mapping[int, float], min_r2: float) -> list[str]:
    """Why a measured table is not to be trusted (empty when it is): its
    linear fit's r² is below `min_r2`, or ℓ falls with batch size by more
    than MONOTONE_TOLERANCE."""
    problems: list[str] = []
    values = [float(ms) for ms in latency_ms.values()]
    _, _, r2 = fit_linear(latency_ms)
    spread = max(values) - min(values)
    if r2 < min_r2 and spread > max(NOISE_MS, MONOTONE_TOLERANCE * max(values)):
        problems.append(f"linear fit r² {r2:.3f} < {min_r2:g}")
    peak_b, peak = 0, 0.0
    for b, ms in sorted((int(b), float(ms)) for b, ms in latency_ms.items()):
        if peak - ms > max(NOISE_MS, MONOTONE_TOLERANCE * peak):
            problems.append(f"ℓ({b}) = {ms:.2f} ms below ℓ({peak_b}) = {peak:.2f} ms")
        if ms > peak:
            peak_b, peak = b, ms
    return problems


def sanitize_device(device: str) -> str:
    """A device key as a file-name part: `cuda:0` → `cuda-0`, `cpu 2t` → `cpu-2t`."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(device)).strip(".-")
    if not cleaned:
        raise ValueError(f"device name {device!r} has nothing usable for a file name")
    return cleaned


def profile_cache_path(config: ModelConfig, device: str, cache_dir: Path | None = None) -> Path:
    """`<cache dir>/<model>.<content hash>.<device>.json`."""
    root = default_profile_cache_dir() if cache_dir is None else Path(cache_dir)
    return root / f"{config.name}.{_content_key(config)}.{sanitize_device(device)}.json"


def _content_key(config: ModelConfig) -> str:
    """16 hex digits of the model file's SHA-256; for a model without a file
    (emulated), of what defines it."""
    digest = _model_hash(config)
    if digest is None:
        what = repr((config.backend, config.inputs, config.outputs, sorted(config.extra.items())))
        digest = hashlib.sha256(what.encode()).hexdigest()
    return digest[:16]


def write_profile_cache(
    config: ModelConfig,
    device: str,
    latency_ms: Mapping[int, float],
    *,
    fit: Mapping[str, float],
    device_description: str | None = None,
    extra: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """Write the cache file (profile_cache_path, atomically; the directory
    is made if missing) with the measured table, the fit {alpha_ms, beta_ms,
    r2}, where it was measured and the model file's SHA-256; returns the path."""
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
    path = profile_cache_path(config, device, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode())
    return path


def read_profile_cache(
    config: ModelConfig, device: str, cache_dir: Path | None = None
) -> ProfileSpec | None:
    """The cached measured profile of `config` on `device`; None when there is
    none, it cannot be read, or it is stale (the model file changed)."""
    path = profile_cache_path(config, device, cache_dir)
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
