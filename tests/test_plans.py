"""One plan format for every planner and `PLAN=FILE`: each planner's plan
file → PLAN= → what the daemon runs (devices, shares, per-model devices,
batch sizes, groups, pipelines), in-process; a plan that does not fit
refused naming every mismatch; the daemon serving an InSS plan."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.planning.cli import main as plan_main
from app.planning.herd.plan import read_plan as read_herd
from app.planning.inss.plan import read_plan as read_inss
from app.planning.partition.plan import read_plan as read_partition
from app.planning.plan_files import FORMAT_VERSION, read_plan_file
from app.planning.ppipe.plan import Cluster, ModelTarget, Pipeline, Stage
from app.planning.ppipe.plan import Plan as PPipePlan
from app.planning.ppipe.plan import write_plan as write_ppipe
from app.repository.loader import load_repository
from app.server.core_groups import apply_core_groups
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.plan_checks import prepare_plan
from app.server.plans import PlanMismatch, load_plan, place_inss, whole_devices
from app.server.settings import Settings
from app.server.startup import (
    StartupFailed,
    device_layout,
    per_model_options,
    unserved_options,
)
from tests.fakes import inss_plan
from tests.test_core_groups import partition_plan
from tests.test_statistics import emulated_repository

ROOT = Path(__file__).resolve().parent.parent
HERD_EXAMPLE = ROOT / "bench" / "workloads" / "herd" / "example.yaml"
HERD_REPOSITORY = ROOT / "bench" / "repositories" / "herd-example"
INSS_BUNDLED = ROOT / "bench" / "workloads" / "inss" / "bundled.yaml"


def run_planner(*argv: str) -> None:
    from app.cluster_sources import read_cluster

    out, err = io.StringIO(), io.StringIO()
    assert plan_main(list(argv), out, err, cluster_reader=read_cluster) == 0, err.getvalue()


def served(env: dict[str, str], repository: Path):
    """Settings from the environment, the repository read, and the plan
    checked and applied to the settings, as the daemon's start-up does."""
    settings = Settings.from_env({"MODEL_REPOSITORY": str(repository), **env})
    index = load_repository(settings.repository)
    resolved, plan = prepare_plan(settings, index)
    return settings, resolved, plan, index


# ------------------------------------------------------------------ files


