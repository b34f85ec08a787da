"""Per-model statistics in the shape of Triton's statistics extension.

`Statistics` is a plain accumulator: the service feeds it numbers (seconds,
item counts, wall-clock milliseconds) and `report` returns the body of
`GET /v2/models[/{m}[/versions/{v}]]/stats` as plain dicts and lists (the
gRPC ModelStatistics RPC builds its message from the same structure). It
reads no clock and does no I/O, so tests drive it with exact numbers.

How our timings map onto Triton's fields (each `{count, ns}`; a request's
times are measured from its arrival, the moment its bytes reached the
server):

| Triton field      | per request (`inference_stats`)                               |
|-------------------|---------------------------------------------------------------|
| `success`         | a request answered with outputs; ns: arrival → answer ready   |
| `fail`            | a request answered with an error (refused at admission,       |
|                   | dropped, executor failed, shut down); ns: arrival → error     |
| `queue`           | arrival → its batch's start on the device (queued in the core)|
| `compute_input`   | intake: arrival → inputs in shared memory, handed to the core |
| `compute_infer`   | its batch's execution on the device                           |
| `compute_output`  | batch end → outputs read and the answer ready                 |
| `cache_hit/miss`  | always zero: there is no response cache                       |

`inference_count` counts items (a request of n items counts n, as Triton's
does), `success.count` requests, `execution_count` batches that ran to their
end without an error. `last_inference` is the wall-clock time, in
milliseconds since the epoch, of the last request answered either way.

`batch_stats` has one entry per batch size (in items) that ran, each batch
counted once when it ends (`batch_executed`): `compute_infer` its execution;
`compute_input` and `compute_output` the largest intake and answer time
among its requests, since a batch can start only once its last request's
inputs are in and is answered once its last request is. Those two are
folded in as the batch's requests are answered (`request_succeeded` with its
`batch` key); a request whose client went away adds nothing.

A model's statistics start at zero when it is (re)loaded and go when it is
unloaded, as Triton's do.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

_NS_PER_S = 1_000_000_000
# Batches whose requests are still being answered; a batch whose requests'
# clients went away never completes, so the table is bounded.
_OPEN_BATCHES_LIMIT = 4096


def _ns(seconds: float) -> int:
    return max(0, round(seconds * _NS_PER_S))


@dataclass
class Duration:
    """A Triton `{count, ns}` pair."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += _ns(seconds)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchSizeStats:
    """One entry of `batch_stats`: the batches of one size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class _OpenBatch:
    """A batch that ended and whose requests are being answered."""

    stats: BatchSizeStats
    waiting: int  # requests not answered yet
    input_s: float = 0.0  # the largest intake so far
    output_s: float = 0.0  # the largest answer time so far


@dataclass
class ModelStatistics:
    """One model version's counters since it was loaded."""

    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batches: dict[int, BatchSizeStats] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Triton's `$model_stat` object."""
        inference = {
            key: getattr(self, key).as_dict()
            for key in (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            )
        }
        batch_stats = [
            {
                "batch_size": size,
                "compute_input": stats.compute_input.as_dict(),
                "compute_infer": stats.compute_infer.as_dict(),
                "compute_output": stats.compute_output.as_dict(),
            }
            for size, stats in sorted(self.batches.items())
        ]
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": inference,
            "batch_stats": batch_stats,
        }


class Statistics:
    """Every loaded model's `ModelStatistics`; see the module docstring."""

    def __init__(self) -> None:
        self._models: dict[str, ModelStatistics] = {}
        self._open: OrderedDict[tuple[str, Hashable], _OpenBatch] = OrderedDict()

    def add_model(self, name: str, version: str, model_name: str | None = None) -> None:
        """Start (or restart, on a reload) `name`'s statistics at zero. `name`
        is the served model's key; `model_name` (default `name`) and
        `version` are what the report shows (each version of a model is
        served, and counted, under a key of its own)."""
        self.remove_model(name)
        self._models[name] = ModelStatistics(model_name or name, version)

    def remove_model(self, name: str) -> None:
        self._models.pop(name, None)
        for key in [key for key in self._open if key[0] == name]:
            del self._open[key]

    def models(self) -> list[str]:
        return sorted(self._models)

    def request_succeeded(
        self,
        model: str,
        *,
        items: int = 1,
        total_s: float,
        queue_s: float,
        input_s: float,
        infer_s: float,
        output_s: float,
        at_ms: int,
        batch: Hashable | None = None,
    ) -> None:
        """A request of `items` items answered with outputs. `batch`: the key
        its batch was counted under by `batch_executed`."""
        stats = self._models.get(model)
        if stats is None:
            return  # unloaded meanwhile: its statistics are gone
        if items < 1:
            raise ValueError(f"a request has at least one item, got {items}")
        stats.inference_count += items
        stats.success.add(total_s)
        stats.queue.add(queue_s)
        stats.compute_input.add(input_s)
        stats.compute_infer.add(infer_s)
        stats.compute_output.add(output_s)
        stats.last_inference_ms = max(stats.last_inference_ms, at_ms)
        if batch is not None:
            self._fold_into_batch(model, batch, input_s, output_s)

    def request_failed(self, model: str, *, total_s: float, at_ms: int) -> None:
        """A request answered with an error, `total_s` after its arrival."""
        stats = self._models.get(model)
        if stats is None:
            return  # an unknown model, or unloaded meanwhile
        stats.fail.add(total_s)
        stats.last_inference_ms = max(stats.last_inference_ms, at_ms)

    def batch_executed(
        self, model: str, *, batch: Hashable, batch_size: int, requests: int, infer_s: float
    ) -> None:
        """A batch of `batch_size` items (from `requests` requests) ran to
        its end in `infer_s`; counted once, under the key `batch`."""
        stats = self._models.get(model)
        if stats is None:
            return
        stats.execution_count += 1
        entry = stats.batches.setdefault(batch_size, BatchSizeStats())
        entry.compute_infer.add(infer_s)
        entry.compute_input.add(0.0)
        entry.compute_output.add(0.0)
        self._open[(model, batch)] = _OpenBatch(entry, requests)
        while len(self._open) > _OPEN_BATCHES_LIMIT:
            self._open.popitem(last=False)

    def _fold_into_batch(
        self, model: str, batch: Hashable, input_s: float, output_s: float
    ) -> None:
        """The batch's input and output time are its slowest request's: add
        what this request adds to the largest seen so far."""
        key = (model, batch)
        open_batch = self._open.get(key)
        if open_batch is None:
            return
        if input_s > open_batch.input_s:
            open_batch.stats.compute_input.ns += _ns(input_s) - _ns(open_batch.input_s)
            open_batch.input_s = input_s
        if output_s > open_batch.output_s:
            open_batch.stats.compute_output.ns += _ns(output_s) - _ns(open_batch.output_s)
            open_batch.output_s = output_s
        open_batch.waiting -= 1
        if open_batch.waiting <= 0:
            del self._open[key]

    def report(self, model: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's `$stats_model_response`: every loaded model's statistics,
        or `model`'s (and, given, only if its version is `version`). The
        caller checks the name and version exist (unknown: an empty list)."""
        chosen = [
            stats
            for stats in sorted(self._models.values(), key=lambda s: (s.name, s.version))
            if (model is None or stats.name == model)
            and (version is None or stats.version == version)
        ]
        return {"model_stats": [stats.as_dict() for stats in chosen]}


__all__ = ["BatchSizeStats", "Duration", "ModelStatistics", "Statistics"]


def epoch_ms() -> int:
    """Now, in milliseconds since the epoch (Triton's `last_inference`)."""
    return time.time_ns() // 1_000_000
