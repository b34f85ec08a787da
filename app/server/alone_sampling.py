"""The driver's side of the asynchronous profiler (app/runtime/alone_profiler.py).

`AloneSampler` draws, as each batch is dispatched, which of its requests
its executor re-runs alone once the batch has run: each with probability
`rate` (the PROFILE_SAMPLE_RATE setting), and only those of models declared
dynamic (`ModelInfo.dynamic`): a static model's alone-time is its profile's
ℓ(items) already, and re-running its requests would cost device time for
nothing. The marks name each request's rows in the batch and its
application, so the executor's report says which application's histogram
the time belongs to.

`alone_time_per_request` turns a measured re-run into the alone-time the
core's model speaks of (app/scheduling/model.py, `InputDependence`): a
request of k items re-run alone takes c0 + k·x_r, its alone-time is
a_r = c0 + x_r.
"""

from __future__ import annotations

import random

from app.runtime.messages import AloneMark
from app.scheduling.model import ModelInfo
from app.scheduling.types import Batch


class AloneSampler:
    """Marks a batch's requests to re-run alone, each with probability `rate`."""

    def __init__(self, rate: float = 0.0, rng: random.Random | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"the alone-time sample rate must be 0 to 1, got {rate}")
        self.rate = rate
        self._rng = rng or random.Random()

    def marks(self, batch: Batch, model: ModelInfo | None) -> tuple[AloneMark, ...]:
        """(first row, rows, application) of each sampled request of
        `batch`, whose rows are its requests' items in order."""
        if self.rate <= 0.0 or model is None or model.dynamic is None:
            return ()
        marks = []
        first = 0
        for request in batch.requests:
            if self.rate >= 1.0 or self._rng.random() < self.rate:
                marks.append((first, request.items, request.app))
            first += request.items
        return tuple(marks)


def alone_time_per_request(seconds: float, items: int, model: ModelInfo | None) -> float:
    """The alone-time a_r = c0 + x_r of a request of `items` rows that ran
    alone in `seconds` = c0 + items·x_r (as measured when the model is not
    declared dynamic, or its request has one row)."""
    if items <= 1 or model is None or model.dynamic is None:
        return seconds
    c0 = model.dynamic.c0
    return c0 + max(0.0, seconds - c0) / items