def test_every_planner_writes_the_envelope_and_version_1_files_still_read(tmp_path: Path) -> None:
    herd, inss = tmp_path / "herd.json", tmp_path / "inss.json"
    run_planner("herd", str(HERD_EXAMPLE), "--time-limit", "10", "--out", str(herd))
    run_planner("inss", str(INSS_BUNDLED), "--out", str(inss))
    for path, planner, rates in (
        (herd, "herd", {"ResNet50": 400.0, "VGG16": 150.0, "BERT": 120.0}),
        (inss, "inss", {"resnet50-emulated": 100.0, "bert-emulated": 25.0}),
    ):
        file = read_plan_file(path)
        assert file.version == FORMAT_VERSION and file.planner == planner
        made = file.made_from
        assert made is not None and made.inputs[0].endswith(".yaml")
        assert made.command.startswith(f"python -m app plan {planner} ")
        assert rates.items() <= made.rates.items() and made.made_at.endswith("Z")
    # The same plan as a version-1 file (kind and version beside its fields).
    doc = json.loads(inss.read_text())
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"kind": "inss-plan", "version": 1, **doc["plan"]}))
    assert read_inss(legacy) == read_inss(inss)
    assert read_plan_file(legacy).made_from is None
    doc["version"] = 7
    (tmp_path / "future.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="plan version 7, this build reads 1 and 2"):
        read_plan_file(tmp_path / "future.json")


# ------------------------------------------------------------------ PLAN → what the daemon runs


def test_an_inss_plan_sets_shares_placement_and_batch_sizes(tmp_path: Path) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 1.0, "d": 1.0})
    path = inss_plan(
        tmp_path / "plan.json",
        {"a": ("emulated:0", 1.0, 4), "b": ("emulated:1", 0.7, 2), "c": ("emulated:1", 0.3, 8)},
    )
    env = {"PLAN": str(path), "CPU_SLICES": "0", "EMULATED_DEVICES": "3"}
    settings, resolved, plan, index = served(env, repository)
    # The kind's policy, POLICY not given: symphony forms each share's batches.
    assert settings.policy == "symphony" and resolved.policy_options == {}
    # Under POLICY=inss (InSS's FIFO batching) the plan's batch sizes are its `batch`.
    settings, resolved, plan, index = served(env | {"POLICY": "inss"}, repository)
    assert plan is not None and plan.file.kind == "inss-plan"
    assert resolved.device_shares == {"emulated:1": (0.7, 0.3)}
    assert resolved.policy_options == {"batch": {"a": 4, "b": 2, "c": 8}}
    configs = place_inss(plan, index.models, whole_devices(resolved), resolved.policy)
    # d is not in the plan: it runs on the device the plan leaves free.
    assert {n: c.devices for n, c in configs.items()} == {
        "a": ("emulated:0",),
        "b": ("emulated:1/0",),
        "c": ("emulated:1/1",),
        "d": ("emulated:2",),
    }
    devices = device_layout(resolved, configs.values())
    assert [(d.name, d.share) for d in devices] == [
        ("emulated:0", 1.0),
        ("emulated:1/0", 0.7),
        ("emulated:1/1", 0.3),
        ("emulated:2", 1.0),
    ]
    # Under triton the batches are its max_batch; POLICY_OPTIONS wins over the plan.
    env |= {"POLICY": "triton", "POLICY_OPTIONS": '{"max_batch": 3}'}
    assert served(env, repository)[1].policy_options == {"max_batch": 3}
    del env["POLICY_OPTIONS"]
    assert served(env, repository)[1].policy_options == {"max_batch": {"a": 4, "b": 2, "c": 8}}


def test_an_inss_plans_time_shared_device_is_not_split(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Models the planner runs in turn on a whole device (each at share 1.0)
    share that device's one executor, as time-sharing does."""
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 1.0})
    path = inss_plan(
        tmp_path / "plan.json",
        {"a": ("emulated:0", 1.0, 4), "b": ("emulated:0", 1.0, 2), "c": ("emulated:1", 1.0, 8)},
    )
    env = {"PLAN": str(path), "CPU_SLICES": "0", "EMULATED_DEVICES": "2", "POLICY": "inss"}
    _, resolved, plan, index = served(env, repository)
    assert resolved.device_shares is None
    assert resolved.policy_options == {"batch": {"a": 4, "b": 2, "c": 8}}
    configs = place_inss(plan, index.models, whole_devices(resolved), resolved.policy)
    assert {n: c.devices for n, c in configs.items()} == {
        "a": ("emulated:0",),
        "b": ("emulated:0",),
        "c": ("emulated:1",),
    }
    assert {n: c.max_batch_size for n, c in configs.items()} == {"a": 8, "b": 8, "c": 8}
    # Under symphony (the plan's default) the time-shared models' batches are
    # capped at the plan's: the duty cycle the planner checked; c is alone.
    with caplog.at_level("INFO", logger="app.server"):
        _, resolved, plan, index = served(env | {"POLICY": "symphony"}, repository)
        configs = place_inss(plan, index.models, whole_devices(resolved), resolved.policy)
    assert {n: c.max_batch_size for n, c in configs.items()} == {"a": 4, "b": 2, "c": 8}
    assert (
        "the plan's batch sizes (a 4, b 2, c 8) apply under POLICY=inss or triton; policy "
        "symphony forms batches by its own rule, up to the plan's for the time-shared a, b"
    ) in caplog.messages
    assert "plan: model a on emulated:0, batch ≤ 4 (time-shared)" in caplog.messages
    assert "plan: model c on emulated:1, batches by symphony" in caplog.messages


