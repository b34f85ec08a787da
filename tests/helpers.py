"""Small builders shared by the policy tests (virtual clock, no sleeping)."""

from __future__ import annotations

from itertools import count

from app.scheduling import DeviceInfo, LatencyProfile, ModelInfo, Request
from app.scheduling.types import Decision, Dispatch, Drop, Preempt

_ids = count()


def model(
    name: str = "m",
    alpha_ms: float = 1.0,
    beta_ms: float = 10.0,
    slo_ms: float = 50.0,
    max_batch: int = 32,
    expected_rate: float | None = None,
) -> ModelInfo:
    profile = LatencyProfile.linear(alpha_ms, beta_ms, max_batch)
    return ModelInfo(name, profile, slo_ms / 1000, max_batch, expected_rate)


def devices(n: int = 1) -> list[DeviceInfo]:
    return [DeviceInfo(i) for i in range(n)]


def request(info: ModelInfo, arrival: float, slo_s: float | None = None) -> Request:
    slo = info.slo if slo_s is None else slo_s
    return Request(next(_ids), info.name, arrival, arrival + slo)


def dispatches(decisions: list[Decision]) -> list[Dispatch]:
    return [d for d in decisions if isinstance(d, Dispatch)]


def drops(decisions: list[Decision]) -> list[Drop]:
    return [d for d in decisions if isinstance(d, Drop)]


def preempts(decisions: list[Decision]) -> list[Preempt]:
    return [d for d in decisions if isinstance(d, Preempt)]
