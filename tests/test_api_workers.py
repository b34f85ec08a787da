"""API_WORKERS: HTTP worker processes apart from the scheduler process
(app/frontdoor/). The daemon tests start `python -m app serve` on one
emulated device whose model answers its input (`x` in, `x` out)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.errors import Dropped, ModelUnloaded, ServingError
from app.frontdoor.messages import ErrorDescriptor, ServiceView, dump, load
from app.frontdoor.remote import RemoteService
from app.planning.herd.plan import HerdPlan, ServingGroup
from app.repository.config import version_key
from app.server.settings import Settings
from app.server.startup import arena_capacity, create_arena, worker_slots
from bench.daemon_launcher import free_port
from tests.fakes import emulated_config

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------- in-process


def test_an_error_crosses_as_its_class_reason_and_status():
    error = load(dump(("answer", ErrorDescriptor.of(Dropped("too late", "slo")))))[1].error()
    assert isinstance(error, Dropped)
    assert (error.message, error.reason, error.status, str(error)) == (
        "too late",
        "slo",
        503,
        "too late",
    )
    unknown = ErrorDescriptor("NoSuchError", "odd", "odd_reason", 418).error()
    assert type(unknown) is ServingError and (unknown.status, unknown.reason) == (418, "odd_reason")


def test_each_worker_owns_an_equal_share_of_the_arena(no_leftover_segments: None):
    config = emulated_config()  # max_batch_size 8
    alone = Settings(arena_slots=100)
    assert arena_capacity(alone, config) == 100
    split = Settings(arena_slots=100, api_workers=3)
    assert worker_slots(split, config) == 34
    assert arena_capacity(split, config) == 3 * 34
    assert worker_slots(Settings(arena_slots=10, api_workers=4), config) == 8  # a whole request
    arena = create_arena(split, config)
    try:
        assert arena.capacity == 102 and arena.free_slots == 0  # the scheduler takes none
    finally:
        arena.close_and_unlink()


def test_a_worker_answers_model_questions_from_the_view_as_the_service_would():
    config = emulated_config()
    service = RemoteService(0, lambda message: None)
    key = version_key(config.name, "7")
    service.on_message(
        (
            "view",
            ServiceView(
                configs={config.name: config},
                refusals={
                    key: ErrorDescriptor.of(ModelUnloaded("model 'emu' version 7 is unloaded"))
                },
                model_names=[config.name],
                ready={config.name: True},
                server_ready=True,
            ),
        )
    )
    assert service.model_config(config.name) is config
    assert service.model_ready(config.name) and service.server_ready()
    with pytest.raises(ModelUnloaded, match="unloaded"):
        service.model_config(config.name, "7")
    with pytest.raises(ServingError, match="unknown model 'other'") as unknown:
        service.model_config("other")
    assert unknown.value.status == 404
    assert service.fail_all("the scheduler process exited") == 0
    assert not service.server_ready()


# ---------------------------------------------------------------------- daemons


def _repository(root: Path, hold_ms: float, max_batch: int) -> Path:
    (root / "echo").mkdir(parents=True)
    (root / "echo" / "config.yaml").write_text(
        "backend: emulated\n"
        f"max_batch_size: {max_batch}\n"
        "slo_ms: 60000\n"
        f"profile: {{alpha_ms: 0.0, beta_ms: {hold_ms}}}\n"
        "devices: [emulated]\n"
        "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
    )
    return root


@dataclass
class Daemon:
    process: subprocess.Popen
    url: str
    log: Path

    def workers(self) -> list[int]:
        """The API worker processes: this daemon's spawned children other
        than its executors (named dsrv-…) and multiprocessing's tracker."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
                comm = (entry / "comm").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if (
                ppid == self.process.pid
                and b"spawn_main" in cmdline
                and b"resource_tracker" not in cmdline
                and not comm.startswith("dsrv-")
                and _alive(int(entry.name))
            ):
                found.append(int(entry.name))
        return sorted(found)


