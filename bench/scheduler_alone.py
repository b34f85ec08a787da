"""The scheduling core alone: requests per second it decides on one core.

    python -m bench.scheduler_alone [--policy symphony] [--models 8] [--devices 8]
                                    [--requests 200000] [--rate 100000] [--repeat 3]
                                    [--profile]

As Symphony's scheduler-only runs (symphony.txt §5, Fig. 11 left): no HTTP,
no executors, no clock. Request descriptors (`app.scheduling.types.Request`)
are made in this process at Poisson arrival times of `--rate` requests per
(virtual) second over `--models` models, and handed to the core through the
driver API the simulator and the daemon use (app/scheduling/driven.py:
`add_request`, `advance` at `next_wakeup`, `batch_finished`). The devices
are emulated with ℓ(b) ≈ 0 (`--alpha-us` per item + `--beta-us` per batch,
default 1 µs + 10 µs): a batch ends on its device that long after it starts,
so what is measured is the core's own work per request and the few lines of
driver around it. Time is virtual; only the wall time of the loop is real.

The figure is requests handed to the core per second of wall time (best and
median of `--repeat` runs on the same arrivals); the line says whether the
core ran compiled (`python -m app.build_fast`) or as pure Python.
`--profile` runs once more under cProfile and prints the top costs.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import time
from dataclasses import dataclass

import numpy as np

from app.build_fast import compiled_modules
from app.scheduling.driven import BatchCore
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import Complete, DeviceInfo, Dispatch, Drop, Preempt

_INF = float("inf")


@dataclass(frozen=True)
class AloneSetup:
    """What the core is given: models, devices and their ℓ(b), the arrivals."""

    policy: str = "symphony"
    models: int = 8
    devices: int = 8
    requests: int = 200_000
    rate: float = 100_000.0  # requests per virtual second, all models together
    slo_ms: float = 25.0
    max_batch: int = 16
    alpha_us: float = 1.0
    beta_us: float = 10.0
    seed: int = 1

    def model_infos(self) -> list[ModelInfo]:
        profile = LatencyProfile.linear(self.alpha_us / 1000.0, self.beta_us / 1000.0, 64)
        return [
            ModelInfo(f"m{k}", profile, self.slo_ms / 1000.0, self.max_batch)
            for k in range(self.models)
        ]

    def arrivals(self) -> tuple[list[float], list[int]]:
        """Arrival times (s) and each request's model index."""
        rng = np.random.default_rng(self.seed)
        times = np.cumsum(rng.exponential(1.0 / self.rate, self.requests))
        return times.tolist(), rng.integers(0, self.models, self.requests).tolist()


@dataclass
class AloneRun:
    requests: int
    answered: int
    dropped: int
    batches: int
    wall_s: float

    @property
    def rate(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0


class _Devices:
    """Emulated devices: each runs its batches in order, a batch lasting ℓ(size)."""

    def __init__(self, models: list[ModelInfo], count: int) -> None:
        self.latency = {m.name: m.profile.latency_by_size for m in models}
        self.free_at = [0.0] * count
        self.events: list[tuple[float, int, int]] = []  # (end, batch id, device)
        self.answered = self.dropped = self.batches = 0

    def apply(self, decisions: list, now: float) -> None:
        for d in decisions:
            if isinstance(d, Dispatch):
                batch = d.batch
                start = max(batch.release_at, self.free_at[batch.device], now)
                end = start + self.latency[batch.model][batch.size]
                self.free_at[batch.device] = end
                heapq.heappush(self.events, (end, batch.id, batch.device))
                self.batches += 1
            elif isinstance(d, Complete):
                self.answered += len(d.requests)
            elif isinstance(d, Drop):
                self.dropped += len(d.requests)
            elif isinstance(d, Preempt):  # pragma: no cover - symphony never preempts
                raise RuntimeError("the scheduler-alone driver does not preempt")


def drive(core: BatchCore, setup: AloneSetup, times: list[float], models: list[int]) -> AloneRun:
    """Hand every arrival to `core`, firing its timers and ending its batches
    in time order, until it holds nothing; the wall time of all of it."""
    from app.scheduling.types import Request

    devices = _Devices(setup.model_infos(), setup.devices)
    names = [f"m{k}" for k in range(setup.models)]
    slo = setup.slo_ms / 1000.0
    events, apply = devices.events, devices.apply
    add, advance, finished, wakeup = (
        core.add_request,
        core.advance,
        core.batch_finished,
        core.next_wakeup,
    )
    n, i = len(times), 0
    started = time.perf_counter()
    while True:
        t_arrival = times[i] if i < n else _INF
        t_event = events[0][0] if events else _INF
        t_timer = wakeup()
        if t_timer is None:
            t_timer = _INF
        if t_event <= t_timer and t_event <= t_arrival:
            if t_event == _INF:
                break
            end, batch_id, device = heapq.heappop(events)
            apply(finished(device, batch_id, end), end)
        elif t_timer <= t_arrival:
            apply(advance(t_timer), t_timer)
        else:
            decisions = add(Request(i, names[models[i]], t_arrival, t_arrival + slo), t_arrival)
            if decisions:
                apply(decisions, t_arrival)
            i += 1
    wall = time.perf_counter() - started
    return AloneRun(n, devices.answered, devices.dropped, devices.batches, wall)


def run_once(setup: AloneSetup, times: list[float], models: list[int]) -> AloneRun:
    infos = setup.model_infos()
    core = make_scheduler(setup.policy, infos, [DeviceInfo(d) for d in range(setup.devices)])
    return drive(core, setup, times, models)


def core_kind() -> str:
    compiled = compiled_modules().values()
    return "compiled" if all(compiled) else "partly compiled" if any(compiled) else "pure Python"


def report(setup: AloneSetup, runs: list[AloneRun]) -> str:
    last = runs[-1]
    rates = [r.rate for r in runs]
    return (
        f"{setup.policy} alone, {setup.models} models on {setup.devices} devices "
        f"(ℓ(b) = {setup.alpha_us:g} µs·b + {setup.beta_us:g} µs), "
        f"{setup.requests:,} requests at {setup.rate:,.0f} r/s virtual: "
        f"best {max(rates):,.0f} req/s, median {statistics.median(rates):,.0f} req/s "
        f"({core_kind()} core; answered {last.answered:,}, dropped {last.dropped:,}, "
        f"mean batch {last.answered / max(last.batches, 1):.1f}; "
        f"wall s: {', '.join(f'{r.wall_s:.3f}' for r in runs)})"
    )


def profile_top(setup: AloneSetup, times: list[float], models: list[int], top: int = 12) -> str:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(run_once, setup, times, models)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    defaults = AloneSetup()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("policy", "models", "devices", "requests", "rate", "alpha_us", "beta_us"):
        value = getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile's top costs, once more")
    args = parser.parse_args(argv)
    setup = AloneSetup(
        policy=args.policy,
        models=args.models,
        devices=args.devices,
        requests=args.requests,
        rate=args.rate,
        alpha_us=args.alpha_us,
        beta_us=args.beta_us,
    )
    times, models = setup.arrivals()
    runs = [run_once(setup, times, models) for _ in range(max(args.repeat, 1))]
    print(report(setup, runs))
    if args.profile:
        print(profile_top(setup, times, models))


if __name__ == "__main__":
    main()
