"""CPU milliseconds per answered request, per process, for the daemon and each peer.

    python -m bench.cpu_per_request [--workload a] [--devices 1] [--rates 250]
                                    [--duration 10] [--rounds 1] [--systems symphony]
                                    [--layers asgi-floor,api-noop]
                                    [--peers tritonserver,ray,bentoml] [--out FILE]

Every system is started in turn on the same setup as `bench.compare`
(`--workload` names one of its setups; `--devices` as there), warmed up,
then sent each offered rate of `--rates` (requests per second, open loop,
`bench.loadgen`) for `--duration` seconds. Around each run the CPU time
(user + system) of the server's whole process tree is read from /proc: its
main process (the daemon's event loop; a peer's server or launcher) and
every descendant (the daemon's executors, Triton's Python-backend stubs,
Ray's and BentoML's workers). The figure is the CPU each process used
during the run divided by the requests answered (HTTP 200) in it.

With `--rounds N` the whole set is measured N times, each system started
afresh every round and the order reversed every other round (A B, B A,
…), so that a drift of the machine's speed falls on every system alike;
the table gives each figure's median over the rounds and every round's
total, and each row of the output carries its `round`. On a shared VM one
run's figure moves by a quarter from one minute to the next: compare
medians.

`--layers` adds two reference servers that split the daemon's figure
(bench/cpu_layers.py): `asgi-floor`, uvicorn with an ASGI app that answers
a fixed body (what uvicorn alone costs), and `api-noop`, the daemon's HTTP
API in front of a service that answers at once (what the API layer adds);
both on the setup's repository, sent the daemon's requests.

A peer runs at the first point of its grid (its settings are in the
output). A peer that is not installed is reported as such, with the
install command, and the run goes on with the others. Written to `--out`
(default bench/results/cpu_per_request.json) and printed as a table;
`bench.compare --cpu-rates` adds the same probes to its own results.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app.workloads.spec import Workload, load_workload
from bench.cli import sanitize
from bench.loadgen import ModelTarget, prepare_targets, run_load
from bench.loadgen.targets import build_targets
from bench.proc_cpu import PROC, Usage, read_tree, usage
from bench.progress import say

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cpu_per_request.json"
WARM_UP_S = 2.0


def probe_row(offered_rps: float, answered: int, duration_s: float, used: Usage) -> dict[str, Any]:
    """One rate's figures: CPU ms per answered request, in all and per process."""

    def per_request(seconds: float) -> float | None:
        return 1000.0 * seconds / answered if answered else None

    return {
        "offered_rps": offered_rps,
        "answered": answered,
        "answered_rps": answered / duration_s if duration_s > 0 else 0.0,
        "cpu_ms_per_request": per_request(used.total_s),
        "processes_gone": used.gone,
        "processes": [
            {
                "pid": p.pid,
                "name": p.name,
                "role": p.role,
                "cpu_s": p.cpu_s,
                "cpu_ms_per_request": per_request(p.cpu_s),
            }
            for p in used.processes
        ],
    }


# One open-loop run: (url, workload, rate scale, targets) → requests answered.
LoadRun = Callable[[str, Workload, float, Sequence[ModelTarget]], int]


def answered_run(
    url: str, workload: Workload, scale: float, targets: Sequence[ModelTarget], workers: int = 1
) -> int:
    """Run `workload` at `scale` against `url`; how many requests were answered (200)."""
    result = asyncio.run(run_load(url, workload, scale, targets=targets, workers=workers))
    return int((result.records.status == 200).sum())


def cpu_probes(
    url: str,
    root_pid: int,
    workload: Workload,
    targets: Sequence[ModelTarget],
    rates: Sequence[float],
    duration_s: float,
    *,
    run: LoadRun = answered_run,
    proc: Path = PROC,
) -> list[dict[str, Any]]:
    """A warm-up run, then one run per offered rate, the tree's CPU read around each."""
    nominal = workload.offered_rate()
    short = dataclasses.replace(workload, duration_s=float(duration_s))
    warm = dataclasses.replace(workload, duration_s=min(WARM_UP_S, float(duration_s)))
    if rates:
        say(f"CPU probes: warm-up ({warm.duration_s:g} s)")
        run(url, warm, min(rates) / nominal, targets)
    rows = []
    for rate in rates:
        say(f"CPU probe at {rate:,.0f} r/s for {duration_s:g} s")
        before = read_tree(root_pid, proc)
        answered = run(url, short, rate / nominal, targets)
        after = read_tree(root_pid, proc)
        rows.append(probe_row(rate, answered, float(duration_s), usage(before, after)))
    return rows


