"""The planners read one cluster (app/planning/cluster.py): the repository's
models on the server's devices (`--repository DIR`, the daemon's settings
from the environment) or a serving daemon's (`--from URL`), with one
cluster file over them; the plans name the repository's models."""

from __future__ import annotations

import io
import json
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.api import create_api
from app.cluster_sources import read_cluster
from app.cluster_sources.daemon import cluster_from_daemon
from app.cluster_sources.repository import cluster_from_repository
from app.planning.cli import main as plan_main
from app.planning.cluster_file import apply_cluster_file
from app.planning.config_input import InputError
from app.repository import BUNDLED_REPOSITORY
from app.server.metrics import Metrics
from tests.fakes import FakeService, SyncASGITransport

EMULATED = ["bert-emulated", "densenet121-emulated", "efficientnetb3-emulated", "resnet50-emulated"]
RATES = {
    "resnet50-emulated": 300,
    "bert-emulated": 100,
    "densenet121-emulated": 200,
    "efficientnetb3-emulated": 100,
}
# The daemon's device settings: cpu:0, then emulated:0 and emulated:1.
DEVICES = {"CPU_SLICES": "1", "EMULATED_DEVICES": "2"}


@pytest.fixture
def repository(tmp_path, monkeypatch) -> Path:
    """The bundled repository's emulated models, on the devices above."""
    root = tmp_path / "models"
    for name in EMULATED:
        shutil.copytree(BUNDLED_REPOSITORY / name, root / name)
    for key in ("DEVICE_SHARES", "RAY_ADDRESS", "RAY_NODES", "MODEL_REPOSITORY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in DEVICES.items():
        monkeypatch.setenv(key, value)
    return root


def cluster_file(tmp_path: Path, **sections) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps({"rates": RATES, **sections}))  # JSON is YAML
    return path


def plan(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = plan_main(argv, out, err, cluster_reader=read_cluster)
    return code, out.getvalue(), err.getvalue()


def test_the_repository_cluster_has_the_servers_devices_and_the_models_profiles(repository):
    cluster = cluster_from_repository(repository, dict(DEVICES))
    assert [(d.name, d.kind) for d in cluster.devices] == [
        ("cpu:0", "cpu"),
        ("emulated:0", "emulated"),
        ("emulated:1", "emulated"),
    ]
    by_name = {m.name: m for m in cluster.models}
    assert sorted(by_name) == EMULATED
    resnet = by_name["resnet50-emulated"]
    assert (resnet.slo_s, resnet.max_batch, resnet.devices) == (0.027, 32, ("emulated",))
    assert list(resnet.profiles) == ["emulated"]  # the config's devices: emulated only
    assert resnet.profile().latency(4) == pytest.approx((2.050 * 4 + 5.378) / 1e3)
    assert resnet.input_bytes == resnet.output_bytes == 16 * 4  # FP32 [-1, 16]
    assert resnet.rate is None


def test_partition_plans_the_repositorys_models(repository, tmp_path):
    out_file = tmp_path / "plan.json"
    config = cluster_file(tmp_path, partition={"sub_clusters": 2})
    argv = ["partition", str(config), "--repository", str(repository), "--out", str(out_file)]
    code, _out, err = plan(argv)
    assert code == 0, err
    body = json.loads(out_file.read_text())["plan"]
    planned = sorted(m for s in body["sub_clusters"] for m in s["models"])
    assert planned == EMULATED
    assert len(body["sub_clusters"]) == 2
    assert sum(s["rate"] for s in body["sub_clusters"]) == pytest.approx(sum(RATES.values()))


def test_herd_plans_on_the_servers_device_indices(repository, tmp_path):
    out_file = tmp_path / "plan.json"
    config = cluster_file(tmp_path, herd={"max_group_size": 2})
    argv = ["herd", str(config), "--repository", str(repository), "--out", str(out_file)]
    code, out, err = plan(argv)
    assert code == 0, err
    body = json.loads(out_file.read_text())["plan"]
    groups = [g for g in body["groups"] if g["models"]]
    assert sorted(m for g in groups for m in g["models"]) == EMULATED
    # The pool is the emulated devices, the server's 1 and 2 (cpu:0 is 0).
    assert sorted(i for g in groups for i in g["devices"]) == [1, 2]
    assert "on 2 devices" in out


def test_inss_places_the_repositorys_models_on_whole_devices(repository, tmp_path):
    out_file = tmp_path / "plan.json"
    rates = {**RATES, "resnet50-emulated": 100, "densenet121-emulated": 100}
    config = tmp_path / "cluster.yaml"
    config.write_text(json.dumps({"rates": rates, "inss": {"share_step": 0.25}}))
    argv = ["inss", str(config), "--repository", str(repository), "--out", str(out_file)]
    code, out, err = plan(argv)
    assert code == 0, err
    body = json.loads(out_file.read_text())["plan"]
    assert sorted(m["model"] for m in body["models"]) == EMULATED
    assert sorted(d["device"] for d in body["devices"]) == ["emulated:0", "emulated:1"]
    served = [m for m in body["models"] if m["device"] is not None]
    assert served, out
    for m in served:  # the batch's time is the repository's profile over the share
        alpha, beta = {
            "resnet50-emulated": (2.050, 5.378),
            "bert-emulated": (7.008, 0.159),
            "densenet121-emulated": (1.061, 10.312),
            "efficientnetb3-emulated": (5.924, 4.849),
        }[m["model"]]
        assert m["exec_s"] * 1e3 >= (alpha * m["batch"] + beta) / m["share"] - 1e-6


def write_timings(root: Path, model: str) -> None:
    """Block profiles of `model` in the artifact's layout: 4 blocks on
    classes fast (0.5 ms per item + 0.5 ms per block) and slow (twice)."""
    (root / "block-timing").mkdir(parents=True)
    (root / "cut-bytes").mkdir()
    for cls, factor in (("fast", 1), ("slow", 2)):
        row = ",".join(f"{factor * (500 * b + 500):.1f}" for b in range(1, 5))
        (root / "block-timing" / f"{model}-{cls}-1.csv").write_text((row + "\n") * 4)
    (root / "cut-bytes" / f"{model}.csv").write_text("1000\n1000\n1000\n")


def test_ppipe_plans_the_repositorys_models_that_have_block_profiles(repository, tmp_path):
    write_timings(tmp_path / "timings", "resnet50-emulated")
    out_file = tmp_path / "plan.json"
    section = {"timings": str(tmp_path / "timings"), "classes": {"fast": 1, "slow": 2}}
    config = cluster_file(tmp_path, ppipe=section)
    argv = ["ppipe", str(config), "--repository", str(repository), "--out", str(out_file)]
    code, _out, err = plan(argv)
    assert code == 0, err
    body = json.loads(out_file.read_text())["plan"]
    assert [m["name"] for m in body["models"]] == ["resnet50-emulated"]
    assert body["models"][0]["slo_s"] == pytest.approx(0.027)  # the repository's SLO
    assert "left out: bert-emulated: no block profile" in err


def test_a_model_without_a_rate_is_refused_saying_how_to_give_one(repository, tmp_path):
    code, _, err = plan(["partition", "--repository", str(repository)])
    assert code == 2
    assert "has no rate" in err and "rates:" in err and "--from URL" in err


def test_the_cluster_file_is_checked_naming_the_mistake(repository, tmp_path):
    bad = tmp_path / "bad.yaml"
    for body, message in [
        ({"rates": {"nope": 1}}, "rates: no model 'nope'"),
        ({"partiton": {}}, "unknown keys ['partiton']"),
        ({"rates": RATES, "herd": {"max_group": 2}}, "unknown keys ['max_group']"),
        ({"models": {"x": {"profile": {"alpha_ms": 1, "beta_ms": 1}}}}, "needs slo_ms and"),
        ({"rates": RATES, "models": {"bert-emulated": {"max_batch": 0}}}, "max_batch must be"),
    ]:
        bad.write_text(json.dumps(body))
        code, _, err = plan(["herd", str(bad), "--repository", str(repository)])
        assert code == 2 and message in err, (body, err)


def test_a_cluster_file_alone_declares_devices_and_models(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "kind: cluster\n"
        "devices: [{name: 'gpu:0', kind: gpu, memory_mb: 1000}, {name: 'gpu:1', kind: gpu}]\n"
        "models:\n"
        "  a: {slo_ms: 50, memory_mb: 300, profile: {alpha_ms: 1, beta_ms: 2}}\n"
        "  b: {slo_ms: 80, memory_mb: 400, profile: {latency_ms: {1: 3, 8: 10}}}\n"
        "rates: {a: 100, b: 50}\n"
        "partition: {sub_clusters: 2}\n"
    )
    out_file = tmp_path / "plan.json"
    code, _out, err = plan(["partition", str(config), "--out", str(out_file)])
    assert code == 0, err
    body = json.loads(out_file.read_text())["plan"]
    assert sorted(m for s in body["sub_clusters"] for m in s["models"]) == ["a", "b"]
    assert body["s_max_bytes"] == pytest.approx(1000e6)  # the least device memory


def test_exclude_and_a_declared_profile_change_the_repositorys_models(repository):
    base = cluster_from_repository(repository, dict(DEVICES))
    cluster = apply_cluster_file(
        {
            "models": {
                "bert-emulated": {"exclude": True},
                "resnet50-emulated": {"slo_ms": 50, "profile": {"alpha_ms": 1, "beta_ms": 1}},
            },
            "rates": {"resnet50-emulated": 10},
        },
        "c.yaml",
        base,
    )
    by_name = {m.name: m for m in cluster.models}
    assert "bert-emulated" not in by_name and len(by_name) == 3
    resnet = by_name["resnet50-emulated"]
    assert (resnet.slo_s, resnet.rate) == (0.05, 10.0)
    assert resnet.profile("emulated").latency(3) == pytest.approx(4e-3)
    with pytest.raises(InputError, match="kind: cluster"):
        apply_cluster_file({"rates": {}}, "c.yaml", None)


# ------------------------------------------------------------------ --from URL


class CountingSleep:
    """The rate window: `requests` arrivals of add_one while it "sleeps",
    on a clock that moves by the window."""

    def __init__(self, metrics: Metrics, requests: int) -> None:
        self.metrics, self.requests, self.now = metrics, requests, 100.0

    def clock(self) -> float:
        return self.now

    def __call__(self, seconds: float) -> None:
        for _ in range(self.requests):
            self.metrics.request_received("add_one")
        self.now += seconds


def daemon_client(token: str | None = None) -> tuple[httpx.Client, Metrics]:
    metrics = Metrics()
    for _ in range(7):  # before the window: not counted
        metrics.request_received("add_one")
    app = create_api(lambda: FakeService(), metrics, admin_token=token)
    return httpx.Client(transport=SyncASGITransport(app), base_url="http://daemon"), metrics


def test_from_a_daemon_reads_devices_profiles_and_measured_rates():
    client, metrics = daemon_client()
    window = CountingSleep(metrics, requests=50)
    cluster = cluster_from_daemon(
        "http://daemon", 2.0, client=client, sleep=window, clock=window.clock
    )
    assert [(d.name, d.kind) for d in cluster.devices] == [("emulated:0", "emulated")]
    (model,) = cluster.models
    assert model.name == "add_one"
    assert model.rate == pytest.approx(25.0)  # 50 requests in 2 s
    assert model.profile("emulated").latency(3) == pytest.approx(7e-3)
    assert (model.slo_s, model.max_batch, model.item_bytes) == (0.1, 4, 32)
    assert "rates measured over 2.0 s" in cluster.notes[0]


def test_a_plan_from_a_daemon_names_its_models_with_their_measured_rates(tmp_path):
    client, metrics = daemon_client()
    window = CountingSleep(metrics, requests=30)

    def reader(args):
        return cluster_from_daemon(
            args.from_url, args.window, client=client, sleep=window, clock=window.clock
        )

    out_file = tmp_path / "plan.json"
    out, err = io.StringIO(), io.StringIO()
    argv = ["herd", "--from", "http://daemon", "--window", "3", "--out", str(out_file)]
    assert plan_main(argv, out, err, cluster_reader=reader) == 0, err.getvalue()
    body = json.loads(out_file.read_text())["plan"]
    assert [g["models"] for g in body["groups"] if g["models"]] == [["add_one"]]
    assert "10.0" in out.getvalue()  # 30 requests in 3 s, the stream's req/s


def test_from_a_daemon_with_an_admin_token_needs_it():
    client, _ = daemon_client(token="s3cret")
    with pytest.raises(InputError, match="admin token"):
        cluster_from_daemon("http://daemon", 0.0, client=client)
    cluster = cluster_from_daemon("http://daemon", 0.0, token="s3cret", client=client)
    assert [m.name for m in cluster.models] == ["add_one"] and cluster.models[0].rate is None


def test_the_profile_index_gives_the_whole_devices_profile_and_where_it_was_measured():
    from app.runtime.devices import ExecutorDevice
    from app.scheduling import LatencyProfile
    from app.server.planning_index import profile_index
    from app.server.startup import ModelState
    from tests.fakes import emulated_config

    config = emulated_config("emu", alpha_ms=2.0, beta_ms=20.0)
    devices = [
        ExecutorDevice(0, "emulated", "emulated:0/0", share=0.5),
        ExecutorDevice(1, "emulated", "emulated:0/1", share=0.5),
    ]
    # a core on a half share plans with ℓ(b) / 0.5
    state = ModelState(config, None, (0,), LatencyProfile.linear(4.0, 40.0, 2))  # type: ignore[arg-type]
    (row,) = profile_index({"emu": state}, devices)
    assert row["latency_ms"] == {"1": pytest.approx(44.0), "2": pytest.approx(48.0)}
    assert row["measured_on"] == {"name": "emulated:0/0", "kind": "emulated", "share": 0.5}
    assert row["devices"] == ["emulated:0/0"]
    # read back, the profile is the whole device's again
    from app.planning.daemon_index import _model

    model = _model(row, 5.0)
    assert model.profile("emulated").latency(2) == pytest.approx(24e-3)
    assert (model.rate, model.slo_s) == (5.0, config.slo_ms / 1e3)


@pytest.mark.slow
def test_plan_from_a_serving_daemon(repository, launch_daemon, run_module, tmp_path):
    """`python -m app plan herd --from URL` against a daemon serving the
    emulated models: its devices, its profiles and the rates it measured."""
    daemon = launch_daemon(repository, emulated_devices=2, cpu_slices=0)
    body = {"inputs": {"input": [[0.0] * 16]}}
    stop, sent = threading.Event(), []

    def send() -> None:  # traffic of two models while the planner measures
        with httpx.Client(base_url=daemon.url, timeout=10) as client:
            while not stop.is_set():
                for model in ("resnet50-emulated", "bert-emulated"):
                    sent.append(client.post("/infer", json={"model": model, **body}).status_code)
                time.sleep(0.02)

    out_file = tmp_path / "plan.json"
    config = tmp_path / "cluster.yaml"
    config.write_text(
        json.dumps({"rates": {"densenet121-emulated": 5, "efficientnetb3-emulated": 5}})
    )
    sender = threading.Thread(target=send)
    sender.start()
    try:
        done = run_module(
            "app", "plan", "herd", str(config), "--from", daemon.url, "--window", "2",
            "--out", str(out_file),
        )  # fmt: skip
    finally:
        stop.set()
        sender.join()
    assert sent and set(sent) == {200}
    assert done.returncode == 0, done.stderr
    plan = json.loads(out_file.read_text())["plan"]
    assert sorted(m for g in plan["groups"] for m in g["models"]) == EMULATED
    assert sorted(i for g in plan["groups"] for i in g["devices"]) == [0, 1]
    assert "rates measured over" in done.stderr


def test_the_documented_cluster_file_is_read_by_every_planner(repository):
    """docs/architecture.md's example, over the repository's models."""
    import yaml

    from app.planning.cluster_inputs import herd_input, inss_input, partition_input, ppipe_input

    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    block = page.split("```yaml\nkind: cluster", 1)[1].split("```", 1)[0]
    raw = yaml.safe_load("kind: cluster" + block)
    cluster = apply_cluster_file(raw, "docs", cluster_from_repository(repository, dict(DEVICES)))
    assert sorted(m.name for m in cluster.models) == sorted(set(EMULATED) - {"bert-emulated"})
    assert [d.name for d in cluster.devices] == ["emulated:0", "emulated:1"]
    partition = partition_input(cluster)
    assert (partition["sub_clusters"], partition["s_max_mb"]) == (2, 11000)
    body, pool = herd_input(cluster)
    assert body["cluster"]["max_group_size"] == 2 and pool.devices == (0, 1)
    assert [d["bandwidth_gb_per_s"] for d in inss_input(cluster)["devices"]] == [12, 12]
    body, left = ppipe_input(cluster, Path("/nonexistent"))
    assert body["cluster"]["classes"] == {"fast": 1, "slow": 2} and len(left) == 3