@pytest.fixture
def start(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Callable[..., Daemon]]:
    """`start(workers, hold_ms, max_batch)`: the daemon, ready; killed at the end."""
    started: list[Daemon] = []

    def launch(workers: int, hold_ms: float = 1.0, max_batch: int = 8, **extra: str) -> Daemon:
        port = free_port()
        repository = _repository(tmp_path / f"repo-{len(started)}", hold_ms, max_batch)
        env = {
            **cli_env,
            "MODEL_REPOSITORY": str(repository),
            "EMULATED_DEVICES": "1",
            "CPU_SLICES": "0",
            "METRICS_PORT": "0",
            "API_WORKERS": str(workers),
            "SHUTDOWN_GRACE_S": "2",
            **extra,
        }
        argv = [sys.executable, "-m", "app", "serve", "--port", str(port)]
        log = tmp_path / f"daemon-{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        daemon = Daemon(process, f"http://127.0.0.1:{port}", log)
        started.append(daemon)
        _wait_ready(daemon)
        return daemon

    yield launch
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def _wait_ready(daemon: Daemon, timeout_s: float = 60) -> None:
    give_up = time.monotonic() + timeout_s
    while True:
        assert daemon.process.poll() is None, daemon.log.read_text()
        assert time.monotonic() < give_up, daemon.log.read_text()
        try:
            if httpx.get(f"{daemon.url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def _binary_body(rows: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": rows.nbytes},
                }
            ],
            "outputs": [{"name": "x", "parameters": {"binary_data": True}}],
        }
    ).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return header + rows.astype(np.float32).tobytes(), headers


async def _ask(client: httpx.AsyncClient, url: str, i: int) -> np.ndarray:
    """Request i (1 to 3 items): JSON on /infer, v2 JSON or v2 binary."""
    rows = np.arange(4 * (1 + i % 3), dtype=np.float32).reshape(-1, 4) + 1000 * i
    if i % 3 == 0:
        reply = await client.post(
            f"{url}/infer", json={"model": "echo", "inputs": {"x": rows.tolist()}}
        )
        assert reply.status_code == 200, reply.text
        return np.asarray(reply.json()["outputs"]["x"]["data"], dtype=np.float32)
    if i % 3 == 1:
        body = {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "data": rows.ravel().tolist(),
                }
            ]
        }
        reply = await client.post(f"{url}/v2/models/echo/infer", json=body)
        assert reply.status_code == 200, reply.text
        out = reply.json()["outputs"][0]
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    content, headers = _binary_body(rows)
    reply = await client.post(f"{url}/v2/models/echo/infer", content=content, headers=headers)
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    out = json.loads(reply.content[:length])["outputs"][0]
    return np.frombuffer(reply.content[length:], dtype=np.float32).reshape(out["shape"])


def _answers(url: str, n: int) -> list[np.ndarray]:
    async def run() -> list[np.ndarray]:
        async with httpx.AsyncClient(timeout=30) as client:
            return list(await asyncio.gather(*(_ask(client, url, i) for i in range(n))))

    return asyncio.run(run())


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    series = f'deadline_serve_{name}{{model="echo"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(series))


def _grpc_answers(port: int, n: int) -> list[np.ndarray]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        answers = []
        for i in range(n):
            rows = np.arange(4, dtype=np.float32).reshape(1, 4) - i
            x = grpcclient.InferInput("x", [1, 4], "FP32")
            x.set_data_from_numpy(rows)
            answers.append(client.infer("echo", [x]).as_numpy("x"))
        stats = client.get_inference_statistics("echo", as_json=True)
        assert int(stats["model_stats"][0]["inference_stats"]["success"]["count"]) >= n
        return answers
    finally:
        client.close()


@pytest.mark.slow
def test_two_workers_answer_each_request_once_as_one_process_does(start):
    n = 60
    grpc_port = free_port()
    alone, split = start(0), start(2, GRPC_PORT=str(grpc_port))
    expected = [
        np.arange(4 * (1 + i % 3), dtype=np.float32).reshape(-1, 4) + 1000 * i for i in range(n)
    ]
    for daemon in (alone, split):
        for got, want in zip(_answers(daemon.url, n), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        assert _metric(daemon.url, "requests_total") == n
        assert _metric(daemon.url, "pending_requests") == 0
        stats = httpx.get(f"{daemon.url}/v2/models/echo/stats", timeout=5).json()
        success = stats["model_stats"][0]["inference_stats"]["success"]["count"]
        assert success == n
    assert len(split.workers()) == 2
    # gRPC is served by the workers too, on the one port.
    for i, got in enumerate(_grpc_answers(grpc_port, 6)):
        np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32).reshape(1, 4) - i)
    assert _metric(split.url, "requests_total") == n + 6
    # A bad request: the same answer from a worker as from the single process.
    bad = {"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]}
    replies = [
        httpx.post(f"{d.url}/v2/models/echo/infer", json=bad, timeout=5) for d in (alone, split)
    ]
    assert [r.status_code for r in replies] == [400, 400]
    assert replies[0].json() == replies[1].json()
    # A parameter without effect: counted on the scheduler's /metrics as alone.
    x = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}
    odd = {"parameters": {"odd_one": 1}, "inputs": [x]}
    for daemon in (alone, split):
        reply = httpx.post(f"{daemon.url}/v2/models/echo/infer", json=odd, timeout=5)
        assert reply.status_code == 200, reply.text
        text = httpx.get(f"{daemon.url}/metrics", timeout=5).text
        assert 'name="odd_one"} 1.0' in text, [ln for ln in text.splitlines() if "ignored" in ln]
    unknown = [httpx.get(f"{d.url}/v2/models/nope", timeout=5) for d in (alone, split)]
    assert [r.status_code for r in unknown] == [404, 404] and unknown[0].json() == unknown[1].json()
    assert split.process.send_signal(signal.SIGTERM) is None
    assert split.process.wait(timeout=30) == 0
    assert not [line for line in split.log.read_text().splitlines() if "Traceback" in line]


