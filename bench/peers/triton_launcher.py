"""Start and stop the real Triton Inference Server on loopback, serving one of our repositories.

From Python (the comparison script)::

    handle = start_triton(Path("bench/repositories/live"), port, devices=1,
                          max_queue_delay_us=3000, queue_timeout_us=18_000,
                          models=["resnet50-t4"])
    path, body = kserve_request("resnet50-t4", inputs_meta, slo_ms=25, seed=1)
    ...  # POST {handle.url}{path}: KServe v2 JSON
    stop(handle)

or from a shell (prints ``READY {json}``, serves until Ctrl-C)::

    python -m bench.peers.triton_launcher --repository bench/repositories/live \\
        --port 8200 --devices 1 --models resnet50-t4 \\
        --max-queue-delay-us 3000 --queue-timeout-us 18000

The server is the ``tritonserver`` binary (2.51) that the ``nvidia-pytriton``
wheel bundles, run directly — pytriton's own Python API is not used. The
launcher writes the Triton repository for our models into a run directory
(bench/peers/triton_repository.py), a backend directory holding the wheel's
Python backend with the stub built for this interpreter's Python version, and
starts::

    tritonserver --model-repository RUN/models --backend-directory RUN/backends
        --http-port PORT --allow-grpc false --allow-metrics false
        --disable-auto-complete-config --exit-timeout-secs N

in its own session (killed if the caller dies). `start_triton` returns once
``GET /v2/health/ready`` answers 200 (every model loaded, one stub process
per instance); ``startup_s`` is the wall time from spawn to then.

The Python-backend stub is a separate program that embeds libpython. The
wheel's stub links ``libpython3.X.so.1.0``; the dynamic loader would take the
system's copy, which is not this interpreter (pyenv's, say) and does not see
its packages. So the launcher puts this interpreter's ``LIBDIR`` (sysconfig)
first on ``LD_LIBRARY_PATH`` (a clear error if no shared libpython is there:
an interpreter built without ``--enable-shared`` cannot host the stub). The
stub's Python ignores ``PYTHONPATH``; the generated ``model.py`` puts the
repository root (for ``app`` and ``bench``) and this environment's
site-packages (numpy, onnxruntime) on its ``sys.path`` instead. CUDA warnings at start-up
are harmless: the wheel's server is built with GPU support and finds none.

`stop` sends SIGTERM (Triton unloads the models and exits, waiting at most
``--exit-timeout-secs`` for requests in flight), then SIGKILLs whatever is left
of the session (server and stubs) after `timeout_s`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.peers.session import end_session, free_port, set_pdeathsig
from bench.peers.triton_repository import write_triton_repository

READY_PREFIX = "READY "
INSTALL_HINT = "pip install --no-deps nvidia-pytriton==0.7.0"


class TritonUnavailable(RuntimeError):
    """The Triton binary or what its Python backend needs is missing here."""


# ------------------------------------------------------------------ the binary


@dataclass(frozen=True)
class TritonInstall:
    """Where the wheel's server, Python backend and stub are."""

    server: Path  # pytriton/tritonserver/bin/tritonserver
    python_backend: Path  # pytriton/tritonserver/backends/python
    stub: Path  # pytriton/tritonserver/python_backend_stubs/3.X/triton_python_backend_stub
    libpython_dir: Path  # this interpreter's LIBDIR, for LD_LIBRARY_PATH


def find_triton() -> TritonInstall:
    """The ``nvidia-pytriton`` wheel's ``tritonserver`` and the Python backend
    for this interpreter; raises TritonUnavailable saying what is missing."""
    spec = importlib.util.find_spec("pytriton")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise TritonUnavailable(f"the Triton peer needs the nvidia-pytriton wheel: {INSTALL_HINT}")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = TritonInstall(
        server=root / "bin" / "tritonserver",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
        libpython_dir=libpython_dir(),
    )
    for path in (install.server, install.python_backend / "libtriton_python.so", install.stub):
        if not path.exists():
            raise TritonUnavailable(
                f"{path} is missing: the nvidia-pytriton wheel has no Triton for Python {version} "
                f"here (reinstall: {INSTALL_HINT})"
            )
    return install


