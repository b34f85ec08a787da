"""Execution-time distributions of a dynamic model, and the batch latency
that follows from them (orloj.txt §3 "per-application tracking", §4.2–4.3).

A request r of a dynamic model runs alone for a_r = c0 + x_r seconds; a
batch of k items runs L = c0 + k·max_r x_r (eq. 3–4 with c1·ℓ_r written x_r,
see `InputDependence`). The core keeps, per (model, application), the
alone-times the profiler measured, and derives from them:

* **E[L_k] and the histogram of L_k** for every batch size k = 1..max_batch,
  the figures queue membership and priority scores use. Per §4.3 the batch
  is not known when a request's priority is computed, so the k draws come
  from all the model's applications: the mixture Σ_i w_i F_i with w_i the
  application's share of the samples in use (the traffic the profiler saw),
  and the CDF of the maximum is (Σ_i w_i F_i)^k (eq. 6).
* **E[L_k] of a batch of one application** (`expected_alike`): c0 +
  k·E[max of k draws of F_app], what a request of that application expects
  of a batch of its own kind (Orloj's per-request eligibility, orloj.py).
* **The expected latency of a formed batch** (`expected_batch`): its
  requests' applications are known, the draws are independent but not
  identically distributed, and the CDF of the maximum is Π_r F_app(r).
  Eq. 8 (Özbey et al.) gives the same density as a sum over subsets;
  `max_density_eq8` implements it literally, for small batches, to show
  that the two agree; the product form is what the policy uses.

Discretisation (§4.2.1 warns that the naive histogram is too inaccurate):
the histogram's mass is taken as uniform within each bin, so each F_i is
piecewise linear and F^k, Π F_i are polynomials within a bin; E[max] =
lo + ∫ (1 − F_max) is integrated exactly with Gauss–Legendre nodes per bin.

Histograms are built from the samples themselves: 64 (`bins`) equal bins
over the range the samples in use cover, shared by the model's
applications, so a sample outside the old range never needs rebinning —
the next recomputation spans it. A window keeps at most `max_samples`
samples per application (the oldest go first).

**Windows** (§3 "long-term feedback loop"): samples are collected in
windows of `window_s` seconds, aligned on the first window's start. A reset
must not leave the policy blind, so — a deviation from the paper, which
simply resets — an application's *current* window is used once it holds
`min_samples` samples; until then the previous window's samples (at first,
the model's `prior`) stay in use. When a window closes with fewer than
`min_samples` samples, its samples are discarded and the previous window
stays in use. Applications' shares count the samples in use.

Everything is recomputed lazily: a sample bumps `version` only when it
changes the samples in use, and the tables are rebuilt on the next query.
Nothing here reads a clock: `now` comes with each sample.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from app.scheduling.profile import LatencyProfile

DEFAULT_BINS = 64
DEFAULT_MAX_SAMPLES = 4096


@dataclass(frozen=True)
class LatencyTables:
    """Batch latency per batch size k (index k; index 0 unused): `expected[k]`
    = E[L_k] in seconds, `edges[k]` / `masses[k]` its histogram (bin edges,
    probability mass per bin, masses summing to 1)."""

    expected: tuple[float, ...]
    edges: tuple[np.ndarray, ...]
    masses: tuple[np.ndarray, ...]


class BatchLatency:
    """What a policy asks of a model's batch latency; see the subclasses."""

    version: int = 0

    def tables(self) -> LatencyTables:
        raise NotImplementedError

    def expected(self, k: int) -> float:
        return self.tables().expected[k]

    def histogram(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        tables = self.tables()
        return tables.edges[k], tables.masses[k]

    def expected_batch(self, apps: Sequence[str], items: int) -> float:
        """E[L] of a formed batch of `items` items whose requests come from
        `apps` (one entry per request)."""
        raise NotImplementedError


class StaticLatency(BatchLatency):
    """A model without input dependence: its profile's ℓ(k), a point.

    For a linear profile this is the alone-time distribution "a single point
    ℓ(1)" with c0 = β: c0 + k·(ℓ(1) − c0) = ℓ(k). The profile's ℓ(k) is
    taken directly so that table profiles stay exact and the figures are
    float for float those the other policies plan with."""

    def __init__(self, profile: LatencyProfile, max_batch: int) -> None:
        self.profile = profile
        values = [profile.latency(k) for k in range(1, max_batch + 1)]
        self._tables = LatencyTables(
            expected=(0.0, *values),
            edges=(np.zeros(1), *(np.array([v, v]) for v in values)),
            masses=(np.zeros(0), *(np.ones(1) for _ in values)),
        )

    def tables(self) -> LatencyTables:
        return self._tables

    def expected_batch(self, apps: Sequence[str], items: int) -> float:
        return self.profile.latency(items)


class AloneTimes(BatchLatency):
    """Per-application alone-time histograms of one dynamic model."""

    def __init__(
        self,
        c0: float,
        max_batch: int,
        *,
        window_s: float,
        min_samples: int,
        prior: Iterable[tuple[str, Iterable[float]]] = (),
        bins: int = DEFAULT_BINS,
        max_samples: int = DEFAULT_MAX_SAMPLES,
    ) -> None:
        if not (c0 >= 0.0 and math.isfinite(c0)):
            raise ValueError(f"c0 must be a finite number ≥ 0 (seconds), got {c0}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
        if not (window_s > 0.0):
            raise ValueError(f"window_s must be > 0 (seconds), got {window_s}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be ≥ 1, got {min_samples}")
        if bins < 1:
            raise ValueError(f"bins must be ≥ 1, got {bins}")
        if max_samples < min_samples:
            raise ValueError(
                f"max_samples must be ≥ min_samples = {min_samples}, got {max_samples}"
            )
        self.c0 = c0
        self.max_batch = max_batch
        self.window_s = window_s
        self.min_samples = min_samples
        self.bins = bins
        self.max_samples = max_samples
        # Per application: the previous window's samples (x = a − c0), and
        # the current window's.
        self._previous: dict[str, deque[float]] = {}
        self._current: dict[str, deque[float]] = {}
        self._window_start: float | None = None
        for app, samples in prior:
            # The prior is kept whole (no cap): it is what the model declared.
            self._previous.setdefault(app, deque()).extend(self._x(a) for a in samples)
        self.version = 0
        self._built = -1
        self._tables: LatencyTables | None = None
        self._grid: tuple[np.ndarray, dict[str, np.ndarray], np.ndarray] | None = None

    # ------------------------------------------------------------ samples

    def record(self, app: str, seconds: float, now: float) -> None:
        """A request of `app` ran alone for `seconds`, measured by `now`."""
        if not (seconds >= 0.0 and math.isfinite(seconds)):
            raise ValueError(f"an alone-time must be a finite number ≥ 0 s, got {seconds}")
        self._roll(now)
        current = self._current.setdefault(app, self._ring())
        current.append(self._x(seconds))
        if len(current) >= self.min_samples:
            self.version += 1

    def samples_in_use(self, app: str) -> tuple[float, ...]:
        """The alone-times minus c0 (x = a − c0) that `app`'s histogram is
        built from now."""
        return tuple(self._in_use(app))

    def quantiles(self, app: str, qs: Sequence[float]) -> tuple[float, ...]:
        """`app`'s alone-time (c0 + x) at each quantile of `qs` over the
        samples in use (orloj.txt §3 "per-application tracking"), or () when
        it has none."""
        samples = self.samples_in_use(app)
        if not samples:
            return ()
        return tuple(self.c0 + float(x) for x in np.quantile(np.asarray(samples), qs))

    def apps(self) -> list[str]:
        """Applications with samples in use, in a fixed order."""
        names = set(self._previous) | set(self._current)
        return sorted(a for a in names if self._in_use(a))

    def has_samples(self) -> bool:
        """Whether some application has samples in use (else nothing can be
        estimated)."""
        return any(self._in_use(a) for a in itertools.chain(self._previous, self._current))

    def _roll(self, now: float) -> None:
        if self._window_start is None:
            self._window_start = now
            return
        if now < self._window_start + self.window_s:
            return
        closed = math.floor((now - self._window_start) / self.window_s)
        self._window_start += closed * self.window_s
        for app, current in self._current.items():
            # Only windows with enough samples replace the ones in use; a
            # thin window is dropped. A gap of several windows ends the
            # current one exactly like one window.
            if len(current) >= self.min_samples:
                self._previous[app] = current
        self._current = {}

    def _in_use(self, app: str) -> deque[float]:
        current = self._current.get(app)
        if current is not None and len(current) >= self.min_samples:
            return current
        return self._previous.get(app) or deque()

    def _ring(self) -> deque[float]:
        return deque(maxlen=self.max_samples)

    def _x(self, seconds: float) -> float:
        # Measurements below c0 (noise) count as x = 0.
        return max(0.0, seconds - self.c0)

    # ---------------------------------------------------------- histograms

    def grid(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """(edges of x, per-application masses, mixture masses), on one grid
        of `bins` equal bins over the samples in use (one bin of width 0
        when they are all equal)."""
        if self._grid is not None and self._built == self.version:
            return self._grid
        per_app = {a: np.fromiter(self._in_use(a), float) for a in self.apps()}
        if not per_app:
            raise ValueError("no alone-time samples: give the model a prior or measure some")
        everything = np.concatenate(list(per_app.values()))
        lo, hi = float(everything.min()), float(everything.max())
        if hi == lo:
            edges = np.array([lo, hi])
            masses = {a: np.ones(1) for a in per_app}
        else:
            edges = np.linspace(lo, hi, self.bins + 1)
            masses = {
                a: np.histogram(x, bins=edges)[0].astype(float) / x.size for a, x in per_app.items()
            }
        total = everything.size
        mixture = sum(masses[a] * (per_app[a].size / total) for a in per_app)
        self._grid = (edges, masses, np.asarray(mixture, float))
        self._tables = None
        self._built = self.version
        return self._grid

    def tables(self) -> LatencyTables:
        edges, _, mixture = self.grid()
        if self._tables is not None:
            return self._tables
        cdf = np.concatenate(([0.0], np.cumsum(mixture)))
        cdf[-1] = 1.0
        expected = [0.0]
        all_edges = [np.zeros(1)]
        all_masses = [np.zeros(0)]
        for k in range(1, self.max_batch + 1):
            expected.append(self.c0 + k * expected_max(edges, [(cdf, k)]))
            all_edges.append(self.c0 + k * edges)
            all_masses.append(np.diff(cdf**k))
        self._tables = LatencyTables(tuple(expected), tuple(all_edges), tuple(all_masses))
        return self._tables

    def cdf_at_edges(self, app: str | None) -> np.ndarray:
        """F of `app`'s x at the grid's edges; `None` or an application
        without samples: the model's mixture."""
        _, masses, mixture = self.grid()
        pmf = masses.get(app, mixture) if app is not None else mixture
        cdf = np.concatenate(([0.0], np.cumsum(pmf)))
        cdf[-1] = 1.0
        return cdf

    def expected_batch(self, apps: Sequence[str], items: int) -> float:
        """c0 + items·E[max_r x_r], the draws of each request from its own
        application (Π_r F_app(r), eq. 8's product form); an application
        without samples draws from the model's mixture."""
        if not apps:
            raise ValueError("a batch has at least one request")
        edges, masses, _ = self.grid()
        counts: dict[str | None, int] = {}
        for app in apps:
            key = app if app in masses else None
            counts[key] = counts.get(key, 0) + 1
        factors = [(self.cdf_at_edges(a), n) for a, n in counts.items()]
        return self.c0 + items * expected_max(edges, factors)

    def expected_alike(self, app: str) -> tuple[float, ...]:
        """E[L_k] of a batch of k requests all of `app` (index k, 0 unused):
        c0 + k·E[max of k draws of F_app] (eq. 5 with eq. 6), the batch
        latency Algorithm 1's EstimateBatchLatency(r, bs) gives a request of
        `app`; an application without samples gets the mixture's."""
        edges, masses, _ = self.grid()
        if app not in masses:
            return self.tables().expected
        cdf = self.cdf_at_edges(app)
        return (
            0.0,
            *(self.c0 + k * expected_max(edges, [(cdf, k)]) for k in range(1, self.max_batch + 1)),
        )

    def histogram_alike(self, app: str, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The histogram (edges, masses) of L_k for a batch of k requests all
        of `app`: the mixture's when `app` has no samples."""
        edges, masses, _ = self.grid()
        if app not in masses:
            return self.histogram(k)
        cdf = self.cdf_at_edges(app)
        return self.c0 + k * edges, np.diff(cdf**k)

    def pdf_cdf(self, app: str | None, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(density, CDF) of `app`'s x at points `x` (uniform within a bin);
        for a grid of one zero-width bin the density is not defined."""
        edges = self.grid()[0]
        cdf = self.cdf_at_edges(app)
        if edges[-1] == edges[0]:
            raise ValueError("all samples are equal: the distribution has no density")
        width = edges[1] - edges[0]
        density = np.diff(cdf) / width
        i = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(density) - 1)
        inside = (x >= edges[0]) & (x < edges[-1])
        f = np.where(inside, density[i], 0.0)
        F = np.interp(x, edges, cdf, left=0.0, right=1.0)
        return f, F


def expected_max(edges: np.ndarray, factors: Sequence[tuple[np.ndarray, int]]) -> float:
    """E[max] of independent draws whose CDFs, piecewise linear on `edges`,
    are given at the edges: `factors` = (CDF at edges, how many draws).

    E[max] = lo + ∫_lo^hi (1 − Π F_i^{n_i}) dx; within a bin the integrand
    is a polynomial of degree Σ n_i, integrated exactly by Gauss–Legendre
    with ⌈(Σ n_i + 1)/2⌉ nodes."""
    lo = float(edges[0])
    widths = np.diff(edges)
    if not widths.size or widths.max() == 0.0:
        return lo
    degree = sum(n for _, n in factors)
    nodes, weights = np.polynomial.legendre.leggauss(max(1, (degree + 2) // 2))
    u = (nodes + 1.0) / 2.0  # nodes on [0, 1]
    product = np.ones((widths.size, u.size))
    for cdf, n in factors:
        inside = cdf[:-1, None] + np.diff(cdf)[:, None] * u[None, :]
        product *= inside**n
    per_bin = (1.0 - product) @ (weights / 2.0)
    return lo + float(per_bin @ widths)


def max_density_eq8(cdfs: np.ndarray, pdfs: np.ndarray) -> np.ndarray:
    """Density of the maximum of k independent variables, eq. 8 literally:

        f_(k) = Σ_{κ=1..k} (−1)^{k−κ} κ^k / k! · Σ_{|s|=κ} k·[F^s]^{k−1} f^s

    with F^s, f^s the means of the F_i, f_i over the subset s. `cdfs` and
    `pdfs` have one row per variable (k rows), one column per point. The
    sum runs over all 2^k − 1 subsets: for small k only."""
    cdfs = np.asarray(cdfs, float)
    pdfs = np.asarray(pdfs, float)
    k = cdfs.shape[0]
    if k > 12:
        raise ValueError(f"eq. 8 sums over 2^k subsets; k = {k} is too many")
    total = np.zeros(cdfs.shape[1])
    for kappa in range(1, k + 1):
        coef = (-1) ** (k - kappa) * kappa**k / math.factorial(k)
        for s in itertools.combinations(range(k), kappa):
            F_s = cdfs[list(s)].mean(axis=0)
            f_s = pdfs[list(s)].mean(axis=0)
            total += coef * k * F_s ** (k - 1) * f_s
    return total
