"""The sans-IO scheduling core: requests in, decisions out, time as an argument."""

from app.scheduling.base import Scheduler
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler, policy_names
from app.scheduling.types import (
    Batch,
    Complete,
    Decision,
    DeviceInfo,
    Dispatch,
    Drop,
    DropReason,
    Preempt,
    Request,
)

__all__ = [
    "Batch",
    "Complete",
    "Decision",
    "DeviceInfo",
    "Dispatch",
    "Drop",
    "DropReason",
    "LatencyProfile",
    "ModelInfo",
    "Preempt",
    "Request",
    "Scheduler",
    "make_scheduler",
    "policy_names",
]