def libpython_dir() -> Path:
    """The directory holding this interpreter's shared libpython (sysconfig
    LIBDIR), which the stub must load instead of the system's."""
    name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    candidates = [sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LIBPL")]
    for directory in filter(None, candidates):
        if name and (Path(directory) / name).is_file():
            return Path(directory)
    raise TritonUnavailable(
        f"no shared libpython ({name or 'libpython' + sys.version[:4] + '.so'}) in "
        f"{[c for c in candidates if c]}: Triton's Python-backend stub embeds this "
        f"interpreter ({sys.executable}) and needs it built with --enable-shared"
    )


def backend_directory(install: TritonInstall, target: Path) -> Path:
    """A ``--backend-directory`` whose ``python`` backend runs this Python's stub
    (the wheel keeps one stub per Python version beside the backend; the
    backend looks for ``triton_python_backend_stub`` next to itself)."""
    python = target / "python"
    python.mkdir(parents=True)
    for item in install.python_backend.iterdir():
        (python / item.name).symlink_to(item)
    (python / "triton_python_backend_stub").symlink_to(install.stub)
    return target


def stub_environment(
    install: TritonInstall, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The server's environment: this interpreter's libpython first on
    LD_LIBRARY_PATH (the stub's Python ignores PYTHONPATH; the generated
    model.py sets its sys.path)."""
    env = dict(os.environ if base is None else base)
    libs = [str(install.libpython_dir), env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in libs if p)
    return env


# ------------------------------------------------------------------- requests


_RANDOM_KINDS = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}

# Headers for the requests `kserve_request` builds. Triton gzips its answer
# when the client accepts it (httpx does by default), spending CPU on both
# sides that the daemon's answers do not cost: ask for none.
KSERVE_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


def kserve_request(
    model: str, inputs_meta: Sequence[Mapping[str, Any]], slo_ms: float, seed: int = 0
) -> tuple[str, bytes]:
    """(path, JSON body) of one KServe v2 inference request with batch dimension 1.

    `inputs_meta` is the model's v2 input metadata (``[{"name", "datatype",
    "shape"}]``, the batch dimension -1 or left out); data are random as in
    `bench.loadgen.targets.build_body` (floats in [-1, 1), small integers,
    booleans). `slo_ms` is taken for the same call as `build_body` and not
    sent: Triton has no deadlines, only the queue policy's timeout of the
    model's config. Send it with `KSERVE_HEADERS`.

    Triton answers 200 with ``{"model_name", "model_version", "outputs": [{"name",
    "datatype", "shape", "data"}]}``; a request its queue policy REJECTs gets
    503 ``{"error": "Request timeout expired"}``, sent when the batcher next
    looks at the queue (when the running batch ends), not at the timeout."""
    del slo_ms
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in inputs_meta:
        name, dtype, shape = spec["name"], str(spec["datatype"]).upper(), list(spec["shape"])
        if shape and shape[0] == -1:
            shape = shape[1:]
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"model {model!r}: input {name!r} has a variable dimension {shape}")
        dims = [1, *(int(d) for d in shape)]
        if dtype in _RANDOM_KINDS:
            values = rng.uniform(-1.0, 1.0, dims).astype(_RANDOM_KINDS[dtype]).astype(np.float64)
            data = np.round(values, 6).reshape(-1).tolist()
        elif dtype.startswith(("INT", "UINT")):
            data = rng.integers(0, 10, dims).reshape(-1).tolist()
        elif dtype == "BOOL":
            data = (rng.random(dims) < 0.5).reshape(-1).tolist()
        else:
            raise ValueError(f"model {model!r}: input {name!r} has datatype {dtype}, unsupported")
        tensors.append({"name": name, "shape": dims, "datatype": dtype, "data": data})
    body = json.dumps({"inputs": tensors}, separators=(",", ":")).encode()
    return f"/v2/models/{model}/infer", body


# ---------------------------------------------------------------- the process


@dataclass
class TritonHandle:
    """A running Triton started by `start_triton`."""

    process: subprocess.Popen
    port: int
    url: str
    startup_s: float  # wall time from spawn until GET /v2/health/ready answered 200
    models: list[dict[str, Any]] = field(default_factory=list)  # TritonModel.to_dict()
    log_path: Path | None = None
    run_dir: Path | None = None  # repository, backends, locks (removed by stop)
    _log: Any = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def summary(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "port": self.port,
            "pid": self.pid,
            "startup_s": round(self.startup_s, 3),
            "models": self.models,
            "log_path": str(self.log_path) if self.log_path else None,
        }


def _tail(path: Path | None, n: int = 4000) -> str:
    with contextlib.suppress(OSError, TypeError):
        return Path(path).read_bytes()[-n:].decode(errors="replace")  # type: ignore[arg-type]
    return ""


def start_triton(
    repository: Path,
    port: int,
    *,
    devices: int,
    max_queue_delay_us: int | float | Mapping[str, int | float] = 0,
    queue_timeout_us: int | float | Mapping[str, int | float | None] | None = None,
    models: Sequence[str] | None = None,
    max_batch_size: int | Mapping[str, int] | None = None,
    preferred_batch_sizes: Sequence[int] = (),
    cpu_threads: int = 1,
    cpu_slices: int = 1,
    device_sharing: str = "shared",
    http_threads: int | None = None,
    exit_timeout_s: int = 5,
    startup_timeout_s: float = 120.0,
    log_path: Path | None = None,
) -> TritonHandle:
    """Start Triton on 127.0.0.1:`port` serving `repository`'s models (only
    `models`, when given; settings as `bench.peers.triton_repository.plan_models`);
    returns once it is ready. Raises TritonUnavailable when the binary or a
    shared libpython is missing, RuntimeError (with the log's tail) when the
    server exits or is not ready within `startup_timeout_s`."""
    install = find_triton()
    run_dir = Path(tempfile.mkdtemp(prefix="triton-peer-"))
    try:
        plans = write_triton_repository(
            repository,
            run_dir / "models",
            devices=devices,
            max_queue_delay_us=max_queue_delay_us,
            queue_timeout_us=queue_timeout_us,
            max_batch_size=max_batch_size,
            preferred_batch_sizes=preferred_batch_sizes,
            cpu_threads=cpu_threads,
            cpu_slices=cpu_slices,
            models=models,
            device_sharing=device_sharing,
            lock_directory=run_dir / "devices",
        )
        backends = backend_directory(install, run_dir / "backends")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    cmd = [
        str(install.server),
        f"--model-repository={run_dir / 'models'}",
        f"--backend-directory={backends}",
        "--http-address=127.0.0.1",
        f"--http-port={int(port)}",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--allow-sagemaker=false",
        "--allow-vertex-ai=false",
        "--disable-auto-complete-config",
        "--strict-readiness=true",
        f"--exit-timeout-secs={int(exit_timeout_s)}",
    ]
    if http_threads:
        cmd.append(f"--http-thread-count={int(http_threads)}")
    log_path = Path(log_path) if log_path else run_dir / "triton.log"
    log = open(log_path, "wb")  # noqa: SIM115 - kept open for the server's lifetime
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(run_dir),
        env=stub_environment(install),
        start_new_session=True,
        preexec_fn=set_pdeathsig,
    )
    url = f"http://127.0.0.1:{int(port)}"
    handle = TritonHandle(
        proc, int(port), url, 0.0, [p.to_dict() for p in plans], log_path, run_dir, log
    )
    try:
        handle.startup_s = _wait_ready(proc, url, t0, startup_timeout_s)
    except RuntimeError as exc:
        stop(handle, keep_run_dir=True)
        raise RuntimeError(f"{exc}; log {log_path}:\n{_tail(log_path)}") from None
    except BaseException:  # interrupted while starting: no server may outlive this
        stop(handle)
        raise
    return handle


def _wait_ready(proc: subprocess.Popen, url: str, t0: float, timeout_s: float) -> float:
    """Poll ``GET /v2/health/ready`` until 200; seconds since `t0`."""
    deadline = t0 + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {proc.returncode} while starting")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/v2/health/ready").status_code == 200:
                    return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver not ready in {timeout_s:.0f} s")
            time.sleep(0.02)


def stop(
    handle: TritonHandle, timeout_s: float = 30.0, *, keep_run_dir: bool = False
) -> dict[str, Any]:
    """SIGTERM the server, wait up to `timeout_s`, then SIGKILL what is left of
    its session (server and stubs). Removes the run directory unless the server
    had to be killed or `keep_run_dir`. Returns {"stop_s", "returncode", "killed"}."""
    proc = handle.process
    t0 = time.monotonic()
    killed = end_session(proc, timeout_s, poll_s=0.05)
    if handle._log is not None:
        handle._log.close()
        handle._log = None
    if handle.run_dir is not None and not keep_run_dir and not killed:
        if handle.log_path is not None and handle.run_dir in handle.log_path.parents:
            handle.log_path = None
        shutil.rmtree(handle.run_dir, ignore_errors=True)
        handle.run_dir = None
    return {
        "stop_s": round(time.monotonic() - t0, 3),
        "returncode": proc.returncode,
        "killed": killed,
    }


# ------------------------------------------------------------------------ CLI


def _us_option(text: str) -> int | dict[str, int]:
    """``3000`` → 3000; ``a=3000,b=0`` → {"a": 3000, "b": 0} (microseconds)."""
    if "=" not in text:
        return int(text)
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = int(value)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers.triton_launcher",
        description="Serve a model repository with Triton Inference Server on 127.0.0.1 "
        "(KServe v2 HTTP API, Python backend).",
    )
    p.add_argument("--repository", required=True, help="our model repository directory")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    p.add_argument("--devices", type=int, default=1, help="emulated devices (instances per model)")
    p.add_argument("--models", default="", help="comma-separated models to serve (default: all)")
    p.add_argument("--max-queue-delay-us", type=_us_option, default=0, help="N, or MODEL=N,MODEL=N")
    p.add_argument(
        "--queue-timeout-us",
        type=_us_option,
        default=None,
        help="REJECT timeout: N, or MODEL=N,... (default: no queue policy)",
    )
    p.add_argument("--max-batch-size", type=_us_option, default=None, help="N, or MODEL=N,...")
    p.add_argument("--preferred-batch-sizes", default="", help="comma-separated, e.g. 4,8")
    p.add_argument("--cpu-threads", type=int, default=1, help="ONNX intra-op threads")
    p.add_argument("--cpu-slices", type=int, default=1, help="ONNX instances per model")
    p.add_argument("--device-sharing", choices=("shared", "partition"), default="shared")
    p.add_argument("--startup-timeout-s", type=float, default=120.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    handle = start_triton(
        Path(args.repository),
        args.port or free_port(),
        devices=args.devices,
        max_queue_delay_us=args.max_queue_delay_us,
        queue_timeout_us=args.queue_timeout_us,
        models=[m for m in args.models.split(",") if m] or None,
        max_batch_size=args.max_batch_size,
        preferred_batch_sizes=[int(b) for b in args.preferred_batch_sizes.split(",") if b],
        cpu_threads=args.cpu_threads,
        cpu_slices=args.cpu_slices,
        device_sharing=args.device_sharing,
        startup_timeout_s=args.startup_timeout_s,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print(READY_PREFIX + json.dumps(handle.summary()), flush=True)
    try:
        while not stopping and handle.process.poll() is None:
            time.sleep(0.2)
    finally:
        result = stop(handle)
    print(f"STOPPED {json.dumps(result)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
