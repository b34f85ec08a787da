"""PPipe's data plane: reservation tables, pooled pipelines and policy `ppipe`
(ppipe.txt §5.4, App. A.3). See policy.py for the rules and the driver API."""

from app.scheduling.ppipe.batches import (
    PipelineBatch,
    PipelineComplete,
    PipelineDecision,
    PipelineDispatch,
    StageRun,
    StageStart,
    TransferStart,
)
from app.scheduling.ppipe.layout import (
    DeviceInstance,
    Layout,
    PoolPipeline,
    PoolStage,
)
from app.scheduling.ppipe.policy import PPipeScheduler
from app.scheduling.ppipe.probe import Probe, probe
from app.scheduling.ppipe.reservations import ReservationTable, earliest_common_slot

__all__ = [
    "DeviceInstance",
    "Layout",
    "PPipeScheduler",
    "PipelineBatch",
    "PipelineComplete",
    "PipelineDecision",
    "PipelineDispatch",
    "PoolPipeline",
    "PoolStage",
    "Probe",
    "ReservationTable",
    "StageRun",
    "StageStart",
    "TransferStart",
    "earliest_common_slot",
    "probe",
]
