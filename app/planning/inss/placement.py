"""InSS's placement (inss.txt §3.3, problem (1)) as plain planning code:
which device each model runs on, its MPS share, its batch size (BDA), to
maximise Σ throughput with every model meeting memory, SLO and rate
(problem.py states the checks). The paper places with a learned agent;
these are the references it is measured against.

* `solve_exact` — exhaustive search with pruning, exact on the share grid
  (given BDA's batch sizes, which are optimal for given shares unless
  memory binds, problem.py). A MILP is a poor fit: t_inf is nonlinear in
  the share (LWR, 1/ρ) and in the set of co-runners (the interference
  terms), so a MILP would have to enumerate the same configurations as
  columns. The search is a branch and bound over assignments (each model to
  a device or unserved; the hardest models first), with, per device, the
  best share vector for the set of models placed there, memoised per
  (device signature, set):
    - a model's share starts at the smallest one serving it alone on that
      device (co-runners only slow it, problem.py);
    - a set that cannot share a device is not extended (likewise);
    - bound: the served count and throughput so far plus, for each model
      still to place, its best alone throughput; the greedy plan is the
      first incumbent; interchangeable empty devices are tried once.
    - beside the best share vector, a set of two or more models may run in
      turn on the whole device (time-sharing, problem.py's
      `time_share`; every model at share 1.0, batches on a duty cycle):
      the better of the two is the set's configuration, so a plan is never
      below what time-sharing the same devices, or one model per device
      (a single model's share vector includes 100 %), plans. A plan's
      `details["time_shared"]` names the devices whose models run in turn
      (their `shares_used` is 1.0).
  The objective is lexicographic: first the number of models served, then
  Σ throughput; so an infeasible problem still gets the plan that serves
  the most models, and the others are reported with their reason.
  Cost: with K devices, N models and U = 1/step grid points, at most
  (K + 1)^N assignments and, per device kind, Σ_n C(N, n)·C(U, n) share
  vectors (each with ≤ 6 BDA probes per model): for 4 devices × 6 models at
  10 %, 5^6 = 15,625 assignments and ≤ 8,007 vectors per kind. The pruned
  search on bench/workloads/inss/paper-setting.yaml (that size, two kinds)
  visits 468 nodes and evaluates 1,114 share vectors for 77 device sets, a
  fraction of a second; the plan's `details` record these counts.
  `max_assignments` refuses larger problems (use the greedy).
* `solve_greedy` — the models, hardest first (the largest smallest share
  they need alone, then the highest rate), each to the device where it adds
  most to Σ throughput, the shares of that device re-optimised over the
  grid as above; a model no device can take is unserved. N·K per-device
  searches, each over the share vectors of one device's models: fine for
  tens of devices and models at 10 % steps. Its plan is feasible for what
  it serves and never better than the exact one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from app.planning.inss.latency import exec_time
from app.planning.inss.plan import DevicePlan, ModelPlan, Plan
from app.planning.inss.problem import Device, DeviceEvaluator, Problem, Served

#: The exact search refuses problems with more (K + 1)^N assignments.
MAX_ASSIGNMENTS = 5_000_000
_EPS = 1e-9


@dataclass(frozen=True)
class DeviceChoice:
    """The best share vector for a set of models on one device."""

    value: float  # Σ throughput
    served: tuple[Served, ...]
    time_shared: bool = False  # the models in turn on the whole device


class _Search:
    """State shared by both solvers: the evaluator and per-device memos."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.evaluator = DeviceEvaluator(problem)
        self._best: dict[tuple[tuple[object, ...], frozenset[str]], DeviceChoice | None] = {}
        self._min_units: dict[tuple[tuple[object, ...], str], int | None] = {}
        self._alone: dict[tuple[tuple[object, ...], str], DeviceChoice | None] = {}

    def min_units(self, device: Device, model: str) -> int | None:
        """The smallest grid share serving `model` alone on `device`."""
        key = (device.signature, model)
        if key not in self._min_units:
            found = None
            for u in range(1, self.problem.units + 1):
                (alone,) = self.evaluator.configure(device, {model: u * self.problem.share_step})
                if alone.ok:
                    found = u
                    break
            self._min_units[key] = found
        return self._min_units[key]

    def best(self, device: Device, models: frozenset[str]) -> DeviceChoice | None:
        """The best share vector serving all of `models` on `device`, or None."""
        key = (device.signature, models)
        if key in self._best:
            return self._best[key]
        names = sorted(models)
        lows = [self.min_units(device, m) for m in names]
        found: DeviceChoice | None = None
        if all(low is not None for low in lows):
            step = self.problem.share_step
            for units in _vectors(lows, self.problem.units):  # type: ignore[arg-type]
                shares = {m: u * step for m, u in zip(names, units, strict=True)}
                served = self.evaluator.configure(device, shares, stop_at_failure=True)
                if len(served) < len(names) or not all(s.ok for s in served):
                    continue
                value = sum(s.throughput for s in served)
                if found is None or value > found.value + _EPS:
                    found = DeviceChoice(value, served)
            if len(names) > 1 and (turns := self.evaluator.time_share(device, names)):
                value = sum(s.throughput for s in turns)
                if found is None or value > found.value + _EPS:
                    found = DeviceChoice(value, turns, time_shared=True)
        self._best[key] = found
        return found

    def alone_best(self, model: str) -> float:
        """An upper bound on what `model` adds anywhere: its best alone."""
        values = [
            choice.value
            for d in self.problem.devices
            if (choice := self.best(d, frozenset({model}))) is not None
        ]
        return max(values, default=0.0)

    def order(self) -> list[str]:
        """Hardest first: the largest smallest alone share, then the rate."""

        def need(model: str) -> tuple[float, float]:
            lows = [self.min_units(d, model) for d in self.problem.devices]
            known = [u for u in lows if u is not None]
            return (min(known) if known else math.inf, self.problem.model(model).rate)

        return sorted((m.name for m in self.problem.models), key=need, reverse=True)


