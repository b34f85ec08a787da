"""Autoscaling that acts, live: the load step of bench/autoscale.py sent over
HTTP to the daemon (`python -m app serve`) on emulated devices, with
`AUTOSCALE` against a fixed device count (symphony.txt §4.4, §5.3, §5.6).

    python -m bench.autoscale_live            # 3 × 20 s phases per system (~3.5 min)
    python -m bench.autoscale_live --quick    # 3 × 8 s, autoscaled only

Options: --phase-s, --low-rate / --high-rate (requests/s), --alpha-ms,
--systems (comma list of autoscaled, fixed-max, fixed-start), --workers
(load generator processes), --seed, --out-dir (default
bench/results/autoscale; writes live.json and live.md).

Setup: one emulated model, ℓ(b) = α·b + 10 ms, SLO 100 ms, max batch 32,
policy `symphony`, written to a temporary repository. Poisson arrivals at
`--low-rate`, then `--high-rate`, then `--low-rate` again, `--phase-s`
each, from `bench.loadgen` (the same arrivals for every system). This box
drives a few hundred requests/s over HTTP, not the simulation's 2,000, so
the rates are scaled down (150 → 600 → 150) and α up by the same factor
(3.3 ms rather than 1 ms): each device's work per second at each phase is
the simulation's, and two devices fall short at the high rate as they do
there. Systems:

* **autoscaled** — `EMULATED_DEVICES=8`, `AUTOSCALE=2:8`,
  `AUTOSCALE_WINDOW_S=2`, `AUTOSCALE_COOLDOWN_S=4`: two devices serve at
  the start, the other six are parked and started when the bad rate calls
  for them (app/server/autoscaling.py); a started device serves once its
  executor process is up and has loaded the model;
* **fixed-max** — all 8 devices serve throughout (no AUTOSCALE);
* **fixed-start** — `EMULATED_DEVICES=2`.

The devices in service are read from `GET /v2/devices` (its `alive`
count) every 0.5 s. Reported per system: within-SLO fraction per phase and
per 2-s window, the devices in service over time, device-seconds, the time
from the step up to the first added device alive, the first 2-s window
after the step back at ≥ 99 % within SLO, the devices alive at the end, and
the requests sent and answered (every request must get an answer: 200 or
an explicit error).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.scheduling.profile import LatencyProfile
from app.workloads.arrivals import Arrivals
from app.workloads.spec import ArrivalSpec, DeviceSpec, ModelSpec, Workload
from bench.autoscale import arrivals as step_arrivals
from bench.autoscale import attainment, device_seconds, devices_at
from bench.daemon_launcher import free_port, start_daemon, stop_daemon
from bench.loadgen import prepare_targets, run_load
from bench.loadgen.records import Records

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "results" / "autoscale"
BETA_MS, SLO_MS, MAX_BATCH = 10.0, 100.0, 32
MAX_DEVICES, START_DEVICES = 8, 2
SCALE_WINDOW_S, COOLDOWN_S = 2.0, 4.0
WINDOW = 2.0  # the within-SLO windows of the report
POLL_S = 0.5  # GET /v2/devices
SYSTEMS = ("autoscaled", "fixed-max", "fixed-start")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def repository(root: Path, alpha_ms: float) -> Path:
    """One emulated model `m` served on every emulated device."""
    (root / "m").mkdir(parents=True)
    (root / "m" / "config.yaml").write_text(
        "backend: emulated\n"
        f"max_batch_size: {MAX_BATCH}\n"
        f"slo_ms: {SLO_MS:g}\n"
        f"profile: {{alpha_ms: {alpha_ms:g}, beta_ms: {BETA_MS:g}}}\n"
        "devices: [emulated]\n"
        "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
    )
    return root


def daemon_env(system: str) -> tuple[int, dict[str, str]]:
    """The emulated device count and extra environment of `system`."""
    if system == "autoscaled":
        return MAX_DEVICES, {
            "AUTOSCALE": f"{START_DEVICES}:{MAX_DEVICES}",
            "AUTOSCALE_WINDOW_S": f"{SCALE_WINDOW_S:g}",
            "AUTOSCALE_COOLDOWN_S": f"{COOLDOWN_S:g}",
        }
    if system == "fixed-max":
        return MAX_DEVICES, {}
    if system == "fixed-start":
        return START_DEVICES, {}
    raise ValueError(f"unknown system {system!r}; systems: {', '.join(SYSTEMS)}")


# How long after its SLO the client waits for an answer: the run checks that
# every request is answered, and a box busy with other work can hold an
# answer past the load generator's default 0.5 s (it is then late, not lost).
ANSWER_WAIT_MS = 5000.0


async def poll_devices(url: str, stop: asyncio.Event, samples: list[tuple[float, int]]) -> None:
    """Append (time.monotonic(), devices alive) every POLL_S until `stop`."""
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        while not stop.is_set():
            reply = await client.get("/v2/devices")
            reply.raise_for_status()
            alive = sum(1 for d in reply.json()["devices"] if d["alive"])
            samples.append((time.monotonic(), alive))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)


async def one_run(url: str, load: Workload, times: np.ndarray, workers: int) -> dict[str, Any]:
    """Send `times` to the daemon at `url` while polling its devices; the
    records and the device samples, in seconds from the load's start."""
    targets = await prepare_targets(url, load)
    schedule = Arrivals(times, np.zeros(len(times), dtype=np.int32))
    # The generator's t0 is not returned: each progress report says how many
    # requests went out, and request k goes out at or after t0 + times[k], so
    # now − times[sent − 1] bounds t0 from above; the least bound is t0 to
    # within an inter-arrival gap plus the send lag.
    t0_bounds: list[float] = []

    def progress(sent: int, done: int, total: int) -> None:
        if sent > 0:
            t0_bounds.append(time.monotonic() - times[sent - 1])

    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    poller = asyncio.create_task(poll_devices(url, stop, samples))
    try:
        result = await run_load(
            url,
            load,
            targets=targets,
            arrivals=schedule,
            workers=workers,
            progress=progress,
            timeout_margin_ms=ANSWER_WAIT_MS,
        )
    finally:
        stop.set()
        await poller
    t0 = min(t0_bounds)
    return {
        "records": result.records,
        "generator": result.generator,
        "devices": [(at - t0, n) for at, n in samples],
    }