def test_under_another_policy_an_inss_plans_batches_are_said_not_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 1.0})
    path = inss_plan(tmp_path / "plan.json", {"a": ("emulated:0", 1.0, 4)})
    env = {"PLAN": str(path), "CPU_SLICES": "0", "EMULATED_DEVICES": "2"}
    # symphony, the plan's own policy: said at INFO; another (clockwork): a warning.
    for policy, level in (("symphony", "INFO"), ("clockwork", "WARNING")):
        caplog.clear()
        given = env if policy == "symphony" else env | {"POLICY": policy}
        with caplog.at_level("INFO", logger="app.server"):
            _, resolved, plan, _ = served(given, repository)
        assert resolved.policy == policy and resolved.policy_options == {}
        assert resolved.device_shares is None  # one model on a whole device: no split
        assert plan is not None and plan.inss is not None
        assert plan.inss.device_of == {"a": "emulated:0"}
        assert f"serving PLAN={path} (an InSS plan)" in caplog.messages
        said = [r for r in caplog.records if "the plan's batch sizes" in r.getMessage()]
        assert [(r.levelname, r.getMessage()) for r in said] == [
            (
                level,
                f"the plan's batch sizes (a 4) apply under POLICY=inss or triton; policy {policy} "
                "forms batches by its own rule",
            )
        ]


def test_a_plans_batch_sizes_reach_each_core_for_its_own_models(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"batch": {"a": 4, "b": 2, "gone": 8}, "bda_every_s": 2.0}
    assert per_model_options(options, ["a"]) == {"batch": {"a": 4}, "bda_every_s": 2.0}
    assert per_model_options(options, ["b", "c"]) == {"batch": {"b": 2}, "bda_every_s": 2.0}
    with caplog.at_level("WARNING", logger="app.server"):
        unserved_options(options, ["a", "b", "c"])
    assert caplog.messages == ["policy option 'batch' names models not served, left out: gone"]


def test_the_bundled_inss_example_plans_for_the_documented_server(tmp_path: Path) -> None:
    path = tmp_path / "inss.json"
    run_planner("inss", str(INSS_BUNDLED), "--out", str(path))
    repository = emulated_repository(
        tmp_path / "models",
        {f"{m}-emulated": 1.0 for m in ("resnet50", "densenet121", "bert", "efficientnetb3")},
    )
    env = {"PLAN": str(path), "CPU_SLICES": "0", "EMULATED_DEVICES": "3", "POLICY": "inss"}
    _, resolved, plan, _ = served(env, repository)
    planned = read_inss(path)
    assert plan is not None and plan.inss is not None
    assert plan.inss.batch == {m.model: m.batch for m in planned.models}
    assert resolved.policy_options == {"batch": plan.inss.batch}
    split = [d for d in planned.devices if any(planned.model(m).share < 1.0 for m in d.models)]
    assert resolved.device_shares == (
        {d.device: tuple(planned.model(m).share for m in d.models) for d in split} or None
    )
    # The others run their models on the whole device: alone, or time-shared in turn.
    whole = {d.device for d in planned.devices} - {d.device for d in split}
    assert {plan.inss.device_of[m] for d in planned.devices if d.device in whole
            for m in d.models} <= whole  # fmt: skip


def test_a_herd_plan_by_plan_forms_its_groups_with_flex(tmp_path: Path) -> None:
    """README's HERD example: the documented plan on the documented server
    (bench/repositories/herd-example on 8 emulated devices)."""
    path = tmp_path / "herd.json"
    run_planner("herd", str(HERD_EXAMPLE), "--time-limit", "10", "--out", str(path))
    env = {"PLAN": str(path), "CPU_SLICES": "0", "EMULATED_DEVICES": "8"}
    settings, resolved, _, index = served(env, HERD_REPOSITORY)
    assert settings.policy == "flex" and resolved.core_groups == path
    devices = device_layout(resolved, index.models.values())
    placed = apply_core_groups(path, index.models, devices)
    for group in read_herd(path).groups:
        names = tuple(f"emulated:{i}" for i in group.devices)
        assert all(placed[m].devices == names for m in group.models)


