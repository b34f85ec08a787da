"""Triton Inference Server's dynamic batcher as a baseline (deadline-unaware).

Follows Triton's documented dynamic batcher (user guide "Batchers" →
"Dynamic Batcher": *Preferred Batch Sizes*, *Delayed Batching*, *Queue
Policy*; fields of ``ModelDynamicBatching`` / ``ModelQueuePolicy`` in
``model_config.proto``), re-implemented on this project's sans-IO core.

Rules, per model (one queue per model, FIFO by arrival time):

1. **Batch formation** happens when a device is free. Requests are taken in
   arrival order. If the queue holds ≥ ``max_batch`` requests, a batch of
   ``max_batch`` is sent. Otherwise, if a preferred batch size can be formed,
   a batch of the *largest* formable preferred size is sent ("it will create
   a batch of the largest possible preferred size"). Otherwise, if the
   oldest request has waited ≥ ``max_queue_delay`` the batch is sent as is
   ("If the delay expires the dynamic batcher sends the batch as is");
   else the batcher waits, with a timer at ``oldest.arrival +
   max_queue_delay``. With the default delay of 0, whatever is queued is
   sent at once ("will create batches as large as possible up to the
   maximum batch size and will not delay").
2. **Devices.** Every device hosts an instance of every model and runs one
   batch at a time (Triton's model instances, shared by all models here).
   The free device that has been idle longest gets the batch;
   ``start_at = now + delay(k)`` (control and data transfer, as elsewhere in
   the core). When several models have a batch ready, the one whose oldest
   request is oldest is served first.
3. **Queue timeout** (``default_queue_policy { default_timeout_microseconds,
   timeout_action: REJECT }``): a request whose time in the queue exceeds the
   timeout (``now > arrival + timeout``) is rejected with
   ``DropReason.QUEUE_TIMEOUT``. Triton applies the policy when the batcher
   next looks at the queue; here a timer fires at the first instant after
   ``arrival + timeout`` so the answer is on time in virtual time too. Time
   spent executing does not count: once dispatched a request is not timed
   out.
4. **Queue size** (``max_queue_size``, optional): an arrival that finds the
   model's queue full is rejected at once (``DropReason.OVERLOADED``).
5. **Deadline-unaware.** Request deadlines are ignored: nothing is dropped
   because it will be late, so batches can finish after their requests'
   deadlines. This is the point of the baseline.

Options (constructor keywords) and their defaults — what a careful user who
knows each model's SLO would configure:

* ``max_batch`` — int for all models or ``{model: int}``; default per model
  the largest b ≤ ``model.max_batch`` with ℓ(b) ≤ SLO (``model.slo_batch``,
  at least 1). Values above ``model.max_batch`` are capped to it.
* ``max_queue_delay_ms`` — default 0, Triton's default.
* ``queue_timeout_ms`` — default ``"slo"``: each model's SLO; a number for
  all models; ``None`` for no timeout (Triton's own default of 0 = none).
* ``preferred_batch_sizes`` — default none (Triton's advice for most
  models). Sizes above a model's ``max_batch`` are ignored for that model
  (Triton would refuse such a config).
* ``max_queue_size`` — default ``None`` (unbounded, Triton's default of 0).
* ``model_options`` — ``{model: {option: value}}``: a model's own
  ``max_queue_delay_ms``, ``queue_timeout_ms``, ``preferred_batch_sizes``
  or ``max_queue_size`` over the values above (a model config's
  ``dynamic_batching``: Triton's batcher settings are per model).

Requests with several items (`Request.items`, Triton's batch dimension):
batch sizes — ``max_batch``, preferred sizes — count items, as in Triton.
Requests are taken in arrival order, whole: a batch is full when the next
request would take it past ``max_batch``; a preferred size is formable when
the front requests add up to it exactly; a single request larger than the
batcher's ``max_batch`` (possible only when that option is below the
model's own) is sent alone. ``max_queue_size`` counts requests.

Not modelled: priority levels, ``timeout_action: DELAY``, per-request
timeout overrides, ``preserve_ordering`` (responses are per request
anyway), sequence batching, custom batching strategies, and Triton's
rate limiter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sortedcontainers import SortedList

from app.scheduling.model import ModelInfo
from app.scheduling.replanning import ReplanningScheduler
from app.scheduling.timers import first_instant_after
from app.scheduling.types import DeviceInfo, DropReason, Request

SLO = "slo"  # queue_timeout_ms default: each model's own SLO


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """The dynamic-batching settings in effect for one model (seconds)."""

    max_batch: int
    preferred: tuple[int, ...]  # descending, each ≤ max_batch
    max_queue_delay: float
    queue_timeout: float | None
    max_queue_size: int | None


def batcher_config(
    model: ModelInfo,
    max_batch: int | None,
    *,
    max_queue_delay_ms: float,
    queue_timeout_ms: float | str | None,
    preferred_batch_sizes: Iterable[int],
    max_queue_size: int | None,
) -> BatcherConfig:
    """One model's batcher settings from the options (checked here)."""
    name = model.name
    if max_queue_delay_ms < 0:
        raise ValueError(f"max_queue_delay_ms must be ≥ 0, got {max_queue_delay_ms} for {name!r}")
    if isinstance(queue_timeout_ms, str) and queue_timeout_ms != SLO:
        raise ValueError(
            f"queue_timeout_ms must be a number, None or 'slo', got {queue_timeout_ms!r}"
        )
    if isinstance(queue_timeout_ms, (int, float)) and queue_timeout_ms <= 0:
        raise ValueError(f"queue_timeout_ms must be > 0 (None: no timeout), got {queue_timeout_ms}")
    if max_queue_size is not None and max_queue_size < 1:
        raise ValueError(f"max_queue_size must be ≥ 1 (None: unbounded), got {max_queue_size}")
    preferred = sorted({int(p) for p in preferred_batch_sizes}, reverse=True)
    if any(p < 1 for p in preferred):
        raise ValueError(f"preferred_batch_sizes must be ≥ 1, got {preferred}")
    if max_batch is None:
        cap = max(1, model.slo_batch)
    elif max_batch < 1:
        raise ValueError(f"max_batch must be ≥ 1, got {max_batch} for {name!r}")
    else:
        cap = min(int(max_batch), model.max_batch)
    if queue_timeout_ms is None:
        timeout = None
    elif queue_timeout_ms == SLO:
        timeout = model.slo
    else:
        timeout = float(queue_timeout_ms) / 1000.0
    return BatcherConfig(
        max_batch=cap,
        preferred=tuple(p for p in preferred if p <= cap),
        max_queue_delay=max_queue_delay_ms / 1000.0,
        queue_timeout=timeout,
        max_queue_size=max_queue_size,
    )


