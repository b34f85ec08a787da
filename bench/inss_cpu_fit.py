"""Fitting InSS's latency model (app/planning/inss/) to CPU measurements and
scoring it on what the fit did not see, for bench/inss_cpu_model.py.

* Alone running time o_r(b, ρ): `LocallyWeightedRegression` over each
  model's alone points at the *training* batch sizes (`split_batches`: the
  smallest, the largest and every other one between; the rest are held out)
  at both shares. Scored on the held-out batch sizes, at both shares.
* Co-location: t_co = o_r(b, ρ)·(1 + α_cache,i · l_v), model i beside
  co-runner v. l_v is v's intensity, a number per model fitted from the
  pairs together with each model's α_cache (`fit_intensities`: alternating
  least squares on t_co − t_alone = α_i·l_v·t_alone over the measured alone
  and co-located times; α_i by `fit_cache_interference`, l_v by the same
  line through the origin the other way round). The product α_i·l_v is all
  the data fix, so the l are scaled to a largest of 1. Scored leave one
  ordered pair out: every batch size of (i, v) predicted by α and l fitted
  on the other ordered pairs, with o_r from the alone LWR.

Units: seconds, bytes; shares are fractions in (0, 1].
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.planning.inss.fit import fit_cache_interference
from app.planning.inss.latency import (
    CoRunner,
    DeviceLatency,
    L2Use,
    ModelLatency,
    exec_breakdown,
)
from app.planning.inss.lwr import LocallyWeightedRegression
from bench.inss_cpu_measure import AlonePoint, CoPoint

# One ordered pair's observation: (model, co-runner, time alone, time beside it).
Observation = tuple[str, str, float, float]


@dataclass(frozen=True)
class Prediction:
    """One configuration the fit did not see: measured against predicted
    running time (the compute term; upload/download are reported apart)."""

    kind: str  # "alone" | "co"
    model: str
    co_runner: str | None
    batch: int
    share: float
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """Relative error, signed: predicted / measured − 1."""
        return self.predicted_s / self.measured_s - 1.0


def split_batches(batches: Sequence[int]) -> tuple[list[int], list[int]]:
    """(training, held out): the held-out ones are every other batch size
    strictly between the smallest and the largest, so that every held-out
    one lies between two training ones (LWR interpolates, not extrapolates)."""
    sizes = sorted(set(batches))
    if len(sizes) < 3:
        raise ValueError(f"need ≥ 3 batch sizes to hold one out, got {sizes}")
    held = sizes[1:-1:2]
    return [b for b in sizes if b not in held], held


def fit_alone(
    points: Iterable[AlonePoint], model: str, batches: Sequence[int], log_space: bool
) -> LocallyWeightedRegression:
    """o_r(b, ρ) of `model` from its alone points at `batches`."""
    chosen = [p for p in points if p.model == model and p.batch in batches]
    return LocallyWeightedRegression.from_arrays(
        [p.batch for p in chosen],
        [p.share for p in chosen],
        [p.seconds for p in chosen],
        log_space=log_space,
    )


def alone_predictions(
    points: Sequence[AlonePoint], train: Mapping[str, Sequence[int]], log_space: bool
) -> list[Prediction]:
    """Each model's held-out alone points against its LWR on the others."""
    out = []
    for model, batches in train.items():
        lwr = fit_alone(points, model, batches, log_space)
        out += [
            Prediction(
                "alone", model, None, p.batch, p.share, p.seconds, lwr.predict(p.batch, p.share)
            )
            for p in points
            if p.model == model and p.batch not in batches
        ]
    return out


def fit_intensities(
    observations: Sequence[Observation], iterations: int = 500
) -> tuple[dict[str, float], dict[str, float]]:
    """({model: α_cache}, {co-runner: l}) minimising Σ (t_co − t_alone −
    α_i·l_v·t_alone)² by alternating least squares, each kept ≥ 0 (a
    co-runner never speeds a model up; noisy timings on a busy box can
    suggest it, and a negative product would predict negative times); the
    l scaled to a largest l of 1."""
    if not observations:
        raise ValueError("no co-located observations to fit")
    targets = sorted({o[0] for o in observations})
    intensity = {v: 1.0 for v in sorted({o[1] for o in observations})}
    alpha = dict.fromkeys(targets, 0.0)
    for _ in range(iterations):
        before = (dict(alpha), dict(intensity))
        for i in targets:
            mine = [o for o in observations if o[0] == i]
            if not any(intensity[o[1]] for o in mine):
                alpha[i] = 0.0  # its co-runners interfere with nothing: no slowdown to fit
                continue
            fit = fit_cache_interference(
                [intensity[o[1]] for o in mine], [o[3] for o in mine], [o[2] for o in mine]
            )
            alpha[i] = max(0.0, fit.alpha_cache)
        for v in intensity:
            theirs = [o for o in observations if o[1] == v]
            x = [alpha[o[0]] * o[2] for o in theirs]
            xx = sum(a * a for a in x)
            if xx > 0:  # else no model feels v: its l stays where it was
                fitted = sum(a * (o[3] - o[2]) for a, o in zip(x, theirs, strict=True)) / xx
                intensity[v] = max(0.0, fitted)
        scale = max(abs(v) for v in intensity.values())
        if scale > 0:
            intensity = {v: x / scale for v, x in intensity.items()}
            alpha = {i: a * scale for i, a in alpha.items()}
        change = max(
            [abs(alpha[i] - before[0][i]) for i in alpha]
            + [abs(intensity[v] - before[1][v]) for v in intensity]
        )
        if change < 1e-12:
            break
    return alpha, intensity