def test_a_herd_plan_of_the_repository_on_the_servers_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned from the repository (`--repository`) on the default server's
    devices: the group on the emulated devices, the server's 1 and 2; a
    model the plan leaves out runs on the device no group names."""
    for name in ("CPU_SLICES", "EMULATED_DEVICES", "DEVICE_SHARES", "RAY_ADDRESS", "RAY_NODES"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "herd.json"
    live = ROOT / "bench" / "repositories" / "live"
    cluster = ROOT / "bench" / "workloads" / "cluster" / "live.yaml"
    run_planner("herd", str(cluster), "--repository", str(live), "--out", str(path))
    made = read_plan_file(path).made_from
    assert made is not None and made.inputs == (str(cluster), str(live))
    repository = tmp_path / "models"
    repository.mkdir()
    for model in live.iterdir():
        (repository / model.name).symlink_to(model)
    emulated_repository(repository, {"extra": 1.0})  # in no group
    env = {"PLAN": str(path), "CPU_SLICES": "1", "EMULATED_DEVICES": "3"}
    _, resolved, _, index = served(env, repository)
    placed = apply_core_groups(path, index.models, device_layout(resolved))
    planned = read_herd(path).groups
    assert [g.devices for g in planned if g.models] == [(1, 2)]
    assert {n: c.devices for n, c in placed.items()} == {
        **{m: ("emulated:0", "emulated:1") for m in planned[0].models},
        "extra": ("emulated:2",),
    }


def test_a_partition_plan_of_the_repository_is_dealt_the_devices_its_models_run_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned from the repository, served on the default server's devices:
    the two sub-clusters get an emulated device each, not cpu:0."""
    for name in ("CPU_SLICES", "EMULATED_DEVICES", "DEVICE_SHARES", "RAY_ADDRESS", "RAY_NODES"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "partition.json"
    live = ROOT / "bench" / "repositories" / "live"
    cluster = ROOT / "bench" / "workloads" / "cluster" / "live.yaml"
    run_planner("partition", str(cluster), "--repository", str(live), "--out", str(path))
    env = {"PLAN": str(path), "CPU_SLICES": "1", "EMULATED_DEVICES": "2"}
    _, resolved, _, index = served(env, live)
    placed = apply_core_groups(path, index.models, device_layout(resolved))
    clusters = [c.models for c in read_partition(path).sub_clusters if c.models]
    assert len(clusters) == 2
    for k, models in enumerate(clusters):
        assert all(placed[m].devices == (f"emulated:{k}",) for m in models), placed


def test_a_partition_and_a_ppipe_plan_by_plan(tmp_path: Path) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 1.0})
    path = partition_plan(tmp_path / "p.json", [("a",), ("b", "c")])
    env = {"PLAN": str(path), "CPU_SLICES": "0", "EMULATED_DEVICES": "4"}
    settings, resolved, _, index = served(env, repository)
    assert settings.policy == "symphony" and resolved.core_groups == path
    placed = apply_core_groups(path, index.models, device_layout(resolved))
    assert {n: c.devices for n, c in placed.items()} == {
        "a": ("emulated:0", "emulated:1"),
        "b": ("emulated:2", "emulated:3"),
        "c": ("emulated:2", "emulated:3"),
    }
    ppipe = tmp_path / "ppipe.json"
    stage = Stage(0, 4, "fast", 1, 1, 0.01)
    write_ppipe(
        PPipePlan(Cluster({"fast": 1}, 10.0), (ModelTarget("chain", 1.0, 0.1, 90.0),),
                  (Pipeline("chain", 1, (stage,), 90.0),)),
        ppipe,
    )  # fmt: skip
    ppipe_repository = emulated_repository(tmp_path / "ppipe-models", {"chain": 1.0})
    _, resolved, plan, _ = served({"PLAN": str(ppipe)}, ppipe_repository)
    assert resolved.ppipe_plan == ppipe and resolved.core_groups is None
    assert plan is not None and plan.file.planner == "ppipe"


# ------------------------------------------------------------------ GET /v2/plan


