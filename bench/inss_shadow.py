"""Shadow reallocation under steady load (issue 23 item 4, inss.txt §5.3):
the daemon's device shares change while an open-loop load runs; every
request must be answered exactly once, and the switch must not show.

    python -m bench.inss_shadow              # two 30-s runs (a minute)
    python -m bench.inss_shadow --quick      # two 8-s runs
    python -m bench.inss_shadow --plans      # the same through posted InSS plans
    python -m bench.inss_shadow --moves      # posted InSS plans that move a model

Options: --duration, --rates (alpha,beta requests/s, default 150,60), --policy
(default inss), --out-dir (default bench/results/inss; writes shadow.json
and shadow.md, with --plans plan-switch.json and plan-switch.md, with --moves
plan-moves.json and plan-moves.md).

Setup: one emulated device split `emulated=0.5,0.5`, two emulated models
(`alpha` on emulated:0/0, `beta` on emulated:0/1; ℓ(b) = 2·b + 5 ms at the
whole device, SLO 100 ms), the daemon (`python -m app serve`), Poisson
arrivals from `bench.loadgen` at `--rate` each. Two runs on the same
arrivals:

* **steady** — the shares stay 0.5 / 0.5;
* **reshare** — at 30 % of the run `beta` shrinks to 0.3 and then `alpha`
  grows to 0.7 (`POST /v2/devices/reshare`, shrink first: the shares sum to
  ≤ 1 at every step), and at 65 % they go back (alpha to 0.5, beta to 0.5).
  Each answer gives the reshare's phases: the shadow's start, load and
  warm-up, the switch itself, the old executor's drain and stop.

With `--plans`, the same through InSS plans (app/server/inss_switch.py):
the daemon serves `PLAN_START` (alpha and beta on halves, batches 6 and 2,
policy inss), and at 30 % of the run `PLAN_SHIFT` is posted (`POST
/v2/plan`: 0.7 / 0.3 at batches 4 and 3, its reshares shrink first and its
batch sizes take new cores), at 65 % `PLAN_START` again; the steady run
serves `PLAN_START` throughout. Each switch's answer gives its reshares,
its core switch and its total time.

With `--moves`, InSS plans that place the models otherwise
(app/server/inss_layout.py), on two emulated devices: the daemon serves
`MOVES_START` (alpha on the whole of emulated:0, beta of emulated:1), at 30 %
of the run `MOVES_TOGETHER` is posted (both on halves of emulated:0: its two
share executors added, the whole one removed, beta moved off emulated:1),
at 65 % `MOVES_START` again.

Checked and reported as bench/switch_run.py says: every request answered
once; the within-SLO fraction of each run, of the requests sent within 1 s
after each switch, and from each switch to the next.
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

import httpx

from app.scheduling.profile import LatencyProfile
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.switch_run import (
    Switching,
    log,
    one_run,
    posting_plans,
    render_runs,
    window_cells,
)

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "results" / "inss"
MODELS = {"alpha": "emulated:0/0", "beta": "emulated:0/1"}
ALPHA_MS, BETA_MS, SLO_MS, MAX_BATCH = 2.0, 5.0, 100.0, 16
# (fraction of the run, device, share): shrink first, then grow.
SCHEDULE = (
    (0.30, "emulated:0/1", 0.3),
    (0.30, "emulated:0/0", 0.7),
    (0.65, "emulated:0/0", 0.5),
    (0.65, "emulated:0/1", 0.5),
)
# --plans: model → (device, share, batch); posted at 30 % and 65 % of the run.
Placed = dict[str, tuple[str, float, int]]
PLAN_START: Placed = {"alpha": ("emulated:0", 0.5, 6), "beta": ("emulated:0", 0.5, 2)}
PLAN_SHIFT: Placed = {"alpha": ("emulated:0", 0.7, 4), "beta": ("emulated:0", 0.3, 3)}
# --moves: apart on two devices, then together on halves of one, then apart.
MOVES_START: Placed = {"alpha": ("emulated:0", 1.0, 6), "beta": ("emulated:1", 1.0, 2)}
MOVES_TOGETHER: Placed = PLAN_START


def config_text(device: str | None) -> str:
    return (
        "backend: emulated\n"
        f"max_batch_size: {MAX_BATCH}\n"
        f"slo_ms: {SLO_MS:g}\n"
        f"profile: {{alpha_ms: {ALPHA_MS:g}, beta_ms: {BETA_MS:g}}}\n"
        + (f"devices: [{device}]\n" if device else "")
        + "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
    )


def plan_file(path: Path, placed: Placed) -> Path:
    """An InSS plan: each model on its (device, share, batch)."""
    from app.planning.inss.plan import placement_plan, write_plan

    write_plan(placement_plan(placed, "emulated", SLO_MS / 1e3, 4e9), path)
    return path


def repository(root: Path, placed: bool = True) -> Path:
    """The two models, on their shares (`placed`) or where a plan puts them."""
    for name, device in MODELS.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.yaml").write_text(config_text(device if placed else None))
    return root


def workload(rates: list[float], duration_s: float) -> Workload:
    profile = LatencyProfile.linear(ALPHA_MS, BETA_MS, MAX_BATCH)
    models = [
        ModelSpec(name, profile, SLO_MS, MAX_BATCH, rate, ArrivalSpec("poisson", {}))
        for name, rate in zip(MODELS, rates, strict=True)
    ]
    return Workload("inss-shadow", duration_s, 7, [DeviceSpec("emulated")], models)


async def reshares(url: str, duration_s: float, started: float) -> list[dict[str, Any]]:
    """Carry out SCHEDULE; each reshare's answer with when it was asked and
    when it switched, in seconds from `started`."""
    done = []
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        for fraction, device, share in SCHEDULE:
            wait = started + fraction * duration_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            asked = time.monotonic() - started
            reply = await client.post(
                "/v2/devices/reshare", json={"device": device, "share": share}
            )
            if reply.status_code != 200:
                raise RuntimeError(f"reshare of {device} to {share}: {reply.text}")
            answer = reply.json()
            answer["asked_at_s"] = asked
            answer["switched_at_s"] = answer.pop("switched_at") - started
            done.append(answer)
            log(
                f"  {device} {answer['old_share']:g} → {share:g}: shadow up in "
                f"{answer['spawn_s'] + answer['load_s'] + answer['warmup_s']:.3f} s, switch "
                f"{answer['switch_s'] * 1e6:.0f} µs, old drained in {answer['drain_s']:.3f} s "
                f"({answer['old_batches']} batches), total {answer['total_s']:.3f} s"
            )
    return done


def switches(url: str, duration_s: float, plans: list[tuple[float, Path]] | None) -> Switching:
    """SCHEDULE's reshares, or `plans` posted, from a run's start."""

    def describe(answer: dict[str, Any]) -> str:
        return (
            f"{', '.join(changes(answer, timed=False))}; batches {answer['batch']}, core "
            f"switch {answer['switch_ms']:.3f} ms, {answer['handed_over']} handed over, total "
            f"{answer['total_ms']:.0f} ms"
        )

    if plans:
        return posting_plans(url, duration_s, plans, describe)

    async def run(started: float) -> list[dict[str, Any]]:
        return await reshares(url, duration_s, started)

    return run


def changes(answer: dict[str, Any], timed: bool) -> list[str]:
    """A posted plan's executors added and removed, and its reshares."""
    return (
        [f"+{name}" for name in answer.get("added", [])]
        + [f"−{name}" for name in answer.get("removed", [])]
        + [
            f"{r['device']} → {r['share']:g}" + (f" ({r['total_s']:.3f})" if timed else "")
            for r in answer["reshared"]
        ]
    )


