"""An InSS plan taken up while serving (app/server/inss_switch.py, POST
/v2/plan): the same placement at new shares (shadow executors, shrinks
first) and new batch sizes (new cores, each device at its share's speed),
every request answered once; another placement (share executors added
and removed, models moved: app/server/inss_layout.py) likewise; no InSS
plan in force is a 501 naming why."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.api import create_api
from app.repository.config import ModelConfig
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.plans import InssPlacement
from app.server.settings import Settings
from tests.fakes import emulated_config, inss_plan
from tests.test_statistics import emulated_repository


def _placement(shares, device_of, batch) -> InssPlacement:
    planned = frozenset(d.partition("/")[0] for d in device_of.values())
    return InssPlacement(shares, device_of, batch, planned)


IN_FORCE = _placement(
    {"gpu:1": (0.5, 0.5)},
    {"a": "gpu:0", "b": "gpu:1/0", "c": "gpu:1/1"},
    {"a": 4, "b": 1, "c": 2},
)


def test_the_same_placement_at_new_shares_reshapes_shrinks_first():
    from app.server.inss_switch import placement_differences, reshare_steps

    posted = _placement(
        {"gpu:1": (0.25, 0.75)},
        {"a": "gpu:0", "b": "gpu:1/0", "c": "gpu:1/1"},
        {"a": 2, "b": 1, "c": 4},
    )
    assert placement_differences(IN_FORCE, posted) == []
    assert reshare_steps(IN_FORCE, posted) == [("gpu:1/0", 0.25), ("gpu:1/1", 0.75)]
    grown_first = _placement({"gpu:1": (0.75, 0.25)}, posted.device_of, posted.batch)
    assert reshare_steps(IN_FORCE, grown_first) == [("gpu:1/1", 0.25), ("gpu:1/0", 0.75)]
    moved = _placement(
        {"gpu:1": (0.3, 0.3, 0.4)},
        {"a": "gpu:1/2", "b": "gpu:1/0", "c": "gpu:1/1"},
        posted.batch,
    )
    assert placement_differences(IN_FORCE, moved) == [
        "model 'a' on gpu:0 → gpu:1/2",
        "device 'gpu:1' in 2 shares → 3",
    ]


def test_new_caps_on_time_shared_models_are_kept_out_under_a_policy_of_its_own_batches():
    from app.server.inss_switch import caps_kept

    # a and d run in turn on the whole of gpu:2; b and c on shares of gpu:1.
    def shared(batch):
        device_of = {"a": "gpu:2", "d": "gpu:2", "b": "gpu:1/0", "c": "gpu:1/1"}
        return _placement({"gpu:1": (0.5, 0.5)}, device_of, batch)

    in_force = shared({"a": 4, "d": 2, "b": 1, "c": 2})
    posted = shared({"a": 4, "d": 3, "b": 8, "c": 2})
    # symphony caps only time-shared models: d's new cap waits for a
    # restart; b's new batch is not a cap under symphony.
    assert caps_kept(in_force, posted, "symphony") == {"d": 3}
    assert caps_kept(in_force, in_force, "symphony") == {}
    assert caps_kept(in_force, posted, "inss") == {}  # inss takes the batches up


def _emulated(id_: int, name: str, share: float = 1.0):
    from app.runtime.devices import ExecutorDevice

    return ExecutorDevice(id_, "emulated", name, share=share)


def test_executors_are_matched_by_name_kept_added_with_new_ids_and_removed():
    from app.server.inss_layout import layout_change

    current = [
        _emulated(0, "emulated:0"),
        _emulated(1, "emulated:1/0", 0.4),
        _emulated(2, "emulated:1/1", 0.6),
    ]
    planned = [
        _emulated(0, "emulated:0/0", 0.5),
        _emulated(1, "emulated:0/1", 0.5),
        _emulated(2, "emulated:1/0", 0.7),
        _emulated(3, "emulated:1/1", 0.3),
    ]
    # ids 3 and 4 were used once: new executors start at next_id.
    change = layout_change(current, planned, next_id=5)
    assert [(d.id, d.name, d.share) for d in change.added] == [
        (5, "emulated:0/0", 0.5),
        (6, "emulated:0/1", 0.5),
    ]
    assert [d.name for d in change.removed] == ["emulated:0"]
    assert {n: (old.id, new.id, new.share) for n, (old, new) in change.kept.items()} == {
        "emulated:1/0": (1, 1, 0.7),
        "emulated:1/1": (2, 2, 0.3),
    }
    # shrinks are made before the switch, growths after the removals
    assert change.shrinks() == [("emulated:1/1", 0.3)]
    assert change.growths() == [("emulated:1/0", 0.7)]
    assert [d.name for d in change.devices()] == [
        "emulated:1/0",
        "emulated:1/1",
        "emulated:0/0",
        "emulated:0/1",
    ]


def test_a_moved_model_is_planned_on_its_new_share_by_the_speed_it_ran_at():
    """b was profiled at half of emulated:1 and runs at 0.4 of it now
    (speed 0.8); moved to a share of 0.25, its batch of 1 takes
    ℓ(1) · 0.5 / 0.25 and its new core plans that share at speed 1."""
    from app.scheduling.profile import LatencyProfile
    from app.server.inss_layout import layout_change, moved_states
    from app.server.startup import ModelState

    current = [
        _emulated(0, "emulated:0"),
        _emulated(1, "emulated:1/0", 0.4),
        _emulated(2, "emulated:1/1", 0.6),
    ]
    planned = [
        _emulated(0, "emulated:0"),
        _emulated(1, "emulated:1/0", 0.4),
        _emulated(2, "emulated:1/1", 0.35),
        _emulated(3, "emulated:1/2", 0.25),
    ]
    change = layout_change(current, planned, next_id=3)

    def config(name: str, devices: tuple[str, ...], max_batch: int = 4) -> ModelConfig:
        return replace(emulated_config(name), devices=devices, max_batch_size=max_batch)

    def state(name: str, device: int, devices: tuple[str, ...]) -> ModelState:
        profile = LatencyProfile.linear(2.0, 20.0, 4)  # ms → s: 22 ms at batch 1
        return ModelState(config(name, devices), None, (device,), profile)  # type: ignore[arg-type]

    models = {"b": state("b", 1, ("emulated:1/0",)), "z": state("z", 0, ("emulated:0",))}
    placed = {"b": config("b", ("emulated:1/2",), max_batch=2), "z": models["z"].config}
    states, speeds, problems = moved_states(models, placed, change, {0: 1.0, 1: 0.8, 2: 1.2})
    assert problems == []
    assert states["b"].devices == (3,) and states["z"].devices == (0,)
    assert states["b"].config.max_batch_size == 4  # the cap in force is kept
    assert states["b"].profile.latency(1) == pytest.approx(0.022 * 0.5 / 0.25)
    assert states["z"].profile.latency(1) == pytest.approx(0.022)
    assert speeds == {0: 1.0, 1: 0.8, 2: 1.2, 3: 1.0}

    nowhere = {"b": config("b", ("cpu:0",))}
    _, _, problems = moved_states({"b": models["b"]}, nowhere, change, {})
    assert problems == ["model 'b': the plan leaves it no device"]


@pytest.mark.anyio
async def test_a_plan_moving_models_on_ray_executors_is_a_501_naming_the_restart(tmp_path: Path):
    from types import SimpleNamespace

    from app.server.inss_layout import switch_layout
    from app.server.plan_moves import PlanNotSwitchable
    from app.server.plans import PlanInForce

    placement = _placement({}, {"a": "gpu:0"}, {"a": 1})
    plan = PlanInForce("POST /v2/plan", tmp_path / "plan.json", None, placement)  # type: ignore[arg-type]
    service = SimpleNamespace(pool=object(), dispatcher=object())  # a pool that is not ours
    with pytest.raises(PlanNotSwitchable) as refused:
        await switch_layout(service, plan, Settings(), {})  # type: ignore[arg-type]
    assert refused.value.status == 501
    assert "executors on Ray are placed at start-up: restart with PLAN=FILE" in str(refused.value)


def _settings(repository: Path, plan: Path) -> Settings:
    return Settings.from_env(
        {"MODEL_REPOSITORY": str(repository), "PLAN": str(plan), "CPU_SLICES": "0",
         "EMULATED_DEVICES": "2", "RESPAWN": "0", "COLOCATION_PROFILE": "0",
         "POLICY": "inss", "POLICY_OPTIONS": '{"catch_up": false}'}
    )  # fmt: skip


# (model, batch, α ms, share) of each full batch after a plan: the
# emulated device holds (α·b + 20 ms) / share.
Expected = tuple[tuple[str, int, float, float], ...]


def _check_burst(results: list, expected: Expected) -> None:
    by_model = {m: results[8 * i : 8 * i + 8] for i, (m, *_) in enumerate(expected)}
    for model, batch, alpha, share in expected:
        sizes = [r.batch_size for r in by_model[model]]
        assert max(sizes) == batch, (model, sizes)
        full = [r.exec_ms for r in by_model[model] if r.batch_size == batch]
        expected_ms = (alpha * batch + 20.0) / share
        assert all(expected_ms * 0.95 <= ms <= expected_ms * 1.5 for ms in full), (model, full)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_plans_that_reshare_move_models_and_move_them_back_are_taken_up_under_load(
    tmp_path: Path,
) -> None:
    """a alone on emulated:0; b and c on halves of emulated:1. Posted under
    load, in turn: b 0.4 and c 0.6 of it, batches a 2 and c 4 (the same
    placement); a moved onto emulated:1 beside b and c, which is split in
    three (a share executor added); and back to the start (one removed).
    After each, full batches take ℓ(b) / share at the plan's shares and
    sizes, and every request is answered once."""
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 4.0})
    start = {"a": ("emulated:0", 1.0, 4), "b": ("emulated:1", 0.5, 1), "c": ("emulated:1", 0.5, 2)}
    started = inss_plan(tmp_path / "plan.json", start)
    posted = inss_plan(
        tmp_path / "posted.json",
        {"a": ("emulated:0", 1.0, 2), "b": ("emulated:1", 0.4, 1), "c": ("emulated:1", 0.6, 4)},
    )
    moved = inss_plan(
        tmp_path / "moved.json",
        {"a": ("emulated:1", 0.4, 2), "b": ("emulated:1", 0.3, 1), "c": ("emulated:1", 0.3, 4)},
    )
    back = inss_plan(tmp_path / "back.json", start)
    x = np.ones((1, 4), dtype=np.float32)

    async def scenario():
        service = LiveService(_settings(repository, started), Metrics())
        await service.start()
        answered: Counter[str] = Counter()
        try:
            api = create_api(lambda: service, Metrics())
            transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

                async def load(model: str, n: int) -> None:
                    for _ in range(n):
                        try:
                            await service.infer(model, {"x": x})
                            answered[model] += 1
                        except Exception as exc:  # counted: exactly one answer each
                            answered[type(exc).__name__] += 1
                        await asyncio.sleep(0.005)

                async def switch(plan: Path) -> tuple[dict, list, dict]:
                    # 8 clients a model: the policy's batches (up to 4) fill.
                    clients = [asyncio.ensure_future(load(m, 10)) for m in "abc" for _ in range(8)]
                    await asyncio.sleep(0.2)
                    r = await client.post("/v2/plan", content=plan.read_bytes())
                    assert r.status_code == 200, r.text
                    await asyncio.gather(*clients)
                    after = [service.infer(m, {"x": x}) for m in "abc" for _ in range(8)]
                    burst = await asyncio.gather(*after)
                    devices = (await client.get("/v2/devices")).json()["devices"]
                    return r.json(), burst, {d["name"]: (d["share"], d["models"]) for d in devices}

                steps = [await switch(plan) for plan in (posted, moved, back)]
                in_force = (await client.get("/v2/plan")).json()
            return answered, steps, in_force
        finally:
            await service.stop()

    answered, steps, in_force = asyncio.run(scenario())
    assert answered == Counter({"a": 240, "b": 240, "c": 240}), answered
    assert in_force["setting"] == "POST /v2/plan" and in_force["kind"] == "inss-plan"

    switched, burst, devices = steps[0]
    assert [(r["device"], r["share"]) for r in switched["reshared"]] == [
        ("emulated:1/0", 0.4),
        ("emulated:1/1", 0.6),
    ]
    assert switched["batch"] == {"a": 2, "b": 1, "c": 4} and switched["caps_kept"] == {}
    assert switched["kind"] == "inss-plan" and switched["switch_ms"] < 50
    assert devices == {
        "emulated:0": (1.0, ["a"]),
        "emulated:1/0": (0.4, ["b"]),
        "emulated:1/1": (0.6, ["c"]),
    }
    _check_burst(burst, (("a", 2, 1.0, 1.0), ("b", 1, 2.0, 0.4), ("c", 4, 4.0, 0.6)))

    # a moves onto emulated:1/0 (b's share); b onto /1, which shrinks
    # first; c onto /2, which is added.
    switched, burst, devices = steps[1]
    assert switched["added"] == ["emulated:1/2"] and switched["removed"] == []
    assert [(r["device"], r["share"]) for r in switched["reshared"]] == [("emulated:1/1", 0.3)]
    assert switched["loaded"] == {
        "a": ["emulated:1/0"],
        "b": ["emulated:1/1"],
        "c": ["emulated:1/2"],
    }
    assert switched["switch_ms"] < 50
    assert devices == {
        "emulated:0": (1.0, []),
        "emulated:1/0": (0.4, ["a"]),
        "emulated:1/1": (0.3, ["b"]),
        "emulated:1/2": (0.3, ["c"]),
    }
    _check_burst(burst, (("a", 2, 1.0, 0.4), ("b", 1, 2.0, 0.3), ("c", 4, 4.0, 0.3)))

    # Back: /2 is removed after the switch, then /0 and /1 grow to 0.5.
    switched, burst, devices = steps[2]
    assert switched["added"] == [] and switched["removed"] == ["emulated:1/2"]
    assert [(r["device"], r["share"]) for r in switched["reshared"]] == [
        ("emulated:1/0", 0.5),
        ("emulated:1/1", 0.5),
    ]
    assert devices == {
        "emulated:0": (1.0, ["a"]),
        "emulated:1/0": (0.5, ["b"]),
        "emulated:1/1": (0.5, ["c"]),
    }
    _check_burst(burst, (("a", 4, 1.0, 1.0), ("b", 1, 2.0, 0.5), ("c", 2, 4.0, 0.5)))


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("no_leftover_segments")
async def test_a_split_whose_executor_does_not_start_changes_nothing_and_a_retry_takes_it_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan splits emulated:0 (a alone on its whole) to give a half:
    its share executor is added, the whole one removed. When the new
    executor does not start, the answer is 503 and the plan, devices and
    answers stay those in force; posted again, it is taken up."""
    from app.errors import ExecutorFailed

    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0})
    started = inss_plan(
        tmp_path / "plan.json", {"a": ("emulated:0", 1.0, 4), "b": ("emulated:1", 1.0, 2)}
    )
    split = inss_plan(
        tmp_path / "split.json", {"a": ("emulated:0", 0.5, 4), "b": ("emulated:1", 1.0, 2)}
    )
    service = LiveService(_settings(repository, started), Metrics())
    await service.start()
    x = np.ones((1, 4), dtype=np.float32)
    try:
        pool = service.pool
        assert pool is not None
        add = pool.add_executor

        async def fails(device):
            raise ExecutorFailed(f"executor {device.name} exited at start")

        monkeypatch.setattr(pool, "add_executor", fails)
        r = await _post(service, split.read_bytes())
        assert r.status_code == 503, r.text
        assert "executor emulated:0/0 did not start" in r.json()["error"]
        assert [d.name for d in service.devices] == ["emulated:0", "emulated:1"]
        assert service.plan is not None and service.plan.setting == "PLAN"
        before = await service.infer("a", {"x": x})
        assert before.device == "emulated:0" and before.exec_ms < 21 * 1.5

        monkeypatch.setattr(pool, "add_executor", add)
        r = await _post(service, split.read_bytes())
        assert r.status_code == 200, r.text
        assert r.json()["added"] == ["emulated:0/0"] and r.json()["removed"] == ["emulated:0"]
        assert [(d.name, d.share) for d in service.devices] == [
            ("emulated:1", 1.0),
            ("emulated:0/0", 0.5),
        ]
        after = await service.infer("a", {"x": x})
        assert after.device == "emulated:0/0" and 21 / 0.5 * 0.95 <= after.exec_ms <= 21 / 0.5 * 1.5
    finally:
        await service.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_without_an_inss_plan_in_force_an_inss_plan_is_a_501(tmp_path: Path) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0}, slo_ms=2000)
    service = LiveService(
        Settings(repository=repository, cpu_slices=0, emulated_devices=2), Metrics()
    )
    await service.start()
    try:
        plan = inss_plan(tmp_path / "plan.json", {"a": ("emulated:0", 0.5, 2)})
        r = await _post(service, plan.read_bytes())
        assert r.status_code == 501, r.text
        assert "an InSS plan splits devices into share executors at start-up" in r.text
    finally:
        await service.stop()


async def _post(service: LiveService, body: bytes) -> httpx.Response:
    api = create_api(lambda: service, Metrics())
    transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post("/v2/plan", content=body)
