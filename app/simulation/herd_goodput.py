"""Measured single-device goodput T_i, as the paper takes it
(shepherd-nsdi23.txt §4: "the maximum goodput each stream can achieve on a
single GPU"): the highest Poisson rate one simulated device serves with
≥ 99 % of requests within the SLO, found by the simulator's capacity search
(app/simulation/capacity_search.py) under the groups' own policy (`flex`,
Shepherd's scheduler, by default).

It lives beside the simulator, not in app/planning/herd/, because planning
sits below the simulator in the layout; `python -m app plan herd` hands it
to the planner (`--goodput measured`).

The analytic T (problem.py, `single_device_goodput`) stays the default:
it costs nothing, where this costs a capacity search — about ten simulated
runs — per distinct (profile, SLO, max batch). `MeasuredGoodput` caches
by that key, so the thousand streams of one model and SLO cost one search.

How a search runs, and why:

* The rate scale multiplies U = max b/ℓ(b) over the batches with
  ℓ(b) ≤ SLO — what a device that is always busy with the best batch
  that still meets the SLO serves. No arrival process does better, so the
  search's ceiling is scale 1; it starts at the analytic T (≤ U).
* Each probe simulates about `requests` arrivals (never under
  `min_duration_s` of simulated time): a 99 % target needs enough
  requests that one miss is not a percent. The same seed at every scale
  makes the search, and so the plan, deterministic.
* A profile whose ℓ(1) exceeds the SLO measures 0: nothing is servable.

Units: seconds; rates in requests/s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.planning.herd.problem import Problem, single_device_goodput
from app.scheduling.profile import LatencyProfile
from app.simulation.capacity_search import CapacityResult, find_capacity
from app.simulation.run import SimResult, simulate
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload

Key = tuple[LatencyProfile, float, int]


@dataclass(frozen=True)
class Measurement:
    """One capacity search's outcome."""

    goodput: float  # requests/s; 0.0 when nothing passes
    ceiling: float  # U, the rate at scale 1 (requests/s)
    status: str  # find_capacity's: converged, max_runs, above_max_scale, below_min_scale
    probes: int  # simulated runs
    wall_s: float  # seconds the search took


@dataclass
class MeasuredGoodput:
    """A `Goodput` (problem.py) that measures T in the simulator; call it as
    `single_device_goodput` is called. Results are cached per
    (profile, SLO, max batch) in `measurements`."""

    policy: str = "flex"
    requests: int = 2000  # arrivals per probe, about
    min_duration_s: float = 1.0  # simulated seconds per probe, at least
    seed: int = 0
    target: float = 0.99
    rel_tol: float = 0.01
    measurements: dict[Key, Measurement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.requests < 100:
            raise ValueError(f"requests must be ≥ 100 for a 99 % test, got {self.requests}")
        if not self.min_duration_s > 0:
            raise ValueError(f"min_duration_s must be > 0, got {self.min_duration_s}")

    def __call__(self, profile: LatencyProfile, slo: float, max_batch: int) -> float:
        key = (profile, slo, max_batch)
        if key not in self.measurements:
            self.measurements[key] = self.measure(profile, slo, max_batch)
        return self.measurements[key].goodput

    @property
    def searches(self) -> int:
        return len(self.measurements)

    @property
    def wall_s(self) -> float:
        """Seconds all searches so far took."""
        return sum(m.wall_s for m in self.measurements.values())

    def report(self, problem: Problem, wall_s: float) -> str:
        """Each model and SLO's measured T beside the analytic one, and the cost."""
        lines = [
            f"single-device goodput T_i: measured ({self.policy} on one simulated device, "
            f"Poisson arrivals, ≥ {self.target:.0%} within SLO): {self.searches} "
            f"capacity searches in {wall_s:.2f} s",
            f"{'model':<20} {'SLO ms':>7} {'analytic r/s':>12} {'measured r/s':>12} {'ratio':>6}",
        ]
        seen: set[tuple[str, float]] = set()
        for s in problem.streams:
            model = problem.model(s.model)
            slo = model.slo if s.slo is None else s.slo
            if (model.name, slo) in seen:
                continue
            seen.add((model.name, slo))
            batch = model.profile.max_batch
            analytic = single_device_goodput(model.profile, slo, batch)
            t = self(model.profile, slo, batch)
            ratio = f"{t / analytic:6.2f}" if analytic > 0 else f"{'–':>6}"
            lines.append(f"{model.name:<20} {slo * 1e3:>7g} {analytic:>12.1f} {t:>12.1f} {ratio}")
        return "\n".join(lines) + "\n"

    def measure(self, profile: LatencyProfile, slo: float, max_batch: int) -> Measurement:
        """One capacity search, uncached."""
        began = time.perf_counter()
        capped = _capped(profile, max_batch)
        ceiling = _ceiling(capped, slo)
        if ceiling <= 0.0:
            return Measurement(0.0, 0.0, "unservable", 0, time.perf_counter() - began)
        duration = max(self.min_duration_s, self.requests / ceiling)
        workload = _one_device(capped, slo, ceiling, duration, self.seed)

        def run(scale: float) -> SimResult:
            return simulate(workload, self.policy, rate_scale=scale)

        start = min(1.0, max(_analytic_share(capped, slo, ceiling), 1.0 / 64))
        result: CapacityResult = find_capacity(
            run,
            target=self.target,
            lo=start,
            hi=start,
            rel_tol=self.rel_tol,
            max_scale=1.0,
            min_scale=1.0 / 1024,
        )
        return Measurement(
            result.capacity_rps,
            ceiling,
            result.status,
            len(result.probes),
            time.perf_counter() - began,
        )


def _capped(profile: LatencyProfile, max_batch: int) -> LatencyProfile:
    if max_batch < 1:
        raise ValueError(f"max_batch must be ≥ 1, got {max_batch}")
    if max_batch >= profile.max_batch:
        return profile
    return LatencyProfile(profile.latency_by_size[: max_batch + 1], profile.alpha, profile.beta)


def _ceiling(profile: LatencyProfile, slo: float) -> float:
    """U = max b/ℓ(b) over b with ℓ(b) ≤ SLO; 0 when ℓ(1) > SLO."""
    fits = profile.max_batch_within(slo)
    return max((b / profile.latency(b) for b in range(1, fits + 1)), default=0.0)


def _analytic_share(profile: LatencyProfile, slo: float, ceiling: float) -> float:
    """The analytic T as a share of U: where the search starts."""
    return single_device_goodput(profile, slo, profile.max_batch) / ceiling


def _one_device(
    profile: LatencyProfile, slo: float, rate: float, duration: float, seed: int
) -> Workload:
    model = ModelSpec(
        name="stream",
        profile=profile,
        slo_ms=slo * 1000.0,
        max_batch=profile.max_batch,
        rate=rate,
        arrival=ArrivalSpec("poisson", {}),
    )
    return Workload("herd-single-device", duration, seed, [DeviceSpec("device-0")], [model])
