"""Symphony's autoscaling signals (symphony.txt §4.4) published to /metrics:
every period, each core's bad rate (late or dropped requests) and idle
fraction, the devices' busy fractions, and the device change they advise.

A core whose devices an autoscaler drives (AUTOSCALE, app/server/
autoscaling.py) has its window read here but reset by the autoscaler alone,
so that its windows are whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from app.scheduling.autoscale import advised_device_change
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.metrics import Metrics


async def publish_signals(
    dispatcher: Dispatcher,
    metrics: Metrics,
    device_name: Callable[[int], str],
    period_s: float = 5.0,
    autoscaled: Callable[[CoreGroup], bool] = lambda group: False,
) -> None:
    """Publish the signals every `period_s` until cancelled."""
    while True:
        await asyncio.sleep(period_s)
        now = time.monotonic()
        total = bad = 0.0
        idle = []
        for group in dispatcher.groups:
            signals = group.scheduler.signals(now)
            requests = signals.finished_good + signals.finished_late + signals.dropped
            total += requests
            bad += signals.finished_late + signals.dropped
            idle.append((signals.idle_fraction, len(group.devices)))
            for device, busy in signals.per_device_busy.items():
                metrics.set_device_busy(device_name(device), busy)
            if not autoscaled(group):
                group.scheduler.reset_signals(now)
        devices = sum(n for _, n in idle)
        idle_fraction = sum(f * n for f, n in idle) / devices if devices else 0.0
        bad_rate = bad / total if total else 0.0
        metrics.set_autoscale(
            bad_rate, idle_fraction, advised_device_change(devices, bad_rate, idle_fraction)
        )
