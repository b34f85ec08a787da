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
(`measure_dynamic`): the prior is its alone-time on each of its probes, a
batch of one timed like a profile point (PROBE_WARMUP runs, then the median
of PROBE_REPEATS), and c0 is the intercept of a line through the fastest
probe's time repeated over batches of 1, 2 and 4 rows (C0_BATCHES, within
the model's max batch): ℓ_B = c0 + k·x for k copies of one input
(orloj.txt eq. 3). The fastest probe, because its batches stay small: the
profile's own β is fitted on the slowest input up to the max batch, where
a batch can outgrow the caches and bend the line (earlyexit-wide, 16 steps:
β ≈ 3.5 ms against a c0 of 5–8 ms). With a max batch of 1, the profile's
β. c0 is capped at the shortest alone-time, which it cannot exceed
(a_r = c0 + x_r, x_r ≥ 0). The probes are measured at every start (not
cached: a handful of small batches).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

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
# Batch sizes of the fastest probe whose line gives a dynamic model's c0.
C0_BATCHES = (1, 2, 4)


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
    settings: Settings,
    pool: Profiler,
    device: ExecutorDevice,
    config: ModelConfig,
    *,
    serving: bool = False,
) -> LatencyProfile:
    """The model's latency profile: from its config, else from the cache when
    its fit is good, else measured on `device` (twice when the first is
    poor) and cached. `serving`: the device serves other models meanwhile
    (a load while serving): see `_measure`."""
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
    found = await find_or_measure(settings, pool, device, config, serving=serving)
    return LatencyProfile.from_table(monotone_table(found.latency_ms), config.max_batch_size)


async def find_or_measure(
    settings: Settings,
    pool: Profiler,
    device: ExecutorDevice,
    config: ModelConfig,
    *,
    force: bool = False,
    serving: bool = False,
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
        found = await _measure(settings, pool, device, config, serving)
        if not found.problems:
            return found
        log.info(
            "model %s: profile on %s is poor (%s); measuring it again",
            config.name,
            device.name,
            "; ".join(found.problems),
        )
    found = await _measure(settings, pool, device, config, serving)
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
    settings: Settings,
    pool: Profiler,
    device: ExecutorDevice,
    config: ModelConfig,
    serving: bool = False,
) -> MeasuredProfile:
    """Measure on `device`, cache it, log it. While the device serves other
    models (`serving`), their batches run between the profile's and only
    ever add to its times: it is measured twice, each batch size's lower time
    kept, and it is used but not cached (a later start measures it on a
    quiet device; a reload under load once cached ℓ(1) 25.5 ms for 3.8)."""
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
    if serving:
        again = await pool.profile(device.id, config.name, sizes)
        measured = {b: min(ms, again.get(b, ms)) for b, ms in measured.items()}
    found = MeasuredProfile.of(measured, settings.profile_min_r2, "measured")
    if serving:
        log.info(
            "model %s profiled on %s while it serves other models (lower of two runs): %s; "
            "fit %s; not cached (python -m app profile %s measures it on a quiet device)",
            config.name,
            device.name,
            found.table_text(),
            found.fit_text(),
            config.name,
        )
        return found
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
    probes = list(load_probes(config.dynamic.probes))
    for probe in probes:
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
    c0 = max(0.0, profile.beta or 0.0)
    sizes = [k for k in C0_BATCHES if k <= config.max_batch_size]
    if len(sizes) > 1:
        fastest = probes[int(np.argmin(alone))]
        times = []
        for k in sizes:
            tiled = {name: np.concatenate([array] * k) for name, array in fastest.items()}
            batch = len(next(iter(tiled.values())))
            measured = await pool.profile(
                device.id,
                config.name,
                [batch],
                warmup=PROBE_WARMUP,
                repeats=PROBE_REPEATS,
                inputs=tiled,
            )
            times.append(measured[batch] / 1000.0)
        slope, intercept = np.polyfit(np.array(sizes, float), np.array(times), 1)
        c0 = max(0.0, float(intercept)) if slope > 0 else c0
    c0 = min(c0, min(alone))
    log.info(
        "model %s is dynamic: c0 = %.3f ms; alone-times on its %d probes on %s: %s ms",
        config.name,
        c0 * 1000.0,
        len(alone),
        device.name,
        ", ".join(f"{a * 1000.0:.2f}" for a in alone),
    )
    return InputDependence(c0, (("", tuple(alone)),))
