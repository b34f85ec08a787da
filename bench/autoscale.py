"""Autoscaling that acts, simulated: a load step up and down (symphony.txt
§4.4, §5.3, §5.6) served with devices added and released by Symphony's
advice (app/scheduling/autoscaler.py) against a fixed device count.

    python -m bench.autoscale            # 3 × 60 s phases (seconds)
    python -m bench.autoscale --quick    # 3 × 20 s

Options: --phase-s, --low-rate / --high-rate (requests/s), --max-devices,
--start-devices, --window-s, --cooldown-s, --startup-s (a device serves
this long after it is started: an executor's start and profile), --seed,
--out-dir (default bench/results/autoscale; writes autoscale.json, .md).

Workload: one model, ℓ(b) = 1.0·b + 10 ms (a GPU-like line), SLO 100 ms,
max batch 32, policy `symphony`; Poisson at `--low-rate`, then
`--high-rate`, then `--low-rate` again, `--phase-s` each (the same arrivals
for every system). Systems: **autoscaled** (from `--start-devices`, up to
`--max-devices`), **fixed-max** (all devices from the start: the
over-provisioned answer) and **fixed-start** (never more than at the
start). Reported per system: within-SLO fraction per phase, device-seconds
in service, and for the autoscaled one the time from the step to the first
added device serving, the first 5-s window back at ≥ 99 % within SLO, and
the devices in service at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.scheduling.autoscaler import Autoscaler, ScalingBounds
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.registry import make_scheduler
from app.scheduling.types import DeviceInfo
from app.simulation.engine import Trace, run_simulation

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "results" / "autoscale"
WINDOW = 5.0  # the within-SLO windows of the report


def arrivals(rates: list[float], phase_s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    times: list[float] = []
    start = 0.0
    for rate in rates:
        t = start
        while (t := t + rng.exponential(1.0 / rate)) < start + phase_s:
            times.append(t)
        start += phase_s
    return np.array(times)


def devices_at(samples: list[tuple[float, int]], t: float) -> int:
    """Devices in service at `t`: the last sample at or before it (the first
    one before any)."""
    before = [n for at, n in samples if at <= t]
    return before[-1] if before else samples[0][1]


def device_seconds(samples: list[tuple[float, int]], end: float) -> float:
    """∫ devices in service dt over [0, end], each (time, devices) sample
    holding until the next."""
    inside = [(at, n) for at, n in samples if 0.0 < at < end]
    steps = [(0.0, devices_at(samples, 0.0)), *inside]
    total = 0.0
    for (at, n), (next_at, _) in zip(steps, [*steps[1:], (end, 0)], strict=True):
        total += n * (next_at - at)
    return total


def attainment(
    arrival: np.ndarray, good: np.ndarray, phase_s: float, window_s: float
) -> tuple[list[float | None], list[tuple[float, float | None]], float | None]:
    """Within SLO (`good` per request, by `arrival`) in each of the three
    phases and in each `window_s` window from 0; and the first window that
    starts a window or more after the step up (the end of phase 1) back at
    ≥ 99 %, in seconds after the step."""
    phases = []
    for k in range(3):
        sel = (arrival >= k * phase_s) & (arrival < (k + 1) * phase_s)
        phases.append(float(good[sel].mean()) if sel.any() else None)
    windows = []
    at = 0.0
    while at < 3 * phase_s - 1e-9:
        sel = (arrival >= at) & (arrival < at + window_s)
        windows.append((at, float(good[sel].mean()) if sel.any() else None))
        at += window_s
    back = next(
        (w for w, v in windows if w >= phase_s + window_s and v is not None and v >= 0.99), None
    )
    return phases, windows, None if back is None else back - phase_s


def run(args: argparse.Namespace, system: str, times: np.ndarray) -> tuple[Trace, Autoscaler]:
    info = ModelInfo("m", LatencyProfile.linear(1.0, 10.0, 32), 0.100, 32)
    devices = [DeviceInfo(i) for i in range(args.max_devices)]
    start = args.max_devices if system == "fixed-max" else args.start_devices
    top = args.start_devices if system == "fixed-start" else args.max_devices
    used = devices[:top]
    bounds = ScalingBounds(
        min_devices=1 if system == "autoscaled" else start,
        max_devices=top,
        window_s=args.window_s if system == "autoscaled" else 1e9,
        cooldown_s=args.cooldown_s,
    )
    scaler = Autoscaler(tuple(d.id for d in used), set(range(start)), bounds)
    core = make_scheduler("symphony", [info], used)
    trace = run_simulation(
        core,
        [info],
        used,
        times,
        np.zeros(len(times), dtype=int),
        autoscaler=scaler,
        startup_s=args.startup_s,
    )
    return trace, scaler


def summarise(trace: Trace, phase_s: float) -> dict[str, Any]:
    good = trace.status == 1
    phases, windows, back = attainment(trace.arrival, good, phase_s, WINDOW)
    scaling = trace.scaling or []
    first_up = next((t for t, n in scaling if t > phase_s and n > scaling[0][1]), None)
    return {
        "within_slo_per_phase": phases,
        "within_slo": float(good.mean()),
        "device_seconds": device_seconds(scaling, trace.end_time),
        "devices_over_time": scaling,
        "first_added_serving_s": None if first_up is None else first_up - phase_s,
        "back_above_99_window_s": back,
        "devices_at_end": scaling[-1][1] if scaling else None,
        "windows": windows,
    }


def render(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    def pct(x: float | None) -> str:
        return "—" if x is None else f"{x:.2%}"

    out = [
        f"Load step {args.low_rate:g} → {args.high_rate:g} → {args.low_rate:g} r/s, "
        f"{args.phase_s:g} s each; devices serve {args.startup_s:g} s after a start",
        "",
        "| system | low | high | low again | device-s | added device serving | ≥ 99 % again "
        "| devices at end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        phases = [pct(x) for x in r["within_slo_per_phase"]]
        added = r["first_added_serving_s"]
        back = r["back_above_99_window_s"]
        out.append(
            f"| {name} | {' | '.join(phases)} | {r['device_seconds']:.0f} | "
            f"{'—' if added is None else f'+{added:.1f} s'} | "
            f"{'—' if back is None else f'window at +{back:.0f} s'} | {r['devices_at_end']} |"
        )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    p.add_argument("--phase-s", type=float, default=60.0)
    p.add_argument("--low-rate", type=float, default=400.0)
    p.add_argument("--high-rate", type=float, default=2000.0)
    p.add_argument("--max-devices", type=int, default=8)
    p.add_argument("--start-devices", type=int, default=2)
    p.add_argument("--window-s", type=float, default=5.0)
    p.add_argument("--cooldown-s", type=float, default=10.0)
    p.add_argument("--startup-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.phase_s = min(args.phase_s, 20.0)
    times = arrivals([args.low_rate, args.high_rate, args.low_rate], args.phase_s, args.seed)
    started = time.perf_counter()
    rows = {}
    for system in ("autoscaled", "fixed-max", "fixed-start"):
        trace, _ = run(args, system, times)
        rows[system] = summarise(trace, args.phase_s)
        print(f"{system}: {rows[system]['within_slo']:.2%} within SLO", file=sys.stderr)
    shown = render(rows, args)
    print(shown)
    argv_text = sys.argv[1:] if argv is None else list(argv)
    document = {
        "command": " ".join(["python -m bench.autoscale", *argv_text]),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "systems": rows,
        "wall_s": time.perf_counter() - started,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "autoscale.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / "autoscale.md").write_text(shown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
