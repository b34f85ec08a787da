"""A plan taken up while serving (app/server/plan_switch.py, POST /v2/plan):
the dispatcher's swap of cores on a fake clock (queued requests handed
over, busy devices held until the old cores' batches end), and a live
service switching from one core to HERD's groups and back under load, with
every request answered exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.api import create_api
from app.errors import Dropped
from app.planning.herd.plan import HerdPlan, ServingGroup
from app.runtime.events import BatchFinished, BatchStopped, DeviceDown, DeviceUp
from app.scheduling import DeviceInfo, make_scheduler
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from tests.fakes import model
from tests.fakes_live import FakeClock, FakeExecutors, FakeTimer
from tests.test_statistics import emulated_repository

SLOW = model("slow", alpha_ms=1.0, beta_ms=20.0, slo_ms=200.0, max_batch=32)
FAST = model("fast", alpha_ms=0.1, beta_ms=1.0, slo_ms=60.0, max_batch=64)


def _group(policy: str, models, device_ids) -> CoreGroup:
    core = make_scheduler(policy, list(models), [DeviceInfo(d) for d in device_ids])
    return CoreGroup(core, frozenset(m.name for m in models), tuple(device_ids))


def _dispatcher(*groups: CoreGroup):
    clock, timer, executors = FakeClock(), FakeTimer(), FakeExecutors()
    dispatcher = Dispatcher(list(groups), executors, clock=clock, timer_factory=lambda: timer)
    return dispatcher, executors, clock


# ------------------------------------------------------------ the dispatcher


def test_a_switch_hands_queued_requests_over_and_holds_busy_devices_until_their_batches_end():
    async def scenario() -> None:
        old_slow, old_fast = _group("clockwork", [SLOW], [0]), _group("clockwork", [FAST], [1])
        dispatcher, executors, clock = _dispatcher(old_slow, old_fast)
        first = dispatcher.submit_request("slow", 0, SLOW.slo)  # runs on device 0 to 21 ms
        queued = dispatcher.submit_request("slow", 1, SLOW.slo)  # waits for device 0
        fast = dispatcher.submit_request("fast", 2, FAST.slo)  # runs on device 1
        assert [(s[0], s[2]) for s in executors.submits] == [(0, "slow"), (1, "fast")]
        new = _group("clockwork", [SLOW, FAST], [0, 1])
        assert dispatcher.switch_groups([new]) == 1  # `queued`, handed to the new core
        assert dispatcher.groups == [new] and dispatcher.retiring == [old_slow, old_fast]
        assert len(executors.submits) == 2  # both devices busy: held from the new core
        assert not queued.future.done()

        clock.now = 0.021
        dispatcher.post(BatchFinished(0, executors.submits[0][1], 0.0, 0.021))
        assert first.future.result().batch.device == 0  # answered by the old core
        # device 0 is the new core's now: the handed-over request runs there
        assert [(s[0], s[2], s[3]) for s in executors.submits[2:]] == [(0, "slow", [1])]
        assert dispatcher.retiring == [old_fast]
        clock.now = 0.022
        dispatcher.post(BatchFinished(1, executors.submits[1][1], 0.0, 0.0011))
        assert fast.future.result().batch.model == "fast" and dispatcher.retiring == []
        clock.now = 0.043
        dispatcher.post(BatchFinished(0, executors.submits[2][1], 0.022, 0.043))
        assert queued.future.result().batch.device == 0
        assert dispatcher.pending == {}
        # the new core has both devices, and dispatches on either
        later = [dispatcher.submit_request("fast", 3 + i, FAST.slo) for i in range(2)]
        assert sorted(s[0] for s in executors.submits[3:]) == [0, 1]
        assert not any(p.future.done() for p in later)

    asyncio.run(scenario())


def test_a_held_device_that_fails_stays_down_for_the_new_core_until_it_is_back():
    async def scenario() -> None:
        old = _group("clockwork", [SLOW], [0])
        dispatcher, executors, clock = _dispatcher(old, _group("clockwork", [FAST], [1]))
        running = dispatcher.submit_request("slow", 0, SLOW.slo)
        dispatcher.switch_groups([_group("clockwork", [SLOW, FAST], [0, 1])])
        clock.now = 0.005
        dispatcher.post(DeviceDown(0, "executor emulated:0 died"))
        dispatcher.post(BatchFinished(0, executors.submits[0][1], 0.005, 0.005, "it died"))
        assert running.future.result().error == "it died"  # its old core answered it
        assert dispatcher.retiring == []
        waiting = [dispatcher.submit_request("slow", 1 + i, SLOW.slo) for i in range(2)]
        assert [s[0] for s in executors.submits[1:]] == [1]  # device 0 is still down
        clock.now = 0.010
        dispatcher.post(DeviceUp(0, 0.005))
        assert [s[0] for s in executors.submits[1:]] == [1, 0]
        assert not any(p.future.done() for p in waiting)

    asyncio.run(scenario())


def test_a_retired_batch_that_is_stopped_has_its_requests_run_by_the_new_core():
    """A stopped batch's requests are dropped `unloaded` by its core once the
    model is gone from it: across a switch they go to the new core instead."""

    async def scenario() -> None:
        dispatcher, executors, clock = _dispatcher(_group("flex", [SLOW], [0]))
        stopped = dispatcher.submit_request("slow", 0, SLOW.slo)
        dispatcher.switch_groups([_group("flex", [SLOW], [0])])
        clock.now = 0.002
        dispatcher.post(BatchStopped(0, executors.submits[0][1], 0.002))
        assert not stopped.future.done()
        assert [(s[0], s[3]) for s in executors.submits] == [(0, [0]), (0, [0])]
        clock.now = 0.030
        dispatcher.post(BatchFinished(0, executors.submits[1][1], 0.002, 0.023))
        assert stopped.future.result().batch.device == 0 and dispatcher.retiring == []

    asyncio.run(scenario())


def test_after_a_switch_with_nothing_running_the_old_cores_are_let_go_and_unload_says_so():
    async def scenario() -> None:
        dispatcher, executors, clock = _dispatcher(_group("clockwork", [SLOW], [0]))
        assert dispatcher.switch_groups([_group("clockwork", [SLOW], [0])]) == 0
        assert dispatcher.retiring == []
        first = dispatcher.submit_request("slow", 0, SLOW.slo)  # runs on device 0
        waiting = dispatcher.submit_request("slow", 1, SLOW.slo)
        dispatcher.remove_model("slow")
        with pytest.raises(Dropped) as caught:
            waiting.future.result()
        assert caught.value.reason == "unloaded"
        clock.now = 0.021
        dispatcher.post(BatchFinished(0, executors.submits[0][1], 0.0, 0.021))
        assert first.future.result().batch.device == 0

    asyncio.run(scenario())


# ------------------------------------------------------------ a live service


def _settings(repository: Path, **overrides) -> Settings:
    return Settings(repository=repository, cpu_slices=0, emulated_devices=2, **overrides)


def _herd(groups: list[tuple[list[int], list[str]]]) -> bytes:
    plan = HerdPlan(
        "ilp",
        "paper",
        tuple(ServingGroup(tuple(d), tuple(m), (), 1.0) for d, m in groups),
    )
    return json.dumps(plan.to_dict()).encode()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_live_service_switches_between_one_core_and_herd_groups_under_load(tmp_path: Path):
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 1.0}, slo_ms=2000)
    service = LiveService(_settings(repository, policy="flex"), Metrics())
    await service.start()
    try:
        api = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            answers: list[tuple[str, str, int]] = []  # (phase, model or status, …)
            phase = "one core"
            x = np.ones((1, 4), dtype=np.float32)

            async def load(model: str, n: int) -> None:
                for _ in range(n):
                    try:
                        result = await service.infer(model, {"x": x})
                        answers.append((phase, model, int(result.device.split(":")[1])))
                    except Exception as exc:  # each counted: exactly one answer
                        answers.append((phase, type(exc).__name__, -1))
                    await asyncio.sleep(0.002)

            clients = [asyncio.ensure_future(load(m, 60)) for m in ("a", "b") for _ in range(3)]
            await asyncio.sleep(0.3)
            herd = _herd([([0], ["a"]), ([1], ["b"])])
            r = await client.post("/v2/plan", content=herd)
            assert r.status_code == 200, r.text
            switched = r.json()
            phase = "herd"
            assert switched["kind"] == "herd-plan"
            assert switched["groups"] == [
                {"models": ["a"], "devices": ["emulated:0"]},
                {"models": ["b"], "devices": ["emulated:1"]},
            ]
            assert switched["switch_ms"] < 50
            await asyncio.sleep(0.5)
            back = _herd([([0, 1], ["a", "b"])])
            r = await client.post("/v2/plan", content=back)
            assert r.status_code == 200, r.text
            phase = "one core again"
            await asyncio.gather(*clients)
            plan = (await client.get("/v2/plan")).json()
            assert plan["in_force"] and plan["setting"] == "POST /v2/plan"
            assert [g["devices"] for g in plan["plan"]["groups"]] == [[0, 1]]
            devices = (await client.get("/v2/devices")).json()["devices"]
    finally:
        await service.stop()

    assert len(answers) == 6 * 60  # every request answered, once
    outcomes = Counter(what for _, what, _ in answers)
    assert outcomes == Counter({"a": 180, "b": 180}), outcomes
    herd_phase = [(m, d) for p, m, d in answers if p == "herd"]
    # requests sent after the switch ran on their group's device (those
    # handed over at the switch, sent before it, could run anywhere before)
    assert len(herd_phase) > 20
    late = herd_phase[len(herd_phase) // 2 :]
    assert {(m, d) for m, d in late} <= {("a", 0), ("b", 1)}, Counter(late)
    assert {d["name"]: (d["models"], d["state"], d["node"]) for d in devices} == {
        "emulated:0": (["a", "b"], "serving", None),
        "emulated:1": (["a", "b"], "serving", None),
    }


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_posted_plan_that_does_not_fit_is_refused_and_changes_nothing(tmp_path: Path):
    repository = emulated_repository(tmp_path / "models", {"a": 1.0}, slo_ms=2000)
    service = LiveService(_settings(repository), Metrics())
    await service.start()
    try:
        api = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            groups_before = list(service.dispatcher.groups)
            r = await client.post("/v2/plan", content=_herd([([0, 7], ["a", "ghost"])]))
            assert r.status_code == 409, r.text
            error = r.json()["error"]
            assert "model 'ghost' is not in the repository" in error
            assert "the groups name devices [7], but this server has 2" in error
            assert error.startswith("the posted plan (a HERD plan) does not fit this server")
            assert str(tmp_path) not in error  # no path of the server's
            r = await client.post("/v2/plan", content=b"{not json")
            assert r.status_code == 400 and "JSON" in r.json()["error"]
            inss = {"kind": "inss-plan", "version": 2, "plan": {}}
            r = await client.post("/v2/plan", content=json.dumps(inss).encode())
            assert r.status_code == 422, r.text
            assert "the posted InSS plan: the plan: malformed plan: 'method'" in r.text
            r = await client.post("/v2/plan", content=b"")
            assert r.status_code == 400
            assert service.dispatcher.groups == groups_before
            assert (await client.get("/v2/plan")).json() == {"in_force": False}
            result = await service.infer("a", {"x": np.ones((1, 4), dtype=np.float32)})
            assert result.device.startswith("emulated:")
    finally:
        await service.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_under_autoscale_each_new_group_gets_an_autoscaler_from_its_serving_devices(
    tmp_path: Path,
):
    """AUTOSCALE=1:2 on 4 devices: one core serves a and b on one device
    (its MIN), the others parked. HERD's groups a → 0, 1 and b → 2, 3: the
    first group keeps its serving device, the second starts one of its own."""
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 1.0}, slo_ms=5000)
    settings = _settings(repository, policy="flex", autoscale=(1, 2))
    settings = dataclasses.replace(settings, emulated_devices=4)
    service = LiveService(settings, Metrics())
    await service.start()
    try:
        parking = service.pool.parking
        assert [parking.parked(d) for d in range(4)] == [False, True, True, True]
        x = np.ones((1, 4), dtype=np.float32)
        switched = await service.apply_plan(_herd([([0, 1], ["a"]), ([2, 3], ["b"])]))
        assert [g["devices"] for g in switched["groups"]] == [
            ["emulated:0", "emulated:1"],
            ["emulated:2", "emulated:3"],
        ]
        assert [parking.parked(d) for d in range(4)] == [False, True, False, True]
        scalers = sorted(sorted(s.serving) for _, s in service.scaling.scalers.values())
        assert scalers == [[0], [2]]
        assert (await service.infer("a", {"x": x})).device == "emulated:0"
        assert (await service.infer("b", {"x": x})).device == "emulated:2"
    finally:
        await service.stop()
