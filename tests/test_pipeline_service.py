"""The daemon serving a model as a PPipe pipeline (PPIPE_PLAN,
app/server/pipeline_service.py): the `chain` model profiled on two live
classes, planned by `python -m app plan ppipe`, served over HTTP beside an
ordinary model; answers equal to the uncut model's, readiness, model control
refused, an executor killed and respawned (DeviceDown, then DeviceUp back
into the core), and start-up errors that name what is missing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from app.planning.ppipe import cli as plan_cli
from app.planning.ppipe.profiles import load_profile
from app.repository import block_profile
from app.repository.device_class import DeviceClass
from app.repository.loader import load_repository
from app.server.metrics import Metrics
from app.server.pipeline_service import start_pipelines
from app.server.settings import Settings
from app.server.startup import StartupFailed
from app.server.statistics import Statistics
from bench.overload import MODEL as ORDINARY
from bench.overload import executor_pids, write_repository

CLASSES = "fast:1,slow:1:2"


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(repository, timings directory, plan file): `chain` cut into 10
    blocks and profiled on `fast` and `slow`, an ordinary emulated model
    beside it, and a plan of at most two partitions over 1 fast + 2 slow."""
    root = tmp_path_factory.mktemp("ppipe-serve")
    timings = root / "timings"
    argv = ["--chain", "--out", str(timings), "--max-batch", "2", "--repeats", "1"]
    for cls in CLASSES.split(","):
        argv += ["--class", cls]
    assert block_profile.main(argv) == 0
    even_timings(timings, "chain")
    repository = timings / "models"
    write_repository(repository)
    # Planned for a budget (the SLO less the 40 % margin) of 1.5 × the whole
    # model on `fast`: `slow` (twice as slow) cannot run it whole in time,
    # so the plan cuts it across both classes.
    # Served with the repository's SLO of 100 ms, for a busy test box.
    fast_ms = load_profile("chain", timings, ["fast"]).whole_latency(1, "fast") * 1e3
    slo_ms = round(1.5 * fast_ms / 0.6, 2)
    plan = plan_for(root, timings, {"fast": 1, "slow": 2}, slo_ms)
    assert json.loads(plan.read_text())["plan"]["details"]["timings"] == str(timings.resolve())
    return repository, timings, plan


def even_timings(timings: Path, model: str) -> None:
    """Replace the measured block times of `model` (one repeat on a busy
    box: noisy, and the plans made from them with it) by even ones: 0.8 ms
    a block at batch 1 and 1.2 ms at batch 2 on `fast`, twice that on
    `slow` (its emulated slowdown), so that every run plans alike."""
    for cls, factor in (("fast", 1.0), ("slow", 2.0)):
        path = timings / "block-timing" / f"{model}-{cls}-1.csv"
        blocks = len(path.read_text().splitlines())
        row = f"{800.0 * factor:.3f},{1200.0 * factor:.3f}\n"
        path.write_text(row * blocks)


def plan_for(
    root: Path,
    timings: Path,
    classes: dict[str, int],
    slo_ms: float,
    models: tuple[str, ...] = ("chain",),
) -> Path:
    """A PPipe plan of `models` (equal weights) over `classes` (count per
    class), written by `python -m app plan ppipe` under `root`."""
    stem = "-".join(f"{c}{n}" for c, n in classes.items())
    config = root / f"cluster-{stem}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "cluster": {"classes": classes, "bandwidth_gbps": 1e6},
                "timings": str(timings),
                "models": [{"name": m, "weight": 1.0, "slo_ms": slo_ms} for m in models],
                "planner": {"time_limit_s": 30},
            }
        )
    )
    plan = root / f"plan-{stem}.json"
    assert plan_cli.main(["ppipe", str(config), "--out", str(plan)]) == 0
    return plan


def infer(url: str, model: str, inputs: dict[str, np.ndarray]) -> httpx.Response:
    body = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}
            for n, a in inputs.items()
        ]
    }
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)


