"""The daemon each attack runs against: `python -m app serve` of this
checkout on a repository of two emulated models, started fresh per attack.

- `tiny`: input `x` FP32 [-1, 4] (16 bytes an item), ℓ(b) = 0.05·b + 0.5 ms,
  so the normal client's latency is the front door's, not the model's;
- `long`: the same tensors, ℓ(b) = 6 s, batches of 1 — requests that are
  still running when a SIGTERM's grace period ends.

It is started like `bench.daemon_launcher.start_daemon` (same handle, same
readiness wait, `stop_daemon` stops it), with two additions the attacks
need: an open-file limit set in the child before it executes (as `ulimit -n`
would), and the user's extra settings (environment variables) on top.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path

from bench.daemon_launcher import DaemonHandle, free_port, start_server

NORMAL_MODEL = "tiny"
LONG_MODEL = "long"
LONG_BATCH_S = 6.0  # longer than SHUTDOWN_GRACE_S + 1 s: still running when uvicorn gives up

_MODEL = (
    "backend: emulated\n"
    "max_batch_size: {batch}\n"
    "slo_ms: {slo}\n"
    "profile: {{alpha_ms: {alpha}, beta_ms: {beta}}}\n"
    "devices: [emulated]\n"
    "inputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]\n"
    "outputs: [{{name: y, datatype: FP32, shape: [-1, 4]}}]\n"
)

# Settings every attack's daemon starts with (the user's --set wins).
# GRPC_PORT 0: the attacks are on the HTTP front door (and a daemon must
# not fail to start because another holds the default gRPC port).
BASE_ENV = {"CPU_SLICES": "0", "EMULATED_DEVICES": "2", "POLICY": "symphony", "GRPC_PORT": "0"}


def write_repository(root: Path) -> Path:
    models = {
        NORMAL_MODEL: _MODEL.format(batch=8, slo=1000, alpha=0.05, beta=0.5),
        LONG_MODEL: _MODEL.format(batch=1, slo=60000, alpha=0.0, beta=LONG_BATCH_S * 1000),
    }
    for name, config in models.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.yaml").write_text(config)
    return root


def _limit_files(count: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child, between fork and exec
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))

    return apply


def launch(
    repository: Path,
    env: dict[str, str],
    *,
    nofile: int | None = None,
    startup_timeout_s: float = 60.0,
    command: str = "serve",
) -> DaemonHandle:
    """Start the daemon on a free loopback port with `env` over this
    process's environment (and at most `nofile` open files); return once
    /v2/health/ready answers 200. `command`: "serve" (`python -m app serve`)
    or "uvicorn" (plain `uvicorn app.main:app`, the repository in
    MODEL_REPOSITORY)."""
    port = free_port()
    if command == "uvicorn":
        argv = [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port)]
        argv += ["--log-level", "warning"]
        env = {**env, "MODEL_REPOSITORY": str(repository.resolve())}
    else:
        argv = [sys.executable, "-m", "app", "serve", "--port", str(port)]
        argv += ["--repository", str(repository.resolve()), "--log-level", "warning"]
    return start_server(
        argv,
        port,
        dict(os.environ, **env),
        startup_timeout_s=startup_timeout_s,
        log_prefix="attack-daemon-",
        preexec_fn=_limit_files(nofile) if nofile is not None else None,
    )


_RESPAWNED = re.compile(r"executor (\S+) respawned .*? again ([0-9.]+) s after it failed")


def respawns(log_text: str) -> list[tuple[str, float]]:
    """(device, seconds it was down) for every executor respawn the log reports."""
    return [(device, float(seconds)) for device, seconds in _RESPAWNED.findall(log_text)]


def traceback_count(log_text: str) -> int:
    return log_text.count("Traceback (most recent call last)")
