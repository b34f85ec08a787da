"""SIGTERM and SIGINT under `python -m app serve` and `uvicorn app.main:app`
(app/server/stop_signals.py, LiveService.begin_shutdown and stop).

First the hook itself, around a uvicorn Server's own handler. Then the
daemon: one emulated device runs one model with batches of one request that hold it
for ℓ; requests are sent and counted by the daemon before the signal, so at
the signal one is running and the rest are queued behind it. Each test
checks what a client and an operator see: every request answered (a result,
or 503 JSON with reason shutting_down; never a 500 or a cut connection), the
exit status and time, a log without tracebacks, no shared memory or
executor left behind.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.server.stop_signals import HANDLED, StopSignals, safety_net_s
from bench.daemon_launcher import free_port
from bench.overload import executor_pids
from tests.conftest import ROOT
from tests.fakes import segments_of

# ------------------------------------------------------------ the signal hook


def test_signals_start_the_drain_and_reach_uvicorn_only_as_should_exit():
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app=None))
    calls: list[tuple[str, str]] = []
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}

    async def scenario() -> None:
        for sig in HANDLED:  # what uvicorn's capture_signals installs
            signal.signal(sig, server.handle_exit)
        hook = StopSignals(
            asyncio.get_running_loop(),
            2.5,
            on_first=lambda name: calls.append(("first", name)),
            on_again=lambda name: calls.append(("again", name)),
        )
        assert hook.install()
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0)  # the callbacks run on the loop
        assert calls == [("first", "SIGTERM")]
        assert server.should_exit and not server.force_exit
        assert server.config.timeout_graceful_shutdown == safety_net_s(2.5) == 3.5
        signal.raise_signal(signal.SIGINT)  # uvicorn's handler would force the exit
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0)
        assert calls[1:] == [("again", "SIGINT"), ("again", "SIGTERM")]
        assert not server.force_exit
        # Nothing for capture_signals to raise again once it has shut down.
        assert server._captured_signals == []
        hook.restore()
        assert all(signal.getsignal(sig) == server.handle_exit for sig in HANDLED)

    try:
        asyncio.run(scenario())
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_configured_graceful_timeout_is_kept_and_a_default_handler_is_not_hooked():
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app=None, timeout_graceful_shutdown=7))
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}

    async def scenario() -> None:
        signal.signal(signal.SIGTERM, server.handle_exit)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # nothing to wrap: left alone
        hook = StopSignals(asyncio.get_running_loop(), 1.0, lambda _: None, lambda _: None)
        assert hook.install()
        assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0)
        assert server.should_exit and server.config.timeout_graceful_shutdown == 7
        hook.restore()

    try:
        asyncio.run(scenario())
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------ the daemon


def _repository(root: Path, hold_ms: float) -> Path:
    (root / "hold").mkdir(parents=True)
    (root / "hold" / "config.yaml").write_text(
        "backend: emulated\n"
        "max_batch_size: 1\n"
        "slo_ms: 600000\n"
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


@pytest.fixture
def start(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Callable[..., Daemon]]:
    """`start(command, hold_ms, grace_s)`: the daemon on one emulated device,
    started with `command` ("serve": `python -m app serve`, "uvicorn":
    `uvicorn app.main:app`), ready to serve; killed at the end if still running."""
    started: list[Daemon] = []

    def launch(command: str, hold_ms: float, grace_s: float, **extra: str) -> Daemon:
        port = free_port()
        repository = _repository(tmp_path / f"repo-{len(started)}", hold_ms)
        env = {
            **cli_env,
            "MODEL_REPOSITORY": str(repository),
            "EMULATED_DEVICES": "1",
            "CPU_SLICES": "0",
            "POLICY": "clockwork",
            "SHUTDOWN_GRACE_S": str(grace_s),
            **extra,
        }
        if command == "serve":
            argv = [sys.executable, "-m", "app", "serve", "--port", str(port)]
        else:
            argv = [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port)]
        log = tmp_path / f"daemon-{len(started)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        daemon = Daemon(process, f"http://127.0.0.1:{port}", log)
        started.append(daemon)
        give_up = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < give_up, log.read_text()
            try:
                if httpx.get(f"{daemon.url}/v2/health/ready", timeout=1).status_code == 200:
                    return daemon
            except httpx.HTTPError:
                pass
            time.sleep(0.1)

    yield launch
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


@dataclass
class Shutdown:
    answers: list[tuple[int, str, dict | str]]  # status, content type, body
    code: int | None  # None: still running after the bound
    exit_s: float  # from the first signal


def _received(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    series = 'deadline_serve_requests_total{model="hold"} '
    return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(series))


def _signal_with_requests_in_flight(
    daemon: Daemon, requests: int, signals: list[tuple[float, signal.Signals]], bound_s: float
) -> Shutdown:
    """Send `requests` at once; when the daemon has them all, send each
    signal `delay` seconds after the one before; wait up to `bound_s` for
    the exit."""

    async def one(client: httpx.AsyncClient) -> tuple[int, str, dict | str]:
        body = {"model": "hold", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}
        try:
            reply = await client.post(f"{daemon.url}/infer", json=body)
        except httpx.HTTPError as exc:  # cut or refused: not an answer
            return -2, "", repr(exc)
        kind = reply.headers.get("content-type", "")
        return reply.status_code, kind, reply.json() if kind == "application/json" else reply.text

    async def scenario() -> Shutdown:
        async with httpx.AsyncClient(timeout=60) as client:
            sent = [asyncio.create_task(one(client)) for _ in range(requests)]
            give_up = time.monotonic() + 10
            while await asyncio.to_thread(_received, daemon.url) < requests:
                assert time.monotonic() < give_up, "the daemon did not receive every request"
                await asyncio.sleep(0.02)
            first = time.monotonic()
            for delay, sig in signals:
                await asyncio.sleep(delay)
                daemon.process.send_signal(sig)
            try:
                code = await asyncio.to_thread(daemon.process.wait, bound_s)
            except subprocess.TimeoutExpired:
                code = None
            exit_s = time.monotonic() - first
            return Shutdown(await asyncio.gather(*sent), code, exit_s)

    return asyncio.run(scenario())


def _assert_clean_exit(daemon: Daemon, shutdown: Shutdown) -> None:
    assert shutdown.code == 0, (shutdown.code, daemon.log.read_text()[-3000:])
    log = daemon.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "never retrieved" not in log, log[-3000:]
    pid = daemon.process.pid
    assert not segments_of(pid), "shared memory left behind"
    assert not executor_pids(pid), "executors left running"


def _assert_refused_for_shutdown(answer: tuple[int, str, dict | str]) -> None:
    status, kind, body = answer
    assert (status, kind) == (503, "application/json"), answer
    assert isinstance(body, dict) and body["reason"] == "shutting_down" and body["error"], body


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "uvicorn"])
def test_sigterm_lets_requests_finish_for_the_grace_then_answers_the_rest_503(start, command):
    # ℓ = 0.8 s, grace 1 s: the running request finishes within the grace,
    # the next one would end 0.6 s after it, the three others later still.
    grace = 1.0
    daemon = start(command, hold_ms=800, grace_s=grace)
    shutdown = _signal_with_requests_in_flight(daemon, 5, [(0.0, signal.SIGTERM)], grace + 5)
    print(f"{command}: SIGTERM with 1 running, 4 queued: exited in {shutdown.exit_s:.2f} s")
    assert shutdown.code is not None, f"still running {grace + 5} s after SIGTERM"
    assert shutdown.exit_s < grace + 2 + 3  # grace + 2 s, and room for a loaded machine
    statuses = Counter(status for status, _, _ in shutdown.answers)
    assert set(statuses) <= {200, 503}, shutdown.answers
    assert statuses[200] >= 1 and statuses[503] >= 3, statuses
    for answer in shutdown.answers:
        if answer[0] == 200:
            assert answer[2]["outputs"]["x"]["data"] == [[1.0, 2.0, 3.0, 4.0]]
        else:
            _assert_refused_for_shutdown(answer)
    _assert_clean_exit(daemon, shutdown)


@pytest.mark.slow
@pytest.mark.parametrize("again", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_the_grace_at_once_and_still_answers_every_request(start, again):
    # A 30 s grace and six 2 s batches: without the second signal the
    # daemon would serve them all (12 s) or wait out the grace.
    daemon = start("serve", hold_ms=2000, grace_s=30.0)
    signals = [(0.0, signal.SIGTERM), (0.5, again)]
    shutdown = _signal_with_requests_in_flight(daemon, 6, signals, 15.0)
    print(f"SIGTERM, then {again.name} 0.5 s later: exited in {shutdown.exit_s:.2f} s")
    assert shutdown.code is not None, "still running 15 s after SIGTERM"
    assert shutdown.exit_s < 10.0
    statuses = Counter(status for status, _, _ in shutdown.answers)
    assert set(statuses) <= {200, 503} and statuses[503] >= 5, shutdown.answers
    for answer in shutdown.answers:
        if answer[0] == 503:
            _assert_refused_for_shutdown(answer)
    _assert_clean_exit(daemon, shutdown)


@pytest.mark.slow
def test_a_request_completed_after_sigterm_is_refused_while_an_accepted_one_finishes(start):
    """A request still arriving at SIGTERM (its connection open, its body
    not yet whole) is new work: it is refused with 503 shutting_down (by the
    protocol at the signal, or by the app once whole), while the request
    accepted before the signal runs to its result; the daemon exits as soon
    as that one is answered."""
    daemon = start("serve", hold_ms=1500, grace_s=5.0)
    body = b'{"model": "hold", "inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}'
    head = (
        "POST /infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()

    async def scenario() -> tuple[bytes, float, httpx.Response, float]:
        host, port = daemon.url.removeprefix("http://").split(":")
        async with httpx.AsyncClient(timeout=30) as client:
            running = asyncio.create_task(client.post(f"{daemon.url}/infer", content=body))
            while await asyncio.to_thread(_received, daemon.url) < 1:
                await asyncio.sleep(0.02)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(head + body[:10])
            await writer.drain()
            await asyncio.sleep(0.2)
            signalled = time.monotonic()
            daemon.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)  # past uvicorn's own look at its exit flag
            writer.write(body[10:])
            await writer.drain()
            t0 = time.monotonic()
            refused = await asyncio.wait_for(reader.read(), 10)  # until it closes
            refused_s = time.monotonic() - t0
            writer.close()
            served = await running
            code = await asyncio.to_thread(daemon.process.wait, 10)
            assert code == 0
        return refused, refused_s, served, time.monotonic() - signalled

    refused, refused_s, served, exit_s = asyncio.run(scenario())
    status_line, _, rest = refused.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 503 Service Unavailable", refused
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["reason"] == "shutting_down", refused
    assert refused_s < 1.0  # refused, not held for the grace
    assert served.status_code == 200, served.text
    assert exit_s < 5.0  # the grace is 5 s: over once the accepted request is answered
    log = daemon.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert not segments_of(daemon.process.pid)


def _raw_exchange(url: str, data: bytes, wait_s: float) -> tuple[bytes, float]:
    """Send `data` on a fresh connection and read until the server closes it
    (or `wait_s`); what came back and when."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received, time.monotonic() - began