@pytest.mark.slow
def test_the_daemon_serves_the_plan_beside_an_ordinary_model(planned, launch_daemon):
    import onnxruntime as ort

    repository, _, plan = planned
    daemon = launch_daemon(
        repository,
        policy="symphony-wc",
        emulated_devices=1,
        cpu_slices=0,
        startup_timeout_s=180,
        extra_env={"PPIPE_PLAN": str(plan), "PPIPE_CLASSES": CLASSES},
    )
    url = daemon.url
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{url}/v2/models/chain/ready").status_code == 200
    index = httpx.post(f"{url}/v2/repository/index", json={}).json()
    assert {(m["name"], m["state"]) for m in index} == {("chain", "READY"), (ORDINARY, "READY")}
    whole = ort.InferenceSession(str(repository / "chain" / "model.onnx"))
    rng = np.random.default_rng(3)
    devices = set()
    for _ in range(8):
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        reply = infer(url, "chain", {"input": x})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        got = np.asarray(body["outputs"][0]["data"], np.float32).reshape(1, 10)
        (expected,) = whole.run(None, {"input": x})
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        devices.add(body["parameters"]["device"])
    # Each answer names the instance of each stage, in order.
    plan_body = json.loads(plan.read_text())["plan"]
    classes = [[s["device_class"] for s in p["stages"]] for p in plan_body["pipelines"]]
    # The plan cuts the model across both classes (see `planned`).
    assert any(sorted(c) == ["fast", "slow"] for c in classes)
    assert {tuple(d.split(":")[0] for d in path.split(">")) for path in devices} <= {
        tuple(c) for c in classes
    }
    # Triton's statistics count the pipeline's batches and requests.
    stats = httpx.get(f"{url}/v2/models/chain/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 8 and stats["execution_count"] >= 1
    assert (
        sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]
    )
    # The ordinary model is served by the dispatcher, as without a plan.
    reply = infer(url, ORDINARY, {"x": np.ones((1, 4), np.float32)})
    assert reply.status_code == 200, reply.text
    # Model control leaves the plan's models alone, with a reason.
    reply = httpx.post(f"{url}/v2/repository/models/chain/unload", json={})
    assert reply.status_code == 400 and "PPIPE_PLAN" in reply.text
    # An executor of the pipeline killed: it is respawned, its instance back
    # in the core's tables, and the model answers again.
    pid = daemon.process.pid
    pipeline_executors = {
        name: p for name, p in executor_pids(pid).items() if name.split(":")[0] in ("fast", "slow")
    }
    assert sorted(n.split(":")[0] for n in pipeline_executors) == ["fast", "slow", "slow"]
    (fast,) = (n for n in pipeline_executors if n.startswith("fast:"))
    os.kill(pipeline_executors[fast], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        again = executor_pids(pid).get(fast)
        ready = httpx.get(f"{url}/v2/models/chain/ready").status_code == 200
        if again not in (None, pipeline_executors[fast]) and ready:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the pipeline's fast executor did not come back")
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    reply = infer(url, "chain", {"input": x})
    assert reply.status_code == 200, reply.text
    got = np.asarray(reply.json()["outputs"][0]["data"], np.float32).reshape(2, 10)
    np.testing.assert_allclose(got, whole.run(None, {"input": x})[0], rtol=1e-4, atol=1e-5)
    # More items than the profile covers (--max-batch 2): refused, with why.
    x = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    reply = infer(url, "chain", {"input": x})
    assert reply.status_code == 400 and "batches of up to 2 items" in reply.text
    metrics = httpx.get(f"{url}/metrics").text
    assert f'deadline_serve_executor_failures_total{{device="{fast}"}} 1.0' in metrics


@pytest.mark.parametrize(
    "change,message",
    [
        ({"ppipe_classes": ()}, "its classes ['fast', 'slow'] are not live classes"),
        ({"ppipe_timings": Path("/nonexistent")}, "no block-timing/ and cut-bytes/"),
        ({"repository": "empty"}, "model 'chain': no such model in the repository"),
        ({"ppipe_plan": "no pipeline"}, "model 'chain': the plan gives it no pipeline"),
    ],
)
def test_a_plan_that_cannot_be_served_stops_start_up_naming_why(planned, tmp_path, change, message):
    repository, _, plan = planned
    if change.get("repository") == "empty":
        change = {"repository": tmp_path}
    if change.get("ppipe_plan") == "no pipeline":  # a plan that met no SLO
        body = json.loads(plan.read_text())
        plan = tmp_path / "empty-plan.json"
        plan.write_text(json.dumps({**body, "plan": {**body["plan"], "pipelines": []}}))
        change = {"ppipe_plan": plan}
    live_classes = tuple(DeviceClass.parse(c) for c in CLASSES.split(","))
    fields = {"repository": repository, "ppipe_plan": plan, "ppipe_classes": live_classes}
    settings = Settings(**{**fields, **change})
    index = load_repository(settings.repository)

    async def start() -> None:
        await start_pipelines(settings, index, Metrics(), Statistics())

    with pytest.raises(StartupFailed) as failed:
        asyncio.run(start())
    assert str(failed.value).startswith(f"PPIPE_PLAN {plan}: ")
    assert message in str(failed.value)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_a_ppipe_plan_posted_under_load_takes_over_and_every_request_is_answered_once(
    planned, tmp_path
):
    """The server serves the plan over 1 fast + 2 slow instances; a plan
    over two fast instances only is posted while clients send requests:
    every request gets one answer, equal to the uncut model's; those sent
    after the switch run on the new plan's instances; the old pipelines'
    executors are gone. A plan that pipelines another set of models is a
    501 and changes nothing."""
    import onnxruntime as ort

    from app.api import create_api
    from app.server.live import LiveService

    repository, timings, plan = planned
    slo_ms = json.loads(plan.read_text())["plan"]["models"][0]["slo_s"] * 1e3
    fast_only = plan_for(tmp_path, timings, {"fast": 2}, slo_ms)
    settings = Settings.from_env(
        {"MODEL_REPOSITORY": str(repository), "PLAN": str(plan), "PPIPE_CLASSES": CLASSES,
         "CPU_SLICES": "0", "EMULATED_DEVICES": "1", "RESPAWN": "0"}
    )  # fmt: skip
    whole = ort.InferenceSession(str(repository / "chain" / "model.onnx"))
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    expected = [whole.run(None, {"input": x})[0] for x in inputs]

    async def scenario():
        service = LiveService(settings, Metrics())
        await service.start()
        answers: list[tuple[float, int, object]] = []
        try:
            api = create_api(lambda: service, Metrics())
            transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                old_devices = (await client.get("/v2/devices")).json()["devices"]

                async def load(n: int) -> None:
                    for i in range(n):
                        try:
                            result = await service.infer("chain", {"input": inputs[i % 4]})
                            answers.append((time.monotonic(), i % 4, result))
                        except Exception as exc:  # counted: one answer each
                            answers.append((time.monotonic(), i % 4, exc))
                        await asyncio.sleep(0.01)

                clients = [asyncio.ensure_future(load(40)) for _ in range(3)]
                await asyncio.sleep(0.3)
                reply = await client.post("/v2/plan", content=fast_only.read_bytes())
                switched_at = time.monotonic()
                await asyncio.gather(*clients)
                new_devices = (await client.get("/v2/devices")).json()["devices"]
                empty = json.loads(fast_only.read_text())
                empty["plan"]["models"] = []
                refused = [await client.post("/v2/plan", content=json.dumps(empty).encode())]
                unknown = json.loads(plan.read_text())
                for pipeline in unknown["plan"]["pipelines"]:
                    for stage in pipeline["stages"]:
                        stage["device_class"] = "medium"
                refused.append(await client.post("/v2/plan", content=json.dumps(unknown).encode()))
                in_force = (await client.get("/v2/plan")).json()
                served = await service.infer("chain", {"input": inputs[0]})
            return reply, switched_at, answers, old_devices, new_devices, refused, in_force, served
        finally:
            await service.stop()

    reply, switched_at, answers, old_devices, new_devices, refused, in_force, served = asyncio.run(
        scenario()
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["kind"] == "ppipe-plan" and body["models"] == ["chain"]
    assert body["old_failed"] == 0 and body["old_drained_s"] < 5
    assert {d for p in body["pipelines"] for s in p["stages"] for d in s["devices"]} <= {
        "fast:0",
        "fast:1",
    }
    assert len(answers) == 120
    failures = [a for _, _, a in answers if isinstance(a, Exception)]
    assert failures == []
    for _, i, result in answers:
        got = np.asarray(result.outputs["output"], np.float32).reshape(1, 10)
        np.testing.assert_allclose(got, expected[i], rtol=1e-4, atol=1e-5)
    after = [result.device for at, _, result in answers if at > switched_at + 0.05]
    assert after and all(part.split(":")[0] == "fast" for path in after for part in path.split(">"))
    classes = lambda devices: sorted(  # noqa: E731
        d["class"] for d in devices if d["name"].split(":")[0] in ("fast", "slow")
    )
    assert classes(old_devices) == ["fast", "slow", "slow"]
    assert classes(new_devices) == ["fast", "fast"]
    # the answers after the switch ran on every instance of the new plan
    assert {part for path in after for part in path.split(">")} == {"fast:0", "fast:1"}
    other_models, unknown_class = refused
    assert other_models.status_code == 501, other_models.text
    assert "a model moves between a pipeline and the dispatcher's cores" in other_models.text
    assert unknown_class.status_code == 409, unknown_class.text
    assert "its classes ['medium'] are not live classes" in unknown_class.text
    # the refused plans changed nothing: the posted one serves on
    assert in_force["setting"] == "POST /v2/plan" and in_force["kind"] == "ppipe-plan"
    assert in_force["plan"] == json.loads(fast_only.read_text())["plan"]
    assert served.device.split(":")[0] == "fast"


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> tuple[Path, Path, float]:
    """(repository, plan, SLO ms): `chain` and a copy of it, `twin`, each
    profiled on `fast` and `slow`, planned with equal weights over 1 fast +
    2 slow executors."""
    root = tmp_path_factory.mktemp("ppipe-twins")
    timings = root / "timings"
    classes = [arg for cls in CLASSES.split(",") for arg in ("--class", cls)]
    common = ["--out", str(timings), "--max-batch", "2", "--repeats", "1", *classes]
    assert block_profile.main(["--chain", *common]) == 0
    repository = timings / "models"
    chain = repository / "chain" / "model.onnx"
    assert block_profile.main([str(chain), "--name", "twin", *common]) == 0
    for name in ("chain", "twin"):
        even_timings(timings, name)
    (repository / "twin").mkdir()
    for name in ("model.onnx", "config.yaml"):
        (repository / "twin" / name).write_bytes((repository / "chain" / name).read_bytes())
    # A budget (the SLO less the 40 % margin) of 4 × the whole model on
    # `fast`: a slow executor runs it whole too, so both models get pipelines.
    fast_ms = load_profile("chain", timings, ["fast"]).whole_latency(1, "fast") * 1e3
    slo_ms = round(4 * fast_ms / 0.6, 2)
    plan = plan_for(root, timings, {"fast": 1, "slow": 2}, slo_ms, ("chain", "twin"))
    return repository, plan, slo_ms


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("no_leftover_segments")
async def test_ppipe_pipelines_are_made_again_for_the_measured_rates_and_taken_up(twins):
    """chain and twin planned for equal weights; then chain gets 100 r/s and
    twin none: the MILP for those rates carries more times the load, so the
    re-plan is taken up while serving (new pipelines, one instant); the same
    rates again keep it. Both models answer as the uncut model does."""
    import onnxruntime as ort

    from app.server.live import LiveService
    from app.server.ppipe_replanning import IDLE_RATE, load_factor, ppipe_replan

    repository, plan, _ = twins
    settings = Settings.from_env(
        {"MODEL_REPOSITORY": str(repository), "PLAN": str(plan), "PPIPE_CLASSES": CLASSES,
         "CPU_SLICES": "0", "EMULATED_DEVICES": "1", "RESPAWN": "0"}
    )  # fmt: skip
    service = LiveService(settings, Metrics())
    await service.start()
    try:
        replanner = service.replanner(1.0, 0.2)
        rates = {"chain": 100.0, "twin": 0.0}
        found = ppipe_replan(plan, [], [], rates, {})
        assert found.rates == {"chain": 100.0, "twin": IDLE_RATE}
        assert found.found >= 1.2 * found.kept, (found.kept, found.found)
        assert found.found == pytest.approx(load_factor(found.plan, found.rates))
        switched = await replanner.replan(rates)
        assert switched is not None and switched["kind"] == "ppipe-plan"
        assert switched["old_failed"] == 0
        in_force = service.plan_in_force()
        assert in_force is not None and in_force["setting"] == "POST /v2/plan"
        assert in_force["made_from"]["command"] == "REPLAN_S=1 REPLAN_GAIN=0.2"
        assert await replanner.replan(rates) is None  # made for these rates: kept
        assert replanner.taken_up == 1
        whole = ort.InferenceSession(str(repository / "chain" / "model.onnx"))
        x = np.random.default_rng(9).standard_normal((1, 3, 32, 32)).astype(np.float32)
        (expected,) = whole.run(None, {"input": x})
        for model in ("chain", "twin"):
            answer = await service.infer(model, {"input": x})
            got = np.asarray(answer.outputs["output"], np.float32).reshape(1, 10)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    finally:
        await service.stop()
