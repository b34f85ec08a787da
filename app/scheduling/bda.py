"""BDA, InSS's batch decision algorithm (inss.txt §5.3, Algorithm 1).

Given where each model runs and with what share (the provisioning), BDA
picks one batch size per model: the one that maximises throughput while the
model's memory fits its device (constraint 4a), its tasks meet their SLO
(4b) and its throughput keeps up with its arrival rate λ (4c). Task latency,
memory and throughput all grow with the batch size (§5.3's observation), so
the batch sizes that satisfy 4a and 4b form a prefix [1, b_max] and the
throughput is largest at b_max: a binary search over [1, 32] finds it in at
most ⌈log2 33⌉ = 6 probes, and 4c is then checked there.

`decide_batches` runs it for every model and reports, per model, the batch
size (None when none fits) and whether the model is served (`ok`); the
provisioning is feasible when every model is. When it is not, InSS asks its
placement (the learned agent, or an exact search) for another provisioning
and runs BDA again.

It lives in the scheduling core because both use it: the planner
(app/planning/inss/problem.py) for a provisioning, and policy `inss`
(app/scheduling/inss.py) again whenever the measured rates change.

The constraints come in as callables, so that BDA is independent of how
latency is predicted (app/planning/inss/latency.py's model, or a profile):
`fits(model, b)` is 4a and 4b together, `throughput(model, b)` gives 4c's
left-hand side.

Deviations from the printed pseudo-code, each for a reason:

* *flag_i*. Line 7 sets flag_i when a batch size is too large, but the text
  says flag_i tells whether a batch size satisfying the constraints was
  found (set at line 9); we follow the text: a model is served when some
  batch size satisfies 4a, 4b and 4c.
* *Line 10's break*. The pseudo-code stops searching a model as soon as a
  batch size meets 4a and 4b but not 4c. A larger batch size has more
  throughput and may still meet 4a and 4b, so stopping there could declare
  a model unservable that is not; we search the largest batch size meeting
  4a and 4b (the throughput maximum, as the text intends) and check 4c
  there, in the same number of probes.
* *Every model*. Algorithm 1 returns at the first model it cannot serve;
  `decide_batches` decides every model, so that the caller (and its log)
  learns which ones fail.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

# Algorithm 1, line 3.
MIN_BATCH = 1
MAX_BATCH = 32


@dataclass(frozen=True)
class BatchDecision:
    """One model's outcome: the largest batch size meeting memory and SLO
    (None when not even 1 does), its throughput, whether that keeps up with
    the arrival rate, and how many batch sizes were probed."""

    model: Hashable
    batch: int | None
    throughput: float
    ok: bool
    probes: int


def decide_batch(
    model: Hashable,
    rate: float,
    fits: Callable[[Hashable, int], bool],
    throughput: Callable[[Hashable, int], float],
    *,
    min_batch: int = MIN_BATCH,
    max_batch: int = MAX_BATCH,
) -> BatchDecision:
    """BDA for one model (see the module docstring). `rate` is λ in
    requests/s; `fits(model, b)` is constraints 4a and 4b; `throughput(model,
    b)` in requests/s."""
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"batch range [{min_batch}, {max_batch}] is empty or below 1")
    if not rate >= 0.0:
        raise ValueError(f"model {model!r}: arrival rate must be ≥ 0, got {rate}")
    low, high = min_batch, max_batch
    best: int | None = None
    probes = 0
    while low <= high:
        mid = (low + high) // 2
        probes += 1
        if fits(model, mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    if best is None:
        return BatchDecision(model, None, 0.0, False, probes)
    served = throughput(model, best)
    return BatchDecision(model, best, served, served >= rate, probes)


def decide_batches(
    rates: dict[Hashable, float] | Iterable[tuple[Hashable, float]],
    fits: Callable[[Hashable, int], bool],
    throughput: Callable[[Hashable, int], float],
    *,
    min_batch: int = MIN_BATCH,
    max_batch: int = MAX_BATCH,
) -> tuple[dict[Hashable, BatchDecision], bool]:
    """BDA for every model of `rates` (model → λ): each model's decision,
    and whether every model is served (Algorithm 1's returned flag)."""
    items = rates.items() if isinstance(rates, dict) else rates
    decisions = {
        model: decide_batch(model, rate, fits, throughput, min_batch=min_batch, max_batch=max_batch)
        for model, rate in items
    }
    return decisions, all(d.ok for d in decisions.values())
