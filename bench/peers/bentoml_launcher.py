"""Start and stop the BentoML peer (bench/peers/bentoml_service.py) on loopback.

BentoML runs in its **own virtual environment**, not the server's: BentoML
1.4.40 needs ``opentelemetry-instrumentation-*`` 0.66b1, which pin
``opentelemetry-api``/``-sdk`` 1.45.1 and ``-semantic-conventions`` 0.66b1,
while the server's environment has 1.45.2/0.66b2 (through FastAPI and Ray,
whose ``opentelemetry-exporter-prometheus`` needs ``opentelemetry-sdk~=1.45.2``);
installing it there would downgrade them. Create it once::

    python -m bench.peers.bentoml_launcher --setup      # .venv-peers/bentoml

(bentoml, numpy, onnxruntime and PyYAML, the last three at the versions of the
calling interpreter; the service imports the daemon's ``app`` package from the
repository through PYTHONPATH). Then, from Python (the comparison script)::

    handle = start_bentoml(repository, port, devices=1, max_latency_ms=25)
    ...  # POST http://127.0.0.1:{port}/infer/<model>  (bench.peers.bentoml_grid)
    stop(handle)

or from a shell (serves until Ctrl-C)::

    python -m bench.peers.bentoml_launcher --repository bench/repositories/live \\
        --port 8200 --devices 1 --models resnet50-t4 [--max-latency-ms 25] \\
        [--max-batch-size 32]

`start_bentoml` writes the service's configuration (`plan_service`) to a JSON
file, starts ``python -m bentoml serve bench.peers.bentoml_service:PeerService``
with the peer's interpreter in a new session (its own process group, sent
SIGTERM if the caller dies), and returns once ``GET /readyz`` answers 200:
``startup_s`` is the time from spawn to that answer. `stop` sends SIGTERM to
the process group, waits, SIGKILLs what is left of the session, and reports
any leftover it had to kill.

Bundled ONNX models' files are built here, in the caller's environment (the
peer's has no ``onnx`` package), before the service starts.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import venv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.peers.session import end_session, free_port, set_pdeathsig

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_VENV = REPO_ROOT / ".venv-peers" / "bentoml"
BENTOML_VERSION = "1.4.40"
SERVICE = "bench.peers.bentoml_service:PeerService"
# Installed beside bentoml at the calling interpreter's versions, so the peer
# runs the same numerics as the daemon.
SHARED_PACKAGES = ("numpy", "onnxruntime", "PyYAML")


# --------------------------------------------------------------------- the venv


def setup_venv(path: Path = PEER_VENV, *, quiet: bool = True) -> Path:
    """Create (or update) the peer's virtual environment at `path` with
    ``bentoml==BENTOML_VERSION`` and SHARED_PACKAGES; returns its interpreter."""
    path = Path(path)
    if not peer_python_path(path).exists():
        venv.EnvBuilder(with_pip=True, clear=False).create(path)
    pins = [f"bentoml=={BENTOML_VERSION}"]
    for name in SHARED_PACKAGES:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(name)
    cmd = [str(peer_python_path(path)), "-m", "pip", "install", *(["-q"] if quiet else []), *pins]
    subprocess.run(cmd, check=True)
    return peer_python_path(path)


def peer_python_path(path: Path = PEER_VENV) -> Path:
    return Path(path) / "bin" / "python"


def peer_python(path: Path = PEER_VENV) -> Path:
    """The peer's interpreter; a clear error when the venv or bentoml is missing."""
    python = peer_python_path(path)
    setup = "python -m bench.peers.bentoml_launcher --setup"
    if not python.exists():
        raise RuntimeError(f"no BentoML peer environment at {path}: create it with `{setup}`")
    probe = subprocess.run(
        [str(python), "-c", "import bentoml; print(bentoml.__version__)"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        raise RuntimeError(f"bentoml is not importable with {python}; run `{setup}`")
    return python


# ---------------------------------------------------------------------- the plan


def _per_model(value: Any, name: str, default: Any) -> Any:
    if isinstance(value, Mapping):
        return value.get(name, default)
    return default if value is None else value


def api_name(model: str) -> str:
    """The API method's name for `model` (an identifier)."""
    return "infer_" + "".join(c if c.isalnum() else "_" for c in model)


def plan_service(
    repository: Path,
    *,
    devices: int,
    max_latency_ms: float | Mapping[str, float] | None = None,
    max_batch_size: int | Mapping[str, int] | None = None,
    models: Sequence[str] | None = None,
    cpu_threads: int = 1,
    cpu_slices: int = 1,
    max_concurrency: int | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """The service's configuration (the JSON `bentoml_service` reads).

    `max_latency_ms` / `max_batch_size` are one value for every model or a
    mapping by model name; None means the model's SLO and its configured
    ``max_batch_size`` (a larger batch is capped at it, as the daemon never runs
    one either). Workers: `devices` for emulated models, `cpu_slices` for ONNX
    models; one service serves one kind (start two for a mix)."""
    from app.repository.loader import load_repository

    index = load_repository(Path(repository))
    if models:
        missing = [m for m in models if m not in index.models]
        if missing:
            raise ValueError(
                f"models {missing} are not in {repository} "
                f"(it has {sorted(index.models)}; errors: {index.errors})"
            )
        configs = [index.models[m] for m in models]
    else:
        configs = list(index.models.values())
    if not configs:
        raise ValueError(f"no servable model in {repository} (errors: {index.errors})")
    kinds = {"emulated" if c.backend == "emulated" else c.backend for c in configs}
    if kinds - {"emulated", "onnx"}:
        raise ValueError(f"the BentoML peer serves emulated and ONNX models, not {sorted(kinds)}")
    if len(kinds) != 1:
        raise ValueError(
            "one BentoML service serves emulated or ONNX models, not both "
            f"({[(c.name, c.backend) for c in configs]}); start one per kind"
        )
    device_kind = "emulated" if kinds == {"emulated"} else "cpu"
    workers = int(devices) if device_kind == "emulated" else int(cpu_slices)
    if workers < 1:
        raise ValueError(f"need at least one worker (devices / cpu_slices), got {workers}")
    planned = []
    for config in configs:
        if len(config.inputs) != 1 or len(config.outputs) != 1:
            raise ValueError(
                f"model {config.name!r}: a batchable BentoML API takes one input and gives "
                f"one output; it has {len(config.inputs)} and {len(config.outputs)}"
            )
        if config.inputs[0].variable:
            raise ValueError(f"model {config.name!r}: variable input shapes are not supported")
        latency = float(_per_model(max_latency_ms, config.name, config.slo_ms))
        if latency <= 0:
            raise ValueError(f"model {config.name!r}: max_latency_ms must be > 0, got {latency}")
        mbs = int(_per_model(max_batch_size, config.name, config.max_batch_size))
        if mbs < 1:
            raise ValueError(f"model {config.name!r}: max_batch_size must be ≥ 1, got {mbs}")
        planned.append(
            {
                "name": config.name,
                "directory": str(Path(config.directory).resolve()),
                "api": api_name(config.name),
                "route": f"/infer/{config.name}",
                "input": config.inputs[0].name,
                "max_batch_size": min(mbs, config.max_batch_size),
                "max_latency_ms": latency,
            }
        )
    return {
        "device_kind": device_kind,
        "workers": workers,
        "threads": int(cpu_threads) if device_kind == "cpu" else 1,
        "models": planned,
        "traffic": {"max_concurrency": max_concurrency, "timeout": timeout_s},
    }


# ------------------------------------------------------------------ the process


@dataclass
class BentoMLHandle:
    """A running BentoML peer started by `start_bentoml`."""

    process: subprocess.Popen
    port: int
    url: str
    startup_s: float  # spawn → first 200 from GET /readyz
    config: dict[str, Any] = field(default_factory=dict)  # plan_service's output
    log_path: Path | None = None
    _log: Any = None
    _tmp_dir: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def summary(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "pid": self.pid,
            "startup_s": round(self.startup_s, 3),
            "bentoml_version": BENTOML_VERSION,
            "config": self.config,
            "log_path": str(self.log_path) if self.log_path else None,
        }


def _build_bundled(repository: Path, names: Sequence[str] | None) -> None:
    """Build the bundled models' generated files (a no-op elsewhere)."""
    from app.repository.bundled import ensure_bundled_models

    ensure_bundled_models(Path(repository), names)


def start_bentoml(
    repository: Path,
    port: int,
    *,
    devices: int,
    max_latency_ms: float | Mapping[str, float] | None = None,
    max_batch_size: int | Mapping[str, int] | None = None,
    models: Sequence[str] | None = None,
    cpu_threads: int = 1,
    cpu_slices: int = 1,
    max_concurrency: int | None = None,
    timeout_s: float | None = None,
    startup_timeout_s: float = 120.0,
    log_path: Path | None = None,
    venv_path: Path = PEER_VENV,
) -> BentoMLHandle:
    """Serve `repository` with BentoML on 127.0.0.1:`port` (see `plan_service`
    for the knobs); returns once ``GET /readyz`` answers 200. Raises
    RuntimeError (with the log's tail) when it does not come up."""
    python = peer_python(venv_path)
    _build_bundled(Path(repository), models)
    config = plan_service(
        repository,
        devices=devices,
        max_latency_ms=max_latency_ms,
        max_batch_size=max_batch_size,
        models=models,
        cpu_threads=cpu_threads,
        cpu_slices=cpu_slices,
        max_concurrency=max_concurrency,
        timeout_s=timeout_s,
    )
    tmp = Path(tempfile.mkdtemp(prefix="bentoml-peer-"))
    config_path = tmp / "service.json"
    config_path.write_text(json.dumps(config, indent=1))
    log_path = Path(log_path) if log_path else tmp / "bentoml.log"
    env = dict(os.environ)
    env.update(
        {
            "BENTOML_PEER_CONFIG": str(config_path),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
            "BENTOML_HOME": str(tmp / "home"),  # its model/bento store: private, throwaway
            "BENTOML_DO_NOT_TRACK": "True",
            # The caller's venv must not leak into the peer's interpreter.
            "VIRTUAL_ENV": str(Path(venv_path).resolve()),
        }
    )
    env.pop("PYTHONHOME", None)
    cmd = [str(python), "-m", "bentoml", "serve", SERVICE]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    log = open(log_path, "wb")  # noqa: SIM115 - kept open for the child's lifetime
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(REPO_ROOT),
        env=env,
        start_new_session=True,
        preexec_fn=set_pdeathsig,
    )
    url = f"http://127.0.0.1:{port}"
    handle = BentoMLHandle(proc, port, url, 0.0, config, log_path, log, tmp)
    deadline = t0 + startup_timeout_s
    last = ""
    with httpx.Client(timeout=2.0) as client:
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                why = (
                    f"exited with {proc.returncode}"
                    if proc.poll() is not None
                    else f"not ready in {startup_timeout_s:.0f} s ({last})"
                )
                stop(handle)
                raise RuntimeError(f"BentoML {why}; log {log_path}:\n{_tail(log_path)}")
            try:
                r = client.get(f"{url}/readyz")
                if r.status_code == 200:
                    break
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            time.sleep(0.05)
    handle.startup_s = time.monotonic() - t0
    return handle


def _tail(path: Path, n: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-n:].decode(errors="replace")
    return ""


def stop(handle: BentoMLHandle, timeout_s: float = 20.0) -> dict[str, Any]:
    """SIGTERM the peer's process group, wait, then SIGKILL anything left in its
    session. Returns {"stop_s", "killed": [leftover commands]}."""
    proc = handle.process
    t0 = time.monotonic()
    killed = end_session(proc, timeout_s, whole_group=True)
    if handle._log is not None:
        handle._log.close()
        handle._log = None
    # Keep the log (and its directory) only when something went wrong.
    failed = proc.returncode not in (0, -signal.SIGTERM) or killed
    if handle._tmp_dir is not None and not failed:
        shutil.rmtree(handle._tmp_dir, ignore_errors=True)
        if handle.log_path is not None and handle._tmp_dir in handle.log_path.parents:
            handle.log_path = None
        handle._tmp_dir = None
    return {"stop_s": round(time.monotonic() - t0, 3), "killed": killed}


# --------------------------------------------------------------------------- CLI


def parse_per_model(text: str, kind: type) -> Any:
    """``8`` → 8; ``a=8,b=4`` → {"a": 8, "b": 4} (values converted by `kind`)."""
    if "=" not in text:
        return kind(text)
    out = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"expected MODEL=VALUE, got {part!r}")
        out[name.strip()] = kind(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers.bentoml_launcher",
        description="Serve a model repository with BentoML's adaptive batching on 127.0.0.1.",
    )
    p.add_argument("--setup", action="store_true", help="create the peer's venv and exit")
    p.add_argument("--venv", type=Path, default=PEER_VENV, help="the peer's venv")
    p.add_argument("--repository", type=Path, help="model repository directory")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    p.add_argument("--devices", type=int, default=1, help="emulated devices (workers)")
    p.add_argument(
        "--max-latency-ms",
        type=lambda t: parse_per_model(t, float),
        default=None,
        help="N or MODEL=N,... (default: each model's SLO)",
    )
    p.add_argument(
        "--max-batch-size",
        type=lambda t: parse_per_model(t, int),
        default=None,
        help="N or MODEL=N,... (default: each model's max_batch_size)",
    )
    p.add_argument("--models", default="", help="comma-separated models (default: all)")
    p.add_argument("--cpu-threads", type=int, default=1, help="ONNX intra-op threads")
    p.add_argument("--cpu-slices", type=int, default=1, help="workers for ONNX models")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--timeout-s", type=float, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.setup:
        print(f"peer interpreter: {setup_venv(args.venv, quiet=False)}")
        return 0
    if args.repository is None:
        raise SystemExit("--repository is required (or --setup)")
    handle = start_bentoml(
        args.repository,
        args.port or free_port(),
        devices=args.devices,
        max_latency_ms=args.max_latency_ms,
        max_batch_size=args.max_batch_size,
        models=[m for m in args.models.split(",") if m] or None,
        cpu_threads=args.cpu_threads,
        cpu_slices=args.cpu_slices,
        max_concurrency=args.max_concurrency,
        timeout_s=args.timeout_s,
        venv_path=args.venv,
    )
    print("READY " + json.dumps(handle.summary()), flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        while not done.wait(0.5) and handle.process.poll() is None:
            pass
    finally:
        print(json.dumps(stop(handle)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
