"""Autoscaling that acts: Symphony's advised device change (symphony.txt
§4.4) carried out within bounds and a cool-down.

The core counts what Symphony's rule reads (app/scheduling/autoscale.py):
over a window, the bad rate r (requests late or dropped) and each device's
busy fraction. Every `window_s` the driver calls `Autoscaler.tick(core,
now)`, which reads and resets the core's window and decides:

1. **Advice**, over the devices in service N: r above `bad_rate_threshold`
   → add ⌈N·r/(1−r)⌉ devices; else the idle fraction f (1 − mean busy of
   the devices in service) above `idle_threshold` → release ⌊N·f⌋ (§4.4).
2. **Bounds**: never more than `max_devices` in service or starting, never
   fewer than `min_devices` in service.
3. **Cool-down**: after an action, none for `cooldown_s` — the window after
   a change still shows the load before it.
4. **Scale up**: the parked devices (lowest id first) are started; they
   serve once the driver has brought them up (`started`), after the
   executor's start-up — the simulator waits `startup_s`, the daemon spawns
   processes. Until then they count toward the bound, not toward N.
5. **Scale down**: only devices with no batch in flight or stopping are
   released (the highest id first), so nothing is re-queued: the driver
   calls the core's `device_down` on them and parks them. Fewer idle than
   advised: fewer go.

Deviation: Symphony advises an operator (or a cloud autoscaler) and leaves
the acting to it; here the server acts on its own devices, so the rule's
window needs a cool-down and bounds, which §4.4 does not give: defaults are
ours (window 5 s, cool-down 10 s).

Plain computation: time comes in as `now`, actions go out as values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.scheduling.autoscale import advised_device_change
from app.scheduling.driven import ServedCore


@dataclass(frozen=True)
class ScalingBounds:
    min_devices: int = 1
    max_devices: int = 1
    window_s: float = 5.0
    cooldown_s: float = 10.0
    bad_rate_threshold: float = 0.01
    idle_threshold: float = 0.05

    def __post_init__(self) -> None:
        if not 1 <= self.min_devices <= self.max_devices:
            raise ValueError(
                f"need 1 ≤ min_devices ≤ max_devices, got {self.min_devices}, {self.max_devices}"
            )
        for name in ("window_s", "cooldown_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)) or (name == "window_s" and value == 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value}")
        for name in ("bad_rate_threshold", "idle_threshold"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(frozen=True)
class ScaleUp:
    """Start these parked devices."""

    devices: tuple[int, ...]


@dataclass(frozen=True)
class ScaleDown:
    """Release these devices (idle: nothing on them)."""

    devices: tuple[int, ...]


@dataclass
class ScalingStep:
    """One tick's reading and what it decided."""

    at: float
    serving: int
    bad_rate: float
    idle_fraction: float
    advised: int
    action: ScaleUp | ScaleDown | None


@dataclass
class Autoscaler:
    """Acts on §4.4's advice (module docstring). `devices`: every device the
    driver may run; `serving`: those in service at the start (the rest are
    parked)."""

    devices: tuple[int, ...]
    serving: set[int]
    bounds: ScalingBounds
    starting: set[int] = field(default_factory=set)
    last_action_at: float = -math.inf
    history: list[ScalingStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.devices = tuple(self.devices)
        self.serving = set(self.serving)
        if not self.serving <= set(self.devices):
            raise ValueError(
                f"serving devices {sorted(self.serving)} are not all in {self.devices}"
            )
        if len(self.devices) < self.bounds.max_devices:
            raise ValueError(
                f"max_devices {self.bounds.max_devices} but only {len(self.devices)} devices"
            )
        if not self.bounds.min_devices <= len(self.serving) <= self.bounds.max_devices:
            raise ValueError(
                f"{len(self.serving)} devices serving at the start, outside "
                f"[{self.bounds.min_devices}, {self.bounds.max_devices}]"
            )

    @property
    def parked(self) -> list[int]:
        return [d for d in self.devices if d not in self.serving and d not in self.starting]

    def started(self, device: int) -> None:
        """The driver brought `device` into service (after ScaleUp)."""
        self.starting.discard(device)
        self.serving.add(device)

    def tick(self, core: ServedCore, now: float) -> ScaleUp | ScaleDown | None:
        """Read and reset the core's window; the action to take, if any."""
        signals = core.signals(now)
        core.reset_signals(now)
        busy = [signals.per_device_busy.get(d, 0.0) for d in self.serving]
        idle = 1.0 - sum(busy) / len(busy) if busy else 0.0
        b = self.bounds
        advised = advised_device_change(
            len(self.serving), signals.bad_rate, idle, b.bad_rate_threshold, b.idle_threshold
        )
        action: ScaleUp | ScaleDown | None = None
        if advised and now >= self.last_action_at + b.cooldown_s:
            if advised > 0:
                room = b.max_devices - len(self.serving) - len(self.starting)
                chosen = tuple(self.parked[: max(0, min(advised, room))])
                if chosen:
                    self.starting.update(chosen)
                    action = ScaleUp(chosen)
            else:
                room = len(self.serving) - b.min_devices
                quiet = _quiet(core, self.serving)
                chosen = tuple(sorted(quiet, reverse=True)[: max(0, min(-advised, room))])
                if chosen:
                    self.serving.difference_update(chosen)
                    action = ScaleDown(chosen)
            if action is not None:
                self.last_action_at = now
        self.history.append(
            ScalingStep(now, len(self.serving), signals.bad_rate, idle, advised, action)
        )
        return action


def _quiet(core: ServedCore, serving: Iterable[int]) -> list[int]:
    """Devices in service with no batch in flight or stopping."""
    stopping = {s.batch.device for s in core.stopping.values()}
    idle = set(core.idle_devices()) - stopping
    return [d for d in serving if d in idle]
