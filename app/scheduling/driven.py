"""The driver API: what a scheduling core is asked, by the simulator
(app/simulation/) and by the daemon's drivers (app/server/dispatcher.py,
app/server/pipeline_driver.py) alike — the only way either reaches a core.

Every policy answers the same calls, with time as an argument and its
decisions as the value (sans-IO):

* `add_request(request, now)` — a request arrived;
* `advance(now)` / `next_wakeup()` — the core's own timers: the driver
  calls `advance` at (or after) the time `next_wakeup` names;
* `device_down(device, now)` / `device_up(device, now)` — an executor died
  (what it held is lost) or is back;
* `queued()` — requests the core holds and has not answered.

And the reports of the work it sent out, by the shape of that work:

* `BatchCore` — a batch runs whole on one device (every policy but
  `ppipe`): `batch_finished`, `batch_stopped` (a preemption's stop, or a
  batch skipped), and `record_alone_time` (the asynchronous profiler's
  re-runs, orloj.txt §4.1);
* `StageCore` — a batch is a chain of stages over pools of instances
  (`ppipe`, app/scheduling/ppipe/): each `StageStart` is to it what a
  `Dispatch` is to the others, reported by `stage_finished` (with the
  executor's start and end, for feedback correction) or `stage_failed`, and
  a `TransferStart` by `transfer_finished`. Its `layout` (the plan's
  instances and pipelines) is what its drivers emulate or start.

Protocols rather than classes, so that a wrapper around a core (one that
records the calls, tests/fakes_live.py) drives the same drivers, compiled
or not.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, TypeVar

from app.scheduling.base import Stopping
from app.scheduling.model import ModelInfo
from app.scheduling.ppipe.batches import PipelineDecision
from app.scheduling.ppipe.layout import Layout
from app.scheduling.types import AutoscaleSignals, Decision, DeviceInfo, Request

D = TypeVar("D", covariant=True)


class DrivenCore(Protocol[D]):
    """The calls every core answers (see the module docstring)."""

    def add_request(self, request: Request, now: float) -> list[D]: ...
    def advance(self, now: float) -> list[D]: ...
    def next_wakeup(self) -> float | None: ...
    def device_down(self, device: int, now: float) -> list[D]: ...
    def device_up(self, device: int, now: float) -> list[D]: ...
    def queued(self) -> int: ...


class BatchCore(DrivenCore[Decision], Protocol):
    """A core whose batches run whole on one device: `Scheduler`'s."""

    def batch_finished(self, device: int, batch_id: int, now: float) -> list[Decision]: ...
    def batch_stopped(self, device: int, batch_id: int, now: float) -> list[Decision]: ...
    def record_alone_time(
        self, model: str, app: str, seconds: float, now: float
    ) -> list[Decision]: ...


class ServedCore(BatchCore, Protocol):
    """A `BatchCore` as the daemon serves it (app/server/): models loaded
    and unloaded while serving, a device's speed changed by a reshare, and
    Symphony's autoscaling signals (symphony.txt §4.4)."""

    name: ClassVar[str]
    speed_changes: ClassVar[bool]
    models: dict[str, ModelInfo]
    devices: dict[int, DeviceInfo]
    stopping: dict[int, Stopping]  # preempted batches whose stop is not confirmed

    def idle_devices(self) -> list[int]: ...
    def add_model(self, model: ModelInfo, now: float) -> list[Decision]: ...
    def remove_model(self, name: str, now: float) -> list[Decision]: ...
    def set_device_speed(self, device: int, speed: float, now: float) -> list[Decision]: ...
    def signals(self, now: float) -> AutoscaleSignals: ...
    def reset_signals(self, now: float) -> None: ...


class StageCore(DrivenCore[PipelineDecision], Protocol):
    """A core whose batches run stage by stage: `PPipeScheduler`."""

    @property
    def layout(self) -> Layout: ...

    # Times an instance was routed around because a stage it held was overdue.
    overdue_count: int

    def stage_finished(
        self,
        batch_id: int,
        stage: int,
        started: float,
        finished: float,
        now: float,
        *,
        device: int | None = None,
        run: int | None = None,
    ) -> list[PipelineDecision]: ...
    def stage_failed(
        self, batch_id: int, stage: int, now: float, *, run: int | None = None
    ) -> list[PipelineDecision]: ...
    def transfer_finished(
        self,
        batch_id: int,
        stage: int,
        started: float,
        finished: float,
        now: float,
        *,
        run: int | None = None,
    ) -> list[PipelineDecision]: ...
