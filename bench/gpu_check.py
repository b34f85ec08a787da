"""The daemon on a real GPU: one prepared run (docs/gpu.md).

    python -m bench.gpu_check [--wheels DIR] [--out DIR] [--budget-s 480]
    python -m bench.gpu_check --dry-run --out /tmp/gpu-check   # the CPU dry run

On a machine where torch sees a CUDA device it runs, within `--budget-s`:

1. `wheels`: the modules the daemon and the load generator import that are
   missing are installed from `--wheels DIR` (`pip install --no-index
   --find-links DIR`), before anything of the project is imported;
2. `environment`: torch, CUDA, the GPU, onnxruntime's providers, cores;
3. `models`: a ResNet-50 (torchvision's with random weights when it imports,
   else the same layout in plain torch) and the bundled `torchcnn`, saved as
   TorchScript into a repository of their own (max batch 64);
4. `profile`: ℓ(b) of both on `cuda:0` for b = 1…64 through the Torch
   backend as the executor runs it, and the linear fit (α, β, r²); then the
   served ResNet-50 (112² images: a 224² one is 1.2 MB of JSON a request);
5. `preemption`: FLEX's means, a batch stopped at an exit point through a
   real executor on `cuda:0`: stop delay (median, p99) against the batch's time;
6. `ceiling`: the front door's ceiling with ℓ ≈ 0 (`bench.compare`'s
   `ceiling` setup), the load generator on several worker processes; the
   capacity searches start below it;
7. `capacity_<policy>`: the daemon (Torch backend on the GPU) serving
   `resnet50` at an SLO of 3×ℓ(1) (at least `--min-slo-ms`), capacity by
   bisection with `bench.loadgen`, for symphony, triton, clockwork and flex;
8. `mps`: the same daemon with `cuda:0` split into two shares, through MPS
   when `nvidia-cuda-mps-control` is on PATH (else says so);
   `two_executors`: the same two shares without MPS (time-shared).

Each step records its result, or its failure or why it was skipped, in one
JSON (`gpu_check.json`) and a short table (`gpu_check.md`) under `--out`
(default `$OUT`, else bench/results/gpu-check); a failing step does not stop
the others, and a step that would start after the budget is spent is
skipped. Without CUDA (or with `--dry-run`) every step that can runs on the
CPU with tiny sizes and short probes and the GPU-only ones say "skipped: no
CUDA"; tests/test_gpu_check.py runs it so.

`python -m bench.gpu_check serve …` is `python -m app serve …` counting
GPUs with torch when onnxruntime has no CUDA provider (the daemon counts
them through onnxruntime, app/runtime/devices.py): the capacity steps start
the daemon so.

Only the standard library is imported at the top: the project is imported
after the wheels step.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Set for the daemon of the `two_executors` step: its GPU shares without MPS.
NO_MPS = "GPU_CHECK_NO_MPS"
# The SLO is 3×ℓ(1) of the served model, but never below this: the daemon's
# own answer path (HTTP, the deadline margin, IPC; a median of 1-3 ms and a
# p99 of several on the 2-core box, BENCHMARKS.md) would make any smaller
# SLO unmeetable whatever the device.
MIN_SLO_MS = 15.0
# On the CPU dry run the load generator, the daemon and the model share a
# few busy cores: the ceiling's SLO (bench/workloads/live-ceiling.yaml).
DRY_MIN_SLO_MS = 50.0
# How far past its budget a run may go before the step in progress is stopped.
HARD_STOP_S = 45
POLICIES = ("symphony", "triton", "clockwork", "flex")
# import name → distribution: what `python -m app serve` and bench.loadgen import.
NEEDED = {
    "numpy": "numpy",
    "yaml": "pyyaml",
    "sortedcontainers": "sortedcontainers",
    "rich": "rich",
    "fastapi": "fastapi",
    "starlette": "starlette",
    "pydantic": "pydantic",
    "uvicorn": "uvicorn",
    "httptools": "httptools",
    "orjson": "orjson",
    "prometheus_client": "prometheus-client",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "httpx": "httpx",
}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def deadline(self, reserve_s: float = 0.0) -> float:
        """time.monotonic() by which a step should end, leaving `reserve_s`."""
        return self.started + self.seconds - reserve_s


class Run:
    """The steps of one run and what each recorded."""

    def __init__(
        self, budget: Budget, cuda: bool, on_record: Callable[[], None] = lambda: None
    ) -> None:
        self.budget = budget
        self.cuda = cuda
        self.on_record = on_record
        self.steps: dict[str, dict[str, Any]] = {}

    def step(
        self,
        name: str,
        fn: Callable[[], dict[str, Any]],
        *,
        needs_cuda: bool = False,
        min_s: float = 0.0,
        needs: tuple[str, ...] = (),
    ) -> dict[str, Any] | None:
        """Run `fn` as step `name`; its result, or None when it failed or
        was skipped (recorded either way)."""
        record: dict[str, Any]
        failed = [n for n in needs if self.steps.get(n, {}).get("status") != "ok"]
        if needs_cuda and not self.cuda:
            record = {"status": "skipped", "reason": "skipped: no CUDA"}
        elif failed:
            record = {"status": "skipped", "reason": f"skipped: needs {', '.join(failed)}"}
        elif self.budget.left() < min_s:
            record = {
                "status": "skipped",
                "reason": f"skipped: time budget ({self.budget.left():.0f} s left, "
                f"needs {min_s:.0f} s)",
            }
        else:
            print(f"gpu_check: {name} ({self.budget.left():.0f} s left)", file=sys.stderr)
            t0 = time.monotonic()
            try:
                record = {"status": "ok", **fn()}
            except Exception as exc:
                record = {
                    "status": "failed",
                    "error": _clip(f"{type(exc).__name__}: {exc}"),
                    "traceback": traceback.format_exc()[-3000:],
                }
            record["seconds"] = round(time.monotonic() - t0, 2)
            print(f"gpu_check: {name}: {record['status']}", file=sys.stderr)
        self.steps[name] = record
        self.on_record()
        return record if record["status"] == "ok" else None


def _clip(text: str, head: int = 400, tail: int = 1600) -> str:
    """`text`'s start and end (a daemon's log ends with why it stopped)."""
    return text if len(text) <= head + tail else f"{text[:head]} … {text[-tail:]}"


# ------------------------------------------------------------------ wheels
def missing_modules() -> dict[str, str]:
    return {m: d for m, d in NEEDED.items() if importlib.util.find_spec(m) is None}


def install_wheels(wheels: Path | None) -> dict[str, Any]:
    missing = missing_modules()
    if not missing:
        return {"missing": [], "installed": []}
    if wheels is None:
        raise RuntimeError(
            f"missing {sorted(missing.values())} and no --wheels DIR to install them from"
        )
    names = sorted(set(missing.values()))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
    done = subprocess.run([*cmd, *names], capture_output=True, text=True, timeout=300, check=False)
    importlib.invalidate_caches()
    still = missing_modules()
    if done.returncode != 0 or still:
        raise RuntimeError(
            f"pip install {names} from {wheels}: exit {done.returncode}, still missing "
            f"{sorted(still.values())}: {done.stderr[-1500:]}"
        )
    return {"missing": names, "installed": names, "from": str(wheels)}


# ------------------------------------------------------------- environment
def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "mps_control": shutil.which("nvidia-cuda-mps-control"),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["torch_cuda"] = torch.version.cuda
    try:
        import onnxruntime as ort

        info["onnxruntime"] = ort.__version__
        info["ort_providers"] = ort.get_available_providers()
    except ImportError as exc:
        info["onnxruntime"] = f"not importable: {exc}"
    from app.runtime.devices import cuda_device_count

    info["gpus_the_daemon_counts"] = cuda_device_count()
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
        info["nvidia_smi"] = out.stdout.strip()
    return info


# ------------------------------------------------------------------ daemon
def serve(argv: list[str]) -> int:
    """`python -m app serve argv…`, GPUs counted by torch when onnxruntime
    cannot see them (it has no CUDA provider)."""
    from app.runtime import devices, mps

    if os.environ.get(NO_MPS):  # as if the control program were not on PATH
        mps.MPS_CONTROL = "nvidia-cuda-mps-control (left out by bench.gpu_check)"
    if devices.cuda_device_count() == 0:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            devices.cuda_device_count = lambda: count  # type: ignore[assignment]
    from app.__main__ import main as app_main

    return app_main(["serve", *argv])


def start(repository: Path, env: dict[str, str], timeout_s: float) -> Any:
    from bench.daemon_launcher import free_port, start_server

    port = free_port()
    full = dict(os.environ, GRPC_PORT="0", EMULATED_DEVICES="0", **env)
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), full.get("PYTHONPATH")) if p)
    args = ["--port", str(port), "--repository", str(repository), "--log-level", "info"]
    argv = [sys.executable, "-m", "bench.gpu_check", "serve", *args]
    return start_server(
        argv, port, full, startup_timeout_s=timeout_s, log_prefix="gpu-check-daemon-", cwd=ROOT
    )


def workload(name: str, slo_ms: float, alpha: float, beta: float, rate: float, probe_s: float):
    from app.workloads.spec import parse_workload

    doc = {
        "name": f"gpu-check-{name}",
        "duration_s": probe_s,
        "seed": 1,
        "devices": 1,
        "arrival": {"process": "poisson"},
        "models": [
            {
                "name": name,
                "profile": {"alpha_ms": max(alpha, 0.0), "beta_ms": max(beta, 0.0)},
                "slo_ms": slo_ms,
                "max_batch": 64,
                "rate": rate,
            }
        ],
    }
    return parse_workload(doc, ROOT)


def nominal_rate(
    latency_ms: dict[str, float], slo_ms: float, door_rps: float | None, door_share: float
) -> float:
    """Where the capacity search starts (r/s): half the best b/ℓ(b) among
    batches that fit half the SLO, and at most `door_share` of the front
    door's ceiling."""
    fits = [int(b) / ms * 1000 for b, ms in latency_ms.items() if ms <= slo_ms / 2]
    rate = 0.5 * max(fits, default=1000 / next(iter(latency_ms.values())))
    return max(1.0, min(rate, door_share * door_rps) if door_rps else rate)


