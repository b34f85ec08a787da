"""Connection hygiene, continued (tests/test_connections.py has the
timeouts, the header cap and the body budget): the connection cap below the
open-file limit, and how `python -m app serve` and plain uvicorn get the
connection options."""

from __future__ import annotations

import os
import re
import resource
import select
import signal
import socket
import time
from typing import Any

import httpx
import pytest
import uvicorn

from app.api.connection import (
    GuardedProtocol,
    uvicorn_connection_options,
)
from app.server.connection_limits import (
    DEFAULT_MAX_CONNECTIONS,
    ConnectionLimits,
    choose_max_connections,
    connection_limits,
    fd_plan,
)
from app.server.settings import Settings
from bench.overload import executor_pids, write_repository
from tests.guarded_server import (
    RecordingApp,
    connect,
    read_to_close,
    status_and_body,
    wait_for,
)

# ------------------------------------------------------------------ connections


@pytest.mark.slow
def test_at_max_connections_a_new_connection_replaces_the_longest_idle_one(guarded_serve):
    """MAX_CONNECTIONS 3: idle connections cannot lock a new client out —
    the one idle longest is closed to admit it, and a connection in the
    middle of a request is never the one closed."""
    address = guarded_serve(RecordingApp(), max_connections=3, header_timeout_s=30.0)
    first, second = connect(address), connect(address)  # idle: opened, nothing sent
    try:
        time.sleep(0.2)  # let the server take them in first
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as client:
            # the third connection fills the limit; the fourth replaces `first`
            assert client.post("/infer", content=b"x").json() == {"size": 1}
            second.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12")
            time.sleep(0.2)  # `second` now has a request in progress: not idle
            with connect(address) as newcomer:
                newcomer.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert newcomer.recv(65536).startswith(b"HTTP/1.1 200 ")
            assert read_to_close(first) == b""  # closed without an answer: it asked nothing
            second.sendall(b"34567890")  # its request completes as if nothing happened
            assert second.recv(65536).startswith(b"HTTP/1.1 200 ")
            # `client` was idle longer than `second` (answered before it sent
            # its request): the newcomer took its place; it reconnects.
            assert client.post("/infer", content=b"yy").json() == {"size": 2}
    finally:
        first.close()
        second.close()


@pytest.mark.slow
def test_at_max_connections_with_every_connection_busy_a_new_one_is_refused_503(guarded_serve):
    address = guarded_serve(RecordingApp(), max_connections=2, header_timeout_s=30.0)
    busy = [connect(address) for _ in range(2)]
    try:
        for sock in busy:  # a head, part of the body: a request in progress
            sock.sendall(b"POST /infer HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n12")
        time.sleep(0.2)
        with connect(address) as refused:
            status, body = status_and_body(read_to_close(refused))
        assert (status, body["reason"]) == (503, "too_many_connections")
        for sock in busy:  # the open ones are served as before
            sock.sendall(b"34")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in busy:
            sock.close()


@pytest.mark.slow
def test_idle_clients_holding_every_connection_leave_descriptors_to_respawn_an_executor(
    launch_daemon, tmp_path
):
    """`python -m app serve` at `ulimit -n 256`: clients that open more idle
    connections than the process has file descriptors never hold more than
    the cap (each one above it replaces the one idle longest), a client is
    still served, and an executor killed meanwhile is respawned."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the daemon inherits it
    try:
        handle = launch_daemon(
            write_repository(tmp_path / "repo"),
            emulated_devices=2,
            extra_env={"CPU_SLICES": "0", "HEADER_TIMEOUT_S": "120", "KEEP_ALIVE_TIMEOUT_S": "120"},
            log_level="info",
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    chosen = re.search(r"connections: at most (\d+) open", handle.log_path.read_text())
    assert chosen, handle.log_path.read_text()[-2000:]
    cap = int(chosen.group(1))
    # 256 less 64 + 2·8 + 1 reserved less a backlog of 21: 154.
    assert cap == fd_plan(256, devices=2, models=1).ceiling == 154
    host, port = handle.url.removeprefix("http://").split(":")
    idle: list[socket.socket] = []
    with httpx.Client(base_url=handle.url, timeout=10) as client:
        assert client.get("/v2/health/ready").status_code == 200  # connected first
        try:
            for _ in range(300):  # more than the daemon has file descriptors
                idle.append(socket.create_connection((host, int(port)), timeout=10))
                # Paced: a client faster than the server's accepts fills the
                # 21-deep backlog of `ulimit -n 256`, and each SYN dropped
                # then is sent again 1 s later (7 s of a 10-s test).
                time.sleep(0.002)
            time.sleep(1.0)  # the replaced ones are closed at once
            readable, _, _ = select.select(idle, [], [], 0)
            closed = [s for s in readable if s.recv(65536) == b""]
            # each connection above the cap replaced the one idle longest:
            # the client's (idle since its answer), then the oldest of these
            assert len(closed) == len(readable) == 300 - cap
            assert client.get("/v2/health/ready").json()["devices_alive"] == 2
            os.kill(executor_pids(handle.process.pid)["emulated:0"], signal.SIGKILL)

            def respawned() -> bool:
                return client.get("/v2/health/ready").json().get("devices_alive") == 2

            time.sleep(0.5)
            assert wait_for(respawned, timeout=30.0), handle.log_path.read_text()[-3000:]
        finally:
            for sock in idle:
                sock.close()
    log = handle.log_path.read_text()
    assert "respawned" in log and "Too many open files" not in log, log[-3000:]


def test_the_connection_cap_leaves_file_descriptors_for_executors_and_the_backlog():
    # ulimit -n 1024, three executors, five models: 64 + 3·8 + 5 reserved,
    # an eighth of the rest for the accept backlog, the rest for clients.
    plan = fd_plan(1024, devices=3, models=5)
    assert (plan.reserve, plan.backlog, plan.ceiling) == (93, 116, 815)
    assert plan.reserve + plan.backlog + plan.ceiling == 1024
    # A generous limit: uvicorn's backlog of 2048.
    plan = fd_plan(65536, devices=4, models=10)
    assert (plan.reserve, plan.backlog, plan.ceiling) == (106, 2048, 63382)
    # A tight one: the backlog has a floor of 16.
    plan = fd_plan(128, devices=1, models=0)
    assert (plan.reserve, plan.backlog, plan.ceiling) == (72, 16, 40)
    with pytest.raises(ValueError, match="ulimit -n"):
        fd_plan(80, devices=1, models=0)  # 72 reserved, 16 backlog: none for clients
    # MAX_CONNECTIONS: auto is the ceiling up to DEFAULT_MAX_CONNECTIONS; an
    # explicit value is kept under the ceiling.
    small, large = fd_plan(1024, 3, 5), fd_plan(65536, 4, 10)
    assert choose_max_connections(None, small)[0] == 815
    assert choose_max_connections(None, large)[0] == DEFAULT_MAX_CONNECTIONS == 4096
    assert choose_max_connections(500, small)[0] == 500
    assert choose_max_connections(2000, small) == (
        815,
        "MAX_CONNECTIONS 2000 capped to the file-descriptor ceiling",
    )


def test_connection_limits_come_from_the_settings_and_the_open_file_limit(caplog):
    settings = Settings(
        header_timeout_s=3.0,
        body_timeout_s=7.0,
        keep_alive_timeout_s=2.0,
        max_header_bytes=8192,
        max_body_bytes=1 << 20,
        max_buffered_bytes=1 << 24,
        max_connections=2000,
    )
    with caplog.at_level("INFO", logger="app.server"):
        limits = connection_limits(settings, devices=3, models=5, nofile=1024)
    assert limits == ConnectionLimits(
        header_timeout_s=3.0,
        body_timeout_s=7.0,
        keep_alive_timeout_s=2.0,
        max_header_bytes=8192,
        max_body_bytes=1 << 20,
        max_buffered_bytes=1 << 24,
        max_connections=815,
        backlog=116,
    )
    assert "at most 815 open (MAX_CONNECTIONS 2000 capped" in caplog.text
    assert "RLIMIT_NOFILE 1024 less 93" in caplog.text


# ------------------------------------------------------------------ uvicorn options


def test_uvicorn_options_carry_the_protocol_keep_alive_backlog_and_h11_header_cap():
    settings = Settings(keep_alive_timeout_s=2.5, max_header_bytes=8192, header_timeout_s=4.0)
    options = uvicorn_connection_options(settings, devices=1, models=2)
    protocol = options.pop("http")
    assert issubclass(protocol, GuardedProtocol)
    assert protocol.limits.header_timeout_s == 4.0
    assert protocol.limits.max_header_bytes == 8192
    assert options == {
        "timeout_keep_alive": 2.5,
        "backlog": protocol.limits.backlog,
        "h11_max_incomplete_event_size": 8192,
    }
    assert not {"host", "port"} & set(options)  # the caller's


def test_python_m_app_serve_passes_the_connection_options_to_uvicorn(monkeypatch):
    import app.__main__ as cli
    import app.main

    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: runs.append(kw))
    monkeypatch.setattr(app.main, "create_app", lambda settings: None)
    for name in ("HEADER_TIMEOUT_S", "BODY_TIMEOUT_S", "MAX_CONNECTIONS", "REALTIME_PRIORITY"):
        monkeypatch.delenv(name, raising=False)
    argv = ["serve", "--header-timeout-s", "3", "--body-timeout-s", "9", "--max-connections", "7"]
    assert cli.main([*argv, "--keep-alive-timeout-s", "4"]) == 0
    (options,) = runs
    limits = options["http"].limits
    assert (limits.header_timeout_s, limits.body_timeout_s, limits.max_connections) == (3, 9, 7)
    assert options["timeout_keep_alive"] == 4
    assert options["backlog"] == limits.backlog
    assert options["server_header"] is False  # answers do not name the server software


def test_plain_uvicorn_takes_the_protocol_by_its_class_path(monkeypatch):
    monkeypatch.setenv("HEADER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("MAX_HEADER_BYTES", "9000")
    monkeypatch.setattr(GuardedProtocol, "limits", None)  # read at the first connection
    config = uvicorn.Config(RecordingApp(), http="app.api.connection:GuardedProtocol")
    config.load()
    assert config.http_protocol_class is GuardedProtocol
    limits = GuardedProtocol.limits_in_force()
    assert (limits.header_timeout_s, limits.max_header_bytes) == (2.5, 9000)


def test_plain_uvicorn_is_told_when_its_backlog_does_not_fit_the_open_file_limit(
    monkeypatch, caplog
):
    import app.server.connection_limits as numbers

    monkeypatch.setattr(numbers, "open_file_limit", lambda: 1024)
    monkeypatch.setenv("EMULATED_DEVICES", "2")
    monkeypatch.setenv("CPU_SLICES", "1")
    monkeypatch.setattr(GuardedProtocol, "limits", None)
    with caplog.at_level("INFO", logger="app"):
        limits = GuardedProtocol.limits_in_force(backlog=2048)  # uvicorn's default
    assert limits.backlog < 2048 and limits.max_connections < 1024 - 64 - 3 * 8
    assert f"pass --backlog {limits.backlog}" in caplog.text


def test_the_fd_reserve_counts_a_ppipe_plans_executors(tmp_path):
    """Issue 42, item 10: a plan of 6 stage instances beside 3 devices
    reserved file descriptors for 3 executors."""
    from app.planning.ppipe.plan import Cluster, ModelTarget, Pipeline, Plan, Stage, write_plan
    from app.server.connection_limits import _executors, plan_executors

    stages = (Stage(0, 5, "fast", 1, 2, 0.01), Stage(5, 10, "slow", 1, 4, 0.02))
    plan = Plan(
        Cluster({"fast": 2, "slow": 4}, 10.0),
        (ModelTarget("chain", 1.0, 0.1),),
        (Pipeline("chain", 1, stages, 50.0),),
    )
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert plan_executors(path) == 6
    settings = Settings(cpu_slices=0, emulated_devices=3, ppipe_plan=path)
    assert _executors(settings) == 9
    assert _executors(Settings(cpu_slices=0, emulated_devices=3)) == 3
    limits = connection_limits(settings, models=1, nofile=1024)
    plain = connection_limits(Settings(cpu_slices=0, emulated_devices=3), models=1, nofile=1024)
    assert limits.max_connections == fd_plan(1024, 9, 1).ceiling == 777
    assert plain.max_connections == fd_plan(1024, 3, 1).ceiling == 819
