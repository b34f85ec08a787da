"""Every command in the README and in docs/ works as written.

The documents are README.md and every docs/*.md page but the benchmark
history (docs/benchmark-history.md, a record of past runs whose commands
are those of their day). Their shell commands are their indented code
blocks and fenced `sh`/`bash`/`shell` blocks, one per line (continuation
lines joined, trailing comments dropped, `a && b` as two commands). Each is
either run here verbatim (`RUN`) or listed in `NOT_RUN` with the reason it
cannot be: installing, CI's own command line, a usage synopsis, or minutes
to hours of load. The two sets are exactly the documents' commands, so a
command added to a page must be added to one of them.

One substitution: the servers listen on a free port given as `PORT` (a
setting docs/settings.md documents), and the client commands'
`localhost:8000` is rewritten to it, so that the test never depends on port
8000 being free. The Python examples (fenced `python` blocks) are run as
they are: the scheduling core's alone (docs/architecture.md), the gRPC
client's against the quick-start server (README; its `localhost:8001`
rewritten to the server's free `GRPC_PORT`).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from app.workloads.spec import load_workload
from bench.daemon_launcher import free_port
from bench.loadgen import LoadGenError
from bench.loadgen.targets import prepare_targets
from tests.conftest import ROOT

README = ROOT / "README.md"
HISTORY = ROOT / "docs" / "benchmark-history.md"
DOCUMENTS = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p != HISTORY)]
SHELL_FENCES = ("```sh", "```bash", "```shell")

QUICK_START_SERVER = "python -m app serve"
LIVE_SERVER = "python -m app serve --repository bench/repositories/live --emulated-devices 2"
SIMULATOR = "python -m bench.simulate --workload bench/workloads/symphony-table4-resnet50.yaml"
LOADGEN = (
    "python -m bench.loadgen --url http://127.0.0.1:8000 "
    "--workload bench/workloads/live-a-resnet50-emulated.yaml --capacity"
)
PLAN_PPIPE = (
    "python -m app plan ppipe bench/workloads/ppipe/hc1-g1.yaml --time-limit 10 "
    "--out /tmp/ppipe-plan.json"
)
PLAN_REFERENCE = (
    "python -m app plan ppipe --reference data/ppipe/plans-maf19/colorization-v2-googlenet-v3-"
    "pytorch-repvgg-b3_0.3-0.33-0.37_L4-P4_25-75_bw-gbps-6_sla-multiplier-5_v4.json "
    "--timings data/ppipe"
)
PLAN_HERD = (
    "python -m app plan herd bench/workloads/herd/example.yaml --time-limit 10 "
    "--out /tmp/herd-plan.json"
)
PLAN_HERD_MEASURED = "python -m app plan herd bench/workloads/herd/example.yaml --goodput measured"
PLAN_INSS = (
    "python -m app plan inss bench/workloads/inss/paper-setting.yaml --out /tmp/inss-plan.json"
)
PLAN_PARTITION = (
    "python -m app plan partition bench/workloads/partition/example.yaml "
    "--out /tmp/partition-plan.json"
)
PLAN_CLUSTER_HERD = (
    "python -m app plan herd bench/workloads/cluster/live.yaml --repository "
    "bench/repositories/live --out /tmp/herd-live.json"
)
PLAN_CLUSTER_PARTITION = (
    "python -m app plan partition bench/workloads/cluster/live.yaml --repository "
    "bench/repositories/live --out /tmp/partition-live.json"
)
RAY_CLUSTER = "python -m bench.ray_cluster --workers 1 --hold 5"
CI_LINE = (
    "pip install -e '.[test]' && ruff check . && "
    'python -m pytest -q -n auto -m "not serial" && python -m pytest -q -m serial'
)

_POLICY_FORMS = (
    "one policy written five ways; tests/test_policy_spec.py reads each form to the same "
    "settings and simulator policy"
)
_INSTALLS = "installs into the running environment from the package index (.ci/run installs)"
PPIPE_PROFILE = (
    "python -m app.repository.block_profile --chain --out /tmp/ppipe-chain --class fast:1 "
    "--class slow:1:2 --max-batch 2"
)
PPIPE_PLAN = (
    "python -m app plan ppipe bench/workloads/ppipe/chain-live.yaml --timings /tmp/ppipe-chain "
    "--out /tmp/ppipe-chain/plan.json"
)
PPIPE_SERVE = (
    "PLAN=/tmp/ppipe-chain/plan.json PPIPE_CLASSES=fast:1,slow:1:2 python -m app serve "
    "--repository /tmp/ppipe-chain/models"
)
PLAN_INSS_BUNDLED = (
    "python -m app plan inss bench/workloads/inss/bundled.yaml --out /tmp/inss-plan.json"
)
SERVE_INSS = "PLAN=/tmp/inss-plan.json EMULATED_DEVICES=3 python -m app serve"
SERVE_HERD = (
    "MODEL_REPOSITORY=bench/repositories/herd-example CPU_SLICES=0 EMULATED_DEVICES=8 "
    "PLAN=/tmp/herd-plan.json python -m app serve"
)
SERVE_HERD_LIVE = (
    "PLAN=/tmp/herd-live.json python -m app serve --repository bench/repositories/live"
)
SERVE_PARTITION_LIVE = (
    "PLAN=/tmp/partition-live.json python -m app serve --repository bench/repositories/live"
)
SERVE_REPLANNING = (
    "PLAN=/tmp/partition-live.json REPLAN_S=10 python -m app serve "
    "--repository bench/repositories/live"
)

NOT_RUN = {
    'python -m bench.gpu_check --wheels .whl --out "$OUT"': "needs a machine with a CUDA GPU "
    "(tests/test_gpu_check.py runs its CPU dry run)",
    "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 "
    "--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 "
    "--platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl fastapi==0.165.0 "
    "starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 "
    "typing-inspection==0.4.5 typing-extensions==4.16.0 annotated-doc==0.0.7 "
    "opentelemetry-api==1.45.2 uvicorn==0.54.0 click==8.5.1 h11==0.16.0 httptools==0.9.0 "
    "orjson==3.13.0": "downloads wheels for another machine from the package index",
    "python -m bench.ray_cluster --workers 1 --hold 600": "the same cluster as the one "
    "tests/test_ray_cluster.py starts, held for 10 minutes",
    "RAY_ADDRESS=127.0.0.1:PORT python -m app serve": "a daemon on that cluster "
    "(tests/test_ray_pool.py serves on a local one; the port is the cluster's)",
    "python -m bench.ray_executors --netns": "a two-node bench, minutes; "
    "tests/test_bench_ray.py runs its quick form",
    "python -m bench.orloj_live --model earlyexit-wide --policies clockwork,orloj "
    "--sample-rates 0,0.2": "a live benchmark, minutes; tests/test_orloj_live.py runs a short one",
    "python -m bench.orloj_tables --arrivals trace --rate-scale 0.8333333": "a benchmark "
    "of minutes; tests/test_orloj.py checks its tables",
    "python -m bench.api_workers_cpu --workers 0,1,2 --rate 400": "three daemons under load, "
    "a minute; tests/test_api_workers.py runs one short measurement",
    "pip install -e .": _INSTALLS,
    "pip install -e '.[test]'": _INSTALLS,
    "pip install -e '.[bench]'": _INSTALLS,
    "pip install -e '.[bench,peers]'": _INSTALLS,
    "python -m bench.peers.bentoml_launcher --setup": "creates .venv-peers/bentoml from the "
    "package index (.ci/run runs it; tests/test_peer_bentoml.py serves with it)",
    "pip install -e '.[fast]'": _INSTALLS,
    "python -m app.build_fast": "compiles the core in this checkout, ~30 s "
    "(tests/test_build_fast.py builds a copy and checks its decisions)",
    "python -m app.build_fast --status": "tests/test_build_fast.py checks what it reports "
    "(compiled_modules)",
    "python -m app.build_fast --clean": "removes a build from this checkout "
    "(tests/test_build_fast.py cleans its copy)",
    "ruff check .": "CI's own line: .ci/run runs it verbatim (checked here)",
    'python -m pytest -q -n auto -m "not serial"': "CI's own line: .ci/run runs it verbatim "
    "(checked here); this suite, on every core",
    "python -m pytest -q -m serial": "CI's own line: .ci/run runs it verbatim (checked here); "
    "the tests that run alone",
    "python -m bench.simulate --workload FILE [--policy P ...] [--rate-scale X] [--capacity] "
    "[--json] [--plot out.png]": "a usage synopsis with placeholders",
    "python -m app plan herd --from http://127.0.0.1:8000 --window 30 --out /tmp/herd-live.json": (
        "needs the live server under load; tests/test_plan_cluster.py plans with --from from a "
        "daemon it serves and loads"
    ),
    "POLICY=symphony:stagger_slack=2 python -m app serve": _POLICY_FORMS,
    "POLICY=symphony POLICY_OPTIONS=stagger_slack=2 python -m app serve": _POLICY_FORMS,
    "POLICY=symphony POLICY_OPTIONS='{\"stagger_slack\": 2}' python -m app serve": _POLICY_FORMS,
    "python -m bench.simulate --workload W.yaml --policy symphony:stagger_slack=2": _POLICY_FORMS,
    "python -m bench.simulate --workload W.yaml --policy 'symphony:{\"stagger_slack\": 2}'": (
        _POLICY_FORMS
    ),
    "python -m app profile MODEL [--force]": "a usage synopsis with placeholders "
    "(tests/test_triton_repository.py runs the command's code)",
    LOADGEN: "a capacity bisection of 15-s open-loop runs, minutes of load; the server the "
    "README starts for it is checked to serve its workload (loadgen's own check)",
    "python -m bench.compare": "every system on workloads a, b and c, ~45 min, the peers",
    "python -m bench.compare --workload zoo8 zoo8-bursty --peers tritonserver,bentoml,ray "
    "--ray-waits 2,5": "8 models on 8 devices, every system and peer grid, ~70 min "
    "(tests/test_compare.py checks the setups and runs the daemon and a peer end to end)",
    "python -m bench.compare --workload ceiling --systems symphony --peers none "
    "--cdf-fraction 0.5": (
        "a capacity bisection and a latency CDF of the live daemon, minutes of load"
    ),
    "python -m bench.orloj_tables": "15 cases × 5 SLOs × 5 policies over 100 s of trace, "
    "minutes (tests/test_dynamic_workloads.py runs it on a tiny case)",
    "python -m bench.orloj_queue": "a timing micro-benchmark up to 10,000 pending requests "
    "(tests/test_orloj.py checks the structure's answers)",
    "python -m bench.ray_executors": "a local Ray cluster, three daemons' capacity searches and a "
    "kill under load, ~10 min (tests/test_bench_ray.py runs its --quick form end to end)",
    "python -m bench.orloj_live": "a calibration and several live runs of minutes each",
    "python -m bench.ppipe_planner": "72 reference plans re-solved, seconds to a minute "
    "(tests/test_ppipe_planner.py re-solves two)",
    "python -m bench.ppipe_sim": "6 groups × 4 clusters × 3 variants × 2 arrival processes, "
    "capacity searches of 30-s simulations, ~20 min (tests/test_ppipe_simulation.py runs plans)",
    "python -m bench.ppipe_live": "block profiling and live capacity searches, minutes of load",
    "python -m bench.ppipe_switch": "block profiling and three 30-s daemon runs under load "
    "(tests/test_pipeline_service.py posts a PPipe plan under load; tests/test_bench_ppipe_live.py "
    "checks the bench's plans and tables)",
    "python -m bench.ppipe_plan_sim /tmp/ppipe-chain/plan.json --timings /tmp/ppipe-chain "
    "--slo-ms 100": "two capacity searches of 30-s simulations, ~10 s, on the plan the commands "
    "above write (tests/test_bench_ppipe_live.py runs it on a reference plan)",
    "python -m bench.ppipe_sim --arrivals maf21 --trace "
    "AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt": "needs the 305-MB MAF-2021 trace, "
    "not bundled (tests/test_folded_arrivals.py reads its CSV layout and folds traces)",
    "python -m bench.inss_tables": "fits to the paper's tables; tests/test_inss_latency.py runs it "
    "and checks what it writes",
    "python -m bench.inss_cpu_model": "a timing measurement of co-located executors "
    "(tests/test_inss_cpu_model.py runs its --quick form)",
    "python -m app plan inss bench/workloads/inss/paper-setting.yaml --learned --train-steps "
    "20000 --policy-out /tmp/inss-policy.pt": "SAC-D training, minutes on one core "
    "(tests/test_inss_learned.py runs --learned on a tiny case)",
    "python -m bench.herd": "HERD's solve time at 1,000 workers and simulated goodput of "
    "seven groupings, minutes (tests/test_herd.py runs its pieces)",
    "python -m bench.plan_switch": "30 s of load on a daemon of 8 emulated devices "
    "(tests/test_plan_switch.py switches plans under load)",
    "python -m bench.inss_sim": "capacity searches of four systems × two arrival processes, "
    "2 min (tests/test_bench_inss_sim.py runs its --quick form)",
    "python -m bench.inss_sim --config bench/workloads/inss/paper-setting-saturating.yaml "
    "--out-dir bench/results/inss/saturating": "as the line before, on the saturating setting "
    "(tests/test_inss_plan.py loads and plans it)",
    "python -m bench.inss_curves": "tables of the measured curves' fits "
    "(tests/test_inss_measured.py checks each figure through its functions)",
    "python -m bench.inss_sim --config bench/workloads/inss/gpulet-small.yaml --out-dir "
    "bench/results/inss/gpulet-small": "capacity searches, ~1 min "
    "(tests/test_bench_inss_sim.py simulates the setting's four systems at one load)",
    "python -m bench.inss_sim --config bench/workloads/inss/ppipe-large.yaml --duration 600 "
    "--dwell 60 --out-dir bench/results/inss/ppipe-large": "capacity searches of 600-s "
    "simulations, ~30 s (tests/test_inss_measured.py loads PPipe's curves)",
    "python -m bench.inss_shadow": "two 30-s daemon runs under load "
    "(tests/test_bench_inss_live.py runs its --quick form)",
    "python -m bench.inss_shadow --moves": "two 30-s daemon runs under load "
    "(tests/test_inss_switch.py moves models under load; tests/test_bench_inss_live.py checks "
    "its plans)",
    "python -m bench.inss_live": "five live capacity searches, minutes of load "
    "(tests/test_bench_inss_live.py runs one --quick probe)",
    "python -m bench.autoscale": "a simulated load step, seconds (tests/test_autoscaler.py runs "
    "its --quick form)",
    "python -m bench.autoscale_live": "three daemons, 60 s of live load each, ~3.5 min "
    "(tests/test_bench_autoscale_live.py runs its --quick form)",
    "python -m bench.inss_learned": "SAC-D training on five cases, ~15 min on one core "
    "(tests/test_inss_learned.py trains on a tiny case)",
    "python -m bench.symphony_partition": "20 configurations × three 10-s solves of 800 models, "
    "~10 min (tests/test_symphony_partition.py runs its --quick form)",
    "python -m bench.inprocess --workload bench/workloads/live-a-resnet50-emulated.yaml "
    "--capacity": "a capacity bisection of 15-s runs, minutes of load",
    "podman build -t deadline-serve .": "builds the container image: root, podman and the "
    "package index (deploy/container/smoke.sh builds and checks it)",
    "podman run --rm -p 8000:8000 -p 8001:8001 deadline-serve": "runs the container image "
    "(deploy/container/smoke.sh runs it and checks HTTP and gRPC)",
    "perf_analyzer -m resnet50-emulated -u localhost:8001 -i grpc --shape input:16 "
    "--concurrency-range 1:4": "Triton's perf_analyzer binary is not among the test "
    "dependencies (`pip install perf-analyzer`); the gRPC calls it makes are the README "
    "example's, run here",
}


def readme_commands(text: str) -> list[str]:
    """The shell commands of a document's indented code blocks and fenced
    shell blocks."""
    commands: list[str] = []
    fence: str | None = None  # the opening line of the fence we are in
    pending = ""
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line.strip()
            continue
        indented = fence is None and line.startswith("    ")
        if not (indented or (fence in SHELL_FENCES and line.strip())):
            continue
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        command = re.sub(r"\s+#.*$", "", pending).strip()
        pending = ""
        if command:
            commands += [part.strip() for part in command.split(" && ")]
    return commands


def document_commands() -> dict[Path, list[str]]:
    """Each document's commands, in the documents' order."""
    return {path: readme_commands(path.read_text()) for path in DOCUMENTS}


def all_commands() -> list[str]:
    return [c for commands in document_commands().values() for c in commands]


def client_commands(commands: list[str]) -> list[str]:
    return [c for c in commands if c.startswith("curl ")]


def run_set(commands: list[str]) -> set[str]:
    return {
        QUICK_START_SERVER,
        LIVE_SERVER,
        SIMULATOR,
        PLAN_PPIPE,
        PLAN_REFERENCE,
        PLAN_INSS,
        PLAN_HERD,
        PLAN_HERD_MEASURED,
        PLAN_PARTITION,
        PLAN_CLUSTER_HERD,
        PLAN_CLUSTER_PARTITION,
        RAY_CLUSTER,
        PPIPE_PROFILE,
        PPIPE_PLAN,
        PPIPE_SERVE,
        PLAN_INSS_BUNDLED,
        SERVE_INSS,
        SERVE_HERD,
        SERVE_HERD_LIVE,
        SERVE_PARTITION_LIVE,
        SERVE_REPLANNING,
        *client_commands(commands),
    }


def test_every_documented_command_is_run_or_listed_with_its_reason() -> None:
    for path, commands in document_commands().items():
        assert len(commands) == len(set(commands)), f"a command appears twice in {path.name}"
    commands = all_commands()
    assert run_set(commands) | set(NOT_RUN) == set(commands), (
        "commands neither run nor listed: "
        f"{set(commands) - run_set(commands) - set(NOT_RUN)}; "
        f"listed but not in any document: {set(NOT_RUN) - set(commands)}"
    )
    assert not run_set(commands) & set(NOT_RUN)
    assert len(client_commands(commands)) == 9
    # README's test line is exactly what CI runs.
    assert CI_LINE in README.read_text()
    assert CI_LINE in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_documents_name_no_path_outside_the_repository() -> None:
    for path in DOCUMENTS:
        text = path.read_text()
        assert "../shared" not in text and "/work/" not in text, path.name
        for target in re.findall(r"\]\(([^)#]*)(?:#[^)]*)?\)", text):
            if not target or "://" in target:
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), (path.name, target)
            assert resolved.exists(), f"{path.name} links to missing {target}"


def test_the_readme_is_a_short_hub() -> None:
    assert len(README.read_text().splitlines()) <= 300


def _env(cli_env: dict[str, str], port: int) -> dict[str, str]:
    return {**cli_env, "PORT": str(port)}


@pytest.fixture
def serve_readme(cli_env: dict[str, str], tmp_path: Path) -> Iterator:
    """`start(command)`: the README's server command, verbatim, in the
    repository root on a free port (PORT); its URL once ready. Every server
    started stops at the end of the test."""
    started: list[subprocess.Popen] = []

    def start(command: str, grpc_port: int = 0) -> str:
        port = free_port()
        log = tmp_path / f"server-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                ["bash", "-c", command],
                cwd=ROOT,
                env={**_env(cli_env, port), "GRPC_PORT": str(grpc_port)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"{command!r} exited with {process.returncode}:\n{log.read_text()}")
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"{command!r} not ready in 120 s:\n{log.read_text()}")

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _bash(command: str, cli_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _python_examples() -> dict[str, str]:
    """The documents' fenced Python blocks, by the module each is about."""
    examples = {}
    for path in DOCUMENTS:
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
            about = "tritonclient.grpc" if "tritonclient.grpc" in block else "app.scheduling"
            assert about not in examples, f"two examples about {about}"
            examples[about] = block
    assert set(examples) == {"tritonclient.grpc", "app.scheduling"}
    return examples