def capacity(
    repository: Path,
    policy: str,
    env: dict[str, str],
    profile: dict[str, Any],
    slo_ms: float,
    opts: argparse.Namespace,
    deadline: float,
    door_rps: float | None = None,
    log_lines: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The daemon with `policy` serving `resnet50`: its capacity at `slo_ms`."""
    import asyncio

    from bench.compare.measure import Options, capacity_search
    from bench.daemon_launcher import stop_daemon
    from bench.loadgen import prepare_targets

    # On the CPU the model and the front door share the same few cores.
    door_share = 0.5 if env.get("CPU_SLICES") == "0" else 0.1
    rate = nominal_rate(profile["latency_ms"], slo_ms, door_rps, door_share)
    load = workload("resnet50", slo_ms, profile["alpha_ms"], profile["beta_ms"], rate, opts.probe_s)
    handle = start(repository, {"POLICY": policy, **env}, max(45.0, deadline - time.monotonic()))
    try:
        targets = asyncio.run(prepare_targets(handle.url, load))
        options = Options(opts.probe_s, opts.max_probes, 1.0, None, opts.workers)
        probes = max(
            1, min(opts.max_probes, int((deadline - time.monotonic()) / (opts.probe_s + 1)))
        )
        cap, rows = capacity_search(handle.url, load, targets, options, probes)
    finally:
        stop_daemon(handle)
        log = handle.log_path.read_text(errors="replace")
    return {
        "policy": policy,
        "slo_ms": slo_ms,
        "nominal_rps": rate,
        "capacity_rps": cap.capacity_rps,
        "capacity_status": cap.status,
        "startup_s": round(handle.startup_s, 2),
        "request_bytes": len(targets[0].body),
        "probes": rows,
        "log": [line for line in log.splitlines() if any(k in line for k in log_lines)][-10:],
    }


# -------------------------------------------------------------------- run
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=None, help="where the JSON and table go ($OUT)")
    p.add_argument("--wheels", type=Path, default=None, help="folder of wheels for what is missing")
    p.add_argument("--dry-run", action="store_true", help="the CPU dry run, even with a GPU")
    p.add_argument("--budget-s", type=float, default=None, help="whole run (480; dry run 50)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--probe-s", type=float, default=None, help="capacity probe (3; dry run 1)")
    p.add_argument("--max-probes", type=int, default=None, help="per capacity (6; dry run 2)")
    p.add_argument(
        "--min-slo-ms",
        type=float,
        default=None,
        help=f"floor of the SLO 3×ℓ(1): what the answer path itself takes ({MIN_SLO_MS:g}; "
        f"dry run {DRY_MIN_SLO_MS:g})",
    )
    p.add_argument("--workers", type=int, default=None, help="load generator processes")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    opts = parse_args(argv)
    dry_budget = 50.0
    budget = Budget(opts.budget_s or (dry_budget if opts.dry_run else 480.0))
    out = opts.out or Path(os.environ.get("OUT") or ROOT / "bench" / "results" / "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "mode": "cpu-dry-run",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "budget_s": budget.seconds,
        "options": {},
        "steps": {},
    }

    def write() -> None:
        """The report as it stands: after every step, so that a run killed
        at its command's limit still leaves what it measured."""
        report["seconds"] = round(time.monotonic() - budget.started, 1)
        (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
        (out / "gpu_check.md").write_text(render(report))

    run = Run(budget, cuda=False, on_record=write)
    report["steps"] = run.steps
    run.step("wheels", lambda: install_wheels(opts.wheels))
    env_info = run.step("environment", environment, needs=("wheels",))
    cuda = bool(env_info and env_info["cuda_available"]) and not opts.dry_run
    run.cuda = cuda
    if not cuda and opts.budget_s is None:
        budget.seconds = dry_budget
    cores = os.cpu_count() or 1
    opts.probe_s = opts.probe_s or (3.0 if cuda else 1.0)
    opts.max_probes = opts.max_probes or (6 if cuda else 2)
    opts.workers = opts.workers or (min(4, max(1, cores // 4)) if cuda else 1)
    opts.min_slo_ms = opts.min_slo_ms or (MIN_SLO_MS if cuda else DRY_MIN_SLO_MS)
    report["mode"] = "gpu" if cuda else "cpu-dry-run"
    report["budget_s"] = budget.seconds
    report["options"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()}
    # A step still running HARD_STOP_S past the budget is interrupted (and
    # recorded as failed); the steps after it are skipped.
    signal.signal(signal.SIGALRM, _overrun)
    signal.alarm(int(max(1.0, budget.left())) + HARD_STOP_S)
    try:
        measure(run, opts, cuda, cores)
    finally:
        signal.alarm(0)
        write()
        print(render(report))
    return 0


def _overrun(signum: int, frame: Any) -> None:
    raise TimeoutError(f"the run went {HARD_STOP_S} s past its time budget")


def measure(run: Run, opts: argparse.Namespace, cuda: bool, cores: int) -> None:
    """Every step after the environment's, in order (module docstring)."""
    _Measurement(run, opts, cuda, cores).run_all()


class _Measurement:
    """The steps' shared state: the repositories, the budget, the profile
    the daemons serve with."""

    def __init__(self, run: Run, opts: argparse.Namespace, cuda: bool, cores: int) -> None:
        from bench import gpu_check_parts as parts

        self.parts = parts
        self.run, self.opts, self.cuda, self.cores = run, opts, cuda, cores
        self.sizes = parts.GPU_SIZES if cuda else parts.DRY_SIZES
        self.device = "cuda" if cuda else "cpu"
        self.threads = 1
        self.repository = Path(tempfile.mkdtemp(prefix="gpu-check-repo-"))
        self.served_repository = Path(tempfile.mkdtemp(prefix="gpu-check-served-"))
        self.cache = Path(tempfile.mkdtemp(prefix="gpu-check-profiles-"))
        self.budget = run.budget
        self.policies = [p for p in opts.policies.split(",") if p]
        # The live steps share what is left after the profile in equal parts.
        self.live_steps = len(self.policies) + 4
        self.served: dict[str, Any] | None = None
        self.slo_ms = 0.0
        self.door_rps: float | None = None
        self.daemon_env: dict[str, str] = {}

    def run_all(self) -> None:
        run = self.run
        run.step("models", self.models, needs=("environment",))
        self.profile_step()
        run.step("preemption", self.preempt, needs=("models",), min_s=8.0)
        # First: what the front door sustains bounds the rates the others start at.
        front = run.step(
            "ceiling", lambda: self.ceiling(self.part()), needs=("environment",), min_s=8.0
        )
        self.door_rps = front["capacity_rps"] if front and front["capacity_rps"] > 0 else None
        sizes = self.sizes
        batches = ",".join(str(b) for b in (1, 2, 4, 8, 16, 32, 64) if b <= sizes.max_batch)
        self.daemon_env = {
            "PROFILE_CACHE_DIR": str(self.cache),
            "PROFILE_BATCH_SIZES": batches,
            **({"CPU_SLICES": "0"} if self.cuda else {"CPU_SLICES": "1", "THREADS_PER_SLICE": "1"}),
        }
        for policy in self.policies:
            if self.served is None:
                run.step(f"capacity_{policy}", dict, needs=("profile",))
                continue
            run.step(f"capacity_{policy}", self.serve_capacity(policy, self.daemon_env), min_s=8.0)
        self.shares_steps()

    def part(self) -> float:
        self.live_steps -= 1
        return max(8.0, self.budget.left() * 0.85 / max(self.live_steps + 1, 1))

    def models(self) -> dict[str, Any]:
        built = self.parts.build_repository(self.repository, self.sizes)
        shutil.copytree(self.repository / "resnet50", self.served_repository / "resnet50")
        self.serve_slo(1000.0)
        built["resnet50"]["served_image"] = self.sizes.serve_image
        return built

    def serve_slo(self, slo_ms: float) -> None:
        self.parts.set_slo(
            self.served_repository,
            "resnet50",
            slo_ms,
            description="ResNet-50 for bench.gpu_check",
            size=self.sizes.serve_image,
            classes=1000,
            sizes=self.sizes,
        )

    def profile(self) -> dict[str, Any]:
        from app.repository.loader import load_repository

        parts, sizes, budget = self.parts, self.sizes, self.budget
        index = load_repository(self.repository)
        deadline = budget.deadline(reserve_s=0.75 * budget.left())
        out = {
            name: parts.profile_model(
                index.models[name], self.device, sizes, self.threads, deadline
            )
            for name in ("resnet50", "torchcnn")
        }
        if sizes.serve_image != sizes.image:  # the served one, at the daemon's sizes
            config = load_repository(self.served_repository).models["resnet50"]
            batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= sizes.max_batch)
            deadline = budget.deadline(reserve_s=0.7 * budget.left())
            served = parts.profile_model(
                config, self.device, sizes, self.threads, deadline, batches
            )
            out["resnet50_served"] = {**served, "image": sizes.serve_image}
        return out

    def profile_step(self) -> None:
        profiles = self.run.step("profile", self.profile, needs=("models",))
        served = profiles.get("resnet50_served", profiles["resnet50"]) if profiles else None
        self.served = served
        if served:  # the served config's SLO: the workload's may not be looser
            self.slo_ms = max(3 * served["latency_ms"]["1"], self.opts.min_slo_ms)
            self.run.steps["profile"]["slo"] = {
                "three_l1_ms": 3 * served["latency_ms"]["1"],
                "min_slo_ms": self.opts.min_slo_ms,
                "slo_ms": self.slo_ms,
            }
            self.serve_slo(self.slo_ms)

    def preempt(self) -> dict[str, Any]:
        from app.runtime.devices import ExecutorDevice

        device = self.device
        executor = ExecutorDevice(0, device, f"{device}:0", threads=self.threads)
        deadline = time.monotonic() + self.part()
        return self.parts.preemption(
            self.repository, ["resnet50", "torchcnn"], executor, self.sizes, deadline
        )

    def ceiling(self, seconds: float) -> dict[str, Any]:
        from app.workloads.spec import load_workload
        from bench.compare.measure import Options, run_daemon
        from bench.compare.setups import SETUPS

        opts = self.opts
        setup = SETUPS["ceiling"]
        probes = max(1, min(opts.max_probes, int(seconds / (opts.probe_s + 1)) - 2))
        workers = max(opts.workers, min(8, self.cores // 2))
        options = Options(opts.probe_s, probes, 1.0, None, workers)
        result = run_daemon(setup, load_workload(setup.workload), "symphony", options)
        return {
            "capacity_rps": result.capacity_rps,
            "capacity_status": result.capacity_status,
            "slo_ms": 50.0,
            "workers": options.workers,
            "api_workers": "not a setting of this daemon (one uvicorn process)",
            "probes": result.probes,
        }

    def serve_capacity(
        self, policy: str, env: dict[str, str], log_lines: tuple[str, ...] = ()
    ) -> Any:
        served = self.served
        assert served is not None
        seconds = self.part()
        return lambda: capacity(
            self.served_repository,
            policy,
            env,
            served,
            self.slo_ms,
            self.opts,
            time.monotonic() + seconds,
            self.door_rps,
            log_lines,
        )

    def shares_steps(self) -> None:
        run = self.run
        mps_log = ("MPS", "mps", "shares", "time-share")
        for name, with_mps in (("mps", True), ("two_executors", False)):
            env = {**self.daemon_env, "DEVICE_SHARES": "cuda:0=0.5,0.5"}
            if not with_mps:  # the shares' executors time-share the GPU
                env[NO_MPS] = "1"
            if not self.cuda:
                run.step(name, dict, needs_cuda=True)
            elif with_mps and shutil.which("nvidia-cuda-mps-control") is None:
                run.steps[name] = {
                    "status": "skipped",
                    "reason": "skipped: nvidia-cuda-mps-control is not on PATH (no MPS here)",
                }
            elif self.served is None:
                run.step(name, dict, needs=("profile",))
            else:
                run.step(name, self.serve_capacity("symphony", env, mps_log), min_s=8.0)


def render(report: dict[str, Any]) -> str:
    lines = [
        f"bench.gpu_check, {report['mode']}, {report['date']}, {report.get('seconds', '?')} s",
        "",
        "| step | status | result |",
        "|---|---|---|",
    ]
    for name, rec in report["steps"].items():
        lines.append(f"| {name} | {rec['status']} | {_summary(name, rec)} |")
    return "\n".join(lines) + "\n"


def _summary(name: str, rec: dict[str, Any]) -> str:
    if rec["status"] == "skipped":
        return rec["reason"]
    if rec["status"] == "failed":
        return next((ln for ln in rec["error"].splitlines()[1:] if ln.strip()), rec["error"])[:160]
    if name == "environment":
        return f"torch {rec['torch']}, GPUs {rec.get('gpus', [])}, {rec['cores']} cores"
    if name == "profile":
        return "; ".join(
            f"{m}: ℓ(1) {p['latency_ms']['1']:.2f} ms, ℓ({list(p['latency_ms'])[-1]}) "
            f"{list(p['latency_ms'].values())[-1]:.2f} ms, α {p['alpha_ms']:.3f} β "
            f"{p['beta_ms']:.2f} r² {p['r2']:.3f}, {p['exit_points']} exit points"
            for m, p in rec.items()
            if isinstance(p, dict) and "latency_ms" in p
        )
    if "capacity_rps" in rec:
        slo = f" at SLO {rec['slo_ms']:.1f} ms" if "slo_ms" in rec else ""
        return f"{rec['capacity_rps']:.0f} r/s{slo} ({rec['capacity_status']})"
    if name == "preemption":
        parts = []
        for model, r in rec.items():
            for p in r.get("points", []) if isinstance(r, dict) else []:
                if p["delay_median_ms"] is not None:
                    parts.append(
                        f"{model} b={p['batch']}: {p['normal_ms']:.1f} ms, stop "
                        f"{p['delay_median_ms']:.2f}/{p['delay_p99_ms']:.2f} ms"
                    )
        return "; ".join(parts) or "no batch stopped"
    if name == "models":
        return "; ".join(
            f"{m}: {r['built']}, {r['image']}² input" for m, r in rec.items() if isinstance(r, dict)
        )
    if name == "wheels":
        return f"installed {rec['installed']}" if rec["installed"] else "nothing missing"
    return ""


if __name__ == "__main__":
    raise SystemExit(main())
