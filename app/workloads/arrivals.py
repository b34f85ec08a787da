"""Arrival times for a workload: one vectorised numpy stream per model.

Each model draws from its own child of `SeedSequence(workload.seed)`, spawned
by model index, so a model's stream does not change when models are added
after it (a model's spawn key is its index, whatever the count). Trace
arrivals are the exception by design: adding a model to a trace group changes
the round-robin row assignment. Request sizes (`ModelSpec.items`) come from
children of a second sequence, `SeedSequence([seed, 2])`, so giving a model
sizes leaves every arrival time unchanged. Likewise each request's
application and work (an input-dependent model's `latency:`, see
app/workloads/dynamic.py) come from children of `SeedSequence([seed, 4])`:
giving a model a latency block changes no arrival time and no size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.workloads.spec import ModelSpec, Workload, trace_assignment, trace_window


@dataclass
class Arrivals:
    times: np.ndarray  # float64 seconds, ascending, within [0, duration)
    model_index: np.ndarray  # int32 index into workload.models
    items: np.ndarray | None = None  # int32 items of each request; None: one each
    # Application of each request (object array of str; "" for a static
    # model's requests), and its work x_r = c1·ℓ_r in seconds (0 for static
    # models): an input-dependent request runs c0 + x_r alone. None: all static.
    apps: np.ndarray | None = None
    work: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.times)

    def select(self, keep: np.ndarray) -> Arrivals:
        """The arrivals where `keep` (a boolean mask) is true, sizes,
        applications and work included."""
        items = None if self.items is None else self.items[keep]
        apps = None if self.apps is None else self.apps[keep]
        work = None if self.work is None else self.work[keep]
        return Arrivals(self.times[keep], self.model_index[keep], items, apps, work)

    def counts(self, n_models: int) -> np.ndarray:
        """Arrivals per model."""
        return np.bincount(self.model_index, minlength=n_models)


def generate_arrivals(workload: Workload, rate_scale: float = 1.0) -> Arrivals:
    """All arrivals in [0, duration), merged in time order. `rate_scale`
    multiplies every rate (burst: the burst size, rounded, at least 1)."""
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise ValueError(f"rate_scale must be a positive number, got {rate_scale}")
    children = np.random.SeedSequence(workload.seed).spawn(len(workload.models))
    trace_rows = trace_assignment(workload.models)
    size_children = np.random.SeedSequence([workload.seed, 2]).spawn(len(workload.models))
    work_children = np.random.SeedSequence([workload.seed, 4]).spawn(len(workload.models))
    streams = []
    sizes = []
    apps = []
    works = []
    for i, (model, child) in enumerate(zip(workload.models, children, strict=True)):
        items_child = size_children[i]
        rng = np.random.default_rng(child)
        streams.append(_model_times(model, rng, workload.duration_s, rate_scale, trace_rows.get(i)))
        sizes.append(model.items.draw(np.random.default_rng(items_child), len(streams[-1])))
        app, work = _model_work(model, np.random.default_rng(work_children[i]), len(streams[-1]))
        apps.append(app)
        works.append(work)
    times = np.concatenate(streams) if streams else np.empty(0)
    index = np.repeat(np.arange(len(streams), dtype=np.int32), [len(s) for s in streams])
    # Stable, so simultaneous arrivals (bursts) keep model order then draw order.
    order = np.argsort(times, kind="stable")
    items = np.concatenate(sizes) if sizes else np.empty(0, dtype=np.int32)
    app_names = np.concatenate(apps) if apps else np.empty(0, dtype=object)
    work_s = np.concatenate(works) if works else np.empty(0)
    return Arrivals(
        times[order], index[order], items[order].astype(np.int32), app_names[order], work_s[order]
    )


def _model_work(
    model: ModelSpec, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """(application, work x_r in seconds) of a model's n requests."""
    apps = np.full(n, "", dtype=object)
    if model.latency is None:
        return apps, np.zeros(n)
    which, lengths = model.latency.draw(rng, n)
    names = np.array([a.name for a in model.latency.apps], dtype=object)
    return names[which], model.latency.c1 * lengths / 1000.0


def _model_times(
    model: ModelSpec,
    rng: np.random.Generator,
    duration: float,
    scale: float,
    rows: np.ndarray | None,
) -> np.ndarray:
    p = model.arrival.params
    process = model.arrival.process
    if process in ("poisson", "gamma", "constant"):
        rate = (model.rate or 0.0) * scale
        if process == "constant":
            return _constant(rate, p["offset_ms"] / 1000.0, duration)
        shape = p["shape"] if process == "gamma" else 1.0
        return _gamma_renewal(rng, rate, shape, duration)
    if process == "burst":
        size = max(1, round(p["size"] * scale))
        return _burst(size, p["period_ms"] / 1000.0, p["offset_ms"] / 1000.0, duration)
    if process == "mmpp":
        return _mmpp(rng, p, scale, duration)
    if process == "trace":
        assert rows is not None
        return _trace(rng, p, rows, scale, duration)
    raise ValueError(f"model {model.name!r}: unknown arrival process {process!r}")