def _in_flight(url: str, requests: int, timeout_s: float = 30) -> list[tuple[int, str]]:
    """`requests` at once to /infer, each on its own connection: (status, reason)."""

    async def one() -> tuple[int, str]:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            body = {"model": "echo", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}
            try:
                reply = await client.post(f"{url}/infer", json=body)
            except httpx.HTTPError as exc:  # the connection failed: not an answer
                return -1, type(exc).__name__
            return reply.status_code, reply.json().get(
                "reason", ""
            ) if reply.status_code != 200 else ""

    async def run() -> list[tuple[int, str]]:
        return list(await asyncio.gather(*(one() for _ in range(requests))))

    return asyncio.run(run())


@pytest.mark.slow
def test_a_killed_worker_fails_its_clients_and_is_started_again_with_nothing_left(start):
    daemon = start(2, hold_ms=200.0, max_batch=1)
    workers = daemon.workers()
    assert len(workers) == 2

    async def scenario() -> list[tuple[int, str]]:
        loop = asyncio.get_running_loop()
        answers = loop.run_in_executor(None, _in_flight, daemon.url, 16)
        await asyncio.sleep(1.0)  # every request is in (16 take 3.2 s)
        os.kill(workers[0], signal.SIGKILL)
        return await answers

    answers = asyncio.run(scenario())
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, -1}, answers
    assert -1 in statuses and 200 in statuses, answers  # both workers had some
    deadline = time.monotonic() + 30
    while len(daemon.workers()) < 2 or workers[0] in daemon.workers():
        assert time.monotonic() < deadline, daemon.log.read_text()
        time.sleep(0.2)
    _wait_ready(daemon)
    while _metric(daemon.url, "pending_requests") != 0:  # the dead worker's answered too
        assert time.monotonic() < deadline, daemon.log.read_text()
        time.sleep(0.2)
    assert _in_flight(daemon.url, 4) == [(200, "")] * 4
    assert "API worker 0 exited (status -9): starting it again" in daemon.log.read_text() or (
        "API worker 1 exited (status -9): starting it again" in daemon.log.read_text()
    )


@pytest.mark.slow
def test_a_killed_scheduler_gets_every_waiting_request_a_503_and_the_workers_exit(start):
    daemon = start(2, hold_ms=300.0, max_batch=1)
    workers = daemon.workers()

    async def scenario() -> list[tuple[int, str]]:
        loop = asyncio.get_running_loop()
        answers = loop.run_in_executor(None, _in_flight, daemon.url, 10)
        await asyncio.sleep(1.0)
        daemon.process.kill()
        return await answers

    answers = asyncio.run(scenario())
    assert set(answers) <= {(200, ""), (503, "shutting_down")}, answers
    assert (503, "shutting_down") in answers, answers
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "API workers still running after the scheduler died"
        time.sleep(0.1)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{daemon.url}/v2/health/live", timeout=2)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigterm_answers_every_request_in_flight_and_the_daemon_exits_0(start):
    daemon = start(2, hold_ms=300.0, max_batch=1)  # SHUTDOWN_GRACE_S 2: ~7 of 12 finish

    async def scenario() -> list[tuple[int, str]]:
        loop = asyncio.get_running_loop()
        answers = loop.run_in_executor(None, _in_flight, daemon.url, 12)
        await asyncio.sleep(0.5)
        daemon.process.send_signal(signal.SIGTERM)
        return await answers

    answers = asyncio.run(scenario())
    assert set(answers) == {(200, ""), (503, "shutting_down")}, answers
    assert daemon.process.wait(timeout=30) == 0
    assert "answered" in daemon.log.read_text() and "shut down" in daemon.log.read_text()


