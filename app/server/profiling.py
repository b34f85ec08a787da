"""Measuring a model's latency profile on a device, and judging it.

A model without a profile in its config is measured at start-up on the
first device that hosts it, and the table cached (app/repository/profiles.py)
for the next start. A measurement taken while the machine is busy can be
nonsense (ℓ(1) = 296 ms, ℓ(2) = 32 ms, ℓ(4) = 650 ms, r² 0.03): a poor table,
cached or new, is measured once more; if it is still poor, the server runs
with it and says so in a WARNING with the numbers and the command that
measures it again on a quiet machine (`python -m app profile MODEL --force`).

A dynamic model (config key `dynamic`, app/repository/dynamic_fields.py)
gets `ModelInfo.dynamic` = InputDependence(c0, prior) besides its profile
(`measure_dynamic`): c0 is the intercept β of the profile's linear fit (the
profile is measured on one synthetic input repeated over the batch, so
ℓ(b) = c0 + b·x), and the prior is its alone-time on each of its probes, a
batch of one timed like a profile point (PROBE_WARMUP runs, then the median
of PROBE_REPEATS). c0 is capped at the shortest alone-time, which it cannot
exceed (a_r = c0 + x_r, x_r ≥ 0). The probes are measured at every start
(not cached: a handful of single requests).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.repository.config import ModelConfig
from app.repository.dynamic_fields import load_probes
from app.repository.profiles import (
    default_profile_cache_dir,
    fit_linear,
    fit_problems,
    monotone_table,
    profile_cache_path,
    profile_from_spec,
    read_profile_cache,
    write_profile_cache,
)
from app.runtime.devices import ExecutorDevice
from app.scheduling.model import InputDependence
from app.scheduling.profile import LatencyProfile
from app.server.settings import Settings

log = logging.getLogger("app.server")


class Profiler(Protocol):
    """What measuring needs of the executor pool."""

    async def profile(
        self, device_id: int, model: str, batch_sizes: list[int]
    ) -> dict[int, float]: ...


class Prober(Protocol):
    """What measuring a dynamic model's probes needs of the executor pool."""

    async def profile(
        self,
        device_id: int,
        model: str,
        batch_sizes: list[int],
        warmup: int = ...,
        repeats: int = ...,
        timeout: float | None = ...,
        inputs: Mapping[str, object] | None = ...,
    ) -> dict[int, float]: ...


# Runs per probe: a few, as a probe is one request (ms) and all are measured
# at every start.
PROBE_WARMUP = 2
PROBE_REPEATS = 5


@dataclass(frozen=True)
class MeasuredProfile:
    """A latency table with its linear fit and what is wrong with it."""

    latency_ms: dict[int, float]
    alpha_ms: float
    beta_ms: float
    r2: float
    problems: tuple[str, ...]
    source: str  # "cache" | "measured"

    @classmethod
    def of(cls, table: Mapping[int, float], min_r2: float, source: str) -> MeasuredProfile:
        alpha, beta, r2 = fit_linear(table)
        problems = tuple(fit_problems(table, min_r2))
        return cls(dict(sorted(table.items())), alpha, beta, r2, problems, source)

    def table_text(self) -> str:
        return ", ".join(f"ℓ({b})={ms:.2f}ms" for b, ms in self.latency_ms.items())

    def fit_text(self) -> str:
        return f"ℓ(b) = {self.alpha_ms:.3f}·b + {self.beta_ms:.3f} ms (r² {self.r2:.3f})"


def profile_cache_dir(settings: Settings) -> Path:
    return settings.profile_cache_dir or default_profile_cache_dir()


def profile_cache_path_for(settings: Settings, config: ModelConfig, device: ExecutorDevice) -> Path:
    """Where `config`'s profile on `device` is cached."""
    return profile_cache_path(config, device_tag(device), profile_cache_dir(settings))


def device_tag(device: ExecutorDevice) -> str:
    """The device part of a profile's cache key (a CPU share's is its
    threads, one per core; a GPU share's says its share)."""
    if device.kind == "cpu":
        return f"cpu-{device.threads}t"
    share = "" if device.share == 1.0 else f"-{device.share:g}"
    return f"{device.kind}-{device.index}{share}"


async def measure_profile(
    settings: Settings, pool: Profiler, device: ExecutorDevice, config: ModelConfig
) -> LatencyProfile:
    """The model's latency profile: from its config, else from the cache when
    its fit is good, else measured on `device` (twice when the first is
    poor) and cached."""
    if config.profile is not None:
        declared = profile_from_spec(config.profile, config.max_batch_size)
        if device.kind == "emulated" and device.share < 1.0:
            # The config's profile is the whole device's; an emulated share
            # holds each batch ℓ(b) / share (app.runtime.emulated).
            log.info(
                "model %s: latency profile from its config / share %g on %s",
                config.name,
                device.share,
                device.name,
            )
            return declared.scaled(1.0 / device.share)
        log.info("model %s: latency profile from its config", config.name)
        return declared
    found = await find_or_measure(settings, pool, device, config)
    return LatencyProfile.from_table(monotone_table(found.latency_ms), config.max_batch_size)


async def find_or_measure(
    settings: Settings,
    pool: Profiler,
    device: ExecutorDevice,
    config: ModelConfig,
    *,
    force: bool = False,
) -> MeasuredProfile:
    """The cached table when its fit is good (and not `force`), else a
    measured one: measured again once when poor, then a WARNING if still."""
    tag, cache_dir, min_r2 = (
        device_tag(device),
        profile_cache_dir(settings),
        settings.profile_min_r2,
    )
    cached = None if force else read_profile_cache(config, tag, cache_dir)
    if cached is not None and cached.latency_ms:
        found = MeasuredProfile.of(cached.latency_ms, min_r2, "cache")
        if not found.problems:
            log.info("model %s: latency profile on %s from the cache", config.name, device.name)
            return found
        log.warning(
            "model %s: cached profile on %s is poor (%s: %s); measuring it again",
            config.name,
            device.name,
            "; ".join(found.problems),
            found.table_text(),
        )
    else:
        found = await _measure(settings, pool, device, config)
        if not found.problems:
            return found
        log.info(
            "model %s: profile on %s is poor (%s); measuring it again",
            config.name,
            device.name,
            "; ".join(found.problems),
        )
    found = await _measure(settings, pool, device, config)
    if found.problems:
        log.warning(
            "model %s: latency profile on %s is still poor after measuring it again (%s): %s; "
            "fit %s. Deadlines are planned with it (made non-decreasing); measure it again on "
            "a quiet machine: python -m app profile %s --force",
            config.name,
            device.name,
            "; ".join(found.problems),
            found.table_text(),
            found.fit_text(),
            config.name,
        )
    return found


async def _measure(
    settings: Settings, pool: Profiler, device: ExecutorDevice, config: ModelConfig
) -> MeasuredProfile:
    """Measure on `device`, cache it, log it."""
    sizes = sorted(
        {b for b in settings.profile_batch_sizes if b <= config.max_batch_size}
        | {1, config.max_batch_size}
    )
    log.info(
        "model %s: profiling on %s (batch sizes %s) …",
        config.name,
        device.name,
        ", ".join(map(str, sizes)),
    )
    measured = await pool.profile(device.id, config.name, sizes)
    found = MeasuredProfile.of(measured, settings.profile_min_r2, "measured")
    path = write_profile_cache(
        config,
        device_tag(device),
        measured,
        fit={"alpha_ms": found.alpha_ms, "beta_ms": found.beta_ms, "r2": found.r2},
        cache_dir=profile_cache_dir(settings),
    )
    log.info(
        "model %s profiled on %s: %s; fit %s; cached in %s",
        config.name,
        device.name,
        found.table_text(),
        found.fit_text(),
        path,
    )
    return found


async def measure_dynamic(
    pool: Prober, device: ExecutorDevice, config: ModelConfig, profile: LatencyProfile
) -> InputDependence | None:
    """A dynamic model's InputDependence (see the module docstring); None
    for a static one. The probes were checked when the config loaded."""
    if config.dynamic is None:
        return None
    alone: list[float] = []
    for probe in load_probes(config.dynamic.probes):
        batch = len(next(iter(probe.values())))
        measured = await pool.profile(
            device.id,
            config.name,
            [batch],
            warmup=PROBE_WARMUP,
            repeats=PROBE_REPEATS,
            inputs=probe,
        )
        alone.append(measured[batch] / 1000.0)
    c0 = min(max(0.0, profile.beta or 0.0), min(alone))
    log.info(
        "model %s is dynamic: c0 = %.3f ms; alone-times on its %d probes on %s: %s ms",
        config.name,
        c0 * 1000.0,
        len(alone),
        device.name,
        ", ".join(f"{a * 1000.0:.2f}" for a in alone),
    )
    return InputDependence(c0, (("", tuple(alone)),))