def _vectors(lows: list[int], total: int) -> Iterator[tuple[int, ...]]:
    """Integer vectors u with u_j ≥ lows[j] and Σ u ≤ total."""
    if not lows:
        yield ()
        return
    rest = sum(lows[1:])
    for u in range(lows[0], total - rest + 1):
        for tail in _vectors(lows[1:], total - u):
            yield (u, *tail)


def solve_greedy(problem: Problem) -> Plan:
    """The greedy heuristic (module docstring)."""
    search = _Search(problem)
    return _plan(search, _greedy_sets(search), "greedy", {})


def _greedy_sets(search: _Search) -> list[frozenset[str]]:
    devices = search.problem.devices
    sets: list[frozenset[str]] = [frozenset() for _ in devices]
    for model in search.order():
        best_gain, best_k = -math.inf, None
        for k, device in enumerate(devices):
            if _symmetric_skip(devices, sets, k):
                continue
            current = search.best(device, sets[k]) if sets[k] else DeviceChoice(0.0, ())
            grown = search.best(device, sets[k] | {model})
            if current is None or grown is None:
                continue
            gain = grown.value - current.value
            if gain > best_gain + _EPS:
                best_gain, best_k = gain, k
        if best_k is not None:
            sets[best_k] = sets[best_k] | {model}
    return sets


def _symmetric_skip(devices: tuple[Device, ...], sets: list[frozenset[str]], k: int) -> bool:
    """An empty device interchangeable with an earlier empty one adds nothing new."""
    return not sets[k] and any(
        not sets[j] and devices[j].signature == devices[k].signature for j in range(k)
    )


def solve_exact(problem: Problem, max_assignments: int = MAX_ASSIGNMENTS) -> Plan:
    """The exact branch and bound (module docstring)."""
    devices, n = problem.devices, len(problem.models)
    if (len(devices) + 1) ** n > max_assignments:
        raise ValueError(
            f"exact search over {len(devices)} devices × {n} models is too large "
            f"({len(devices) + 1}^{n} assignments > {max_assignments}); use the greedy"
        )
    search = _Search(problem)
    incumbent_sets = _greedy_sets(search)
    incumbent = _score(search, incumbent_sets)
    order = search.order()
    upper = [search.alone_best(m) for m in order]
    servable = [u > 0 for u in upper]  # λ > 0, so a served model has throughput > 0
    tail_value = [sum(upper[i:]) for i in range(n + 1)]
    tail_count = [sum(servable[i:]) for i in range(n + 1)]
    sets: list[frozenset[str]] = [frozenset() for _ in devices]
    values = [0.0 for _ in devices]
    visited = 0

    def dfs(i: int, count: int) -> None:
        nonlocal incumbent, incumbent_sets, visited
        visited += 1
        total = sum(values)
        if not _better((count + tail_count[i], total + tail_value[i]), incumbent):
            return
        if i == n:
            incumbent, incumbent_sets = (count, total), list(sets)
            return
        model = order[i]
        for k, device in enumerate(devices):
            if _symmetric_skip(devices, sets, k):
                continue
            grown = search.best(device, sets[k] | {model})
            if grown is None:
                continue
            old_set, old_value = sets[k], values[k]
            sets[k], values[k] = old_set | {model}, grown.value
            dfs(i + 1, count + 1)
            sets[k], values[k] = old_set, old_value
        dfs(i + 1, count)  # the model unserved

    dfs(0, 0)
    return _plan(search, incumbent_sets, "exact", {"nodes": visited})