@pytest.mark.slow
def test_plain_uvicorn_gets_the_connection_protections_and_a_clean_shutdown(start):
    """Issue 42, item 6: under `uvicorn app.main:app` a stalled head got no
    408, a 200 KB header a 200, and a stalled body at SIGTERM a 500
    text/plain with a traceback."""
    daemon = start("uvicorn", hold_ms=10, grace_s=1.0, HEADER_TIMEOUT_S="1", BODY_TIMEOUT_S="2")
    stalled, stalled_s = _raw_exchange(
        daemon.url, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n", 8
    )
    big = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    flooded, _ = _raw_exchange(daemon.url, big, 8)
    body_head = (
        b"POST /infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model"'
    )
    slow_body, slow_body_s = _raw_exchange(daemon.url, body_head, 8)

    import socket

    host, port = daemon.url.removeprefix("http://").split(":")
    held = socket.create_connection((host, int(port)), timeout=10)
    held.sendall(body_head)
    time.sleep(0.3)
    daemon.process.send_signal(signal.SIGTERM)
    at_signal = b""
    try:
        while chunk := held.recv(65536):
            at_signal += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    held.close()
    code = daemon.process.wait(timeout=20)
    log = daemon.log.read_text()
    assert stalled.startswith(b"HTTP/1.1 408 "), stalled[:200]
    assert 0.9 <= stalled_s <= 4.0, stalled_s
    assert flooded.startswith(b"HTTP/1.1 431 "), flooded[:200]
    assert slow_body.startswith(b"HTTP/1.1 408 ") and 1.9 <= slow_body_s <= 5.0, slow_body[:200]
    assert at_signal.startswith(b"HTTP/1.1 503 ") and b"shutting_down" in at_signal, at_signal
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and " 500 " not in log, log[-3000:]
    assert "replaced by the guarded one" in log, log[-3000:]