def render(runs: dict[str, dict[str, Any]]) -> str:
    out = render_runs(runs)
    switches = runs.get("reshare", {}).get("switches", [])
    if switches and "reshared" in switches[0]:  # --plans
        out += [
            "",
            "| plan posted | executors added (+), removed (−), reshared (s each) | batches | "
            "core switch ms | handed over | total ms | within SLO 1 s after | same 1 s, steady |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        steady = runs.get("steady", {}).get("after_switch", [{}] * len(switches))
        for s, w, st in zip(switches, runs["reshare"]["after_switch"], steady, strict=True):
            shares = ", ".join(changes(s, timed=True))
            batches = ", ".join(f"{m} {b}" for m, b in (s["batch"] or {}).items()) or "—"
            cells = window_cells(w, st)
            out.append(
                f"| at {s['asked_at_s']:.1f} s | {shares} | {batches} | {s['switch_ms']:.3f} | "
                f"{s['handed_over']} | {s['total_ms']:.0f} | {cells[0]} | {cells[1]} |"
            )
    elif switches:
        out += [
            "",
            "| device | share | shadow up s | switch µs | old drained s (batches) | total s | "
            "within SLO 1 s after | same 1 s, steady |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        steady = runs.get("steady", {}).get("after_switch", [{}] * len(switches))
        for s, w, st in zip(switches, runs["reshare"]["after_switch"], steady, strict=True):
            up = s["spawn_s"] + s["load_s"] + s["warmup_s"]
            cells = window_cells(w, st)
            out.append(
                f"| {s['name']} | {s['old_share']:g} → {s['new_share']:g} | {up:.3f} | "
                f"{s['switch_s'] * 1e6:.0f} | {s['drain_s']:.3f} ({s['old_batches']}) | "
                f"{s['total_s']:.3f} | {cells[0]} | {cells[1]} |"
            )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.inss_shadow", description=__doc__)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--rates", default="150,60", help="requests/s of alpha,beta")
    parser.add_argument("--policy", default="inss")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--plans", action="store_true", help="switch through posted InSS plans (POST /v2/plan)"
    )
    parser.add_argument(
        "--moves",
        action="store_true",
        help="switch through posted InSS plans that move a model (executors added and removed)",
    )
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 8.0)
    rates = [float(r) for r in args.rates.split(",")]
    if len(rates) != 2:
        raise SystemExit("--rates takes two numbers: alpha's and beta's")
    load = workload(rates, args.duration)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="inss-shadow-") as tmp:
        posted = args.plans or args.moves
        repo = repository(Path(tmp) / "models", placed=not posted)
        env = {"DEVICE_SHARES": "emulated=0.5,0.5", "COLOCATION_PROFILE": "0"}
        plans = None
        if posted:
            first, then = (MOVES_START, MOVES_TOGETHER) if args.moves else (PLAN_START, PLAN_SHIFT)
            start = plan_file(Path(tmp) / "plan-start.json", first)
            shift = plan_file(Path(tmp) / "plan-shift.json", then)
            plans = [(0.30, shift), (0.65, start)]
            env = {"PLAN": str(start), "COLOCATION_PROFILE": "0"}
        for name in ("reshare", "steady"):
            handle = start_daemon(
                repo,
                free_port(),
                policy=args.policy,
                emulated_devices=2 if args.moves else 1,
                cpu_slices=0,
                extra_env=env,
            )
            log(f"{name}: daemon ready in {handle.startup_s:.1f} s")
            try:
                at = [w["switched_at_s"] for w in runs["reshare"]["switches"]] if runs else None
                switching = switches(handle.url, load.duration_s, plans) if not runs else None
                runs[name] = asyncio.run(one_run(handle.url, load, switching, at))
            finally:
                stop_daemon(handle)
            r = runs[name]
            log(f"{name}: {r['answered']}/{r['sent']} answered, {r['within_slo']:.2%} within SLO")
    shown = render(runs)
    print(shown)
    document = {
        "command": "python -m bench.inss_shadow" + (" " + " ".join(argv) if argv else ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform()},
        "options": {
            "duration": args.duration,
            "rates": rates,
            "policy": args.policy,
            "plans": args.plans,
            "moves": args.moves,
        },
        "runs": runs,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "plan-moves" if args.moves else "plan-switch" if args.plans else "shadow"
    (args.out_dir / f"{stem}.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / f"{stem}.md").write_text(shown + "\n")
    bad = [n for n, r in runs.items() if r["unanswered"] or r["answered_twice"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
