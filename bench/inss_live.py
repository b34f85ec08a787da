"""Two models sharing the CPU at once vs in turn, live on this box (issue 23:
InSS's spatial sharing against time-sharing, same load generator).

    python -m bench.inss_live                    # five capacity searches (minutes)
    python -m bench.inss_live --quick            # one short probe each (a smoke run)

Options: --models (default mlp,cnn: two bundled ONNX models), --rates
(requests/s per model at rate scale 1, default 300,300), --probe-s (5),
--max-runs (8 probes per search), --rel-tol (0.05), --out-dir (default
bench/results/inss; writes live.json and live.md).

Setups, each a daemon (`python -m app serve`) on a repository holding the
two models, searched for capacity — the highest rate scale with ≥ 99 % of
requests answered within SLO — by `bench.loadgen` (`find_live_capacity`,
the same open-loop Poisson generator and arrival sequence for every setup):

* **shares** — `DEVICE_SHARES=cpu=0.5,0.5`: two executors pinned to a core
  each (one intra-op thread), the first model on `cpu:0/0`, the second on
  `cpu:0/1`: the two run at the same time (InSS's spatial sharing; on two
  cores it is the only split into two). The core plans with each model's
  profile × its measured co-location slowdown (`COLOCATION_PROFILE`, on).
  Policies `inss` (FIFO per model, batch b_i by Gpulet's half-SLO rule, as
  no rate is given to plan with) and `symphony`;
* **time-sharing** — one executor on both cores (two intra-op threads) holds
  both models, one batch at a time: each model gets the whole CPU in turn.
  Policies `symphony` (the project's multi-model time-sharing scheduler) and
  `inss`; and `symphony` with one intra-op thread (`time-sharing-1t`): the
  models in turn on one core, the other core left to the daemon and the
  load generator.

Goodput at capacity = requests within SLO per second at the best passing
probe. The load generator and the daemon run on the same two cores as the
executors (they take part of both in every setup alike).

Output: a table on stdout, `<out-dir>/live.json` (per setup: capacity,
goodput, the probes, the daemon's co-location log lines) and `live.md`.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.repository.bundled import ensure_bundled_models
from app.repository.loader import load_model_config
from app.scheduling.profile import LatencyProfile
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen import find_live_capacity

ROOT = Path(__file__).resolve().parent.parent
MODELS_ROOT = ROOT / "app" / "models"
OUT_DIR = ROOT / "bench" / "results" / "inss"
TARGET = 0.99


@dataclass(frozen=True)
class Setup:
    name: str
    policy: str
    shares: bool  # one model per core (cpu=0.5,0.5) or both on the whole CPU
    threads: int = 2  # time-sharing: the executor's intra-op threads

    def env(self) -> dict[str, str]:
        if self.shares:
            return {"CPU_SLICES": "1", "DEVICE_SHARES": "cpu=0.5,0.5"}
        return {"CPU_SLICES": "1", "THREADS_PER_SLICE": str(self.threads)}


SETUPS = (
    Setup("shares/inss", "inss", True),
    Setup("shares/symphony", "symphony", True),
    Setup("time-sharing/symphony", "symphony", False),
    Setup("time-sharing/inss", "inss", False),
    Setup("time-sharing-1t/symphony", "symphony", False, threads=1),
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def repository(root: Path, models: Sequence[str], setup: Setup) -> Path:
    """The bundled `models` under `root`, placed as `setup` says."""
    ensure_bundled_models(MODELS_ROOT, list(models))
    for i, name in enumerate(models):
        source = MODELS_ROOT / name
        config = load_model_config(source)
        if config.backend != "onnx" or config.devices is not None:
            raise ValueError(f"{name}: need a bundled ONNX model with no `devices` of its own")
        target = root / name
        shutil.copytree(source, target)
        device = f"cpu:0/{i}" if setup.shares else "cpu:0"
        text = (target / "config.yaml").read_text()
        (target / "config.yaml").write_text(f"{text.rstrip()}\ndevices: [{device}]\n")
    return root


def workload(models: Sequence[str], rates: Sequence[float], duration_s: float) -> Workload:
    """Poisson arrivals at `rates`, each model's SLO from its config (the
    profiles are not used by a live run)."""
    specs = []
    for name, rate in zip(models, rates, strict=True):
        config = load_model_config(MODELS_ROOT / name)
        specs.append(
            ModelSpec(
                name,
                LatencyProfile.linear(1.0, 1.0, config.max_batch_size),
                config.slo_ms,
                config.max_batch_size,
                rate,
                ArrivalSpec("poisson", {}),
            )
        )
    return Workload("inss-live", duration_s, 1, [DeviceSpec("cpu")], specs)


def colocation_lines(log_path: Path) -> list[str]:
    return [line.strip() for line in log_path.read_text().splitlines() if " beside " in line]


def run_setup(setup: Setup, args: argparse.Namespace, models: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="inss-live-") as tmp:
        # The repository first: it builds the bundled models a fresh clone lacks.
        repo = repository(Path(tmp) / "models", models, setup)
        load = workload(models, args.rates, args.probe_s)
        handle = start_daemon(
            repo,
            free_port(),
            policy=setup.policy,
            emulated_devices=0,
            extra_env=setup.env(),
            log_level="info",
            startup_timeout_s=300.0,
        )
        log(f"{setup.name}: daemon ready in {handle.startup_s:.1f} s")
        try:
            if args.quick:
                lo = hi = 1.0
                max_runs = 1
            else:
                lo, hi, max_runs = 0.5, 1.0, args.max_runs
            found, probes = find_live_capacity(
                handle.url,
                load,
                target=TARGET,
                lo=lo,
                hi=hi,
                rel_tol=args.rel_tol,
                max_runs=max_runs,
                probe_duration_s=args.probe_s,
            )
        finally:
            stop_daemon(handle)
        lines = colocation_lines(handle.log_path)
    best = probes.get(found.rate_scale) if found.rate_scale is not None else None
    overall = best.summary["overall"] if best is not None else {}
    row = {
        "setup": setup.name,
        "policy": setup.policy,
        "env": setup.env(),
        "capacity_scale": found.rate_scale or 0.0,
        "offered_rps": found.capacity_rps,
        "goodput_rps": overall.get("goodput_rps", 0.0),
        "slo_attainment": overall.get("slo_attainment"),
        "status": found.status,
        "probes": [
            {
                "scale": scale,
                "offered_rps": result.summary["overall"]["offered_rps"],
                "slo_attainment": result.summary["overall"]["slo_attainment"],
            }
            for scale, result in sorted(probes.items())
        ],
        "colocation": lines,
    }
    log(
        f"{setup.name}: capacity × {row['capacity_scale']:.3f}, "
        f"goodput {row['goodput_rps']:.1f} r/s ({found.status})"
    )
    return row


def table(rows: Sequence[dict[str, Any]]) -> str:
    best_time_sharing = max(
        (r["goodput_rps"] for r in rows if r["setup"].startswith("time-sharing")), default=0.0
    )
    out = [
        "| setup | policy | capacity (× rates) | goodput at SLO (r/s) | vs best time-sharing |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        gain = r["goodput_rps"] / best_time_sharing - 1.0 if best_time_sharing else None
        shown = "" if gain is None or r["setup"].startswith("time") else f"{gain:+.1%}"
        out.append(
            f"| {r['setup'].split('/')[0]} | {r['policy']} | {r['capacity_scale']:.3f} | "
            f"{r['goodput_rps']:.1f} | {shown} |"
        )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.inss_live", description=__doc__)
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--rates", default="300,300")
    parser.add_argument("--probe-s", type=float, default=5.0)
    parser.add_argument("--max-runs", type=int, default=8)
    parser.add_argument("--rel-tol", type=float, default=0.05)
    parser.add_argument("--setups", default=",".join(s.name for s in SETUPS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.rates = [float(r) for r in args.rates.split(",")]
    if len(models) != 2 or len(args.rates) != 2:
        raise SystemExit("--models and --rates take two values each")
    by_name = {s.name: s for s in SETUPS}
    wanted = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in by_name]
    if unknown:
        raise SystemExit(f"unknown setups {unknown}; choose from {sorted(by_name)}")
    if args.quick:
        args.probe_s = min(args.probe_s, 2.0)
    started = time.monotonic()
    rows = [run_setup(by_name[name], args, models) for name in wanted]
    shown = table(rows)
    print(shown)
    document = {
        "command": "python -m bench.inss_live" + (" " + " ".join(argv) if argv else ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count()},
        "models": models,
        "rates": args.rates,
        "probe_s": args.probe_s,
        "seconds": time.monotonic() - started,
        "setups": rows,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "live.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / "live.md").write_text(shown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