def summarise(run: dict[str, Any], phase_s: float) -> dict[str, Any]:
    records: Records = run["records"]
    samples: list[tuple[float, int]] = run["devices"]
    step_up, step_down, end = phase_s, 2 * phase_s, 3 * phase_s
    answered = records.status != 0
    good = (records.status == 200) & (records.latency_ms <= SLO_MS)
    phases, windows, back = attainment(records.intended, good, phase_s, WINDOW)
    at_step = devices_at(samples, step_up)
    first_up = next((t for t, n in samples if t > step_up and n > at_step), None)
    peak = max((n for t, n in samples if step_up < t <= end), default=at_step)
    errors = records.errors()
    return {
        "sent": int(np.isfinite(records.sent).sum()),
        "requests": len(records.status),
        "answered": int(answered.sum()),
        "unanswered": int((~answered).sum()),
        "errors": errors,
        "no_answer": {
            records.reasons[r] if r >= 0 else "?": int(c)
            for r, c in zip(*np.unique(records.reason[~answered], return_counts=True), strict=True)
        },
        "within_slo": float(good.mean()) if len(good) else None,
        "within_slo_per_phase": phases,
        "windows": windows,
        "devices_over_time": samples,
        "device_seconds": device_seconds(samples, end),
        "devices_at_step_up": at_step,
        "devices_peak_after_step_up": peak,
        "devices_at_step_down": devices_at(samples, step_down),
        "devices_at_end": devices_at(samples, end),
        "first_added_alive_s": None if first_up is None else first_up - step_up,
        "back_above_99_window_s": back,
        "generator": run["generator"],
    }