def table(results: Sequence[dict[str, Any]]) -> str:
    """One row per system and rate: CPU ms per answered request, main process,
    the rest — each the median over the rounds — and every round's total."""
    lines = [
        "| system | offered r/s | answered r/s | CPU ms / request | main process | children "
        "| each round |",
        "|---|---|---|---|---|---|---|",
    ]
    for system in results:
        if "unavailable" in system:
            lines.append(f"| {system['system']} | not installed: {system['unavailable']} ||||||")
            continue
        by_rate: dict[float, list[dict[str, Any]]] = {}
        for row in system["cpu_per_request"]:
            by_rate.setdefault(row["offered_rps"], []).append(row)
        for rate, rows in by_rate.items():
            totals = [row["cpu_ms_per_request"] for row in rows]
            answered = [row for row in rows if row["answered"]]
            main = [_role_ms(row, "main") for row in answered]
            rest = [_role_ms(row, "child") for row in answered]
            lines.append(
                f"| {system['label']} | {rate:,.0f} "
                f"| {statistics.median(r['answered_rps'] for r in rows):,.0f} "
                f"| {_ms(_median(totals))} | {_ms(_median(main))} | {_ms(_median(rest))} "
                f"| {' / '.join(_ms(t) for t in totals)} |"
            )
    return "\n".join(lines)


def _role_ms(row: dict[str, Any], role: str) -> float:
    return 1000.0 * sum(p["cpu_s"] for p in row["processes"] if p["role"] == role) / row["answered"]


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


# One system's measurement, started afresh: its result document.
Measure = Callable[[], dict[str, Any]]


def measure_rounds(measures: Sequence[tuple[str, Measure]], rounds: int) -> list[dict[str, Any]]:
    """Each of `measures` `rounds` times, the order reversed every other
    round; one result per system (in the order given) whose rows carry their
    `round`. A system reported unavailable is not tried again."""
    merged: dict[str, dict[str, Any]] = {}
    for number in range(1, rounds + 1):
        order = measures if number % 2 else list(reversed(measures))
        for name, measure in order:
            if "unavailable" in merged.get(name, {}):
                continue
            if rounds > 1:
                say(f"round {number} of {rounds}: {name}")
            result = measure()
            if "unavailable" in result:
                merged[name] = result
                continue
            rows = [{**row, "round": number} for row in result["cpu_per_request"]]
            if name in merged:
                merged[name]["cpu_per_request"] += rows
            else:
                merged[name] = {**result, "cpu_per_request": rows}
    return [merged[name] for name, _ in measures]


def measure_daemon(setup: Any, workload: Workload, policy: str, args: Any) -> dict[str, Any]:
    from bench.daemon_launcher import free_port, start_daemon, stop_daemon

    say(f"starting the daemon (policy {policy})")
    handle = start_daemon(
        setup.repository,
        free_port(),
        policy=policy,
        emulated_devices=setup.emulated_devices,
        cpu_slices=setup.cpu_slices,
        threads_per_slice=setup.cpu_threads,
    )
    try:
        targets = asyncio.run(prepare_targets(handle.url, workload))
        rows = cpu_probes(
            handle.url, handle.process.pid, workload, targets, args.rates, args.duration
        )
    finally:
        stop_daemon(handle)
    return {"system": policy, "label": f"daemon, policy {policy}", "cpu_per_request": rows}


def measure_layer(setup: Any, workload: Workload, name: str, args: Any) -> dict[str, Any]:
    """A reference server of bench/cpu_layers.py under uvicorn, as the daemon runs it."""
    from bench.cpu_layers import LAYERS, REPOSITORY_ENV
    from bench.daemon_launcher import free_port, start_server, stop_daemon

    say(f"starting {name} (uvicorn)")
    layer = LAYERS[name]
    port = free_port()
    env = dict(os.environ, **{REPOSITORY_ENV: str(Path(setup.repository).resolve())})
    argv = [sys.executable, "-m", "uvicorn", *layer.app, "--port", str(port)]
    argv += ["--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level=warning"]
    handle = start_server(argv, port, env, startup_timeout_s=60.0, log_prefix="cpu-layer-")
    try:
        targets = layer_targets(setup, workload)
        rows = cpu_probes(
            handle.url, handle.process.pid, workload, targets, args.rates, args.duration
        )
    finally:
        stop_daemon(handle)
    return {"system": name, "label": layer.label, "cpu_per_request": rows}


