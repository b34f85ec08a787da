"""Start and stop this project's daemon (`python -m app serve`) for benchmarks.

handle = start_daemon(repository, port, policy="symphony", emulated_devices=4)
... drive http://127.0.0.1:port ...
stop_daemon(handle)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class DaemonHandle:
    process: subprocess.Popen
    url: str
    startup_s: float
    log_path: Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free now; bind it soon)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_daemon(
    repository: Path,
    port: int,
    *,
    policy: str = "symphony",
    policy_options: dict[str, Any] | None = None,
    emulated_devices: int = 2,
    cpu_slices: int | None = None,
    threads_per_slice: int | None = None,
    startup_timeout_s: float = 120.0,
    extra_env: dict[str, str] | None = None,
    log_level: str = "warning",
) -> DaemonHandle:
    """Start the daemon on 127.0.0.1:`port`; return once /v2/health/ready is 200."""
    # GRPC_PORT and METRICS_PORT 0: daemons started side by side must not
    # all bind the default ports; give one in `extra_env` to serve it.
    env = dict(
        os.environ,
        POLICY=policy,
        EMULATED_DEVICES=str(emulated_devices),
        GRPC_PORT="0",
        METRICS_PORT="0",
    )
    if policy_options:
        env["POLICY_OPTIONS"] = json.dumps(policy_options)
    if cpu_slices is not None:
        env["CPU_SLICES"] = str(cpu_slices)
    if threads_per_slice is not None:
        env["THREADS_PER_SLICE"] = str(threads_per_slice)
    env.update(extra_env or {})
    argv = [sys.executable, "-m", "app", "serve", "--port", str(port)]
    argv += ["--repository", str(Path(repository).resolve()), "--log-level", log_level]
    return start_server(argv, port, env, startup_timeout_s=startup_timeout_s, log_prefix="daemon-")


def start_server(
    argv: list[str],
    port: int,
    env: dict[str, str],
    *,
    startup_timeout_s: float,
    log_prefix: str,
    cwd: Path = REPO_ROOT,
    preexec_fn: Any = None,
) -> DaemonHandle:
    """Run `argv` (a server that will listen on 127.0.0.1:`port`) with `env`
    as its whole environment, its output to a log file in a new temporary
    directory named `log_prefix`…; return once /v2/health/ready is 200
    (`wait_ready`)."""
    log_path = Path(tempfile.mkdtemp(prefix=log_prefix)) / "server.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )
    return wait_ready(process, f"http://127.0.0.1:{port}", started, startup_timeout_s, log_path)


def wait_ready(
    process: subprocess.Popen,
    url: str,
    started: float,
    startup_timeout_s: float,
    log_path: Path,
) -> DaemonHandle:
    """The daemon's handle once `url`'s /v2/health/ready answers 200; it is
    killed (and RuntimeError raised, with its log) if it exits or is not
    ready within `startup_timeout_s` of `started` (time.monotonic())."""
    while time.monotonic() - started < startup_timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"daemon exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                return DaemonHandle(process, url, time.monotonic() - started, log_path)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise RuntimeError(f"daemon not ready in {startup_timeout_s} s:\n{log_path.read_text()}")


def stop_daemon(handle: DaemonHandle, timeout_s: float = 30.0) -> int | None:
    """SIGTERM (graceful shutdown), then SIGKILL if it does not exit in time."""
    process = handle.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode
