"""Workload files: which devices, which models, and how requests arrive.

One YAML format feeds both the simulator and the load generator (DESIGN.md,
"Workload format"). Parsing validates everything up front and names the file
and the field in every error, because a typo in a 35-model file should fail
before a ten-minute run, not after it.

Top-level keys::

    name, description, duration_s, seed, devices, arrival, total_rate,
    popularity, slo_ms, slo_p99_multiple, max_batch, items, jitter,
    preemption_delay_ms, profile_sample_rate, models

`slo_ms` (or `slo_p99_multiple`), `max_batch` and `items` at the top level
are defaults for models that omit them. A model gives a `profile:` or, when
its execution time depends on its input, a `latency:` block
(app/workloads/dynamic.py, which also defines `slo_p99_multiple`);
`profile_sample_rate` is the share of such a model's finished requests the
simulated profiler re-runs alone (default DEFAULT_PROFILE_SAMPLE_RATE).

`arrival` is the default for models without their own `arrival:` (a model's
own arrival replaces it whole; nothing is merged). Without either, the
process is Poisson.

Arrival processes and their keys (defaults in brackets):

    poisson   -                            (rate from the model)
    gamma     shape                        (rate from the model; CV = 1/sqrt(shape))
    constant  offset_ms [0]                (rate from the model)
    burst     size, period_ms, offset_ms [0]
    mmpp      states: [{rate, dwell_s}, ...], order: random|cycle [random], initial [0]
    trace     file, minute_s [60], start_minute [1], scale [1.0]

Rates: poisson/gamma/constant need a rate, either per model (`rate:`) or from
`total_rate`, split by per-model `share:` (shares sum to 1) or by `popularity`
(`even` or `{zipf: s}`, in model order). burst, mmpp and trace imply their own
rate and take neither `rate` nor `share`.

Request sizes (`items`, app/workloads/items.py): how many items (batch
dimension) each request carries — one integer (`items: 4`: every request 4
items) or a mapping from item counts to probabilities (`items: {1: 0.7, 4:
0.3}`, summing to 1); counts from 1 to the model's max_batch. Default 1.
Rates stay in requests/s; the simulator's batches count items, and goodput
counts requests.

`count: N` (N > 1) expands a model entry into N models `name-0..name-(N-1)`;
every key, `rate` and `share` included, applies to each copy.

Trace composition: models whose arrivals are the same trace spec (same file
and parameters) share that trace's functions round-robin in model order: row i
goes to the i % len(group)-th model of the group. A global `arrival:` trace
therefore spreads the functions over all models that inherit it (as Shepherd
and PPipe do); a model with its own, different trace spec gets all rows.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.config_fields import FieldReader, read_yaml
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.types import DeviceInfo
from app.workloads.dynamic import (
    DEFAULT_PROFILE_SAMPLE_RATE,
    DynamicLatency,
    ModelLatency,
    check_latency_keys,
    parse_model_latency,
    parse_slo_defaults,
)
from app.workloads.items import ONE_ITEM, ItemSizes, check_items, parse_items

PROCESSES = ("poisson", "gamma", "constant", "burst", "mmpp", "trace")
# Processes driven by a model rate; the others carry their rate in their params.
RATE_PROCESSES = frozenset({"poisson", "gamma", "constant"})

_PROCESS_KEYS: dict[str, frozenset[str]] = {
    "poisson": frozenset(),
    "gamma": frozenset({"shape"}),
    "constant": frozenset({"offset_ms"}),
    "burst": frozenset({"size", "period_ms", "offset_ms"}),
    "mmpp": frozenset({"states", "order", "initial"}),
    "trace": frozenset({"file", "minute_s", "start_minute", "scale"}),
}
_TOP_KEYS = frozenset(
    {
        "name",
        "description",
        "duration_s",
        "seed",
        "devices",
        "arrival",
        "total_rate",
        "popularity",
        "slo_ms",
        "slo_p99_multiple",
        "max_batch",
        "items",
        "jitter",
        "preemption_delay_ms",
        "profile_sample_rate",
        "models",
    }
)
_MODEL_KEYS = frozenset(
    {"name", "profile", "latency", "slo_ms", "slo_p99_multiple", "max_batch", "items", "rate"}
    | {"share", "count", "arrival"}
)
_DEVICE_KEYS = frozenset({"name", "speed", "kind", "count"})
_TRACE_HEADER = ("HashOwner", "HashApp", "HashFunction", "Trigger")
_MISSING: Any = object()


@dataclass(frozen=True)
class ArrivalSpec:
    """How one model's requests arrive. `params` holds the process's keys with
    defaults filled in (and a trace `file` resolved to an absolute path)."""

    process: str
    params: dict

    @property
    def implied_rate(self) -> float | None:
        """Mean requests/s the process implies by itself (burst, mmpp); None
        where the model's rate drives it, or a file must be read (trace)."""
        p = self.params
        if self.process == "burst":
            return p["size"] * 1000.0 / p["period_ms"]
        if self.process == "mmpp":
            # Both the random and the cyclic jump chains visit states equally
            # often, so the time share of a state is proportional to its dwell.
            dwell = sum(s["dwell_s"] for s in p["states"])
            return sum(s["rate"] * s["dwell_s"] for s in p["states"]) / dwell
        return None


@dataclass(frozen=True)
class ModelSpec:
    name: str
    profile: LatencyProfile
    slo_ms: float
    max_batch: int
    rate: float | None  # requests/s for rate-driven processes (after any split)
    arrival: ArrivalSpec
    items: ItemSizes = ONE_ITEM  # request sizes (batch dimension)
    latency: DynamicLatency | None = None  # an input-dependent model (dynamic.py)
    prior_key: tuple[int, ...] = ()  # (workload seed, model index): seeds its prior

    def to_model_info(self, expected_rate: float | None = None) -> ModelInfo:
        """The core's view; `expected_rate` (requests/s) overrides `rate`
        (Workload passes the rate implied by a burst/mmpp/trace process).
        The core plans with items/s: the rate times the mean items."""
        rate = self.rate if expected_rate is None else expected_rate
        if rate is not None:
            rate *= self.items.mean
        dynamic = None if self.latency is None else self.latency.input_dependence(self.prior_key)
        return ModelInfo(
            self.name,
            self.profile,
            self.slo_ms / 1000.0,
            self.max_batch,
            expected_rate=rate,
            dynamic=dynamic,
        )

    @property
    def alone_p99_ms(self) -> float:
        """P99 of a one-item request's time alone: the unit of slo_p99_multiple."""
        if self.latency is not None:
            return self.latency.alone_p99_ms()
        return self.profile.latency(1) * 1000.0


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    speed: float = 1.0
    kind: str = "emulated"


@dataclass(frozen=True)
class Workload:
    name: str
    duration_s: float
    seed: int
    devices: list[DeviceSpec]
    models: list[ModelSpec]
    jitter: float = 0.0  # sigma of the lognormal execution-time jitter (simulator)
    preemption_delay_ms: float = 0.0  # cost of stopping a batch (simulator)
    profile_sample_rate: float = DEFAULT_PROFILE_SAMPLE_RATE  # simulated profiler

    def model_infos(self) -> list[ModelInfo]:
        return [m.to_model_info(r) for m, r in zip(self.models, self.model_rates(), strict=True)]

    def device_infos(self) -> list[DeviceInfo]:
        return [DeviceInfo(i, d.name, d.speed, d.kind) for i, d in enumerate(self.devices)]

    def model_rates(self) -> list[float]:
        """Mean offered requests/s per model at rate_scale 1. For a trace it is
        the expected count inside [0, duration) divided by the duration."""
        trace_rows = trace_assignment(self.models)
        rates: list[float] = []
        for i, m in enumerate(self.models):
            if m.rate is not None:
                rates.append(m.rate)
            elif m.arrival.process == "trace":
                counts, starts = trace_window(m.arrival.params, self.duration_s)
                minute_s = m.arrival.params["minute_s"]
                # The last minute may be cut by the duration: count its overlap.
                overlap = np.clip(self.duration_s - starts, 0.0, minute_s) / minute_s
                total = float(counts[trace_rows[i]].sum(axis=0) @ overlap)
                rates.append(total * m.arrival.params["scale"] / self.duration_s)
            else:
                implied = m.arrival.implied_rate
                rates.append(0.0 if implied is None else implied)
        return rates

    def offered_rate(self) -> float:
        return float(sum(self.model_rates()))


# --------------------------------------------------------------------------- loading


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    doc = read_yaml(path, "workload file")
    return parse_workload(doc, path.parent, source=str(path))


def parse_workload(doc: dict, base_dir: Path, source: str = "<workload>") -> Workload:
    """Validate a parsed YAML document; `base_dir` resolves relative trace
    paths and `source` names the file in error messages."""
    ctx = FieldReader(source)
    ctx.keys(doc, "top level", _TOP_KEYS, required=("duration_s", "devices", "models"))
    name = doc.get("name", Path(source).stem if source != "<workload>" else "workload")
    if not isinstance(name, str) or not name:
        ctx.fail("name", f"must be a non-empty string, got {name!r}")
    duration = ctx.number(doc, "duration_s", "duration_s", above=0.0)
    seed = ctx.number(doc, "seed", "seed", default=0, at_least=0, integer=True)
    jitter = ctx.number(doc, "jitter", "jitter", default=0.0, at_least=0.0)
    preempt = ctx.number(
        doc, "preemption_delay_ms", "preemption_delay_ms", default=0.0, at_least=0.0
    )
    sample_rate = ctx.number(
        doc, "profile_sample_rate", "profile_sample_rate", default=DEFAULT_PROFILE_SAMPLE_RATE
    )
    if not 0.0 <= sample_rate <= 1.0:
        ctx.fail("profile_sample_rate", f"must be a fraction in [0, 1], got {sample_rate:g}")
    devices = _parse_devices(ctx, doc["devices"])
    base_dir = Path(base_dir)
    default_arrival = (
        _parse_arrival(ctx, doc["arrival"], "arrival", base_dir)
        if "arrival" in doc
        else ArrivalSpec("poisson", {})
    )
    models = _parse_models(ctx, doc, default_arrival, base_dir, seed)
    return Workload(name, duration, seed, devices, models, jitter, preempt, sample_rate)


def _parse_devices(ctx: FieldReader, raw: Any) -> list[DeviceSpec]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            ctx.fail("devices", f"must be ≥ 1, got {raw}")
        return [DeviceSpec(f"dev{i}") for i in range(raw)]
    if not isinstance(raw, list) or not raw:
        ctx.fail("devices", "must be a positive count or a non-empty list of devices")
    devices: list[DeviceSpec] = []
    for i, entry in enumerate(raw):
        where = f"devices[{i}]"
        ctx.keys(entry, where, _DEVICE_KEYS)
        speed = ctx.number(entry, "speed", f"{where}.speed", default=1.0, above=0.0)
        kind = entry.get("kind", "emulated")
        if not isinstance(kind, str) or not kind:
            ctx.fail(f"{where}.kind", f"must be a non-empty string, got {kind!r}")
        name = entry.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            ctx.fail(f"{where}.name", f"must be a non-empty string, got {name!r}")
        count = ctx.number(entry, "count", f"{where}.count", default=None, at_least=1, integer=True)
        for j in range(count or 1):
            if name is None:
                label = f"dev{len(devices)}"
            else:
                label = name if count is None else f"{name}-{j}"
            devices.append(DeviceSpec(label, speed, kind))
    seen: set[str] = set()
    for d in devices:
        if d.name in seen:
            ctx.fail("devices", f"duplicate device name {d.name!r}")
        seen.add(d.name)
    return devices


def _parse_arrival(ctx: FieldReader, raw: Any, where: str, base_dir: Path) -> ArrivalSpec:
    if not isinstance(raw, Mapping):
        ctx.fail(where, f"must be a mapping like {{process: poisson}}, got {raw!r}")
    process = raw.get("process")
    if process is None:
        ctx.fail(where, f"missing required key 'process' (one of {list(PROCESSES)})")
    if process not in PROCESSES:
        ctx.fail(f"{where}.process", f"unknown process {process!r}; expected one of {PROCESSES}")
    ctx.keys(raw, where, _PROCESS_KEYS[process] | {"process"})
    params: dict[str, Any] = {}
    if process == "gamma":
        params["shape"] = ctx.number(raw, "shape", f"{where}.shape", above=0.0)
    elif process == "constant":
        params["offset_ms"] = ctx.number(
            raw, "offset_ms", f"{where}.offset_ms", default=0.0, at_least=0.0
        )
    elif process == "burst":
        params["size"] = ctx.number(raw, "size", f"{where}.size", at_least=1, integer=True)
        params["period_ms"] = ctx.number(raw, "period_ms", f"{where}.period_ms", above=0.0)
        params["offset_ms"] = ctx.number(
            raw, "offset_ms", f"{where}.offset_ms", default=0.0, at_least=0.0
        )
    elif process == "mmpp":
        params.update(_parse_mmpp(ctx, raw, where))
    elif process == "trace":
        params.update(_parse_trace(ctx, raw, where, base_dir))
    return ArrivalSpec(process, params)


def _parse_mmpp(ctx: FieldReader, raw: Mapping, where: str) -> dict[str, Any]:
    states_raw = raw.get("states")
    if not isinstance(states_raw, list) or not states_raw:
        ctx.fail(f"{where}.states", "must be a non-empty list of {rate, dwell_s}")
    states = []
    for i, s in enumerate(states_raw):
        sw = f"{where}.states[{i}]"
        ctx.keys(s, sw, frozenset({"rate", "dwell_s"}), required=("rate", "dwell_s"))
        states.append(
            {
                "rate": ctx.number(s, "rate", f"{sw}.rate", at_least=0.0),
                "dwell_s": ctx.number(s, "dwell_s", f"{sw}.dwell_s", above=0.0),
            }
        )
    order = raw.get("order", "random")
    if order not in ("random", "cycle"):
        ctx.fail(f"{where}.order", f"must be 'random' or 'cycle', got {order!r}")
    initial = ctx.number(raw, "initial", f"{where}.initial", default=0, at_least=0, integer=True)
    if initial >= len(states):
        ctx.fail(f"{where}.initial", f"must index a state (0..{len(states) - 1}), got {initial}")
    return {"states": states, "order": order, "initial": initial}


def _parse_trace(ctx: FieldReader, raw: Mapping, where: str, base_dir: Path) -> dict[str, Any]:
    file = raw.get("file")
    if not isinstance(file, str) or not file:
        ctx.fail(f"{where}.file", "missing trace file path (a CSV in the Azure Functions format)")
    path = Path(file) if Path(file).is_absolute() else (base_dir / file)
    path = path.resolve()
    if not path.is_file():
        ctx.fail(f"{where}.file", f"trace file not found: {path}")
    try:
        n_minutes = _trace_header(str(path), path.stat().st_mtime_ns)
    except ValueError as exc:
        ctx.fail(f"{where}.file", str(exc))
    start = ctx.number(raw, "start_minute", f"{where}.start_minute", default=1, integer=True)
    if not 1 <= start <= n_minutes:
        ctx.fail(f"{where}.start_minute", f"must be in 1..{n_minutes} for {path}, got {start}")
    return {
        "file": str(path),
        "minute_s": ctx.number(raw, "minute_s", f"{where}.minute_s", default=60.0, above=0.0),
        "start_minute": start,
        "scale": ctx.number(raw, "scale", f"{where}.scale", default=1.0, above=0.0),
    }


@dataclass
class _Entry:
    """A model after expansion, before its rate is resolved."""

    where: str
    name: str
    latency: ModelLatency  # profile, dynamic model and SLO
    max_batch: int
    rate: float | None
    share: float | None
    arrival: ArrivalSpec
    items: ItemSizes


