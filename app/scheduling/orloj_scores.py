"""Orloj's priority score (orloj.txt §4.1 eq. 1–2, §4.4), vectorised.

A request with deadline D, waiting at time t, whose batch runs L (a random
variable with a histogram: bins [l1, l2) of probability mass m, density
h = m/(l2 − l1)) has the priority

    p(t) = (E[C_delay(t)] − E[C_now(t)]) / E[L]                      (eq. 1)

where C is a step cost c = 1 at the deadline, C_now(t) = C(t + L) and
C_delay(t) = C(t + τ + L) with τ ~ Exp(b): the expected cost saved by
running it now rather than after a delay, per unit of expected worker time.
Per bin (eq. 2, with the slack s = D − t):

    p_i = h/(E[L]·b) · (e^{b·l2} − e^{b·l1}) · e^{−b·s}   for s > l2
    p_i = h/(E[L]·b) · (1 − e^{b·l1} · e^{−b·s})          for l1 < s ≤ l2
    p_i = 0                                               for s ≤ l1

h must be a density for eq. 1's integral to give this. Written as
p(t) = α·e^{b(t − base)} + β, α and β are constant between a request's
milestones (the instants s crosses a bin edge): bins entirely below s give
α's prefix sum, the one bin that holds s gives the rest of α and all of β.
`ScoreTable.alpha_beta` computes them for a whole array of deadlines at
once (a `searchsorted` of the slacks into the edges and prefix sums over
the bins).

Units: seconds. The delay rate `b` is per second: the paper's 1e-4 per ms
is 0.1 per s. A zero-width bin (a point mass, e.g. a static model's ℓ(k))
is the limit w → 0: m·e^{b·l}/E[L] in α's sum, and never the bin that
holds s.

**Rebasing** (§4.4): e^{−b·D} and e^{b·t} overflow with large timestamps,
so times are taken relative to a base; `needs_rebase` says when
b·(t − base) has grown past `REBASE_EXPONENT` (then every α must be
recomputed from the new base, which changes no score and no order).
"""

from __future__ import annotations

import math

import numpy as np

# b·(t − base) at which the base moves to t: e^{±50} stays far from the
# float range's ends (e^{709}), and α·e^{b(t−base)} keeps full precision.
REBASE_EXPONENT = 50.0
# The paper's b = 1e-4 per ms, in seconds.
DEFAULT_DELAY_RATE = 0.1


class ScoreTable:
    """Eq. 2 for one batch-latency histogram: `edges` (n + 1 ascending bin
    edges, seconds), `masses` (n probability masses), `expected` = E[L]
    (seconds), `rate` = b (per second)."""

    __slots__ = ("_beta", "_full_prefix", "_gamma", "edges", "expected", "rate")

    def __init__(self, edges: np.ndarray, masses: np.ndarray, expected: float, rate: float) -> None:
        edges = np.asarray(edges, float)
        masses = np.asarray(masses, float)
        if edges.ndim != 1 or masses.shape != (edges.size - 1,) or masses.size == 0:
            raise ValueError(
                f"a histogram needs n ≥ 1 masses and n + 1 edges, got {masses.shape} "
                f"masses and {edges.shape} edges"
            )
        if np.any(np.diff(edges) < 0):
            raise ValueError("histogram edges must be ascending")
        if not (rate > 0.0 and math.isfinite(rate)):
            raise ValueError(f"the delay rate b must be a finite number > 0 (per s), got {rate}")
        if not (expected > 0.0 and math.isfinite(expected)):
            raise ValueError(f"E[L] must be a finite number > 0 (seconds), got {expected}")
        self.edges = edges
        self.expected = expected
        self.rate = rate
        b = rate
        l1 = edges[:-1]
        width = np.diff(edges)
        z = b * width
        # expm1(z)/z → 1 as z → 0: (e^{b·l2} − e^{b·l1})/(b·w) = e^{b·l1}·expm1(z)/z.
        growth = np.where(z > 0, np.expm1(z) / np.where(z > 0, z, 1.0), 1.0)
        full = masses * np.exp(b * l1) * growth / expected  # × e^{−b·s}, s > l2
        self._full_prefix = np.concatenate(([0.0], np.cumsum(full)))
        density = np.where(width > 0, masses / np.where(width > 0, width, 1.0), 0.0)
        self._beta = density / (expected * b)  # the bin holding s: β − γ·e^{−b·s}
        self._gamma = self._beta * np.exp(b * l1)

    def alpha_beta(self, due: np.ndarray, t: float, base: float) -> tuple[np.ndarray, np.ndarray]:
        """α and β of p = α·e^{b(t − base)} + β for requests due at `due`,
        valid from `t` until each one's next milestone."""
        due = np.asarray(due, float)
        slack = due - t
        n = self.edges.size - 1
        # idx = how many edges lie strictly below s: bins 0..idx−2 lie
        # entirely below it (l2 < s), bin idx−1 holds it (l1 < s ≤ l2).
        idx = np.searchsorted(self.edges, slack, side="left")
        full = self._full_prefix[np.clip(idx - 1, 0, n)]
        holds = (idx >= 1) & (idx <= n)
        mid = np.clip(idx - 1, 0, n - 1)
        gamma = np.where(holds, self._gamma[mid], 0.0)
        beta = np.where(holds, self._beta[mid], 0.0)
        alpha = (full - gamma) * np.exp(-self.rate * (due - base))
        return alpha, beta

    def scores(self, due: np.ndarray, t: float, base: float = 0.0) -> np.ndarray:
        """p(t) of eq. 2 for requests due at `due`."""
        alpha, beta = self.alpha_beta(due, t, base)
        return alpha * math.exp(self.rate * (t - base)) + beta

    def milestones(self, due: np.ndarray, t: float) -> np.ndarray:
        """When each request's α and β next change: the instant its slack
        reaches the lower edge of the bin that holds it, or of the last bin
        below it (inf once s ≤ the first edge: its score stays 0)."""
        due = np.asarray(due, float)
        idx = np.searchsorted(self.edges, due - t, side="left")
        lower = self.edges[np.clip(idx - 1, 0, self.edges.size - 1)]
        return np.where(idx >= 1, due - lower, np.inf)

    @property
    def last_edge(self) -> float:
        """Beyond this slack every bin lies below s: p = α·e^{bt} with α ∝
        e^{−b·D}, so scores fall with the deadline and keep its order."""
        return float(self.edges[-1])


def score_eq2(edges: np.ndarray, masses: np.ndarray, expected: float, rate: float, slack: float):
    """Eq. 2 bin by bin, as the paper writes it (a reference for tests)."""
    total = 0.0
    b = rate
    for l1, l2, m in zip(edges[:-1], edges[1:], masses, strict=True):
        if l2 == l1:
            total += m * math.exp(-b * (slack - l1)) / expected if slack > l2 else 0.0
            continue
        h = m / (l2 - l1)
        if slack > l2:
            total += (
                h / (expected * b) * (math.exp(b * l2) - math.exp(b * l1)) * math.exp(-b * slack)
            )
        elif slack > l1:
            total += h / (expected * b) * (1.0 - math.exp(b * l1) * math.exp(-b * slack))
    return total


def needs_rebase(t: float, base: float, rate: float) -> bool:
    """Whether e^{b(t − base)} has grown enough that the base should move to t."""
    return rate * (t - base) > REBASE_EXPONENT
