"""Triton's model-repository extension (issue 20, item 4): load and unload
without a restart, the admin-token rules, config overrides; and, on a real
LiveService with executor processes, that load and unload under load lose
no request: every one is answered exactly once, with outputs or an explicit
error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections import Counter
from pathlib import Path

import httpx
import pytest

from app.api import create_api
from app.api import models as api_models
from app.errors import InvalidInput
from app.runtime.arena import compute_layout
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.model_control import (
    MAX_SLO_MS,
    apply_override,
    check_arena,
    machine_memory_bytes,
)
from tests.fakes import FakeService, emulated_config, segments_of
from tests.test_statistics import body, emulated_repository, live_settings

# ------------------------------------------------------------------ the token rules


async def _post(app, path: str, **kwargs) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(path, **kwargs)


@pytest.mark.anyio
async def test_loopback_without_a_token_may_load_and_unload():
    service = FakeService()
    app = create_api(lambda: service, Metrics())
    assert (await _post(app, "/v2/repository/models/add_one/unload")).json() == {}
    override = json.dumps({"max_batch_size": 4})
    r = await _post(
        app, "/v2/repository/models/add_one/load", json={"parameters": {"config": override}}
    )
    assert r.status_code == 200, r.text
    assert service.calls == [{"unload": "add_one"}, {"load": "add_one", "config": override}]


@pytest.mark.anyio
async def test_with_a_token_the_bearer_must_match():
    service = FakeService()
    app = create_api(lambda: service, Metrics(), admin_token="s3cret", bind_host="0.0.0.0")
    path = "/v2/repository/models/add_one/unload"
    r = await _post(app, path)
    assert r.status_code == 401 and "Bearer" in r.json()["error"]
    r = await _post(app, path, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"] == "invalid bearer token"
    r = await _post(app, path, headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200, r.text
    assert service.calls == [{"unload": "add_one"}]


@pytest.mark.anyio
async def test_no_token_on_a_public_bind_is_refused_naming_why():
    service = FakeService()
    app = create_api(lambda: service, Metrics(), bind_host="0.0.0.0")
    for action in ("load", "unload"):
        r = await _post(app, f"/v2/repository/models/add_one/{action}")
        assert r.status_code == 403, r.text
        assert r.json()["reason"] == "management_disabled"
        assert "not a loopback address" in r.json()["error"] and "ADMIN_TOKEN" in r.json()["error"]
    assert service.calls == []


@pytest.mark.anyio
async def test_bad_requests_name_the_problem():
    service = FakeService()
    app = create_api(lambda: service, Metrics())
    r = await _post(app, "/v2/repository/models/add_one/load", json={"parameters": {"file:1": "x"}})
    assert r.status_code == 422 and "file:1" in r.json()["error"], r.text
    r = await _post(app, "/v2/repository/models/..x/load")
    assert r.status_code == 400 and r.json()["reason"] == "invalid_model_name"
    r = await _post(app, "/v2/repository/models/nope/unload")
    assert r.status_code == 404
    assert service.calls == []


def test_override_numbers_are_finite_and_bounded_and_may_be_strings():
    """Issue 42, items 1–2: `{"slo_ms": Infinity}` wedged the loop and
    `max_batch_size` 10^8 took 8 GB; Triton's own JSON (numbers as strings)
    is taken, parsed strictly."""
    config = emulated_config("emu")
    taken = {
        '{"max_batch_size": "16"}': ("max_batch_size", 16),
        '{"max_batch_size": 65536}': ("max_batch_size", 65536),
        '{"max_batch_size": 8.0}': ("max_batch_size", 8),
        '{"slo_ms": "50"}': ("slo_ms", 50.0),
        '{"slo_ms": "2.5e3"}': ("slo_ms", 2500.0),
        '{"slo_ms": 3600000}': ("slo_ms", 3600000.0),
        '{"parameters": {"slo_ms": {"string_value": "75"}}}': ("slo_ms", 75.0),
        '{"allow_slo_loosening": "true"}': ("allow_slo_loosening", True),
    }
    for text, (field, value) in taken.items():
        assert getattr(apply_override(config, text), field) == value, text
    refused = {
        '{"slo_ms": Infinity}': "slo_ms",
        '{"slo_ms": NaN}': "slo_ms",
        '{"slo_ms": -Infinity}': "slo_ms",
        '{"slo_ms": 1e400}': "slo_ms",
        '{"slo_ms": "1e400"}': "slo_ms",
        '{"slo_ms": "inf"}': "slo_ms",
        '{"slo_ms": "abc"}': "slo_ms",
        '{"slo_ms": 3600001}': "slo_ms",
        '{"slo_ms": true}': "slo_ms",
        '{"parameters": {"slo_ms": {"string_value": "Infinity"}}}': "slo_ms",
        '{"parameters": {"slo_ms": {"string_value": "nan"}}}': "slo_ms",
        '{"max_batch_size": 65537}': "max_batch_size",
        '{"max_batch_size": 100000000}': "max_batch_size",
        '{"max_batch_size": 1e9}': "max_batch_size",
        '{"max_batch_size": "1e400"}': "max_batch_size",
        '{"max_batch_size": "inf"}': "max_batch_size",
        '{"max_batch_size": "abc"}': "max_batch_size",
        '{"max_batch_size": "16.5"}': "max_batch_size",
        '{"max_batch_size": 2.5}': "max_batch_size",
        '{"max_batch_size": true}': "max_batch_size",
        '{"max_batch_size": Infinity}': "max_batch_size",
        '{"allow_slo_loosening": "yes"}': "allow_slo_loosening",
        '{"description": "' + "d" * 4097 + '"}': "description",
        '{"devices": []}': "devices",
        '{"devices": [""]}': "devices",
        '{"devices": ["cpu", "cpu"]}': "devices",
        '{"devices": "cpu"}': "devices",
        '{"devices": [' + ",".join(['"x"'] * 65) + "]}": "devices",
    }
    for text, field in refused.items():
        with pytest.raises(InvalidInput) as caught:
            apply_override(config, text)
        assert f"config override: {field}" in caught.value.message, (text, caught.value.message)
        assert len(caught.value.message) < 300
    assert MAX_SLO_MS == api_models.MAX_SLO_MS == 3_600_000.0


def test_an_arena_larger_than_a_quarter_of_memory_is_refused_naming_max_batch_size():
    config = dataclasses.replace(emulated_config("emu"), max_batch_size=65536)
    slot = compute_layout(config, 1, "x")["slot_nbytes"]
    check_arena(config, 65536, memory=4 * 65536 * slot)  # exactly a quarter: taken
    with pytest.raises(InvalidInput, match="max_batch_size 65536 needs a shared-memory arena"):
        check_arena(config, 65536, memory=4 * 65536 * slot - 1)
    assert machine_memory_bytes() > 2**28  # this machine's, read


def test_config_override_sets_what_maps_and_refuses_the_rest():
    config = emulated_config("emu")
    changed = apply_override(
        config,
        json.dumps(
            {
                "name": "emu",
                "max_batch_size": 2,
                "description": "smaller",
                "parameters": {"slo_ms": {"string_value": "75"}},
            }
        ),
    )
    assert (changed.max_batch_size, changed.slo_ms, changed.description) == (2, 75.0, "smaller")
    assert changed.inputs == config.inputs and changed.profile == config.profile
    refusals = {
        '{"dynamic_batching": {}}': "field 'dynamic_batching' is not supported",
        '{"backend": "onnx"}': "'backend' cannot change",
        '{"max_batch_size": 0}': "max_batch_size must be an integer from 1 to 65536, got 0",
        '{"slo_ms": -1}': "slo_ms must be a finite number > 0",
        '{"parameters": {"policy": {"string_value": "x"}}}': "parameter 'policy' is not supported",
        "[1]": "must be a JSON object",
        "{": "not valid JSON",
    }
    for text, words in refusals.items():
        with pytest.raises(InvalidInput, match=words.replace("(", r"\(")):
            apply_override(config, text)


# ------------------------------------------------------------------ a live service


def _outcome(reply: httpx.Response) -> str:
    if reply.status_code == 200:
        return "ok"
    return f"{reply.status_code} {reply.json()['reason']}"


@pytest.mark.slow
@pytest.mark.anyio
async def test_unload_and_load_under_load_lose_no_request(tmp_path: Path):
    # SLO 500 ms: Symphony holds a batch that is not full until its latest
    # start, so an unload waits at most that long for the requests accepted.
    repository = emulated_repository(tmp_path / "models", {"alpha": 1.0, "beta": 1.0}, 500)
    service = LiveService(live_settings(repository), Metrics())
    await service.start()
    try:
        app = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            stop = asyncio.Event()
            replies: dict[str, list[str]] = {"alpha": [], "beta": []}

            async def clients(model: str, n: int) -> None:
                async def one() -> None:
                    i = 0
                    while not stop.is_set():
                        reply = await client.post(f"/v2/models/{model}/infer", json=body(i))
                        replies[model].append(_outcome(reply))
                        i += 1
                        # a client refused backs off, as a real one would
                        await asyncio.sleep(0.002 if reply.status_code == 200 else 0.02)

                await asyncio.gather(*(one() for _ in range(n)))

            load = asyncio.gather(clients("alpha", 4), clients("beta", 2))
            await asyncio.sleep(0.3)
            before = len(replies["alpha"])
            segments = {s for s in segments_of(os.getpid()) if "alpha" in s}
            assert len(segments) == 1
            r = await client.post("/v2/repository/models/alpha/unload")
            assert r.status_code == 200, r.text
            # the executors let go of it and its arena is unlinked
            assert not {s for s in segments_of(os.getpid()) if "alpha" in s}
            assert "alpha" not in service.pool.configs  # type: ignore[union-attr]
            await asyncio.sleep(0.2)
            refused = await client.post("/v2/models/alpha/infer", json=body(1))
            index = (await client.post("/v2/repository/index")).json()
            stats = await client.get("/v2/models/alpha/stats")
            override = json.dumps({"max_batch_size": 2})
            r = await client.post(
                "/v2/repository/models/alpha/load", json={"parameters": {"config": override}}
            )
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.3)
            stop.set()
            await load
            config = (await client.get("/v2/models/alpha/config")).json()
            index_after = (await client.post("/v2/repository/index")).json()
            served = await client.post("/v2/models/alpha/infer", json=body(2))
    finally:
        await service.stop()

    assert refused.status_code == 503
    assert refused.json() == {"error": "model 'alpha' is unloaded", "reason": "unloaded"}
    assert {"name": "alpha", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index
    assert stats.status_code == 503
    assert config["max_batch_size"] == 2
    assert {e["name"]: e["state"] for e in index_after} == {"alpha": "READY", "beta": "READY"}
    assert served.status_code == 200 and served.json()["parameters"]["batch_size"] <= 2

    alpha, beta = Counter(replies["alpha"]), Counter(replies["beta"])
    # every request answered once, with outputs or an explicit error (a
    # deadline drop is one: the test box is shared, its event loop may lag)
    assert set(alpha) <= {"ok", "503 unloaded", "503 deadline"}, alpha
    assert set(beta) <= {"ok", "503 deadline"} and beta["ok"] > 0, beta
    assert alpha["503 unloaded"] > 0 and before > 0
    served_after = replies["alpha"][before:]
    assert "ok" in served_after[served_after.index("503 unloaded") :]  # served again
    assert service.outstanding("alpha") == service.outstanding("beta") == 0
    assert not service.dispatcher.pending  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.anyio
async def test_accepted_requests_past_the_grace_get_503_unloaded(tmp_path: Path):
    """A slow model (each batch 300 ms, batches of one) with requests queued
    behind it and a grace of 450 ms: the batches that run meanwhile are answered, the
    queued ones 503 unloaded — each exactly once."""
    root = tmp_path / "models"
    (root / "slow").mkdir(parents=True)
    (root / "slow" / "config.yaml").write_text(
        "backend: emulated\nmax_batch_size: 1\nslo_ms: 60000\n"
        "profile: {alpha_ms: 0.0, beta_ms: 300.0}\ndevices: [emulated]\n"
        "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
    )
    service = LiveService(live_settings(root, shutdown_grace_s=0.45), Metrics())
    await service.start()
    try:
        app = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            sent = [
                asyncio.create_task(client.post("/v2/models/slow/infer", json=body(i)))
                for i in range(6)
            ]
            while service.outstanding("slow") < 6:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # the first batch is running
            r = await client.post("/v2/repository/models/slow/unload")
            replies = await asyncio.gather(*sent)
            report = (await client.post("/v2/repository/index")).json()
    finally:
        await service.stop()
    assert r.status_code == 200, r.text
    outcomes = Counter(_outcome(reply) for reply in replies)
    assert outcomes["ok"] >= 1 and outcomes["503 unloaded"] >= 1, outcomes
    assert sum(outcomes.values()) == 6 and set(outcomes) == {"ok", "503 unloaded"}, outcomes
    unloaded = [reply.json()["error"] for reply in replies if reply.status_code == 503]
    assert all("unloaded" in text for text in unloaded), unloaded
    assert report == [
        {"name": "slow", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_model_added_to_the_repository_is_loaded_and_bad_loads_are_refused(tmp_path):
    repository = emulated_repository(tmp_path / "models", {"alpha": 1.0})
    service = LiveService(live_settings(repository), Metrics())
    await service.start()
    try:
        app = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            missing = await client.post("/v2/repository/models/gamma/load")
            emulated_repository(repository, {"gamma": 3.0})  # added while serving
            loaded = await client.post("/v2/repository/models/gamma/load")
            served = await client.post("/v2/models/gamma/infer", json=body(1))
            bad = await client.post(
                "/v2/repository/models/alpha/load",
                json={"parameters": {"config": '{"instance_group": []}'}},
            )
            still = await client.post("/v2/models/alpha/infer", json=body(1))
            stats = (await client.get("/v2/models/stats")).json()
    finally:
        await service.stop()
    assert missing.status_code == 404 and "not in the repository" in missing.json()["error"]
    assert loaded.status_code == 200, loaded.text
    assert served.status_code == 200, served.text
    assert bad.status_code == 400 and "'instance_group'" in bad.json()["error"]
    assert still.status_code == 200  # a refused override leaves the model as it was
    counts = {m["name"]: m["inference_stats"]["success"]["count"] for m in stats["model_stats"]}
    assert counts == {"alpha": 1, "gamma": 1}


# ------------------------------------------------------------ issue 42: a model never vanishes

ALPHA_256 = (
    "backend: emulated\nmax_batch_size: 256\nslo_ms: 5000\n"
    "profile: {alpha_ms: 1.0, beta_ms: 5.0}\ndevices: [emulated]\n"
    "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
    "outputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
)
BROKEN_ONNX = (
    "backend: onnx\nmodel_file: model.onnx\nmax_batch_size: 16\nslo_ms: 5000\n"
    "profile: {alpha_ms: 1.0, beta_ms: 1.0}\ndevices: [cpu]\n"
    "inputs: [{name: x, datatype: FP32, shape: [-1, 8]}]\n"
    "outputs: [{name: y, datatype: FP32, shape: [-1, 8]}]\n"
)


def _items(n: int, width: int = 4) -> dict:
    return {
        "inputs": [
            {"name": "x", "shape": [n, width], "datatype": "FP32", "data": [1.0] * n * width}
        ]
    }


@pytest.mark.slow
@pytest.mark.anyio
async def test_failed_loads_leave_the_model_serving_or_failed_with_its_reason(tmp_path: Path):
    """Issue 42, items 1–4, 8, 9: bad overrides are refused before anything
    changes; a reload sizes the arena as start-up does; a reload while the
    executor restarts waits for it; a model that failed at start-up (a
    truncated ONNX file) loads once fixed; no answer names a server path."""
    from app.server.settings import Settings
    from tests.fakes import mlp_onnx

    root = tmp_path / "models"
    (root / "alpha").mkdir(parents=True)
    (root / "alpha" / "config.yaml").write_text(ALPHA_256)
    (root / "broken").mkdir()
    (root / "broken" / "config.yaml").write_text(BROKEN_ONNX)
    (root / "broken" / "model.onnx").write_bytes(b"\x08\x07truncated")
    settings = Settings(
        repository=root,
        cpu_slices=1,
        emulated_devices=1,
        exit_on_error=False,
        arena_slots=64,
        respawn=True,
    )
    service = LiveService(settings, Metrics())
    await service.start()
    outcomes: dict[str, tuple[int, str]] = {}
    try:
        app = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

            async def load(model: str, override: str | None = None) -> httpx.Response:
                body = {"parameters": {"config": override}} if override is not None else None
                return await client.post(f"/v2/repository/models/{model}/load", json=body)

            async def index() -> dict[str, tuple[str, str]]:
                entries = (await client.post("/v2/repository/index")).json()
                return {e["name"]: (e["state"], e["reason"]) for e in entries}

            def record(what: str, reply: httpx.Response) -> None:
                outcomes[what] = (reply.status_code, reply.text)

            record("index at start", httpx.Response(200, json=await index()))
            record("load broken", await load("broken"))
            record("index after", httpx.Response(200, json=await index()))
            mlp_onnx(root / "broken" / "model.onnx", width=8)  # fixed
            record("load fixed", await load("broken"))
            record("infer fixed", await client.post("/v2/models/broken/infer", json=_items(2, 8)))

            record(
                "200 items before", await client.post("/v2/models/alpha/infer", json=_items(200))
            )
            record("plain reload", await load("alpha"))
            record("200 items after", await client.post("/v2/models/alpha/infer", json=_items(200)))
            for override in (
                '{"slo_ms": Infinity}',
                '{"max_batch_size": "100000000"}',
                '{"devices": ["tpu"]}',
            ):
                record(override, await load("alpha", override))
                record(
                    override + " infer", await client.post("/v2/models/alpha/infer", json=_items(1))
                )
            record("string mbs", await load("alpha", '{"max_batch_size": "16"}'))
            record("index alpha", httpx.Response(200, json=await index()))

            # A reload while alpha's executor restarts waits for it.
            device = service.models["alpha"].devices[0]
            os.kill(service.pool.pid(device), 9)  # type: ignore[union-attr,arg-type]
            while service.pool.alive(device):  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            record("reload during respawn", await load("alpha"))
            record("index after respawn", httpx.Response(200, json=await index()))
            record(
                "infer after respawn", await client.post("/v2/models/alpha/infer", json=_items(1))
            )
    finally:
        await service.stop()

    status = {what: code for what, (code, _) in outcomes.items()}
    text = {what: body for what, (_, body) in outcomes.items()}
    assert all(str(tmp_path) not in body for body in text.values()), text
    start = json.loads(text["index at start"])
    assert start["broken"][0] == "UNAVAILABLE" and "model.onnx" in start["broken"][1], start
    assert status["load broken"] == 400 and "load_failed" in text["load broken"], text
    after = json.loads(text["index after"])
    assert after["broken"][0] == "UNAVAILABLE" and after["broken"][1], after  # still listed
    assert status["load fixed"] == 200 and status["infer fixed"] == 200, text
    assert status["200 items before"] == status["plain reload"] == 200, text
    assert status["200 items after"] == 200, text["200 items after"]  # the arena kept 256 slots
    for override, field in (
        ('{"slo_ms": Infinity}', "slo_ms"),
        ('{"max_batch_size": "100000000"}', "max_batch_size"),
        ('{"devices": ["tpu"]}', "no device of this server can run it"),
    ):
        assert status[override] == 400 and field in text[override], text[override]
        assert status[override + " infer"] == 200, text[override + " infer"]  # still serving
    assert status["string mbs"] == 200
    assert json.loads(text["index alpha"])["alpha"] == ["READY", ""]
    assert status["reload during respawn"] == 200, text["reload during respawn"]
    assert json.loads(text["index after respawn"])["alpha"] == ["READY", ""]
    assert status["infer after respawn"] == 200


@pytest.mark.anyio
async def test_reshare_bodies_are_held_to_finite_shares_as_requests_are():
    """Issue 42, item 1: management bodies are input too."""
    service = FakeService()
    app = create_api(lambda: service, Metrics())
    bodies = {
        b'{"device": "emulated:0", "share": NaN}': 422,
        b'{"device": "emulated:0", "share": Infinity}': 422,
        b'{"device": "emulated:0", "share": 1e400}': 422,
        b'{"device": "emulated:0", "share": 0}': 422,
        b'{"device": "emulated:0", "share": 1.5}': 422,
        b'{"device": "emulated:0", "share": "0.5"}': 200,
        b'{"device": "emulated:0", "share": 0.25}': 200,
    }
    answers = {}
    for text in bodies:
        reply = await _post(
            app, "/v2/devices/reshare", content=text, headers={"Content-Type": "application/json"}
        )
        answers[text] = reply.status_code
        if reply.status_code != 200:
            assert "share" in reply.json()["error"], reply.text
    assert answers == bodies
    assert service.calls == [
        {"reshare": "emulated:0", "share": 0.5},
        {"reshare": "emulated:0", "share": 0.25},
    ]
