"""Symphony's autoscaling signals (symphony.txt §4.4).

Bad rate r: the fraction of requests that were dropped or finished late.
Idle fraction f: the fraction of device time spent not executing.
Advice: when r is above a threshold add N·r/(1−r) devices; otherwise, when
devices idle, release N·f of them (N = current device count).
"""

from __future__ import annotations

import math

from app.scheduling.types import AutoscaleSignals


class AutoscaleMonitor:
    """Counts outcomes and busy time since the last `reset`."""

    def __init__(
        self,
        device_ids: list[int],
        *,
        bad_rate_threshold: float = 0.01,
        idle_threshold: float = 0.05,
    ) -> None:
        self.device_ids = list(device_ids)
        self.bad_rate_threshold = bad_rate_threshold
        self.idle_threshold = idle_threshold
        self.reset(0.0)

    def reset(self, now: float) -> None:
        self.since = now
        self.good = 0
        self.late = 0
        self.dropped = 0
        self.busy: dict[int, float] = dict.fromkeys(self.device_ids, 0.0)

    def batch_ended(self, device: int, start: float, end: float, good: int, late: int) -> None:
        """A batch stopped (finished or preempted); count its busy time in the window."""
        self.busy[device] += max(0.0, end - max(start, self.since))
        self.good += good
        self.late += late

    def requests_dropped(self, count: int) -> None:
        self.dropped += count

    def signals(self, now: float, running: list[tuple[int, float]]) -> AutoscaleSignals:
        """Signals since the last reset; `running` is (device, start) of batches
        still executing, whose elapsed part counts as busy."""
        window = max(now - self.since, 0.0)
        busy = dict(self.busy)
        for device, start in running:
            if start < now:
                busy[device] += now - max(start, self.since)
        total = self.good + self.late + self.dropped
        bad_rate = (self.late + self.dropped) / total if total else 0.0
        devices = len(self.device_ids)
        capacity = window * devices
        idle = 1.0 - sum(busy.values()) / capacity if capacity > 0 else 0.0
        idle = min(max(idle, 0.0), 1.0)
        advice = advised_device_change(
            devices, bad_rate, idle, self.bad_rate_threshold, self.idle_threshold
        )
        return AutoscaleSignals(
            window_s=window,
            finished_good=self.good,
            finished_late=self.late,
            dropped=self.dropped,
            bad_rate=bad_rate,
            idle_fraction=idle,
            advised_device_change=advice,
            per_device_busy={d: (b / window if window > 0 else 0.0) for d, b in busy.items()},
        )


def advised_device_change(
    devices: int,
    bad_rate: float,
    idle_fraction: float,
    bad_rate_threshold: float = 0.01,
    idle_threshold: float = 0.05,
) -> int:
    """+⌈N·r/(1−r)⌉ when the bad rate r exceeds its threshold, else −⌊N·f⌋."""
    if bad_rate > bad_rate_threshold:
        if bad_rate >= 1.0:
            return devices  # everything fails: at least double
        return math.ceil(devices * bad_rate / (1.0 - bad_rate))
    if idle_fraction > idle_threshold:
        return -math.floor(devices * idle_fraction)
    return 0
