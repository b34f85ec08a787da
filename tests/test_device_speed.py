"""A device's speed changing while the core serves (a share reallocated by a
shadow executor): batches planned after the change run ℓ(b) / new speed, the
batch already on the device keeps its end, and policies that plan with
speeds fixed at start refuse the change."""

from __future__ import annotations

import pytest

from app.scheduling.registry import make_scheduler, policy_names
from tests.fakes import devices, dispatches, model, request

SPEED_POLICIES = ("symphony", "triton", "inss", "gpulet")


@pytest.mark.parametrize("policy", SPEED_POLICIES)
def test_batches_planned_after_a_speed_change_run_at_the_new_speed(policy: str) -> None:
    info = model("m", alpha_ms=1.0, beta_ms=10.0, slo_ms=200.0, max_batch=1)
    core = make_scheduler(policy, [info], devices(1))
    first = dispatches(core.add_request(request(info, 0.0), 0.0))
    first += dispatches(core.advance(core.next_wakeup() or 0.0))
    assert len(first) == 1
    before = first[0].batch
    assert before.finish_at - before.start_at == pytest.approx(0.011)  # ℓ(1) at speed 1
    # The share doubles while the batch runs: its end stays planned as it was.
    core.set_device_speed(0, 2.0, 0.005)
    assert core.devices[0].speed == 2.0
    now = before.finish_at
    core.batch_finished(0, before.id, now)
    after = dispatches(core.add_request(request(info, now), now))
    wake = core.next_wakeup()
    while not after and wake is not None:
        after = dispatches(core.advance(wake))
        wake = core.next_wakeup()
    assert len(after) == 1
    assert after[0].batch.finish_at - after[0].batch.start_at == pytest.approx(0.0055)


def test_policies_with_speeds_fixed_at_start_refuse_the_change() -> None:
    info = model("m")
    refused = []
    for policy in policy_names():
        core = make_scheduler(policy, [info], devices(1))
        if not core.speed_changes:
            with pytest.raises(ValueError, match=f"policy {core.name} plans with the devices'"):
                core.set_device_speed(0, 2.0, 0.0)
            refused.append(policy)
    assert set(SPEED_POLICIES).isdisjoint(refused) and "nexus" in refused


def test_a_bad_speed_or_device_is_refused() -> None:
    core = make_scheduler("symphony", [model("m")], devices(1))
    with pytest.raises(ValueError, match="unknown device 3"):
        core.set_device_speed(3, 1.0, 0.0)
    for speed in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite and > 0"):
            core.set_device_speed(0, speed, 0.0)