def layer_targets(setup: Any, workload: Workload) -> list[ModelTarget]:
    """The daemon's requests for `workload`, made from the setup's repository
    (the floor answers no metadata to make them from)."""
    from app.repository.loader import load_repository

    configs = load_repository(Path(setup.repository)).models
    inputs = {
        name: [
            {"name": s.name, "datatype": s.datatype, "shape": [-1, *s.item_shape]}
            for s in configs[name].inputs
        ]
        for name in (m.name for m in workload.models)
        if name in configs
    }
    return build_targets(workload, inputs)


def measure_peer(setup: Any, workload: Workload, name: str, args: Any) -> dict[str, Any]:
    from bench.compare.measure import Options
    from bench.compare.peers import PEERS, PeerUnavailable

    peer = PEERS[name]
    try:
        peer.check()
    except PeerUnavailable as exc:
        say(f"{name}: not installed")
        return {"system": name, "unavailable": str(exc)}
    options = Options(
        probe_duration_s=args.duration, max_probes=1, cdf_scale=1.0, cdf_fraction=None, workers=1
    )
    point = peer.grid(setup, workload, options)[0]
    say(f"starting {name} ({point.label})")
    running = peer.start(setup, workload, point)
    try:
        rows = cpu_probes(
            running.url,
            running.handle.process.pid,
            workload,
            peer.targets(setup, workload),
            args.rates,
            args.duration,
        )
    finally:
        peer.stop(running)
    return {
        "system": name,
        "label": f"{peer.title}, {point.label}",
        "settings": point.settings,
        "cpu_per_request": rows,
    }


def build_parser() -> argparse.ArgumentParser:
    from bench.compare.setups import SETUPS

    p = argparse.ArgumentParser(
        prog="python -m bench.cpu_per_request", description=__doc__.splitlines()[0]
    )
    p.add_argument("--workload", default="a", choices=list(SETUPS))
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--rates", type=_rates, default=(250.0,), help="offered r/s, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per rate")
    p.add_argument(
        "--rounds", type=_rounds, default=1, help="measure each system this many times, alternating"
    )
    p.add_argument("--systems", default="symphony", help="the daemon's policies ('none': none)")
    p.add_argument(
        "--layers", default="none", help="reference servers: asgi-floor, api-noop ('none': none)"
    )
    p.add_argument("--peers", default="tritonserver,ray,bentoml", help="peers ('none': none)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p


def _rates(text: str) -> tuple[float, ...]:
    rates = tuple(float(v) for v in text.split(",") if v.strip())
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be > 0 r/s, got {text!r}")
    return rates


def _rounds(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"rounds must be a whole number ≥ 1, got {text!r}")
    return int(text)


def _names(raw: str) -> list[str]:
    names = [s.strip() for s in raw.split(",") if s.strip()]
    return [] if names == ["none"] else names


def main(argv: list[str] | None = None) -> int:
    from bench.compare.cli import DAEMON_POLICIES
    from bench.compare.peers import PEERS
    from bench.compare.setups import SETUPS

    args = build_parser().parse_args(argv)
    from bench.cpu_layers import LAYERS

    systems, layers, peers = _names(args.systems), _names(args.layers), _names(args.peers)
    unknown = (
        [s for s in systems if s not in DAEMON_POLICIES]
        + [name for name in layers if name not in LAYERS]
        + [p for p in peers if p not in PEERS]
    )
    if unknown:
        print(f"error: unknown systems {unknown}", file=sys.stderr)
        return 2
    setup = SETUPS[args.workload].on_devices(args.devices)
    workload = setup.workload_on_devices(load_workload(setup.workload))
    measures: list[tuple[str, Measure]] = [
        (s, functools.partial(measure_daemon, setup, workload, s, args)) for s in systems
    ]
    measures += [(n, functools.partial(measure_layer, setup, workload, n, args)) for n in layers]
    measures += [(p, functools.partial(measure_peer, setup, workload, p, args)) for p in peers]
    results = measure_rounds(measures, args.rounds)
    doc = {
        "workload": workload.name,
        "devices": setup.devices,
        "rates": list(args.rates),
        "duration_s": args.duration,
        "rounds": args.rounds,
        "systems": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(sanitize(doc), indent=1) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