@pytest.mark.anyio
async def test_get_plan_shows_the_plan_in_force(client, service, tmp_path: Path) -> None:
    assert (await client.get("/v2/plan")).json() == {"in_force": False}
    path = tmp_path / "inss.json"
    run_planner("inss", str(INSS_BUNDLED), "--out", str(path))
    plan = load_plan(Settings(plan=path))
    assert plan is not None
    service.plan_in_force = lambda: {**plan.describe(), "loaded_at": "2026-11-28T20:00:00Z"}
    reply = await client.get("/v2/plan")
    assert reply.status_code == 200
    body = reply.json()
    doc = json.loads(path.read_text())
    assert body == {
        "in_force": True,
        "setting": "PLAN",
        "path": str(path),
        "kind": "inss-plan",
        "version": 2,
        "planner": "inss",
        "made_from": doc["made_from"],
        "loaded_at": "2026-11-28T20:00:00Z",
        "plan": doc["plan"],
    }
    assert body["made_from"]["rates"]["resnet50-emulated"] == 100.0


# ------------------------------------------------------------------ refusals


def test_a_plan_that_does_not_fit_is_refused_naming_every_mismatch(tmp_path: Path) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 1.0, "c": 1.0})
    path = inss_plan(
        tmp_path / "plan.json",
        {
            "a": ("emulated:0", 0.5, 40),  # over a's max_batch_size 8
            "zzz": ("emulated:0", 0.5, 2),  # no such model
            "b": ("gpu0", 1.0, 2),  # no such device
        },
    )
    env = {"PLAN": str(path), "CPU_SLICES": "1", "EMULATED_DEVICES": "1"}
    with pytest.raises(PlanMismatch) as error:
        served(env, repository)
    message = str(error.value)
    assert message.splitlines()[0] == (
        f"PLAN={path} (an InSS plan) does not fit this server: 4 mismatches"
    )
    for line in (
        f"  - model 'zzz' is not in the repository {repository}",
        "  - device 'gpu0' is not a device of this server",
        "  - model 'a': the plan batches 40, above its max_batch_size 8",
        "  - model 'c' of the repository is not in the plan, and no device the plan leaves "
        "free (cpu:0) runs it",
        "  this server: models a, b, c; devices cpu:0, emulated:0",
        f"  make a plan for it: `python -m app plan inss CLUSTER.yaml --repository {repository} "
        "--out FILE` with this server's settings in the environment (CLUSTER.yaml gives the "
        "rates: docs/architecture.md#planning), or `python -m app plan inss --from URL --out "
        "FILE` against it serving",
    ):
        assert line in message.splitlines(), message


def test_readmes_herd_plan_on_the_default_server_names_every_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "herd.json"
    run_planner("herd", str(HERD_EXAMPLE), "--time-limit", "10", "--out", str(path))
    repository = emulated_repository(tmp_path / "models", {"mlp": 1.0, "ResNet50": 1.0})
    with pytest.raises(PlanMismatch) as error:
        served({"PLAN": str(path), "CPU_SLICES": "1", "EMULATED_DEVICES": "2"}, repository)
    lines = str(error.value).splitlines()
    missing = {"VGG16", "VGG19", "MobileNet", "DenseNet121", "BERT"}
    assert {f"  - model {m!r} is not in the repository {repository}" for m in missing} <= set(lines)
    assert "  - model 'mlp' of the repository is in no group, and no device the plan leaves " \
        "free (none) runs it" in lines  # fmt: skip
    assert any(
        line.startswith("  - the groups name devices [3, 4, 5, 6, 7], but this server has 3 (0 … "
                        "2: cpu:0, emulated:0, emulated:1)") for line in lines
    )  # fmt: skip
    assert "made by `python -m app plan herd " in lines[0]
    assert f"`python -m app plan herd CLUSTER.yaml --repository {repository} " in lines[-1]


