"""Input-dependent latency in workload files: a model's `latency:` block.

A model gives either a `profile:` (one ℓ(b) per batch size: the same time
for every input) or a `latency:` block, for a dynamic model whose execution
time depends on its input (orloj.txt §3–4)::

    latency:
      batch: {c0_ms: 5.0, c1: 0.1}   # a batch of k items runs c0 + c1·k·max_r ℓ_r
      floor_ms: 0.1                  # ℓ_r below it is clipped to it [DEFAULT_FLOOR_MS]
      apps:                          # a request draws its application by share,
        - name: short                # then ℓ_r from that application's lengths
          share: 0.5
          modes: [{mean_ms: 20, std_ms: 2, weight: 1.0}]   # a mixture of normals
        - name: long
          share: 0.5
          table: long.csv            # or: one ℓ_r in ms per line (relative to the file)
          inputs: long.npz           # optional, live load only: this application's inputs

**Live load.** `bench.loadgen` sends each request its application as
`app_id`; an application's `inputs` (an .npz, relative to the file: one
array per model input, one row per request variant) gives its requests
their inputs, a row each (bench/loadgen/variants.py). The simulator draws
ℓ_r as above and ignores `inputs`.

Each request r has a length ℓ_r (ms); alone it runs c0 + c1·ℓ_r, its
*alone-time*; a batch of k items runs c0 + c1·k·max_r ℓ_r (eq. 3–4: the
inputs are padded to the longest). Normals can go below zero, so ℓ_r is
clipped to `floor_ms` (default 0.1 ms, about one kernel launch: no request
is free). Shares sum to 1 over the applications, weights to 1 within one
(a single application or mode may leave them out).

**SLO.** `slo_p99_multiple: m` (per model, or a top-level default) sets the
SLO to m × the P99 of the alone-time over all of the model's applications,
by share — the paper's unit (§5.2). It is computed, not sampled: bisection
on the mixture's CDF (tables: their empirical CDF), so the figure never
depends on a seed. A static model's alone-time is ℓ(1), its P99 too. A
model gives `slo_ms` or `slo_p99_multiple`, not both; a model's own key
wins over the top-level defaults, and the top level gives one of the two.

**The profile other policies plan with.** Clockwork and Nexus profile a
model once per batch size with one representative input and plan with that
ℓ(b); the derived profile is the same model at the mean length,
ℓ(b) = c0 + c1·b·E[ℓ_r] (E over the mixture, clipping included). A batch
that mixes lengths then runs past their plan, which is what Orloj is about.

**What the core is told** (`input_dependence`): c0 in seconds and, per
application, PRIOR_SAMPLES alone-times drawn from a seed derived from the
workload's seed and the model's index — the profiling a deployment does
before it serves. Later alone-times come from the (simulated) asynchronous
profiler.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.config_fields import FieldReader
from app.repository.loader import parse_profile
from app.repository.profiles import profile_from_spec
from app.scheduling.model import InputDependence
from app.scheduling.profile import LatencyProfile

DEFAULT_FLOOR_MS = 0.1
DEFAULT_PROFILE_SAMPLE_RATE = 0.1  # share of finished requests the profiler re-runs alone
PRIOR_SAMPLES = 500
P99 = 0.99
_SUM_TOLERANCE = 1e-6
_LATENCY_KEYS = frozenset({"batch", "floor_ms", "apps"})
_BATCH_KEYS = frozenset({"c0_ms", "c1"})
_APP_KEYS = frozenset({"name", "share", "modes", "table", "inputs"})
_MODE_KEYS = frozenset({"mean_ms", "std_ms", "weight"})
# Seed-sequence tags: distinct from the other streams of a workload's seed
# (arrivals: seed; items: [seed, 2]; latency draws: [seed, 4], see arrivals.py).
PRIOR_STREAM = 6


@dataclass(frozen=True)
class Mode:
    """One normal component of an application's lengths (ms)."""

    mean_ms: float
    std_ms: float
    weight: float


@dataclass(frozen=True)
class AppLengths:
    """One application's ℓ_r (ms, before clipping): a mixture of normals, or
    an empirical table (`table_ms`, sorted)."""

    name: str
    share: float
    modes: tuple[Mode, ...] = ()
    table_ms: tuple[float, ...] = ()
    # The live load generator's inputs for this application's requests: an
    # .npz of one array per model input, a row per request variant (the
    # simulator draws ℓ_r above and ignores it; bench/loadgen/variants.py).
    inputs: Path | None = None

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.table_ms:
            return np.asarray(self.table_ms)[rng.integers(0, len(self.table_ms), n)]
        which = rng.choice(len(self.modes), size=n, p=[m.weight for m in self.modes])
        means = np.array([m.mean_ms for m in self.modes])[which]
        stds = np.array([m.std_ms for m in self.modes])[which]
        return means + stds * rng.standard_normal(n)

    def cdf(self, y: np.ndarray) -> np.ndarray:
        """P(ℓ_r ≤ y), unclipped."""
        y = np.asarray(y, dtype=float)
        if self.table_ms:
            table = np.asarray(self.table_ms)
            return np.searchsorted(table, y, side="right") / len(table)
        out = np.zeros_like(y)
        for m in self.modes:
            out += m.weight * _normal_cdf(y, m.mean_ms, m.std_ms)
        return out

    def clipped_mean(self, floor: float) -> float:
        """E[max(ℓ_r, floor)]."""
        if self.table_ms:
            return float(np.maximum(np.asarray(self.table_ms), floor).mean())
        total = 0.0
        for m in self.modes:
            if m.std_ms == 0.0:
                total += m.weight * max(m.mean_ms, floor)
                continue
            z = (floor - m.mean_ms) / m.std_ms
            below = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
            density = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
            total += m.weight * (floor * below + m.mean_ms * (1.0 - below) + m.std_ms * density)
        return total

    def upper_ms(self) -> float:
        """A length no draw exceeds in practice (the CDF is 1 there to 1e-30)."""
        if self.table_ms:
            return self.table_ms[-1]
        return max(m.mean_ms + 12.0 * m.std_ms for m in self.modes)


def _normal_cdf(y: np.ndarray, mean: float, std: float) -> np.ndarray:
    if std == 0.0:
        return (y >= mean).astype(float)
    z = (y - mean) / (std * math.sqrt(2.0))
    return 0.5 * (1.0 + np.asarray(_erf(z), dtype=float))


_erf = np.frompyfunc(math.erf, 1, 1)


