"""Sliding-window arrival-rate meter: λ for Symphony's βλ rule (§4.3)."""

from __future__ import annotations

from collections import deque


class RateMeter:
    """Arrivals per second over the last `window_s` seconds, each arrival
    weighted (`record(now, weight)`: the core weighs a request by its items,
    so the rate is in items/s).

    Before a full window has passed, the part of the window not yet observed
    is taken to run at `prior_rate` (the model's expected rate, when it is
    configured); without a prior the rate is taken over the time since the
    first arrival, so that λ is usable from the first few requests on.
    """

    __slots__ = (
        "_arrivals",
        "_cached",
        "_cached_at",
        "_count",
        "_first",
        "prior_rate",
        "window_s",
    )

    def __init__(self, window_s: float = 1.0, prior_rate: float | None = None) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self.prior_rate = prior_rate
        self._arrivals: deque[tuple[float, int]] = deque()
        self._count = 0  # the weights in `_arrivals`
        self._first: float | None = None
        # The last answer: the core asks again at the same `now` right after
        # recording an arrival.
        self._cached_at = -float("inf")
        self._cached = 0.0

    def record(self, now: float, weight: int = 1) -> float:
        """Count an arrival of `weight` at `now`; return the rate including it."""
        if self._first is None:
            self._first = now
        arrivals = self._arrivals
        arrivals.append((now, weight))
        self._count += weight
        horizon = now - self.window_s
        while arrivals[0][0] < horizon:
            self._count -= arrivals.popleft()[1]
        span = now - self._first
        if span >= self.window_s:
            rate = self._count / self.window_s
        else:
            rate = self._partial(self._count, span)
        self._cached_at = now
        self._cached = rate
        return rate

    def rate(self, now: float) -> float:
        if now == self._cached_at:
            return self._cached
        arrivals = self._arrivals
        horizon = now - self.window_s
        while arrivals and arrivals[0][0] < horizon:
            self._count -= arrivals.popleft()[1]
        if self._first is None:
            return self.prior_rate or 0.0
        span = now - self._first
        if span >= self.window_s:
            return self._count / self.window_s
        return self._partial(self._count, span)

    def _partial(self, count: int, span: float) -> float:
        if self.prior_rate is not None:
            return (count + self.prior_rate * (self.window_s - span)) / self.window_s
        return count / span if span > 0 else 0.0