def _gamma_renewal(
    rng: np.random.Generator, rate: float, shape: float, duration: float
) -> np.ndarray:
    """Renewal process with Γ(shape, 1/(shape·rate)) gaps: mean 1/rate, CV
    1/sqrt(shape); shape 1 is Poisson. Drawn in chunks sized so one chunk
    almost always covers the duration."""
    if rate <= 0:
        return np.empty(0)
    expected = rate * duration
    n = int(expected + 6.0 * math.sqrt(expected / shape) + 16)
    chunks = []
    t0 = 0.0
    while True:
        if shape == 1.0:
            gaps = rng.exponential(1.0 / rate, n)
        else:
            gaps = rng.gamma(shape, 1.0 / (shape * rate), n)
        t = t0 + np.cumsum(gaps)
        chunks.append(t)
        if t[-1] >= duration:
            break
        t0 = float(t[-1])
        n = int((duration - t0) * rate * 1.2) + 16
    times = np.concatenate(chunks)
    return times[: np.searchsorted(times, duration, side="left")]


def _constant(rate: float, offset: float, duration: float) -> np.ndarray:
    if rate <= 0 or offset >= duration:
        return np.empty(0)
    # offset + i/rate rather than a cumulative sum: gaps stay exact.
    n = math.ceil((duration - offset) * rate) + 1
    times = offset + np.arange(n, dtype=np.float64) / rate
    return times[times < duration]


def _burst(size: int, period: float, offset: float, duration: float) -> np.ndarray:
    if offset >= duration:
        return np.empty(0)
    n = math.ceil((duration - offset) / period) + 1
    instants = offset + np.arange(n, dtype=np.float64) * period
    return np.repeat(instants[instants < duration], size)


def _mmpp(rng: np.random.Generator, p: dict, scale: float, duration: float) -> np.ndarray:
    """Markov-modulated Poisson: exponential dwell in each state, then a jump
    to a uniformly random other state (or the next one with order: cycle);
    Poisson arrivals at the state's rate while in it. Starts in `initial`."""
    rates = np.array([s["rate"] for s in p["states"]]) * scale
    dwell = np.array([s["dwell_s"] for s in p["states"]])
    n_states = len(rates)
    if n_states == 1:
        seq, starts, lengths = np.zeros(1, dtype=np.int64), np.zeros(1), np.array([duration])
    else:
        seq, starts, lengths = _mmpp_segments(rng, dwell, p["order"], p["initial"], duration)
    counts = rng.poisson(rates[seq] * lengths)
    # Given its count, a Poisson segment's arrivals are uniform over it.
    times = np.repeat(starts, counts) + rng.random(int(counts.sum())) * np.repeat(lengths, counts)
    times.sort()
    return times[times < duration]


def _mmpp_segments(
    rng: np.random.Generator, dwell: np.ndarray, order: str, state: int, duration: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(state, start, length) of each sojourn, clipped to [0, duration)."""
    n_states = len(dwell)
    n = int(1.5 * duration / dwell.mean()) + 16
    seqs, starts, lengths = [], [], []
    t0 = 0.0
    while t0 < duration:
        if order == "cycle":
            seq = (state + np.arange(n)) % n_states
        else:
            # Steps of 1..S-1 (mod S) land uniformly on one of the other states.
            steps = np.concatenate(([0], rng.integers(1, n_states, n - 1)))
            seq = (state + np.cumsum(steps)) % n_states
        sojourn = rng.exponential(dwell[seq])
        ends = t0 + np.cumsum(sojourn)
        begin = ends - sojourn
        keep = begin < duration
        seqs.append(seq[keep])
        starts.append(begin[keep])
        lengths.append(np.minimum(ends[keep], duration) - begin[keep])
        t0 = float(ends[-1])
        step = 1 if order == "cycle" else int(rng.integers(1, n_states))
        state = int((seq[-1] + step) % n_states)
    return np.concatenate(seqs), np.concatenate(starts), np.concatenate(lengths)


def _trace(
    rng: np.random.Generator, p: dict, rows: np.ndarray, scale: float, duration: float
) -> np.ndarray:
    """Replay the per-minute counts of `rows` (summed), compressed to
    `minute_s` seconds a minute, uniform within each minute."""
    counts, starts = trace_window(p, duration)
    per_minute = counts[rows].sum(axis=0).astype(np.float64) * (p["scale"] * scale)
    # Stochastic rounding: exact for integer factors (x2 doubles every count)
    # and unbiased for fractional ones, where plain rounding would erase the
    # many 1-invocation minutes of the Azure trace.
    whole = np.floor(per_minute)
    n = (whole + (rng.random(len(per_minute)) < per_minute - whole)).astype(np.int64)
    minute_s = p["minute_s"]
    times = np.repeat(starts, n) + rng.random(int(n.sum())) * minute_s
    times.sort()
    return times[times < duration]
