"""An InSS plan taken up while serving (app/server/inss_switch.py, POST
/v2/plan): the same placement at new shares (shadow executors, shrinks
first) and new batch sizes (new cores, each device at its share's speed),
every request answered once; another placement, or no InSS plan in force,
is a 501 naming why."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.api import create_api
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.plans import InssPlacement
from app.server.settings import Settings
from tests.fakes import inss_plan
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


def _settings(repository: Path, plan: Path) -> Settings:
    return Settings.from_env(
        {"MODEL_REPOSITORY": str(repository), "PLAN": str(plan), "CPU_SLICES": "0",
         "EMULATED_DEVICES": "2", "RESPAWN": "0", "COLOCATION_PROFILE": "0",
         "POLICY": "inss", "POLICY_OPTIONS": '{"catch_up": false}'}
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_new_shares_and_batch_sizes_are_taken_up_under_load_and_every_request_answered_once(
    tmp_path: Path,
) -> None:
    """a alone on emulated:0; b and c on halves of emulated:1. The posted
    plan gives b 0.4 and c 0.6 of it, and batches a 2 and c 4:
    after it, full batches take ℓ(b) / share at the new shares and sizes."""
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 4.0})
    started = inss_plan(
        tmp_path / "plan.json",
        {"a": ("emulated:0", 1.0, 4), "b": ("emulated:1", 0.5, 1), "c": ("emulated:1", 0.5, 2)},
    )
    posted = inss_plan(
        tmp_path / "posted.json",
        {"a": ("emulated:0", 1.0, 2), "b": ("emulated:1", 0.4, 1), "c": ("emulated:1", 0.6, 4)},
    )
    moved = inss_plan(
        tmp_path / "moved.json",
        {"a": ("emulated:1", 0.4, 2), "b": ("emulated:1", 0.3, 1), "c": ("emulated:1", 0.3, 4)},
    )
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

                # 8 clients a model: the policy's batches (up to 4) fill.
                clients = [asyncio.ensure_future(load(m, 10)) for m in "abc" for _ in range(8)]
                await asyncio.sleep(0.2)
                r = await client.post("/v2/plan", content=posted.read_bytes())
                assert r.status_code == 200, r.text
                switched = r.json()
                await asyncio.gather(*clients)
                after = [service.infer(m, {"x": x}) for m in "abc" for _ in range(8)]
                burst = await asyncio.gather(*after)
                r = await client.post("/v2/plan", content=moved.read_bytes())
                refused = (r.status_code, r.json()["error"])
                devices = (await client.get("/v2/devices")).json()["devices"]
                in_force = (await client.get("/v2/plan")).json()
            return answered, switched, burst, refused, devices, in_force
        finally:
            await service.stop()

    answered, switched, burst, refused, devices, in_force = asyncio.run(scenario())
    assert answered == Counter({"a": 80, "b": 80, "c": 80}), answered
    assert [(r["device"], r["share"]) for r in switched["reshared"]] == [
        ("emulated:1/0", 0.4),
        ("emulated:1/1", 0.6),
    ]
    assert switched["batch"] == {"a": 2, "b": 1, "c": 4} and switched["caps_kept"] == {}
    assert switched["kind"] == "inss-plan" and switched["switch_ms"] < 50
    shares = {d["name"]: d["share"] for d in devices}
    assert shares == {"emulated:0": 1.0, "emulated:1/0": 0.4, "emulated:1/1": 0.6}
    assert in_force["setting"] == "POST /v2/plan" and in_force["kind"] == "inss-plan"
    by_model = {m: burst[8 * i : 8 * i + 8] for i, m in enumerate("abc")}
    for model, batch, alpha, share in (
        ("a", 2, 1.0, 1.0),
        ("b", 1, 2.0, 0.4),
        ("c", 4, 4.0, 0.6),
    ):
        sizes = [r.batch_size for r in by_model[model]]
        assert max(sizes) == batch, (model, sizes)
        full = [r.exec_ms for r in by_model[model] if r.batch_size == batch]
        expected_ms = (alpha * batch + 20.0) / share
        assert all(expected_ms * 0.95 <= ms <= expected_ms * 1.5 for ms in full), (model, full)
    status, error = refused
    assert status == 501
    assert "model 'a' on emulated:0 → emulated:1/0" in error
    assert "device 'emulated:1' in 2 shares → 3" in error
    assert "restart with PLAN=FILE" in error


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