def _parse_models(
    ctx: FieldReader, doc: Mapping, default_arrival: ArrivalSpec, base_dir: Path, seed: int
) -> list[ModelSpec]:
    raw_models = doc["models"]
    if not isinstance(raw_models, list) or not raw_models:
        ctx.fail("models", "must be a non-empty list")
    slo_defaults = parse_slo_defaults(ctx, doc)
    default_mb = ctx.number(doc, "max_batch", "max_batch", default=None, at_least=1, integer=True)
    default_items = parse_items(ctx, doc["items"], "items") if "items" in doc else ONE_ITEM
    entries: list[_Entry] = []
    for i, raw in enumerate(raw_models):
        label = raw.get("name") if isinstance(raw, Mapping) else None
        where = f"models[{i}]" + (f" ({label})" if isinstance(label, str) else "")
        ctx.keys(raw, where, _MODEL_KEYS, required=("name",))
        check_latency_keys(ctx, raw, where)
        name = raw["name"]
        if not isinstance(name, str) or not name:
            ctx.fail(f"{where}.name", f"must be a non-empty string, got {name!r}")
        max_batch = ctx.number(
            raw, "max_batch", f"{where}.max_batch", default=default_mb, at_least=1, integer=True
        )
        if max_batch is None:
            ctx.fail(f"{where}.max_batch", "missing (set it per model or at the top level)")
        latency = parse_model_latency(ctx, raw, where, max_batch, base_dir, slo_defaults)
        items_where = f"{where}.items" if "items" in raw else "items"
        items = parse_items(ctx, raw["items"], items_where) if "items" in raw else default_items
        check_items(ctx, items, items_where, max_batch)
        rate = ctx.number(raw, "rate", f"{where}.rate", default=None, at_least=0.0)
        share = ctx.number(raw, "share", f"{where}.share", default=None, at_least=0.0)
        if share is not None and share > 1:
            ctx.fail(f"{where}.share", f"must be a fraction in [0, 1], got {share}")
        count = ctx.number(raw, "count", f"{where}.count", default=1, at_least=1, integer=True)
        arrival = (
            _parse_arrival(ctx, raw["arrival"], f"{where}.arrival", base_dir)
            if "arrival" in raw
            else default_arrival
        )
        names = [name] if count == 1 else [f"{name}-{j}" for j in range(count)]
        for n in names:
            entries.append(_Entry(where, n, latency, max_batch, rate, share, arrival, items))
    seen: set[str] = set()
    for e in entries:
        if e.name in seen:
            ctx.fail("models", f"duplicate model name {e.name!r} (after count expansion)")
        seen.add(e.name)
    rates = _resolve_rates(ctx, doc, entries)
    return [
        ModelSpec(
            e.name,
            e.latency.profile,
            e.latency.slo_ms,
            e.max_batch,
            r,
            e.arrival,
            e.items,
            e.latency.dynamic,
            (seed, k),
        )
        for k, (e, r) in enumerate(zip(entries, rates, strict=True))
    ]


def _resolve_rates(ctx: FieldReader, doc: Mapping, entries: list[_Entry]) -> list[float | None]:
    """Per-model rate: explicit `rate`, or `total_rate` split by share or
    popularity over the rate-driven models; None for self-rated processes."""
    for e in entries:
        proc = e.arrival.process
        if proc not in RATE_PROCESSES and (e.rate is not None or e.share is not None):
            how = "use the trace's scale" if proc == "trace" else "its parameters set the rate"
            ctx.fail(e.where, f"rate/share do not apply to a {proc!r} arrival ({how})")
    driven = [i for i, e in enumerate(entries) if e.arrival.process in RATE_PROCESSES]
    rates: list[float | None] = [None] * len(entries)
    total = ctx.number(doc, "total_rate", "total_rate", default=None, at_least=0.0)
    if total is None:
        if "popularity" in doc:
            ctx.fail("popularity", "only applies with total_rate")
        for i in driven:
            e = entries[i]
            if e.share is not None:
                ctx.fail(f"{e.where}.share", "share needs a top-level total_rate")
            if e.rate is None:
                ctx.fail(
                    f"{e.where}.rate",
                    f"missing: a {e.arrival.process!r} arrival needs a rate "
                    "(or set a top-level total_rate)",
                )
            rates[i] = e.rate
        return rates
    if not driven:
        ctx.fail("total_rate", "no model takes a rate (all use burst, mmpp or trace arrivals)")
    for i in driven:
        if entries[i].rate is not None:
            ctx.fail(f"{entries[i].where}.rate", "give total_rate or per-model rates, not both")
    with_share = [i for i in driven if entries[i].share is not None]
    if with_share:
        if "popularity" in doc:
            ctx.fail("popularity", "give per-model share or popularity, not both")
        if len(with_share) != len(driven):
            missing = entries[next(i for i in driven if entries[i].share is None)]
            ctx.fail(f"{missing.where}.share", "missing: when one model has a share, all must")
        weights = np.array([entries[i].share for i in driven])
        if abs(weights.sum() - 1.0) > 1e-6:
            ctx.fail("models", f"shares must sum to 1, they sum to {weights.sum():.6g}")
    else:
        weights = _popularity(ctx, doc.get("popularity", "even"), len(driven))
    for i, w in zip(driven, weights, strict=True):
        rates[i] = float(total * w)
    return rates


