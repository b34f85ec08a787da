"""The emulated backend: a device that holds each batch for ℓ(b) of the
model's latency profile (the papers' emulated GPUs), echoing inputs as
outputs. A share of an emulated device (app.runtime.shares) is that fraction
of its speed: it holds a batch ℓ(b) / share. Nothing more: what co-located
shares cost each other is the latency model's to say, not the emulator's."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from app.repository.config import ModelConfig, TensorSpec
from app.runtime.backend import Terminated
from app.scheduling.profile import LatencyProfile

# An emulated device sleeps, then spins only this long for accuracy: with the
# executor's timer slack at 1 µs (executor.py) a wake-up is ~0.1 ms late, and
# a longer spin would burn a core per busy device on a small CPU box.
EMULATED_SPIN_S = 0.0002


def spin_until(deadline: float, spin_s: float = EMULATED_SPIN_S) -> None:
    """Sleep until `deadline` (time.monotonic()), spinning the last `spin_s`
    for sub-millisecond accuracy."""
    remaining = deadline - time.monotonic()
    if remaining > spin_s:
        time.sleep(remaining - spin_s)
    while time.monotonic() < deadline:
        pass


def profile_of(config: ModelConfig) -> LatencyProfile:
    p = config.profile
    if p is None:
        raise ValueError(f"model {config.name!r}: an emulated model needs a latency profile")
    if p.latency_ms:
        return LatencyProfile.from_table(p.latency_ms, config.max_batch_size)
    if p.alpha_ms is not None and p.beta_ms is not None:
        return LatencyProfile.linear(p.alpha_ms, p.beta_ms, config.max_batch_size)
    raise ValueError(
        f"model {config.name!r}: profile needs alpha_ms and beta_ms or a latency table"
    )


class EmulatedBackend:
    """Holds the device for ℓ(b) of the model's profile, then answers.

    Outputs: for each output spec, the batch of the input with the same name
    if it has the same item shape and dtype, else the first input (in config
    order) that has; zeros when none matches. Echoing lets tests check that
    every request gets its own row back in its own slot.

    Preemption: `terminate()` stops the hold at once, or — with
    `parameters: {preemption_delay_ms: d}` in config.yaml — d ms later, to
    emulate a device that only stops at its next exit point. A batch whose
    hold ends before that finishes normally (the stop lost the race).
    """

    def __init__(self, *_: Any, share: float = 1.0, **__: Any) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.share = share
        self.profile: LatencyProfile | None = None
        self.preemption_delay_s = 0.0
        self._plan: list[tuple[str, str | None, TensorSpec]] = []
        self._abort = threading.Event()
        # Fault injection for tests only: while the file named by
        # EMULATED_HANG_FILE exists and is empty or holds this process's pid,
        # a batch hangs (as a stuck kernel would) instead of finishing.
        # Unset in normal use: no cost, no effect.
        self._hang_file = os.environ.get("EMULATED_HANG_FILE") or None

    def load(self, config: ModelConfig) -> None:
        self.profile = profile_of(config)
        delay = config.extra.get("preemption_delay_ms", 0.0)
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
            raise ValueError(
                f"model {config.name!r}: parameters.preemption_delay_ms must be a "
                f"number ≥ 0, got {delay!r}"
            )
        self.preemption_delay_s = float(delay) / 1000.0
        plan = []
        for out in config.outputs:
            candidates = sorted(config.inputs, key=lambda s: s.name != out.name)
            source = next(
                (
                    s.name
                    for s in candidates
                    if s.item_shape == out.item_shape and s.datatype == out.datatype
                ),
                None,
            )
            plan.append((out.name, source, out))
        self._plan = plan

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.monotonic()
        self.reset()
        outputs = self.outputs(inputs)
        self.hold(start + self.latency(_batch_of(inputs)))
        return outputs

    def latency(self, batch: int) -> float:
        """ℓ(batch) in seconds, on this share of the device."""
        assert self.profile is not None, "load() first"
        return self.profile.latency(batch) / self.share

    def outputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch's outputs (echoes or zeros), ready before the hold ends."""
        batch = _batch_of(inputs)
        outputs: dict[str, np.ndarray] = {}
        for name, source, spec in self._plan:
            if source is not None:
                outputs[name] = inputs[source]
            else:
                outputs[name] = np.zeros((batch, *spec.item_shape), dtype=spec.dtype)
        return outputs

    def hold(self, until: float) -> None:
        """Hold the device until `until` (time.monotonic()): interruptible
        sleep, short spin at the end. Raises Terminated if stopped since the
        last `reset()`."""
        if self._hang_file is not None and _hang_requested(self._hang_file):
            until += 3600.0
        remaining = until - time.monotonic()
        if remaining > EMULATED_SPIN_S and self._abort.wait(remaining - EMULATED_SPIN_S):
            stop_at = time.monotonic() + self.preemption_delay_s
            if stop_at < until:
                spin_until(stop_at)
                raise Terminated("run terminated")
        spin_until(until)
        if self._abort.is_set() and self.preemption_delay_s == 0.0:
            raise Terminated("run terminated")

    def terminate(self) -> None:
        self._abort.set()

    def reset(self) -> None:
        """Forget an earlier stop (the executor calls this, under the lock
        that guards terminate(), as each batch starts and ends)."""
        self._abort.clear()


def _batch_of(inputs: dict[str, np.ndarray]) -> int:
    return len(next(iter(inputs.values()))) if inputs else 1


def _hang_requested(path: str) -> bool:
    try:
        with open(path) as f:
            target = f.read().strip()
    except OSError:
        return False
    return target in ("", str(os.getpid()))
