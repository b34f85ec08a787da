"""InSS's batching: FIFO per model under the planner (inss.txt §5; InSS:
spatial sharing of a device by several models, with an interference-aware
latency model).

InSS's planner (app/planning/inss/) gives every model a device share, its
co-runners there and a batch size b_i (BDA); at run time each model's
requests queue FIFO and go to its share in batches:

1. **Full batch**: as soon as b_i requests are queued, a batch of b_i is
   sent (the size BDA chose for the model's rate and SLO);
2. **Last moment**: otherwise the queued requests go together at their
   last moment: the earliest deadline among them (with deadlines arrival +
   SLO, the oldest request's) less ℓ(queued) and delay(queued), and less
   ℓ(b_i) — room for one planned batch sent before them and still running
   (eq. 2's worst case, which the planner's SLO check assumes: a task may
   wait for one more t_inf); when the core's devices are time-shared by
   several models (the planner's time-sharing: models in turn on a whole
   device), the reserve is the duty cycle instead when it is longer — one
   planned batch of every model of the core, spread over its devices,
   Σ_j ℓ_j(b_j) / devices — which the planner's check for time-shared
   models assumes. Without that reserve (`reserve_batch=False`) a
   partial batch sent at its bare last moment ends exactly at its deadline,
   and batches filled meanwhile by a burst queue behind it and end late: on
   bench/workloads/inss/paper-setting.yaml, planned with 2× rate headroom
   (≤ 50 % busy), 1.9 % of requests were late without it in a 6-s run at
   the file's rates, none with it;
3. **Queue timeout**: a request still queued after its SLO (its share was
   busy past its deadline) is dropped (`DropReason.QUEUE_TIMEOUT`).

Two deviations from the paper's FIFO, each measured (`catch_up`,
`drop_hopeless`; bench/workloads/inss/gpulet-small.yaml, Poisson, 30-s
runs, late or dropped at 0.85× / 0.90× of symphony's capacity on the same
shares: 2.39 % / 3.75 % without either, 1.00 % / 1.71 % with both;
symphony 0.56 % / 0.82 %):

* **Catch-up** (rule 1 under a backlog): when more than b_i requests are
  queued, the batch grows past b_i to the largest front batch that still
  ends by the oldest queued request's deadline (up to the model's max
  batch; requests of one item each). BDA's b_i is planned for a rate; a
  burst above it otherwise queues batches of b_i behind each other and ends
  them late;
* **Hopeless requests are dropped** (rule 3 at a free device): a request
  at the front that would end past its deadline even sent alone now is
  dropped (`DropReason.DEADLINE`), as every other policy of the server
  does, instead of being served late and delaying the requests behind it.

Otherwise deadlines set the moment a partial batch goes: a batch may still
finish after its requests' deadlines (the core runs FIFO, as the paper's
executors do).

ℓ is the model's profile on the device this core drives: on a shared device
the latency model's prediction at the model's share beside its planned
co-runners (bench/inss_sim.py builds such profiles from the plan), so the
core needs nothing else to know about sharing.

Batch sizes: the plan's (``batch``), or else BDA's on the measured rates.
InSS runs BDA (§5.3, app/scheduling/bda.py) "whenever measured rates
change": without a planned batch, every `bda_every_s` (on the first arrival
after it) each model's b_i becomes the largest b whose worst-case task
latency, the planner's max(t, (b − 1)/λ) + t with t = ℓ(b) + delay(b)
(app/planning/inss/problem.py), meets its SLO — throughput b / t then at
its most — λ the model's rate over the core's rate window. A model with no
measured rate yet (or none that BDA can serve) keeps the b it had: at
first, Gpulet's rule, the largest b with ℓ(b) ≤ SLO / 2
(app/scheduling/gpulet.py). ℓ is the profile the core plans with, on a
shared device its measured co-location slowdown included
(app/server/colocation.py).

Options: those of `triton` except `max_batch` and `max_queue_delay_ms`:

* ``batch`` — b_i, an int for all models or ``{model: int}`` (the plan's
  batches), fixed; default: BDA on measured rates (above). Capped by the
  model's max batch;
* ``bda_every_s`` — default 1: how often BDA runs without a planned batch.
* ``reserve_batch`` — default True: rule 2's reserve of ℓ(b_i);
* ``catch_up``, ``drop_hopeless`` — default True: the two deviations above
  (False: the paper's FIFO);
* ``queue_timeout_ms`` — default each model's SLO (rule 3).

Otherwise it is Triton's dynamic batcher (app/scheduling/triton.py, which
this class configures): a free device takes the ready batch whose oldest
request is oldest, requests with several items count their items toward
b_i and are never split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from app.scheduling.bda import decide_batch
from app.scheduling.gpulet import half_slo_batch
from app.scheduling.model import ModelInfo
from app.scheduling.triton import BatcherConfig, TritonScheduler, batcher_config
from app.scheduling.types import DeviceInfo, DropReason, Request


class InssScheduler(TritonScheduler):
    """FIFO per model: b_i at once, or the rest at its last moment (module docstring)."""

    name = "inss"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        batch: int | Mapping[str, int] | None = None,
        reserve_batch: bool = True,
        catch_up: bool = True,
        drop_hopeless: bool = True,
        bda_every_s: float = 1.0,
        **options: Any,
    ) -> None:
        self.reserve_batch = reserve_batch
        self.catch_up = catch_up
        self.drop_hopeless = drop_hopeless
        if not (bda_every_s > 0 and math.isfinite(bda_every_s)):
            raise ValueError(f"bda_every_s must be a finite number > 0, got {bda_every_s!r}")
        self.bda_every_s = float(bda_every_s)
        self.planned = batch is not None  # the plan's batches: no BDA at run time
        self._next_bda = -math.inf
        self.bda_runs = 0
        for own in ("max_batch", "max_queue_delay_ms"):
            if own in options:
                raise ValueError(
                    f"policy inss takes no {own!r}: its batch size is `batch`, and a batch "
                    "that is not full goes at its requests' last moment"
                )
        super().__init__(models, devices, max_batch=batch, **options)

    def _batcher_config(self, model: ModelInfo) -> BatcherConfig:
        given = self._max_batch
        wanted = given.get(model.name) if isinstance(given, Mapping) else given
        settings = {**self._shared, **self._per_model.get(model.name, {})}
        return batcher_config(
            model,
            half_slo_batch(model) if wanted is None else wanted,
            **settings,  # type: ignore[arg-type]
        )

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        if not self.planned and now >= self._next_bda:
            self._next_bda = now + self.bda_every_s
            self._run_bda(now)
        super()._on_arrival(request, model, now)

    def _run_bda(self, now: float) -> None:
        """BDA for every model at its measured rate (module docstring)."""
        self.bda_runs += 1
        for name, model in self.models.items():
            rate = self.rates[name].rate(now)
            if rate <= 0.0:
                continue
            decision = decide_batch(
                name,
                rate,
                lambda _, b, m=model, r=rate: self._worst_latency(m, b, r) <= m.slo,
                lambda _, b, m=model: b / self._t_inf(m, b),
                max_batch=model.max_batch,
            )
            if decision.batch is not None and decision.batch != self.config[name].max_batch:
                self.config[name] = replace(self.config[name], max_batch=decision.batch)

    def _t_inf(self, model: ModelInfo, batch: int) -> float:
        return self.latency(model, batch, self._fastest) + self.delay(batch)

    def _worst_latency(self, model: ModelInfo, batch: int, rate: float) -> float:
        """max(t, (b − 1)/λ) + t: the first task of a batch, behind one
        running (app/planning/inss/problem.py, `worst_latency`)."""
        t_inf = self._t_inf(model, batch)
        return max(t_inf, (batch - 1) / rate) + t_inf

    def _send_partial_at(self, name: str) -> float:
        """Rule 2: the earliest deadline among the queued requests (as the
        core plans with it: less its deadline margin) less ℓ(their items) on
        the fastest device, the dispatch delay and, with `reserve_batch`,
        ℓ(b_i) or the duty cycle of the core's models if longer."""
        items = self._items[name]
        due = min(entry[2].due for entry in self.fifo[name])
        model = self.models[name]
        last = due - self.latency(model, items, self._fastest) - self.delay(items)
        if self.reserve_batch:
            last -= max(self._planned_time(model), self._cycle())
        return last

    def _planned_time(self, model: ModelInfo) -> float:
        """ℓ(b_i) on the fastest device."""
        return self.latency(model, self.config[model.name].max_batch, self._fastest)

    def _cycle(self) -> float:
        """One planned batch of every model of the core, over its devices."""
        if len(self.models) < 2:
            return 0.0
        total = sum(self._planned_time(m) for m in self.models.values())
        return total / len(self.devices)

    def _schedule(self, now: float) -> None:
        if self.drop_hopeless and self.idle_devices():
            for name in self.models:
                self._drop_hopeless(name, now)
        super()._schedule(now)

    def _drop_hopeless(self, name: str, now: float) -> None:
        """Rule 3 at a free device: the front requests that would end past
        their deadlines even sent alone now are dropped, not served late."""
        fifo = self.fifo[name]
        model = self.models[name]
        n = 0
        for _, _, request in fifo.islice(0, len(fifo)):
            alone = self.delay(request.items) + self.latency(model, request.items, self._fastest)
            if now + alone <= request.due:
                break
            n += 1
        self._drop_front(name, n, DropReason.DEADLINE)

    def _ready_size(self, name: str, now: float) -> int:
        k = super()._ready_size(name, now)
        if k == 0 or not self.catch_up:
            return k
        return self._catch_up_size(name, k, now)

    def _catch_up_size(self, name: str, k: int, now: float) -> int:
        """Rule 1 under a backlog: more than b_i queued → the largest front
        batch (≤ the model's max batch) that still ends by the oldest
        queued request's deadline, never fewer than the batcher's k."""
        fifo = self.fifo[name]
        model = self.models[name]
        if self._items[name] != len(fifo) or len(fifo) <= k:
            return k
        due = fifo[0][2].due
        best = k
        for size in range(k + 1, min(len(fifo), model.max_batch) + 1):
            if now + self.delay(size) + self.latency(model, size, self._fastest) > due:
                break
            best = size
        return best