@dataclass(frozen=True)
class DynamicLatency:
    """A model whose execution time depends on its input (see the module
    docstring): batch constants, the floor and the applications' lengths."""

    c0_ms: float
    c1: float
    floor_ms: float
    apps: tuple[AppLengths, ...]

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(application index, ℓ_r in ms, clipped) for n requests."""
        which = rng.choice(len(self.apps), size=n, p=[a.share for a in self.apps])
        lengths = np.empty(n)
        for i, app in enumerate(self.apps):
            mask = which == i
            lengths[mask] = app.draw(rng, int(mask.sum()))
        return which.astype(np.int32), np.maximum(lengths, self.floor_ms)

    def length_cdf(self, y: np.ndarray) -> np.ndarray:
        """P(clipped ℓ_r ≤ y) over the mixture of applications."""
        y = np.asarray(y, dtype=float)
        total = sum(app.share * app.cdf(y) for app in self.apps)
        return np.where(y < self.floor_ms, 0.0, total)

    def length_quantile(self, q: float) -> float:
        """The smallest y with P(clipped ℓ_r ≤ y) ≥ q, by bisection."""
        lo, hi = self.floor_ms, max(self.floor_ms, max(a.upper_ms() for a in self.apps))
        if float(self.length_cdf(lo)) >= q:
            return lo
        for _ in range(200):  # lo: below q; hi: at or above it
            mid = 0.5 * (lo + hi)
            if float(self.length_cdf(mid)) >= q:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-12 * hi:
                break
        return hi

    def alone_p99_ms(self) -> float:
        return self.c0_ms + self.c1 * self.length_quantile(P99)

    def mean_length_ms(self) -> float:
        return sum(a.share * a.clipped_mean(self.floor_ms) for a in self.apps)

    def expected_max_length_ms(self, k: int, points: int = 20_001) -> float:
        """E[max of k independent lengths] = floor + ∫ (1 − F(y)^k) dy above
        the floor (numerically, on a grid): what a batch of k mixed requests
        pays on average."""
        hi = max(a.upper_ms() for a in self.apps)
        if hi <= self.floor_ms:
            return self.floor_ms
        y = np.linspace(self.floor_ms, hi, points)
        tail = 1.0 - self.length_cdf(y).astype(float) ** k
        return self.floor_ms + float(np.sum((tail[1:] + tail[:-1]) * 0.5 * np.diff(y)))

    def expected_batch_ms(self, k: int) -> float:
        """E[ℓ_B] of a batch of k requests drawn at random (eq. 5)."""
        return self.c0_ms + self.c1 * k * self.expected_max_length_ms(k)

    def profile(self, max_batch: int) -> LatencyProfile:
        """ℓ(b) = c0 + c1·b·E[ℓ_r]: the one-ℓ(b) view of the other policies."""
        return LatencyProfile.linear(self.c1 * self.mean_length_ms(), self.c0_ms, max_batch)

    def input_dependence(self, prior_key: tuple[int, ...]) -> InputDependence:
        """c0 (s) and PRIOR_SAMPLES alone-times (s) per application, drawn
        from `prior_key` (the workload's seed and the model's index)."""
        return _input_dependence(self, prior_key)


@functools.lru_cache(maxsize=64)
def _input_dependence(latency: DynamicLatency, prior_key: tuple[int, ...]) -> InputDependence:
    rng = np.random.default_rng([*prior_key[:1], PRIOR_STREAM, *prior_key[1:]])
    c0 = latency.c0_ms / 1000.0
    prior = []
    for app in latency.apps:
        lengths = np.maximum(app.draw(rng, PRIOR_SAMPLES), latency.floor_ms)
        alone = c0 + latency.c1 * lengths / 1000.0
        prior.append((app.name, tuple(float(a) for a in np.maximum(alone, c0))))
    return InputDependence(c0, tuple(prior))


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ModelLatency:
    """A model's latency after parsing: the profile every policy gets, the
    dynamic model if it has one, and its SLO (ms)."""

    profile: LatencyProfile
    dynamic: DynamicLatency | None
    slo_ms: float


def parse_slo_defaults(ctx: FieldReader, doc: Mapping) -> tuple[float | None, float | None]:
    """The top-level (slo_ms, slo_p99_multiple) defaults; at most one."""
    slo = ctx.number(doc, "slo_ms", "slo_ms", default=None, above=0.0)
    multiple = ctx.number(doc, "slo_p99_multiple", "slo_p99_multiple", default=None, above=0.0)
    if slo is not None and multiple is not None:
        ctx.fail("slo_p99_multiple", "give a top-level slo_ms or slo_p99_multiple, not both")
    return slo, multiple


def check_latency_keys(ctx: FieldReader, raw: Mapping, where: str) -> None:
    """A model entry has a `profile` or a `latency`, exactly one."""
    if "profile" not in raw and "latency" not in raw:
        ctx.fail(where, "missing required key 'profile' (or 'latency', input-dependent)")
    if "profile" in raw and "latency" in raw:
        ctx.fail(where, "give either 'profile' (static) or 'latency' (input-dependent), not both")


def parse_model_latency(
    ctx: FieldReader,
    raw: Mapping,
    where: str,
    max_batch: int,
    base_dir: Path,
    defaults: tuple[float | None, float | None],
) -> ModelLatency:
    """A model entry's `profile:` or `latency:` (exactly one) and its SLO."""
    check_latency_keys(ctx, raw, where)
    dynamic = None
    if "profile" in raw:
        spec = parse_profile(
            ctx,
            raw["profile"],
            f"{where}.profile",
            max_batch,
            incomplete="needs alpha_ms and beta_ms, or latency_ms",
        )
        profile = profile_from_spec(spec, max_batch)
        p99_ms = profile.latency(1) * 1000.0
    else:
        dynamic = parse_latency(ctx, raw["latency"], f"{where}.latency", base_dir)
        profile = dynamic.profile(max_batch)
        p99_ms = dynamic.alone_p99_ms()
    slo = ctx.number(raw, "slo_ms", f"{where}.slo_ms", default=None, above=0.0)
    multiple = ctx.number(
        raw, "slo_p99_multiple", f"{where}.slo_p99_multiple", default=None, above=0.0
    )
    if slo is not None and multiple is not None:
        ctx.fail(where, "give slo_ms or slo_p99_multiple, not both")
    if slo is None and multiple is None:
        slo, multiple = defaults
    if slo is None and multiple is None:
        ctx.fail(
            f"{where}.slo_ms",
            "missing (set slo_ms or slo_p99_multiple per model or at the top level)",
        )
    return ModelLatency(profile, dynamic, slo if slo is not None else multiple * p99_ms)


