"""FLEX preemptions at INFO, at most one line per model every `every_s`
seconds, each saying how many batches and requests were stopped since the
last: a preemption storm is one line per model, not one per batch."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("app.server")

PREEMPTION_LOG_EVERY_S = 10.0


@dataclass
class _Since:
    """Preemptions of one model not yet logged, and when its last line was."""

    logged_at: float | None = None
    batches: int = 0
    requests: int = 0


class PreemptionLog:
    def __init__(
        self, every_s: float = PREEMPTION_LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._models: dict[str, _Since] = {}

    def preempted(self, model: str, device: str, requests: int) -> bool:
        """Count one preempted batch; True when it was logged."""
        since = self._models.setdefault(model, _Since())
        since.batches += 1
        since.requests += requests
        now = self._clock()
        if since.logged_at is not None and now - since.logged_at < self.every_s:
            return False
        if since.logged_at is None:
            log.info(
                "preempted a batch of %s on %s (%d requests held back)", model, device, requests
            )
        else:
            log.info(
                "preempted %d batches of %s (%d requests held back) in the last %.0f s; "
                "the latest on %s",
                since.batches,
                model,
                since.requests,
                now - since.logged_at,
                device,
            )
        since.logged_at, since.batches, since.requests = now, 0, 0
        return True