def _popularity(ctx: FieldReader, raw: Any, n: int) -> np.ndarray:
    """Weights summing to 1, in model order (the first model is the most
    popular under Zipf, as in Symphony §5.2.1)."""
    if raw == "even":
        return np.full(n, 1.0 / n)
    if isinstance(raw, Mapping) and set(raw) == {"zipf"}:
        s = ctx.number(raw, "zipf", "popularity.zipf", at_least=0.0)
        w = 1.0 / np.arange(1, n + 1, dtype=float) ** s
        return w / w.sum()
    ctx.fail("popularity", f"must be 'even' or {{zipf: s}}, got {raw!r}")


# --------------------------------------------------------------------------- traces


@functools.lru_cache(maxsize=32)
def _trace_header(path: str, mtime_ns: int) -> int:
    """Check the Azure Functions 2019 header; return the number of minute
    columns (1440 in the published files). mtime_ns keys the cache."""
    del mtime_ns
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip().split(",")
    if tuple(header[:4]) != _TRACE_HEADER:
        raise ValueError(
            f"{path}: header must start with {','.join(_TRACE_HEADER)}, got {header[:4]}"
        )
    minutes = header[4:]
    if not minutes or minutes != [str(m) for m in range(1, len(minutes) + 1)]:
        raise ValueError(f"{path}: minute columns must be 1,2,...,N after Trigger")
    return len(minutes)


@functools.lru_cache(maxsize=8)
def _trace_columns(path: str, mtime_ns: int, first: int, last: int) -> np.ndarray:
    """Counts[rows, minutes first..last]; only those columns are parsed, since a
    published day file has 1440 of them and ~46k rows. (mtime_ns keys the
    cache so an edited file is re-read.)"""
    del mtime_ns
    cols = range(4 + first - 1, 4 + last)
    counts = np.loadtxt(
        path, delimiter=",", skiprows=1, usecols=cols, dtype=np.int64, ndmin=2, comments=None
    )
    if counts.shape[0] == 0:
        raise ValueError(f"{path}: trace has no function rows")
    if (counts < 0).any():
        raise ValueError(f"{path}: trace has negative counts")
    counts.setflags(write=False)
    return counts


def trace_window(params: Mapping, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(counts[rows, minutes], start_s[minutes]) for the trace minutes that
    overlap [0, duration_s). Trace minute `start_minute` begins at t = 0; the
    replay ends where the file ends (it does not wrap)."""
    path, minute_s, first = params["file"], params["minute_s"], params["start_minute"]
    available = _trace_header(path, os.stat(path).st_mtime_ns)
    wanted = max(1, math.ceil(duration_s / minute_s - 1e-9))
    last = min(available, first + wanted - 1)
    counts = _trace_columns(path, os.stat(path).st_mtime_ns, first, last)
    starts = np.arange(counts.shape[1], dtype=np.float64) * minute_s
    return counts, starts


def trace_assignment(models: list[ModelSpec]) -> dict[int, np.ndarray]:
    """Model index → the trace rows (functions) it replays. Models with the
    same trace spec share its rows round-robin, in model order."""
    groups: list[tuple[dict, list[int]]] = []
    for i, m in enumerate(models):
        if m.arrival.process != "trace":
            continue
        for params, members in groups:
            if params == m.arrival.params:
                members.append(i)
                break
        else:
            groups.append((m.arrival.params, [i]))
    out: dict[int, np.ndarray] = {}
    for params, members in groups:
        n_rows = _trace_columns(
            params["file"],
            os.stat(params["file"]).st_mtime_ns,
            params["start_minute"],
            params["start_minute"],
        ).shape[0]
        if n_rows < len(members):
            raise ValueError(
                f"{params['file']}: {n_rows} functions cannot feed {len(members)} models "
                "round-robin (each model needs at least one row)"
            )
        for k, i in enumerate(members):
            out[i] = np.arange(k, n_rows, len(members))
    return out
