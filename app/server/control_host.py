"""What model control (app/server/model_control.py), reallocation
(app/server/reallocation.py) and the management routes (app/server/management.py)
read and change of the live service: its models and their states, its
devices, pool and dispatcher, and a few of its answers. `LiveService`
implements it; naming the dependencies here keeps those modules from
importing the service that owns them."""

from __future__ import annotations

from typing import Protocol

from app.runtime.devices import ExecutorDevice
from app.runtime.pool import ExecutorPool
from app.server.autoscaling import DeviceScaling
from app.server.dispatcher import Dispatcher
from app.server.metrics import Metrics
from app.server.pipeline_service import PipelineService
from app.server.plans import PlanInForce
from app.server.settings import Settings
from app.server.startup import ModelState
from app.server.statistics import Statistics


class ControlHost(Protocol):
    """The live service as model control and reallocation see it."""

    settings: Settings
    # Served models by version key; failed or unloaded ones with their
    # reason; those being loaded or unloaded ("loading", "unloading"), which
    # take no requests; each served model's version, kept once it is gone.
    models: dict[str, ModelState]
    unavailable: dict[str, str]
    control_state: dict[str, str]
    versions: dict[str, str]
    own_devices: dict[str, tuple[str, ...] | None]  # config's, before a plan placed it
    devices: list[ExecutorDevice]
    statistics: Statistics
    pool: ExecutorPool | None  # None until started
    dispatcher: Dispatcher | None
    pipelines: PipelineService | None
    # Pipelines a posted PPipe plan replaced, answering what they accepted.
    retiring_pipelines: list[PipelineService]
    metrics: Metrics
    ready: bool
    closing: bool
    plan: PlanInForce | None  # the plan in force (PLAN or POST /v2/plan)
    scaling: DeviceScaling | None  # AUTOSCALE's autoscalers, once started

    def device(self, device_id: int) -> ExecutorDevice: ...
    def outstanding(self, model: str) -> int: ...
    def model_ready(self, name: str) -> bool: ...
    def relative_to_repository(self, reason: str) -> str: ...
    def plan_applied(self, plan: PlanInForce) -> None:
        """`plan` is in force from now on (GET /v2/plan, the plan metrics)."""
        ...