def _score(search: _Search, sets: list[frozenset[str]]) -> tuple[int, float]:
    count, value = 0, 0.0
    for device, models in zip(search.problem.devices, sets, strict=True):
        if models:
            choice = search.best(device, models)
            assert choice is not None, "a plan's device set must be servable"
            count, value = count + len(models), value + choice.value
    return count, value


def _better(a: tuple[int, float], b: tuple[int, float]) -> bool:
    return a[0] > b[0] or (a[0] == b[0] and a[1] > b[1] + _EPS * max(1.0, abs(b[1])))


def _plan(
    search: _Search, sets: list[frozenset[str]], method: str, details: dict[str, object]
) -> Plan:
    problem = search.problem
    served: dict[str, tuple[Device, Served]] = {}
    device_plans = []
    time_shared = []
    for device, models in zip(problem.devices, sets, strict=True):
        choice = search.best(device, models) if models else DeviceChoice(0.0, ())
        assert choice is not None
        for s in choice.served:
            served[s.model] = (device, s)
        if choice.time_shared:
            time_shared.append(device.name)
        used = 1.0 if choice.time_shared else sum(s.share for s in choice.served)
        device_plans.append(
            DevicePlan(
                device=device.name,
                kind=device.kind,
                models=tuple(s.model for s in choice.served),
                shares_used=round(used, 12),
                memory_bytes=device.memory_bytes,
                memory_used_bytes=sum(s.memory_bytes for s in choice.served),
            )
        )
    model_plans = []
    for spec in problem.models:
        if spec.name in served:
            device, s = served[spec.name]
            model_plans.append(ModelPlan.on(spec, device.name, s))
        else:
            model_plans.append(ModelPlan.unserved(spec, why_unserved(search, spec.name)))
    objective = sum(m.throughput for m in model_plans)
    details = {
        **details,
        "configurations": search.evaluator.configurations,
        "device_sets": len(search._best),
        "time_shared": time_shared,
    }
    feasible = all(m.served for m in model_plans)
    return Plan(
        method=method,
        share_step=problem.share_step,
        models=tuple(model_plans),
        devices=tuple(device_plans),
        objective=objective,
        feasible=feasible,
        details=details,
    )


def why_unserved(search: _Search, model: str) -> str:
    """Why `model` has no place: what stops it alone, on each device kind,
    or that it fits alone but not beside the models served."""
    problem, spec = search.problem, search.problem.model(model)
    for device in problem.devices:
        low = search.min_units(device, model)
        if low is not None:
            return (
                f"served alone on {device.name} from a {low * problem.share_step:.0%} share, "
                "but no placement serves it beside the models served (the cluster is too small)"
            )
    reasons = []
    seen: set[tuple[object, ...]] = set()
    for device in problem.devices:
        if device.signature in seen:
            continue
        seen.add(device.signature)
        (alone,) = search.evaluator.configure(device, {model: 1.0})
        where = f"on {device.name} ({device.kind}) alone at 100 %"
        if spec.memory.at(1) > device.memory_bytes:
            reasons.append(
                f"{where}: batch 1 needs {spec.memory.at(1) / 1e6:.0f} MB > "
                f"{device.memory_bytes / 1e6:.0f} MB"
            )
        elif alone.batch is None:
            t = exec_time(search.evaluator.latency(model, device), device.latency, 1, 1.0)
            reasons.append(
                f"{where}: even batch 1 misses the SLO (worst latency {2 * t * 1e3:.1f} ms "
                f"> {spec.slo_s * 1e3:g} ms)"
            )
        else:
            reasons.append(
                f"{where}: at most {alone.throughput:.1f} req/s (batch {alone.batch}) "
                f"< rate {spec.rate:g} req/s"
            )
    return "; ".join(reasons)