def observations(
    co: Sequence[CoPoint], alone: Sequence[AlonePoint]
) -> list[tuple[CoPoint, Observation]]:
    """Each co-located point with its model's measured alone time at the same
    batch size and share."""
    at = {(p.model, p.batch, p.share): p.seconds for p in alone}
    out = []
    for p in co:
        key = (p.model, p.batch, p.share)
        if key not in at:
            raise ValueError(f"no alone time of {p.model} at batch {p.batch}, share {p.share:g}")
        out.append((p, (p.model, p.co_runner, at[key], p.seconds)))
    return out


def latency_model(
    name: str,
    item_bytes: tuple[float, float],
    running_time: LocallyWeightedRegression,
    alpha_cache: float,
    intensity: float,
) -> ModelLatency:
    """ModelLatency of a CPU model: no separate scheduling term (per-operator
    dispatch is inside the measured running time), L2 use l(ρ) = intensity
    at every share (α_u = 0: only one co-located share was measured)."""
    return ModelLatency(
        name=name,
        input_bytes=item_bytes[0],
        output_bytes=item_bytes[1],
        sched_per_kernel_s=0.0,
        kernels=0,
        running_time=running_time,
        l2=L2Use(0.0, intensity),
        alpha_cache=alpha_cache,
    )


def cpu_device(bandwidth_bytes_per_s: float) -> DeviceLatency:
    """The CPU as DeviceLatency: the arena's copy bandwidth; no scheduling
    interference (each executor dispatches its own operators on its own
    core, so what two cost each other is in the cache term)."""
    return DeviceLatency("cpu", bandwidth_bytes_per_s, 0.0, 0.0)


def co_predictions(
    co: Sequence[CoPoint],
    alone: Sequence[AlonePoint],
    lwr: Mapping[str, LocallyWeightedRegression],
    item_bytes: Mapping[str, tuple[float, float]],
    device: DeviceLatency,
) -> list[Prediction]:
    """Leave one ordered pair out: each (model, co-runner)'s points predicted
    with α and l fitted on every other ordered pair."""
    paired = observations(co, alone)
    out = []
    for held in sorted({(p.model, p.co_runner) for p in co}):
        rest = [o for p, o in paired if (p.model, p.co_runner) != held]
        model, runner = held
        if model not in {o[0] for o in rest} or runner not in {o[1] for o in rest}:
            raise ValueError(
                f"holding out {model} beside {runner} leaves no pair to fit "
                f"{model}'s α_cache or {runner}'s intensity: measure more pairs"
            )
        alpha, intensity = fit_intensities(rest)
        target = latency_model(model, item_bytes[model], lwr[model], alpha[model], 0.0)
        runner_l2 = L2Use(0.0, intensity[runner])
        for p, _ in paired:
            if (p.model, p.co_runner) != held:
                continue
            other = CoRunner(runner_l2, p.co_share)
            ran = exec_breakdown(target, device, p.batch, p.share, [other])
            predicted = ran.scheduling + ran.running
            out.append(Prediction("co", model, runner, p.batch, p.share, p.seconds, predicted))
    return out


def transfer_seconds(item_bytes: tuple[float, float], batch: int, device: DeviceLatency) -> float:
    """t_d + t_f of a batch through the arena."""
    return (item_bytes[0] + item_bytes[1]) * batch / device.bandwidth_bytes_per_s


def summary(predictions: Sequence[Prediction]) -> dict[str, dict[str, float]]:
    """Per model and "all": n, median and max of |error|."""
    groups: dict[str, list[float]] = {}
    for p in predictions:
        groups.setdefault(p.model, []).append(abs(p.error))
    groups["all"] = [abs(p.error) for p in predictions]
    return {
        name: {
            "n": len(errors),
            "median_abs_error": statistics.median(errors) if errors else math.nan,
            "max_abs_error": max(errors) if errors else math.nan,
        }
        for name, errors in groups.items()
    }
