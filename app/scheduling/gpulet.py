"""Gpulet's batching as InSS describes it, a baseline for spatially shared
devices (inss.txt §6.1 "Baselines" and §6.3 "SLO Violation"; Gpulet: Choi
et al., USENIX ATC '22).

InSS compares against Gpulet, which "divides a GPU into two pieces" and
"satisfies GPU execution time < SLO/2 and sets a timeout of SLO/2":

1. **Batch size**: the largest b whose execution fits half the SLO,
   ℓ(b) ≤ SLO / 2 (the other half is left to the wait for the batch), at
   least 1 and at most the model's max batch;
2. **Timeout**: a batch is sent when it is full or when its oldest request
   has waited SLO / 2, whichever comes first;
3. **Placement**: two partitions per GPU — a device's shares (the runtime's
   spatial sharing), not the core's concern: every device this core drives
   is one partition.

Otherwise it batches as Triton's dynamic batcher does (app/scheduling/
triton.py, which this class configures): FIFO per model, a free device
takes the next ready batch, requests queued longer than the queue timeout
(default the SLO) are rejected, and deadlines are not otherwise looked at.

Options: those of `triton`, with `max_batch` defaulting to rule 1 per model
and `max_queue_delay_ms` to rule 2 per model (SLO / 2, in ms); either, given
explicitly, applies as given.

Deviations, each for a reason: Gpulet's own scheduler also chooses the
partition sizes and re-partitions periodically from profiled interference;
InSS's description, which the comparison follows, reduces it to the fixed
rules above, and the partitions come from the device layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.scheduling.model import ModelInfo
from app.scheduling.triton import BatcherConfig, TritonScheduler, batcher_config
from app.scheduling.types import DeviceInfo


def half_slo_batch(model: ModelInfo) -> int:
    """Rule 1: the largest b with ℓ(b) ≤ SLO / 2, between 1 and max batch."""
    return max(1, min(model.max_batch, model.profile.max_batch_within(model.slo / 2)))


class GpuletScheduler(TritonScheduler):
    """Gpulet's batching: ℓ(b) ≤ SLO / 2, timeout SLO / 2 (see the module docstring)."""

    name = "gpulet"

    def __init__(
        self,
        models: Sequence[ModelInfo],
        devices: Sequence[DeviceInfo],
        *,
        max_batch: int | Mapping[str, int] | None = None,
        max_queue_delay_ms: float | None = None,
        **options: Any,
    ) -> None:
        # Read by _batcher_config, which the parent's constructor calls.
        self._delay_ms = max_queue_delay_ms
        super().__init__(
            models,
            devices,
            max_batch=max_batch,
            max_queue_delay_ms=0.0 if max_queue_delay_ms is None else max_queue_delay_ms,
            **options,
        )

    def _batcher_config(self, model: ModelInfo) -> BatcherConfig:
        given = self._max_batch
        wanted = given.get(model.name) if isinstance(given, Mapping) else given
        settings = {**self._shared, **self._per_model.get(model.name, {})}
        if self._delay_ms is None and "max_queue_delay_ms" not in self._per_model.get(
            model.name, {}
        ):
            settings["max_queue_delay_ms"] = model.slo / 2 * 1000.0
        return batcher_config(
            model,
            half_slo_batch(model) if wanted is None else wanted,
            **settings,  # type: ignore[arg-type]
        )