class TritonScheduler(ReplanningScheduler):
    """Triton dynamic batcher: max/preferred batch, queue delay, queue timeout."""

    name = "triton"
    speed_changes = True  # speeds are read when a batch is planned on a device

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        max_batch: int | Mapping[str, int] | None = None,
        max_queue_delay_ms: float = 0.0,
        queue_timeout_ms: float | str | None = SLO,
        preferred_batch_sizes: Iterable[int] = (),
        max_queue_size: int | None = None,
        model_options: Mapping[str, Mapping[str, object]] | None = None,
        **options: float,
    ) -> None:
        super().__init__(models, devices, **options)
        if isinstance(max_batch, Mapping):
            unknown = set(max_batch) - set(self.models)
            if unknown:
                raise ValueError(f"max_batch names unknown models: {sorted(unknown)}")
        per_model = dict(model_options or {})
        unknown = set(per_model) - set(self.models)
        if unknown:
            raise ValueError(f"model_options names unknown models: {sorted(unknown)}")
        shared = {
            "max_queue_delay_ms": max_queue_delay_ms,
            "queue_timeout_ms": queue_timeout_ms,
            "preferred_batch_sizes": preferred_batch_sizes,
            "max_queue_size": max_queue_size,
        }
        for name, own in per_model.items():
            if set(own) - set(shared):
                raise ValueError(
                    f"model_options[{name!r}]: no option {sorted(set(own) - set(shared))}; "
                    f"per model: {sorted(shared)}"
                )
        # What each model's BatcherConfig is made from (also for a model added later).
        self._max_batch = max_batch
        self._shared = shared
        self._per_model = per_model
        self.config: dict[str, BatcherConfig] = {
            name: self._batcher_config(model) for name, model in self.models.items()
        }

        # FIFO per model, ordered by (arrival, id), and the items it holds.
        self.fifo: dict[str, SortedList] = {name: SortedList() for name in self.models}
        self._items: dict[str, int] = dict.fromkeys(self.models, 0)

    def _batcher_config(self, model: ModelInfo) -> BatcherConfig:
        max_batch = self._max_batch
        wanted = max_batch.get(model.name) if isinstance(max_batch, Mapping) else max_batch
        own = self._per_model.get(model.name, {})
        return batcher_config(model, wanted, **{**self._shared, **own})  # type: ignore[arg-type]

    def queued(self) -> int:
        return sum(len(fifo) for fifo in self.fifo.values())

    # ------------------------------------------------------------------ hooks

    def _on_arrival(self, request: Request, model: ModelInfo, now: float) -> None:
        config = self.config[model.name]
        fifo = self.fifo[model.name]
        if config.max_queue_size is not None and len(fifo) >= config.max_queue_size:
            self._drop([request], DropReason.OVERLOADED)
            return
        fifo.add((request.arrival, request.id, request))
        self._items[model.name] += request.items
        self._schedule(now)

    def _requeue(self, requests: list[Request], now: float) -> None:
        # Already admitted once: no queue-size check, just back in line.
        for request in requests:
            self.fifo[request.model].add((request.arrival, request.id, request))
            self._items[request.model] += request.items
        self._schedule(now)

    def _on_model_added(self, model: ModelInfo, now: float) -> None:
        self.config[model.name] = self._batcher_config(model)
        self.fifo[model.name] = SortedList()
        self._items[model.name] = 0

    def _on_model_removed(self, name: str, now: float) -> list[Request]:
        self.timers.cancel(("timeout", name))
        self.timers.cancel(("delay", name))
        del self.config[name]
        del self._items[name]
        return [entry[2] for entry in self.fifo.pop(name)]

    # ---------------------------------------------------------------- policy

    def _schedule(self, now: float) -> None:
        for name in self.models:
            self._reject_timed_out(name, now)

        idle = self.idle_devices()
        while idle:
            best: tuple[float, int, str, int] | None = None
            for name, fifo in self.fifo.items():
                if not fifo:
                    continue
                k = self._ready_size(name, now)
                if k:
                    arrival, rid, _ = fifo[0]
                    if best is None or (arrival, rid) < best[:2]:
                        best = (arrival, rid, name, k)
            if best is None:
                break
            _, _, name, k = best
            device = idle.pop(0)
            self._dispatch_front(name, k, device, now)

        for name in self.models:
            self._set_timers(name, now)

    def _ready_size(self, name: str, now: float) -> int:
        """How many requests (from the front) the dynamic batcher would send
        now; 0 = keep waiting."""
        config = self.config[name]
        fifo = self.fifo[name]
        n = len(fifo)
        items = self._items[name]
        if items == n:  # one item each: requests are items
            if n >= config.max_batch:
                return config.max_batch
            for p in config.preferred:  # descending: the largest formable one
                if p <= n:
                    return p
            if n and now >= self._send_partial_at(name):
                return n
            return 0
        # Batch sizes of the front requests taken in order (whole requests,
        # at most max_batch items; a single request above it goes alone).
        sums: list[int] = []
        total = 0
        full = False
        for _, _, request in fifo.islice(0, min(n, config.max_batch)):
            if sums and total + request.items > config.max_batch:
                full = True  # the next request would overflow max_batch
                break
            total += request.items
            sums.append(total)
            if total >= config.max_batch:
                full = True
                break
        if full:
            return len(sums)
        for p in config.preferred:
            if p in sums:
                return sums.index(p) + 1
        if n and now >= self._send_partial_at(name):
            return len(sums)
        return 0

    def _send_partial_at(self, name: str) -> float:
        """When a batch that is neither full nor of a preferred size goes
        anyway (queue not empty): the oldest request's arrival plus the
        queue delay. Policies built on this batcher may send it otherwise."""
        return self.fifo[name][0][0] + self.config[name].max_queue_delay

    def _dispatch_front(self, name: str, k: int, device: int, now: float) -> None:
        fifo = self.fifo[name]
        requests = [entry[2] for entry in fifo.islice(0, k)]
        del fifo[:k]
        items = sum(r.items for r in requests)
        self._items[name] -= items
        self._dispatch(self.models[name], requests, device, now + self.delay(items))

    def _reject_timed_out(self, name: str, now: float) -> None:
        timeout = self.config[name].queue_timeout
        fifo = self.fifo[name]
        if timeout is None or not fifo:
            return
        # FIFO by arrival with one timeout per model: the expired are a prefix.
        n = 0
        while n < len(fifo) and now > fifo[n][0] + timeout:
            n += 1
        self._drop_front(name, n, DropReason.QUEUE_TIMEOUT)

    def _drop_front(self, name: str, n: int, reason: DropReason) -> None:
        """Drop the first `n` queued requests of `name` (none when n = 0)."""
        if not n:
            return
        fifo = self.fifo[name]
        dropped = [entry[2] for entry in fifo.islice(0, n)]
        del fifo[:n]
        self._items[name] -= sum(r.items for r in dropped)
        self._drop(dropped, reason)

    def _set_timers(self, name: str, now: float) -> None:
        config = self.config[name]
        fifo = self.fifo[name]
        timeout_key, delay_key = ("timeout", name), ("delay", name)
        if not fifo:
            self.timers.cancel(timeout_key)
            self.timers.cancel(delay_key)
            return
        oldest = fifo[0][0]
        if config.queue_timeout is not None:
            # Rejected once now > arrival + timeout: the next float after it.
            self.timers.reset(timeout_key, first_instant_after(oldest + config.queue_timeout, 0.0))
        # A delay timer only matters while the batcher is holding requests
        # back; a ready batch waits for a device, and batch_finished wakes us.
        ready_at = self._send_partial_at(name)
        if self._ready_size(name, now) == 0 and ready_at > now:
            self.timers.reset(delay_key, ready_at)
        else:
            self.timers.cancel(delay_key)
