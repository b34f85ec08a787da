"""A PPipe plan taken up while serving, under load (app/server/pipeline_switch.py):
every request answered once, and what the switch costs.

    python -m bench.ppipe_switch              # three 30-s runs
    python -m bench.ppipe_switch --quick      # three 8-s runs

Options: --duration, --rate (requests/s of `chain`, default 60), --out-dir
(default bench/results/ppipe; writes plan-switch.json and plan-switch.md).

Setup, as docs/ppipe.md's example: the generated `chain` model profiled on a
fast CPU class (one thread) and a slow one (one thread, held twice as long),
`python -m app.repository.block_profile --chain`; two plans of
bench/workloads/ppipe/chain-live.yaml's model and SLO — **cut** over one fast
and two slow executors (the file's cluster, which cuts the model across
both classes) and **whole** over two fast executors (the model whole on
each). The daemon (`python -m app serve`, PLAN=the cut plan) gets Poisson
arrivals of `chain` at `--rate` from `bench.loadgen` for `--duration`
seconds, three times on the same arrivals:

* **switched** — at 30 % of the run the whole plan is posted
  (`POST /v2/plan`: its executors started beside the cut plan's, the
  model's requests sent to them from one instant on, the old pipelines'
  requests answered before they stop), at 65 % the cut plan again;
* **steady** — the cut plan throughout;
* **steady whole** — the whole plan throughout: what the plan posted at
  30 % serves at, without a switch.

Checked and reported as bench/switch_run.py says: every request answered
once (the daemon's statistics against the load generator's answers); the
within-SLO fraction of each run, of the requests sent within 1 s after
each switch, and from each switch to the next. Each switch's answer gives
how long the new pipelines took to start, the switch, and the old
pipelines' drain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from app.planning.ppipe import cli as plan_cli
from app.repository import block_profile
from app.scheduling.profile import LatencyProfile
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.switch_run import log, one_run, posting_plans, render_runs, window_cells

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "results" / "ppipe"
CLUSTER = ROOT / "bench" / "workloads" / "ppipe" / "chain-live.yaml"
CLASSES = "fast:1,slow:1:2"
MAX_BATCH = 2
SLO_MS = 100.0  # the chain model's config (block_profile writes it)
# (plan name, classes): the file's cluster, then the model whole on two fast.
PLANS = (("cut", None), ("whole", {"fast": 2}))


def make_plans(root: Path) -> dict[str, Path]:
    """Profile `chain` on the two classes and plan it both ways (module
    docstring); the plan files by name. The repository is root/timings/models."""
    timings = root / "timings"
    argv = ["--chain", "--out", str(timings), "--max-batch", str(MAX_BATCH)]
    for cls in CLASSES.split(","):
        argv += ["--class", cls]
    if block_profile.main(argv) != 0:
        raise SystemExit("profiling the chain model failed")
    files = {}
    for name, classes in PLANS:
        cluster = yaml.safe_load(CLUSTER.read_text())
        if classes is not None:
            cluster["cluster"]["classes"] = classes
        config = root / f"cluster-{name}.yaml"
        config.write_text(yaml.safe_dump(cluster))
        files[name] = root / f"plan-{name}.json"
        argv = ["ppipe", str(config), "--timings", str(timings), "--out", str(files[name])]
        if plan_cli.main(argv) != 0:
            raise SystemExit(f"planning {name} failed")
    return files


def workload(rate: float, duration_s: float) -> Workload:
    # The profile is the load generator's placeholder: the daemon plans.
    profile = LatencyProfile.linear(1.0, 1.0, MAX_BATCH)
    model = ModelSpec("chain", profile, SLO_MS, MAX_BATCH, rate, ArrivalSpec("poisson", {}))
    return Workload("ppipe-switch", duration_s, 11, [DeviceSpec("cpu")], [model])


def describe(answer: dict[str, Any]) -> str:
    stages = "; ".join(
        " > ".join(f"[{s['blocks'][0]},{s['blocks'][1]}) on {','.join(s['devices'])}"
        for s in p["stages"])
        for p in answer["pipelines"]
    )  # fmt: skip
    return (
        f"{stages}; started in {answer['started_s']:.3f} s, old pipelines held "
        f"{answer['old_held']} and drained in {answer['old_drained_s']:.3f} s, total "
        f"{answer['total_s']:.3f} s"
    )


def render(runs: dict[str, dict[str, Any]]) -> str:
    out = render_runs(runs)
    switches = runs["switched"]["switches"]
    out += [
        "",
        "| plan posted | pipelines | started s (the switch) | old held | old drained s | "
        "total s | within SLO 1 s after | same 1 s, steady |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    steady = runs["steady"]["after_switch"]
    for s, w, st in zip(switches, runs["switched"]["after_switch"], steady, strict=True):
        cells = window_cells(w, st)
        stages = "; ".join(
            " > ".join(",".join(x["devices"]) for x in p["stages"]) for p in s["pipelines"]
        )
        out.append(
            f"| at {s['asked_at_s']:.1f} s | {stages} | {s['started_s']:.3f} | "
            f"{s['old_held']} | {s['old_drained_s']:.3f} | "
            f"{s['total_s']:.3f} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.ppipe_switch", description=__doc__)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=60.0, help="requests/s of chain")
    parser.add_argument("--quick", action="store_true", help="three 8-s runs")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 8.0)
    load = workload(args.rate, args.duration)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ppipe-switch-") as tmp:
        plans = make_plans(Path(tmp))
        posts = [(0.30, plans["whole"]), (0.65, plans["cut"])]
        for name, served in (("switched", "cut"), ("steady", "cut"), ("steady whole", "whole")):
            handle = start_daemon(
                Path(tmp) / "timings" / "models",
                free_port(),
                emulated_devices=1,
                cpu_slices=0,
                startup_timeout_s=180,
                extra_env={"PLAN": str(plans[served]), "PPIPE_CLASSES": CLASSES},
            )
            log(f"{name}: daemon ready in {handle.startup_s:.1f} s")
            try:
                at = [w["switched_at_s"] for w in runs["switched"]["switches"]] if runs else None
                switching = (
                    None if runs else posting_plans(handle.url, load.duration_s, posts, describe)
                )
                runs[name] = asyncio.run(one_run(handle.url, load, switching, at))
            finally:
                stop_daemon(handle)
            r = runs[name]
            log(f"{name}: {r['answered']}/{r['sent']} answered, {r['within_slo']:.2%} within SLO")
    shown = render(runs)
    print(shown)
    document = {
        "command": "python -m bench.ppipe_switch" + (" " + " ".join(argv) if argv else ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform()},
        "options": {"duration": args.duration, "rate": args.rate, "classes": CLASSES},
        "runs": runs,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "plan-switch.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / "plan-switch.md").write_text(shown + "\n")
    bad = [n for n, r in runs.items() if r["unanswered"] or r["answered_twice"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