def test_a_plan_of_the_wrong_kind_or_beside_device_shares_is_refused(tmp_path: Path) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0})
    path = inss_plan(tmp_path / "plan.json", {"a": ("emulated:0", 0.5, 2)})
    with pytest.raises(StartupFailed, match="CORE_GROUPS takes a HERD plan or a Symphony "):
        served({"CORE_GROUPS": str(path)}, repository)
    with pytest.raises(StartupFailed, match="DEVICE_SHARES is set too"):
        served({"PLAN": str(path), "DEVICE_SHARES": "emulated=0.5,0.5"}, repository)
    with pytest.raises(ValueError, match=r"PLAN: .*no such file"):
        Settings.from_env({"PLAN": str(tmp_path / "none.json")})


@pytest.mark.slow
def test_serve_refuses_a_plan_that_does_not_fit_with_exit_3_and_no_traceback(
    tmp_path: Path,
) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0})
    path = inss_plan(
        tmp_path / "plan.json", {"a": ("emulated:5", 0.5, 2), "zzz": ("emulated:0", 0.5, 2)}
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MODEL_REPOSITORY": str(repository),
           "PLAN": str(path), "CPU_SLICES": "0", "PORT": "0", "GRPC_PORT": "0",
           "METRICS_PORT": "0"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "app", "serve"], env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output
    assert "Traceback" not in output and "start-up failed:" not in output
    assert "does not fit this server: 2 mismatches" in output
    assert "device 'emulated:5' is not a device of this server" in output
    assert f"model 'zzz' is not in the repository {repository}" in output


# ------------------------------------------------------------------ live


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_the_daemon_serves_an_inss_plan_on_its_shares_at_its_batch_sizes(tmp_path: Path) -> None:
    """Under POLICY=inss: a alone on emulated:0 at batch 4; b and c on 0.5 shares of emulated:1
    at batches 1 and 2: each answer's device and batch are the plan's, and
    its time is ℓ(b) / share (ℓ(b) = α·b + 20 ms)."""
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 4.0})
    path = inss_plan(
        tmp_path / "plan.json",
        {"a": ("emulated:0", 1.0, 4), "b": ("emulated:1", 0.5, 1), "c": ("emulated:1", 0.5, 2)},
    )
    settings = Settings.from_env(
        {"MODEL_REPOSITORY": str(repository), "PLAN": str(path), "CPU_SLICES": "0",
         "EMULATED_DEVICES": "2", "RESPAWN": "0", "COLOCATION_PROFILE": "0",
         "POLICY": "inss", "POLICY_OPTIONS": '{"catch_up": false}'}
    )  # fmt: skip

    async def scenario():
        service = LiveService(settings, Metrics())
        await service.start()
        try:
            x = np.ones((1, 4), dtype=np.float32)
            calls = [service.infer(m, {"x": x}) for m in ("a", "b", "c") for _ in range(8)]
            answers = await asyncio.gather(*calls)
            return answers, service.plan_in_force(), service.metrics.render()[0].decode()
        finally:
            await service.stop()

    answers, in_force, exposed = asyncio.run(scenario())
    assert in_force is not None and in_force["kind"] == "inss-plan"
    # The plan in force as the dashboard reads it.
    assert 'deadline_serve_plan_info{kind="inss-plan",version="2"} 1.0' in exposed
    assert in_force["setting"] == "PLAN" and in_force["path"] == str(path)
    by_model = {m: answers[8 * i : 8 * i + 8] for i, m in enumerate(("a", "b", "c"))}
    assert {r.device for r in by_model["a"]} == {"emulated:0"}
    assert {r.device for r in by_model["b"]} == {"emulated:1/0"}
    assert {r.device for r in by_model["c"]} == {"emulated:1/1"}
    for model, batch, alpha, share in (("a", 4, 1.0, 1.0), ("b", 1, 2.0, 0.5), ("c", 2, 4.0, 0.5)):
        sizes = [r.batch_size for r in by_model[model]]
        assert max(sizes) == batch, (model, sizes)
        full = [r for r in by_model[model] if r.batch_size == batch]
        expected_ms = (alpha * batch + 20.0) / share
        assert all(expected_ms * 0.95 <= r.exec_ms <= expected_ms * 1.5 for r in full), (
            model,
            [r.exec_ms for r in full],
        )