def parse_latency(ctx: FieldReader, raw: Any, where: str, base_dir: Path) -> DynamicLatency:
    ctx.keys(raw, where, _LATENCY_KEYS, required=("batch", "apps"))
    batch = raw["batch"]
    ctx.keys(batch, f"{where}.batch", _BATCH_KEYS, required=("c0_ms", "c1"))
    c0 = ctx.number(batch, "c0_ms", f"{where}.batch.c0_ms", at_least=0.0)
    c1 = ctx.number(batch, "c1", f"{where}.batch.c1", above=0.0)
    floor = ctx.number(raw, "floor_ms", f"{where}.floor_ms", default=DEFAULT_FLOOR_MS, above=0.0)
    apps_raw = raw["apps"]
    if not isinstance(apps_raw, list) or not apps_raw:
        ctx.fail(f"{where}.apps", "must be a non-empty list of applications")
    apps = [_parse_app(ctx, a, f"{where}.apps[{i}]", base_dir) for i, a in enumerate(apps_raw)]
    names = [a.name for a in apps]
    for name in names:
        if names.count(name) > 1:
            ctx.fail(f"{where}.apps", f"duplicate application name {name!r}")
    if len(apps) > 1 and any(a.share is None for a in apps):
        missing = next(i for i, a in enumerate(apps) if a.share is None)
        ctx.fail(f"{where}.apps[{missing}].share", "missing (required with several applications)")
    shares = [1.0 if a.share is None else a.share for a in apps]
    if abs(sum(shares) - 1.0) > _SUM_TOLERANCE:
        ctx.fail(f"{where}.apps", f"shares must sum to 1, they sum to {sum(shares):.6g}")
    apps = [
        AppLengths(a.name, s, a.modes, a.table_ms, a.inputs)
        for a, s in zip(apps, shares, strict=True)
    ]
    return DynamicLatency(c0, c1, floor, tuple(apps))


@dataclass(frozen=True)
class _RawApp:
    name: str
    share: float | None
    modes: tuple[Mode, ...]
    table_ms: tuple[float, ...]
    inputs: Path | None = None


def _parse_app(ctx: FieldReader, raw: Any, where: str, base_dir: Path) -> _RawApp:
    ctx.keys(raw, where, _APP_KEYS, required=("name",))
    name = raw["name"]
    if not isinstance(name, str) or not name:
        ctx.fail(f"{where}.name", f"must be a non-empty string, got {name!r}")
    share = ctx.number(raw, "share", f"{where}.share", default=None, above=0.0)
    if share is not None and share > 1:
        ctx.fail(f"{where}.share", f"must be a fraction in (0, 1], got {share:g}")
    if ("modes" in raw) == ("table" in raw):
        ctx.fail(where, "give either 'modes' (a mixture of normals) or 'table' (a file), one")
    inputs = None
    if "inputs" in raw:
        if not isinstance(raw["inputs"], str) or not raw["inputs"].endswith(".npz"):
            ctx.fail(f"{where}.inputs", f"must name an .npz file, got {raw['inputs']!r}")
        inputs = (base_dir / raw["inputs"]).resolve()
        if not inputs.is_file():
            ctx.fail(f"{where}.inputs", f"no such file: {inputs}")
    if "table" in raw:
        table = _read_table(ctx, raw["table"], f"{where}.table", base_dir)
        return _RawApp(name, share, (), table, inputs)
    modes_raw = raw["modes"]
    if not isinstance(modes_raw, list) or not modes_raw:
        ctx.fail(f"{where}.modes", "must be a non-empty list of {mean_ms, std_ms, weight}")
    modes = []
    for j, m in enumerate(modes_raw):
        mw = f"{where}.modes[{j}]"
        ctx.keys(m, mw, _MODE_KEYS, required=("mean_ms", "std_ms"))
        default_weight = 1.0 if len(modes_raw) == 1 else None
        weight = ctx.number(m, "weight", f"{mw}.weight", default=default_weight, above=0.0)
        if weight is None:
            ctx.fail(f"{mw}.weight", "missing (required with several modes)")
        mean = ctx.number(m, "mean_ms", f"{mw}.mean_ms", above=0.0)
        modes.append(Mode(mean, ctx.number(m, "std_ms", f"{mw}.std_ms", at_least=0.0), weight))
    total = sum(m.weight for m in modes)
    if abs(total - 1.0) > _SUM_TOLERANCE:
        ctx.fail(f"{where}.modes", f"weights must sum to 1, they sum to {total:.6g}")
    return _RawApp(name, share, tuple(modes), (), inputs)


def _read_table(ctx: FieldReader, raw: Any, where: str, base_dir: Path) -> tuple[float, ...]:
    if not isinstance(raw, str) or not raw:
        ctx.fail(where, f"must be a file name (one length in ms per line), got {raw!r}")
    path = Path(raw) if Path(raw).is_absolute() else base_dir / raw
    if not path.is_file():
        ctx.fail(where, f"length table not found: {path}")
    try:
        values = np.loadtxt(path, dtype=float, ndmin=1, comments="#", delimiter=",")
    except ValueError as exc:
        ctx.fail(where, f"{path}: expected one number (ms) per line: {exc}")
    if values.ndim != 1:
        ctx.fail(where, f"{path}: expected one number (ms) per line, got {values.shape[1]} columns")
    if values.size == 0:
        ctx.fail(where, f"{path}: the table is empty")
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        line = int(np.argmax(bad))
        ctx.fail(
            where, f"{path}: lengths must be finite and ≥ 0 ms, value {line + 1} is {values[line]}"
        )
    return tuple(float(v) for v in np.sort(values))