@pytest.mark.slow
def test_a_workers_share_of_the_arena_full_is_a_429_counted_by_the_scheduler(start):
    daemon = start(1, hold_ms=300.0, max_batch=1, ARENA_SLOTS="1")
    answers = _in_flight(daemon.url, 3)
    assert sorted(answers) == [(200, ""), (429, "overloaded"), (429, "overloaded")], answers
    text = httpx.get(f"{daemon.url}/metrics", timeout=5).text
    assert 'deadline_serve_dropped_total{model="echo",reason="overloaded"} 2.0' in text
    stats = httpx.get(f"{daemon.url}/v2/models/echo/stats", timeout=5).json()["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 2


def test_a_worker_frees_its_slots_once_and_only_its_own(no_leftover_segments: None):
    config = emulated_config()
    settings = Settings(arena_slots=16, api_workers=2)
    arena = create_arena(settings, config)
    sent: list[tuple] = []
    try:
        service = RemoteService(1, sent.append)
        view = ServiceView(
            configs={config.name: config},
            arenas={config.name: arena.layout},
            shares={config.name: worker_slots(settings, config)},
        )
        # A killed predecessor left slots 8 and 9 in flight.
        service.on_message(("welcome", {arena.name: [8, 9]}, view))
        share = service._share(config.name, arena.layout)
        assert sorted(share.free) == list(range(10, 16))
        service.on_message(("answer", 123, arena.name, [8, 9], None, None))  # its answer
        service.on_message(
            ("answer", 124, arena.name, [8, 9, 3], None, None)
        )  # again, and not ours
        assert sorted(share.free) == list(range(8, 16))
        share.arena.close()
    finally:
        arena.close_and_unlink()


@pytest.mark.slow
def test_the_cpu_benchmark_counts_each_process_of_the_daemon():
    from bench.api_workers_cpu import measure

    row = measure(1, rate=100.0, duration=2.0)
    assert 120 <= row["requests"] <= 280  # Poisson, 200 expected
    assert row["scheduler"] > 0 and row["workers"] > 0 and row["executor"] > 0


@pytest.mark.slow
def test_model_control_through_a_worker_reaches_every_worker(start):
    daemon = start(2)
    body = {"model": "echo", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}

    def statuses() -> set[tuple[int, str]]:  # 12 connections: both workers answer some
        replies = [httpx.post(f"{daemon.url}/infer", json=body, timeout=5) for _ in range(12)]
        return {(r.status_code, r.json().get("reason", "")) for r in replies}

    assert statuses() == {(200, "")}
    unload = httpx.post(f"{daemon.url}/v2/repository/models/echo/unload", timeout=30)
    assert unload.status_code == 200, unload.text
    assert statuses() == {(503, "unloaded")}
    load = httpx.post(f"{daemon.url}/v2/repository/models/echo/load", timeout=30)
    assert load.status_code == 200, load.text
    assert statuses() == {(200, "")}
    # A plan taken up through a worker: every worker then shows it in force.
    assert httpx.get(f"{daemon.url}/v2/plan").json() == {"in_force": False}
    group = ServingGroup((0,), ("echo",), (), 1.0)
    plan = json.dumps(HerdPlan("ilp", "paper", (group,)).to_dict()).encode()
    switched = httpx.post(f"{daemon.url}/v2/plan", content=plan, timeout=30)
    assert switched.status_code == 200, switched.text
    for _ in range(6):  # connections to both workers
        in_force = httpx.get(f"{daemon.url}/v2/plan").json()
        assert (in_force["in_force"], in_force["kind"]) == (True, "herd-plan"), in_force
    assert statuses() == {(200, "")}
    assert _metric(daemon.url, "pending_requests") == 0


@pytest.mark.slow
def test_a_port_in_use_stops_the_start_in_one_line(run_module):
    import socket

    with socket.socket() as taken:  # bound without SO_REUSEPORT: no one may share it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_module("app", "serve", "--port", str(port), env={"API_WORKERS": "2"})
    assert done.returncode == 3, done.stderr
    assert f"cannot bind 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr
