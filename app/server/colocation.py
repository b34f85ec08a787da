"""What co-located models cost each other on a spatially shared device, so
the core plans with the latency a model has beside its co-runners
(inss.txt §4.2; issue: the core on shared devices).

With `DEVICE_SHARES`, each share of a device is an executor of its own and
each model's profile is measured on its share alone (app/server/profiling.py:
at start-up the other shares idle). Served, the shares run at once and slow
each other down — on a CPU through caches and memory bandwidth, on a GPU
through L2 and the scheduler. InSS's latency model (app/planning/inss/
latency.py) puts that slowdown as a factor on the running time,
(1 + α_cache · Σ co-runners' L2 use), the same for every batch size of the
model at a given co-location. Here that factor is measured, not derived:

1. each model of a shared device is timed at its probe batch (`probe_batch`:
   the largest b with ℓ(b) ≤ SLO / 2, the batch a deadline-aware core sends
   most) on its share alone, then
2. again while one model of every other share of the same device (the first
   by name) runs back to back at its own probe batch;
3. factor = co-located / alone, at least 1 (a co-runner never speeds a model
   up: a smaller ratio is noise), and the model's whole profile × factor is
   what the core plans with (`scaled`).

Deviations from the paper's model, with their reasons:

* One factor for the product α_cache · Σ L2 use, measured at the co-location
  the device serves, instead of α_cache and per-model L2 use fitted across
  co-locations (bench/inss_cpu_fit.py does that fit): the daemon serves one
  co-location, and a CPU has no per-model L2 counters to read.
* The scheduling-interference term (per kernel, linear in the number of
  co-located models) is not separated: it lands in the same factor.
* Co-runners run flat out, the worst case: served, a co-runner idles between
  batches, and the factor errs on the safe side.

`COLOCATION_PROFILE=0` plans with the alone profiles.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.runtime.devices import ExecutorDevice
from app.runtime.pool import ExecutorPool
from app.scheduling.profile import LatencyProfile
from app.server.startup import ModelState

log = logging.getLogger("app.server")

# Each timed call holds the model about this long (repeats = call / ℓ(b)),
# so the messages around a call are a small part of a co-runner's time.
CALL_S = 0.05
CALLS = 5  # timed calls per measurement, alone and co-located; their median
MAX_REPEATS = 200


@dataclass(frozen=True)
class Slowdown:
    """`model` on `device`, at `batch`: alone and beside `co_runners` (one
    model per other share of the device, each on its share)."""

    model: str
    device: str
    co_runners: tuple[str, ...]
    batch: int
    alone_s: float
    co_located_s: float

    @property
    def factor(self) -> float:
        """co-located / alone, at least 1 (module docstring, rule 3)."""
        return max(1.0, self.co_located_s / self.alone_s)


def probe_batch(profile: LatencyProfile, slo_s: float) -> int:
    """The largest b with ℓ(b) ≤ SLO / 2, at least 1."""
    return max(1, profile.max_batch_within(slo_s / 2))


def scaled(profile: LatencyProfile, factor: float) -> LatencyProfile:
    """ℓ(b) × factor for every b, factor ≥ 1 (module docstring, rule 3)."""
    if not factor >= 1.0:
        raise ValueError(f"a co-location factor is ≥ 1, got {factor}")
    return profile.scaled(factor)


def co_locations(
    hosts: Mapping[str, Sequence[int]], devices: Mapping[int, ExecutorDevice]
) -> dict[str, tuple[int, dict[int, str]]]:
    """For each model on a share with busy siblings: (its share's device id,
    {sibling share's device id: the model run there}) — the first model by
    name of each other share of the same device. Models whose device is not
    split, or whose sibling shares host nothing, are left out."""
    on: dict[int, list[str]] = {}
    for model, ids in hosts.items():
        for device_id in ids:
            on.setdefault(device_id, []).append(model)
    out: dict[str, tuple[int, dict[int, str]]] = {}
    for model, ids in sorted(hosts.items()):
        if not ids:
            continue
        own = devices[ids[0]]
        siblings = {
            d.id: min(on[d.id])
            for d in devices.values()
            if d.whole == own.whole and d.id != own.id and on.get(d.id)
        }
        if siblings:
            out[model] = (own.id, siblings)
    return out


async def _timed(pool: ExecutorPool, device_id: int, model: str, batch: int, repeats: int) -> float:
    milliseconds = await pool.profile(device_id, model, [batch], warmup=0, repeats=repeats)
    return milliseconds[batch] / 1000.0


async def _loop(
    pool: ExecutorPool, device_id: int, model: str, batch: int, repeats: int, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        await _timed(pool, device_id, model, batch, repeats)


def _repeats(seconds: float) -> int:
    return max(1, min(MAX_REPEATS, round(CALL_S / max(seconds, 1e-6))))


async def measure_slowdown(
    pool: ExecutorPool,
    model: str,
    device_id: int,
    siblings: Mapping[int, str],
    batch_of: Mapping[str, int],
    expected_s: Mapping[str, float],
) -> Slowdown:
    """`model` on `device_id` alone, then beside `siblings` running flat out
    (module docstring, rules 1–2). `batch_of` and `expected_s` give every
    model's probe batch and ℓ there (to size the calls)."""
    batch = batch_of[model]
    repeats = _repeats(expected_s[model])
    alone = [await _timed(pool, device_id, model, batch, repeats) for _ in range(CALLS)]
    stop = asyncio.Event()
    loops = [
        asyncio.create_task(_loop(pool, d, m, batch_of[m], _repeats(expected_s[m]), stop))
        for d, m in siblings.items()
    ]
    try:
        await _timed(pool, device_id, model, batch, repeats)  # the co-runners get going
        co = []
        for _ in range(CALLS):
            co.append(await _timed(pool, device_id, model, batch, repeats))
            ended = [task for task in loops if task.done()]
            if ended:
                await ended[0]  # raises what ended it
                raise RuntimeError(f"co-runner of {model} stopped while it was measured")
    finally:
        stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
    return Slowdown(
        model,
        pool.devices[device_id].name,
        tuple(siblings.values()),
        batch,
        statistics.median(alone),
        statistics.median(co),
    )


async def measure_slowdowns(
    pool: ExecutorPool,
    hosts: Mapping[str, Sequence[int]],
    profiles: Mapping[str, LatencyProfile],
    slos_s: Mapping[str, float],
) -> list[Slowdown]:
    """Every co-located model's slowdown (`co_locations`), logged."""
    batch_of = {m: probe_batch(profiles[m], slos_s[m]) for m in profiles}
    expected = {m: profiles[m].latency(batch_of[m]) for m in profiles}
    found = []
    for model, (device_id, siblings) in co_locations(hosts, pool.devices).items():
        slowdown = await measure_slowdown(pool, model, device_id, siblings, batch_of, expected)
        log.info(
            "model %s on %s: ×%.3f beside %s (batch %d: %.3f ms alone, %.3f ms co-located)",
            model,
            slowdown.device,
            slowdown.factor,
            ", ".join(slowdown.co_runners),
            slowdown.batch,
            slowdown.alone_s * 1e3,
            slowdown.co_located_s * 1e3,
        )
        found.append(slowdown)
    return found


async def plan_colocated(pool: ExecutorPool, models: Mapping[str, ModelState]) -> list[Slowdown]:
    """Measure every co-located model's slowdown and scale its profile by it
    (each model's profile measured first)."""
    profiles = {}
    for name, state in models.items():
        assert state.profile is not None, f"{name}: profile it first"
        profiles[name] = state.profile
    slowdowns = await measure_slowdowns(
        pool,
        {name: state.devices for name, state in models.items()},
        profiles,
        {name: state.config.slo_ms / 1000.0 for name, state in models.items()},
    )
    for slowdown in slowdowns:
        models[slowdown.model].profile = scaled(profiles[slowdown.model], slowdown.factor)
    return slowdowns