def render(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    def pct(x: float | None) -> str:
        return "—" if x is None else f"{x:.2%}"

    out = [
        f"Load step {args.low_rate:g} → {args.high_rate:g} → {args.low_rate:g} r/s, "
        f"{args.phase_s:g} s each, over HTTP; ℓ(b) = {args.alpha_ms:g}·b + {BETA_MS:g} ms, "
        f"SLO {SLO_MS:g} ms; autoscaled: AUTOSCALE={START_DEVICES}:{MAX_DEVICES}, "
        f"window {SCALE_WINDOW_S:g} s, cool-down {COOLDOWN_S:g} s",
        "",
        "| system | low | high | low again | device-s | added device alive | ≥ 99 % again "
        "| devices peak / end | answered |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        phases = [pct(x) for x in r["within_slo_per_phase"]]
        added = r["first_added_alive_s"]
        back = r["back_above_99_window_s"]
        out.append(
            f"| {name} | {' | '.join(phases)} | {r['device_seconds']:.0f} | "
            f"{'—' if added is None else f'+{added:.1f} s'} | "
            f"{'—' if back is None else f'window at +{back:.0f} s'} | "
            f"{r['devices_peak_after_step_up']} / {r['devices_at_end']} | "
            f"{r['answered']}/{r['requests']} |"
        )
    out += ["", f"Within SLO per {WINDOW:g}-s window (from the start, s):", ""]
    starts = [w for w, _ in next(iter(rows.values()))["windows"]] if rows else []
    out.append("| system | " + " | ".join(f"{w:g}" for w in starts) + " |")
    out.append("|---|" + "---:|" * len(starts))
    for name, r in rows.items():
        cells = ["—" if v is None else f"{v:.0%}" for _, v in r["windows"]]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.autoscale_live", description=__doc__)
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--low-rate", type=float, default=150.0)
    p.add_argument("--high-rate", type=float, default=600.0)
    p.add_argument("--alpha-ms", type=float, default=3.3, help="ℓ(b)'s ms per item")
    p.add_argument("--systems", default=None, help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--workers", type=int, default=1, help="load generator processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="8-s phases, autoscaled only")
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.phase_s = min(args.phase_s, 8.0)
    if args.systems is None:
        systems = ["autoscaled"] if args.quick else list(SYSTEMS)
    else:
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise SystemExit(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}")
    if not (args.phase_s > 0 and args.low_rate > 0 and args.high_rate > 0 and args.alpha_ms > 0):
        raise SystemExit("--phase-s, --low-rate, --high-rate and --alpha-ms must be positive")
    times = step_arrivals([args.low_rate, args.high_rate, args.low_rate], args.phase_s, args.seed)
    profile = LatencyProfile.linear(args.alpha_ms, BETA_MS, MAX_BATCH)
    mean_rate = len(times) / (3 * args.phase_s)
    model = ModelSpec("m", profile, SLO_MS, MAX_BATCH, mean_rate, ArrivalSpec("poisson", {}))
    devices = [DeviceSpec("emulated")]
    load = Workload("autoscale-live", 3 * args.phase_s, args.seed, devices, [model])
    started = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="autoscale-live-") as tmp:
        repo = repository(Path(tmp) / "models", args.alpha_ms)
        for system in systems:
            devices, env = daemon_env(system)
            handle = start_daemon(
                repo, free_port(), emulated_devices=devices, cpu_slices=0, extra_env=env
            )
            log(f"{system}: daemon ready in {handle.startup_s:.1f} s")
            try:
                run = asyncio.run(one_run(handle.url, load, times, args.workers))
            finally:
                stop_daemon(handle)
            rows[system] = summarise(run, args.phase_s)
            r = rows[system]
            log(
                f"{system}: {r['answered']}/{r['requests']} answered, "
                f"{r['within_slo']:.2%} within SLO, devices {r['devices_at_step_up']} → "
                f"{r['devices_peak_after_step_up']} → {r['devices_at_end']}"
            )
    shown = render(rows, args)
    print(shown)
    argv_text = sys.argv[1:] if argv is None else list(argv)
    document = {
        "command": " ".join(["python -m bench.autoscale_live", *argv_text]),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform()},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "systems": rows,
        "wall_s": time.perf_counter() - started,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "live.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / "live.md").write_text(shown + "\n")
    return 1 if any(r["unanswered"] for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