@pytest.mark.slow
def test_quick_start_commands(serve_readme, cli_env) -> None:
    grpc_port = free_port()
    url = serve_readme(QUICK_START_SERVER, grpc_port)
    port = url.rsplit(":", 1)[1]
    clients = client_commands(all_commands())

    def run(command: str) -> str:
        done = _bash(command.replace("localhost:8000", f"localhost:{port}"), cli_env)
        assert done.returncode == 0, (command, done.stderr)
        return done.stdout

    def one(test) -> str:
        (command,) = [c for c in clients if test(c)]
        return command

    # Those that only read, then model control and the reshare, which change
    # the server, in this order whatever page lists them.
    ready = run(one(lambda c: "/v2/health/ready" in c))
    native = run(one(lambda c: "localhost:8000/infer " in c))
    v2 = run(one(lambda c: "/v2/models/resnet50-emulated/infer " in c))
    metadata = run(one(lambda c: c.endswith("localhost:8000/v2/models/mlp")))
    metrics = run(one(lambda c: "/metrics" in c))
    devices = run(one(lambda c: c.endswith("localhost:8000/v2/devices")))
    unload = run(one(lambda c: c.endswith("/v2/repository/models/mlp/unload")))
    load = run(one(lambda c: "/v2/repository/models/mlp/load " in c))
    reshared = run(one(lambda c: "/v2/devices/reshare " in c))
    assert ready == "200\n"
    answer = orjson.loads(native)
    assert answer["outputs"]["output"]["shape"][-1] == 16, answer
    answer = orjson.loads(v2)
    assert answer["outputs"][0]["shape"] == [1, 16], answer
    assert orjson.loads(metadata)["name"] == "mlp"
    assert all("goodput" in line for line in metrics.splitlines()) and metrics.strip()
    # Model control: mlp unloaded, then loaded again with max_batch_size 8.
    assert unload == "{}" and load == "{}", (unload, load)  # 200, as Triton answers
    config = httpx.get(f"{url}/v2/models/mlp/config", timeout=10).json()
    assert config["max_batch_size"] == 8, config
    # The devices, and emulated:1 at half of itself through a shadow executor.
    listed = {d["name"]: d for d in orjson.loads(devices)["devices"]}
    assert listed["emulated:1"]["share"] == 1.0 and listed["emulated:1"]["alive"]
    report = orjson.loads(reshared)
    assert (report["name"], report["old_share"], report["new_share"]) == ("emulated:1", 1.0, 0.5)
    after = httpx.get(f"{url}/v2/devices", timeout=10).json()["devices"]
    assert {d["name"]: d["share"] for d in after}["emulated:1"] == 0.5
    # The gRPC example, against the same server.
    example = _python_examples()["tritonclient.grpc"]
    done = subprocess.run(
        [sys.executable, "-c", example.replace("localhost:8001", f"localhost:{grpc_port}")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "1"  # batch_size
    assert "15." in done.stdout  # the emulated model echoes arange(16)
    # The live benchmark's workload names models this server does not have:
    # bench.loadgen stops at once, naming the model (README, Live benchmarks).
    live_a = load_workload(ROOT / "bench" / "workloads" / "live-a-resnet50-emulated.yaml")
    with pytest.raises(LoadGenError, match="resnet50-t4"):
        asyncio.run(prepare_targets(url, live_a))


@pytest.mark.slow
def test_live_benchmark_server_serves_the_loadgen_workload(serve_readme) -> None:
    """The README's live server serves every model the loadgen command's
    workload names, and accepts a request for each (loadgen's own check
    before it sends load)."""
    url = serve_readme(LIVE_SERVER)
    args = shlex.split(LOADGEN)
    workload = load_workload(ROOT / args[args.index("--workload") + 1])
    targets = asyncio.run(prepare_targets(url, workload, check=True))
    assert [t.name for t in targets] == ["resnet50-t4"]


@pytest.mark.slow
def test_simulator_command(cli_env) -> None:
    done = _bash(SIMULATOR, cli_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("symphony-table4-resnet50: 8 devices")
    for policy in ("symphony", "symphony-wc", "flex", "clockwork", "nexus", "triton"):
        assert re.search(rf"^\s*{re.escape(policy)}\s+[\d,]+\.\d", done.stdout, re.M), policy


@pytest.mark.slow
def test_ppipe_planner_commands(cli_env) -> None:
    """The planner's two README commands: a plan written and read back, and
    a reference plan re-solved to its published objective."""
    from app.planning.ppipe.plan import read_plan

    out = Path("/tmp/ppipe-plan.json")
    out.unlink(missing_ok=True)
    planned = subprocess.run(
        ["bash", "-c", PLAN_PPIPE], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
    )
    assert planned.returncode == 0, planned.stderr.decode()
    plan = read_plan(out)
    assert plan.variant == "ppipe" and {m.name for m in plan.models} == {
        "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k",
        "encnet_r101-d8_4xb2-40k_cityscapes-512x1024",
        "rtmdet_x_8xb32-300e_coco",
    }
    used = plan.devices_used()
    assert used["L4"] <= 25 and used["P4"] <= 75
    assert plan.objective > 0
    resolved = subprocess.run(
        ["bash", "-c", PLAN_REFERENCE], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
    )
    assert resolved.returncode == 0, resolved.stderr.decode()
    answer = orjson.loads(resolved.stdout)
    assert abs(answer["objective"] - answer["reference_objective"]) <= 0.01 * abs(
        answer["reference_objective"]
    )


@pytest.mark.slow
def test_inss_planner_command(cli_env) -> None:
    """InSS's README command: the paper's setting placed, every model served
    within its SLO and rate, the plan written and read back."""
    from app.planning.inss.plan import read_plan

    out = Path("/tmp/inss-plan.json")
    out.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-c", PLAN_INSS], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("InSS plan (exact, 10% share steps) on 4 devices")
    plan = read_plan(out)
    assert plan.feasible and plan.method == "exact"
    assert {m.model for m in plan.models} == {
        "alexnet", "resnet50", "vgg16", "mnasnet", "mobilenet", "efficientnet"
    }  # fmt: skip
    for m in plan.models:
        assert m.worst_latency_s <= m.slo_s and m.throughput >= m.rate, m
    assert all(d.shares_used <= 1 + 1e-9 for d in plan.devices)
    assert plan.objective == sum(m.throughput for m in plan.models)


def test_herd_planner_command(cli_env) -> None:
    """HERD's README command: the example grouped, the plan written and read back."""
    from app.planning.herd.plan import read_plan

    out = Path("/tmp/herd-plan.json")
    out.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-c", PLAN_HERD], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("HERD plan (ilp, optimal")
    plan = read_plan(out)
    assert sorted(i for g in plan.groups for i in g.streams) == list(range(7))
    assert f"least burst tolerance {plan.min_burst_tolerance:.3f}" in done.stdout.decode()


@pytest.mark.slow  # over a second
def test_herd_measured_goodput_command(cli_env) -> None:
    """HERD with measured T_i: named, and a row per model and SLO beside the analytic T."""
    done = subprocess.run(
        ["bash", "-c", PLAN_HERD_MEASURED], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[1].startswith("single-device goodput T_i: measured (flex")
    assert "7 capacity searches" in lines[1]  # six models, ResNet50 at two SLOs
    assert lines[3].split()[:3] == ["ResNet50", "27", "260.2"]


def test_partition_planner_command(cli_env) -> None:
    """Symphony's partitioning, as the README runs it: every model of the
    example in one sub-cluster, within R_max and S_max, the plan read back."""
    from app.planning.partition.plan import read_plan

    out = Path("/tmp/partition-plan.json")
    out.unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-c", PLAN_PARTITION], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith("Symphony partition: 12 models into 3 sub-clusters")
    plan = read_plan(out)
    assert plan.result.status == "optimal" and len(plan.assignment()) == 12
    for s in plan.sub_clusters:
        assert s.models and s.rate <= plan.r_max and s.memory_bytes <= plan.s_max_bytes


def test_cluster_planning_commands(cli_env) -> None:
    """The Planning section's commands: the live repository's models, by
    their names, grouped on the server's emulated devices and partitioned."""
    from app.planning.herd.plan import read_plan as read_herd
    from app.planning.partition.plan import read_plan as read_partition

    live = {"densenet121-1080ti", "resnet50-t4", "xception-1080ti", "zero-emulated"}
    for command, out in (
        (PLAN_CLUSTER_HERD, Path("/tmp/herd-live.json")),
        (PLAN_CLUSTER_PARTITION, Path("/tmp/partition-live.json")),
    ):
        out.unlink(missing_ok=True)
        done = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=cli_env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr.decode()
    herd = read_herd(Path("/tmp/herd-live.json"))
    assert {m for g in herd.groups for m in g.models} == live
    assert sorted(i for g in herd.groups for i in g.devices) == [1, 2]  # emulated:0, emulated:1
    partition = read_partition(Path("/tmp/partition-live.json"))
    assert set(partition.assignment()) == live and len(partition.sub_clusters) == 2


@pytest.mark.slow
@pytest.mark.serial
def test_ray_cluster_command(cli_env) -> None:
    """The local Ray cluster's README command: a head and one worker raylet
    up, listed with their resources, held, and every process of theirs gone
    after it exits (a SIGTERM at the time limit tears it down too)."""
    from bench.ray_cluster import is_live

    process = subprocess.Popen(
        ["bash", "-c", RAY_CLUSTER.replace("--hold 5", "--hold 0.5")],  # held, not 5 s
        cwd=ROOT,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.terminate()
        out, _ = process.communicate(timeout=30)
        pytest.fail(f"{RAY_CLUSTER!r} ran over 120 s:\n{out}")
    assert process.returncode == 0, out
    lines = out.splitlines()
    assert re.match(r"address 127\.0\.0\.1:\d+ \(up in [\d.]+ s\)$", lines[0]), out
    nodes = [line.split() for line in lines[1:-1]]
    assert [(n[0], n[2]) for n in nodes] == [("head", "node:head-label"), ("worker-0", "worker-0")]
    assert lines[-1] == "stopped"
    pids = [int(pid) for n in nodes for pid in n[-1].split(",")]
    assert pids and not [pid for pid in pids if is_live(pid)]


@pytest.mark.slow
def test_ppipe_serving_commands(serve_readme, cli_env) -> None:
    """Profile, plan and serve the chain model as the README says; the
    plan cuts it, and an answer runs through a fast and a slow instance."""
    import shutil

    shutil.rmtree("/tmp/ppipe-chain", ignore_errors=True)
    for command in (PPIPE_PROFILE, PPIPE_PLAN):
        done = subprocess.run(
            ["bash", "-c", command], cwd=ROOT, env=cli_env, capture_output=True, timeout=300
        )
        assert done.returncode == 0, done.stderr.decode()
    plan = orjson.loads(Path("/tmp/ppipe-chain/plan.json").read_bytes())
    assert any(len(p["stages"]) == 2 for p in plan["plan"]["pipelines"])
    url = serve_readme(PPIPE_SERVE)
    x = [0.5] * (3 * 32 * 32)
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": x}]}
    reply = httpx.post(f"{url}/v2/models/chain/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["outputs"][0]["data"]) == 10
    assert ">" in reply.json()["parameters"]["device"]
    # The pipelines' devices are listed with their PPipe class, which `plan
    # ppipe --from URL` reads: one executor per instance the plan's stages
    # use (of the cluster's 1 fast and 2 slow; how many slow ones the plan
    # takes depends on the profiles measured).
    listed = httpx.get(f"{url}/v2/devices").json()["devices"]
    classes = sorted(d["class"] for d in listed if d.get("class"))
    planned = sorted(
        stage["device_class"]
        for pipeline in plan["plan"]["pipelines"]
        for stage in pipeline["stages"]
        for _ in range(stage["devices"])
    )
    assert classes == planned, listed
    assert classes.count("fast") == 1 and 1 <= classes.count("slow") <= 2, listed
    assert all(d["models"] == ["chain"] and d["state"] == "serving" for d in listed if d["class"])
    from app.cluster_sources.daemon import cluster_from_daemon

    cluster = cluster_from_daemon(url, 0.0)
    assert sorted(d.device_class for d in cluster.devices if d.device_class) == classes


def _infer(url: str, model: str) -> dict:
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    reply = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["parameters"]


@pytest.mark.slow
def test_serving_the_documented_plans(serve_readme, cli_env) -> None:
    """docs/inss.md's, docs/shepherd.md's and docs/symphony.md's plans,
    served as they say: each answer on the device (or share) and at most the
    batch its plan gives."""
    from app.planning.herd.plan import read_plan as read_herd
    from app.planning.inss.plan import read_plan as read_inss
    from app.planning.partition.plan import read_plan as read_partition

    for command in (PLAN_INSS_BUNDLED, PLAN_HERD, PLAN_CLUSTER_HERD, PLAN_CLUSTER_PARTITION):
        done = _bash(command, cli_env)
        assert done.returncode == 0, done.stderr
    inss = read_inss(Path("/tmp/inss-plan.json"))
    url = serve_readme(SERVE_INSS)
    for model in inss.models:
        timing = _infer(url, model.model)
        assert timing["device"].startswith(model.device), (model, timing)
        # On a share of the device, or on the whole one (alone, or time-shared in turn).
        assert ("/" in timing["device"]) == (model.share < 1.0), (model, timing)
        assert timing["batch_size"] <= model.batch
    url = serve_readme(SERVE_HERD)
    for group in read_herd(Path("/tmp/herd-plan.json")).groups:
        for model in group.models:
            device = _infer(url, model)["device"]
            assert int(device.split(":")[1]) in group.devices, (model, device, group)
    # Planned from the repository on the default server's devices (cpu:0, emulated:0, emulated:1).
    url = serve_readme(SERVE_HERD_LIVE)
    groups = [g for g in read_herd(Path("/tmp/herd-live.json")).groups if g.models]
    assert [g.devices for g in groups] == [(1, 2)]
    for model in groups[0].models:
        assert _infer(url, model)["device"] in {"emulated:0", "emulated:1"}
    url = serve_readme(SERVE_PARTITION_LIVE)
    clusters = [
        c for c in read_partition(Path("/tmp/partition-live.json")).sub_clusters if c.models
    ]
    for k, cluster in enumerate(clusters):
        for model in cluster.models:
            assert _infer(url, model)["device"] == f"emulated:{k}", (model, k)
    # Re-planning on: the plan serves as before, and another one is taken up
    # while serving (POST /v2/plan): here the HERD plan of the same server.
    url = serve_readme(SERVE_REPLANNING)
    assert httpx.get(f"{url}/v2/plan").json()["kind"] == "symphony-partition"
    herd = Path("/tmp/herd-live.json").read_bytes()
    switched = httpx.post(f"{url}/v2/plan", content=herd, timeout=60.0)
    assert switched.status_code == 200, switched.text
    in_force = httpx.get(f"{url}/v2/plan").json()
    assert (in_force["kind"], in_force["setting"]) == ("herd-plan", "POST /v2/plan")
    for model in groups[0].models:
        assert _infer(url, model)["device"] in {"emulated:0", "emulated:1"}


def test_the_scheduling_core_example_runs() -> None:
    example = _python_examples()["app.scheduling"]
    example += "\nprint(type(decisions).__name__, wake is None or wake >= 0.0)\n"
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "True"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_benchmarks_opens_with_a_short_summary_that_links_to_its_sections() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    summary = text.split("## Summary\n", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Summary") < text.index("## Reading the figures")
    assert len(summary.strip().splitlines()) <= 20
    anchors = {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    links = re.findall(r"\]\(#([^)]+)\)", summary)
    assert len(links) >= 10 and set(links) <= anchors, set(links) - anchors
