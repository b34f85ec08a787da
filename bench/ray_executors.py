"""Executors on Ray against local executors, on a local two-raylet cluster
(issues 24 and 40).

    python -m bench.ray_executors              # ~10 min on 2 cores
    python -m bench.ray_executors --quick      # about a minute and a quarter
    python -m bench.ray_executors --netns      # the worker raylet in a namespace (root)

Options: --batches (dispatch-overhead batches per pool, default 300),
--probe (seconds per capacity probe, default 5), --max-runs (capacity probes
per daemon, default 8), --kill-duration (seconds of load in the kill step,
default 10), --netns (below), --out-dir (default bench/results/ray, with
--netns bench/results/ray-two-nodes; writes ray.json, ray.md).

Setup: a `LocalRayCluster` (bench/ray_cluster.py) of a head and one worker
raylet on this machine, one CPU each. With `--netns` the worker raylet runs
in a network namespace of its own joined by a veth pair (bench/netns.py),
so what goes to it crosses a real network stack. Four steps:

1. **Outputs** — a small ONNX MLP, the same rows through a local
   `ExecutorPool` (an executor process), a `RayExecutorPool` whose actor is
   pinned to the driver's raylet (the shared-memory arena and the batch
   channel), the same through Ray calls, and one pinned to the other raylet
   (Ray's object store); max |Δ| of each against the local outputs
   (bench/ray_pool_steps.py).
2. **Dispatch overhead** — one-row batches of an emulated model with
   ℓ(b) = 0, one after another, through each of the four: per batch, submit
   → BatchFinished minus the run time the executor reports; median and p99.
3. **Live capacity on workload (a)** (bench/workloads/live-a-resnet50-
   emulated.yaml, served from bench/repositories/live): the daemon with two
   local emulated executors; with `RAY_ADDRESS` set to the cluster and both
   executors on its node (`RAY_NODES=0=local,1=local`); and with Ray
   placing them (with `--netns`: one on each node instead).
   `find_live_capacity` (≥ 99 % within SLO) with short probes; the table
   gives the bracket the probes set when the search ran out of probes.
4. **Kill** — the last daemon under a steady 50 % of workload (a)'s rate;
   at 40 % of the run one executor actor's worker process (the cluster's
   process whose command line names `ExecutorActor`; with `--netns` the one
   on the namespace's node) is killed.
   Checked: every request sent is answered, and the daemon's Triton
   statistics count as many successes as the generator received answers
   with outputs (none answered twice; the generator waits 5 s past the
   SLO, since the daemon learns of a death on another node only after up
   to about a second: the heartbeat's silence, HEARTBEAT_TIMEOUT_S, or
   Ray's notice; on its own node the batch channel's close tells it at
   once). Reported, from the daemon's log (app/runtime/ray_faults.py's
   lines): when the daemon saw the actor die (DeviceDown), and when it was
   back — Ray restarted it and it loaded its model (DeviceUp) — in seconds
   after the kill.

Everything started is torn down by PID: the daemons (`stop_daemon`) and the
cluster (leaving its context), then the namespace. The exit status is 1 when
outputs differ, a batch did not end in exactly one event, a request of the
kill step was unanswered or answered twice, or the device did not come back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.workloads.spec import Workload, load_workload
from bench.daemon_launcher import DaemonHandle, free_port, start_daemon, stop_daemon
from bench.loadgen import find_live_capacity, prepare_targets, run_load
from bench.netns import VethNamespace
from bench.ray_cluster import LocalRayCluster, import_ray, is_live
from bench.ray_pool_steps import KINDS, pool_steps

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "results" / "ray"
TWO_NODES_OUT_DIR = ROOT / "bench" / "results" / "ray-two-nodes"
WORKLOAD = ROOT / "bench" / "workloads" / "live-a-resnet50-emulated.yaml"
REPOSITORY = ROOT / "bench" / "repositories" / "live"
ACTOR_CLASS = "ExecutorActor"  # app/runtime/ray_actor.py; Ray names its worker process after it
KILL_AT = 0.4  # of the kill step's run
KILL_RATE_SCALE = 0.5
# The generator gives up on a request this long after its SLO. Ray tells the
# daemon of a dead actor about a second after the kill, and the requests of
# the batches sent to it meanwhile are answered then: wait for them, so that
# "answered" counts the daemon's answers, not the generator's patience.
KILL_TIMEOUT_MARGIN_MS = 5000.0
MAX_DELTA = 1e-5  # outputs "equal": float32 round-off at most
POLL_S = 0.05
PAIRED_SETTLE_S = 0.5  # between two paired runs: the previous daemon drains
SERVE_AGAIN_TIMEOUT_S = 60.0
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}  # as the cluster runs (bench/ray_cluster.py)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------ the daemons
def start(cluster: LocalRayCluster | None, ray_nodes: str | None = None) -> DaemonHandle:
    """The daemon on workload (a)'s repository, two emulated devices: local
    executors, or Ray actors on `cluster` (placed by RAY_NODES, or by Ray)."""
    env = dict(NO_AUTH, RAY_ADDRESS=cluster.address) if cluster is not None else {}
    if ray_nodes is not None:
        env["RAY_NODES"] = ray_nodes
    return start_daemon(REPOSITORY, free_port(), emulated_devices=2, cpu_slices=0, extra_env=env)


# The daemons of the capacity step: (name, on Ray, RAY_NODES). The kill step
# runs on the last one.
LOCAL_DAEMON, SAME_NODE_DAEMON, PLACED_DAEMON, TWO_NODE_DAEMON = (
    "local executors",
    "Ray executors, daemon's node",
    "Ray executors, placed by Ray",
    "Ray executors, one per node",
)
DAEMONS = (
    (LOCAL_DAEMON, False, None),
    (SAME_NODE_DAEMON, True, "0=local,1=local"),  # both take the batch channel
    (PLACED_DAEMON, True, None),
)


def two_node_daemons(worker: str) -> tuple[tuple[str, bool, str | None], ...]:
    """With the worker raylet in a namespace of its own: executor 0 on the
    daemon's node, executor 1 on the worker (node id `worker`)."""
    return (
        (LOCAL_DAEMON, False, None),
        (SAME_NODE_DAEMON, True, "0=local,1=local"),
        (TWO_NODE_DAEMON, True, f"0=local,1={worker}"),
    )


def capacity(url: str, workload: Workload, probe_s: float, max_runs: int) -> dict[str, Any]:
    found, _ = find_live_capacity(url, workload, probe_duration_s=probe_s, max_runs=max_runs)
    probes = sorted(found.probes, key=lambda p: p.scale)
    return {
        "capacity_rps": found.capacity_rps,
        "status": found.status,
        "target": found.target,
        "measured": measured(found.capacity_rps, found.status, probes),
        "probes": [
            {
                "rate_scale": p.scale,
                "offered_rps": p.offered_rps,
                "goodput_rps": p.goodput_rps,
                "within_slo": p.attainment,
                "passed": p.passed,
            }
            for p in probes
        ],
    }


def measured(capacity_rps: float, status: str, probes: list[Any]) -> str:
    """What the probes show of the capacity: the search's value when it
    converged, else the bound they set (≥ the highest passing rate, < the
    lowest failing one), never a bare 0 after probes that ran."""
    if status == "converged" or not probes:
        return f"{capacity_rps:.0f}"
    passing = [p.offered_rps for p in probes if p.passed]
    failing = [p.offered_rps for p in probes if not p.passed]
    bounds = []
    if passing:
        bounds.append(f"≥ {max(passing):.0f}")
    if failing:
        bounds.append(f"< {min(failing):.0f}")
    return " and ".join(bounds)


# ------------------------------------------------------ paired probes
async def paired_probes(
    handles: dict[str, DaemonHandle], workload: Workload, scale: float, rounds: int, probe_s: float
) -> dict[str, Any]:
    """The same short run at `scale` against each daemon in turn, `rounds`
    times, the order reversed every round (ABBA…), so that the box's
    changing load falls on all alike; per daemon, each run's share within
    SLO and goodput, and their means."""
    short = dataclasses.replace(workload, duration_s=probe_s)
    targets = {name: await prepare_targets(h.url, short) for name, h in handles.items()}
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in handles}
    for round_ in range(rounds):
        order = list(handles) if round_ % 2 == 0 else list(reversed(handles))
        for name in order:
            await asyncio.sleep(PAIRED_SETTLE_S)
            result = await run_load(handles[name].url, short, scale, targets=targets[name])
            offered = float(result.summary["overall"]["offered_rps"])
            runs[name].append((offered, result.attainment, result.goodput))
    return {
        name: {
            "rate_scale": scale,
            "rounds": rounds,
            "probe_s": probe_s,
            "offered_rps": [o for o, _, _ in done],
            "within_slo": [a for _, a, _ in done],
            "goodput_rps": [g for _, _, g in done],
            "mean_within_slo": float(np.mean([a for _, a, _ in done])),
            "mean_goodput_rps": float(np.mean([g for _, _, g in done])),
        }
        for name, done in runs.items()
    }


# ------------------------------------------------------------- the kill
def actor_pids(cluster: LocalRayCluster) -> list[int]:
    """The cluster's worker processes that run an executor actor."""
    found = []
    for node in cluster.nodes:
        for process in node.processes():
            try:
                cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
            except OSError:
                continue
            if ACTOR_CLASS.encode() in cmdline and is_live(process.pid):
                found.append(process.pid)
    return sorted(found)


# DeviceDown's log line: Ray's notice of the death, or the watchdog's
# heartbeat falling silent first.
DIED = re.compile(r"executor (\S+) (?:\(Ray actor\) died|hung: no heartbeat)")
BACK = re.compile(r"executor (\S+) is back \(Ray actor pid (\d+), restart \d+\) after ([\d.]+) s")


async def kill_and_watch(
    log_path: Path,
    cluster: LocalRayCluster,
    kill_in_s: float,
    limit_s: float,
    on_node: str | None = None,
) -> dict[str, Any]:
    """Kill one actor's process (on the node named `on_node`, else any)
    after `kill_in_s`; watch the daemon's log (app/runtime/ray_faults.py's
    lines: the actor died or fell silent, it is back) until the device is
    back, at most `limit_s` after the kill."""
    await asyncio.sleep(kill_in_s)
    pids = actor_pids(cluster)
    if on_node is not None:
        there = {p.pid for p in cluster.node(on_node).processes()}
        candidates = [pid for pid in pids if pid in there]
    else:
        candidates = pids
    if not candidates:
        raise RuntimeError(f"no process of the cluster names {ACTOR_CLASS}")
    victim = candidates[0]
    node = next(n.name for n in cluster.nodes if victim in {p.pid for p in n.processes()})
    seen = log_path.stat().st_size
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    died = back = None
    while time.monotonic() - killed < limit_s:
        text = log_path.read_bytes()[seen:].decode(errors="replace")
        now = time.monotonic() - killed
        if died is None and (found := DIED.search(text)):
            died = (found.group(1), now)
        if died is not None and (found := BACK.search(text)):
            back = (found.group(1), int(found.group(2)), float(found.group(3)), now)
            break
        await asyncio.sleep(POLL_S)
    return {
        "actor_pids": pids,
        "killed_pid": victim,
        "killed_on": node,
        "devices_down": [died[0]] if died else [],
        "down_seen_after_s": died[1] if died else None,
        "serving_again_after_s": back[3] if back else None,
        "new_actor_pid": back[1] if back else None,
        "daemon_down_to_up_s": back[2] if back else None,
    }


async def successes(client: httpx.AsyncClient, model: str) -> int:
    doc = (await client.get("/v2/models/stats")).json()
    return sum(
        int(m["inference_stats"]["success"]["count"])
        for m in doc["model_stats"]
        if m["name"] == model
    )


async def kill_step(
    handle: DaemonHandle, cluster: LocalRayCluster, load: Workload, on_node: str | None = None
) -> dict[str, Any]:
    """Steady load with one actor killed mid-run (module docstring, step 4)."""
    (model,) = [m.name for m in load.models]
    url = handle.url
    targets = await prepare_targets(url, load)
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        before = await successes(client, model)
    running = asyncio.create_task(
        run_load(
            url, load, KILL_RATE_SCALE, targets=targets, timeout_margin_ms=KILL_TIMEOUT_MARGIN_MS
        )
    )
    kill = await kill_and_watch(
        handle.log_path,
        cluster,
        KILL_AT * load.duration_s,
        load.duration_s + SERVE_AGAIN_TIMEOUT_S,
        on_node,
    )
    records = (await running).records
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        after = await successes(client, model)
    answered = records.status != 0
    ok = records.status == 200
    errors = records.errors()
    return {
        "duration_s": load.duration_s,
        "rate_scale": KILL_RATE_SCALE,
        "timeout_margin_ms": KILL_TIMEOUT_MARGIN_MS,
        "within_slo": float((ok & (records.latency_ms <= load.models[0].slo_ms)).mean()),
        "sent": int(np.isfinite(records.sent).sum()),
        "answered": int(answered.sum()),
        "unanswered": int((~answered).sum()),
        "ok": int(ok.sum()),
        "errors": errors,
        "server_successes": after - before,
        "answered_twice": (after - before) - int(ok.sum()),
        **kill,
    }


# ------------------------------------------------------------ the report
def render(doc: dict[str, Any]) -> str:
    out = [
        "| executors | data path | outputs max \\|Δ\\| | overhead median ms | p99 ms |",
        "|---|---|---:|---:|---:|",
    ]
    for kind in KINDS:
        o, d = doc["outputs"][kind], doc["overhead"][kind]
        out.append(
            f"| {kind} | {d['data_path']} | {o['max_abs_delta']:g} | "
            f"{d['median_ms']:.3f} | {d['p99_ms']:.3f} |"
        )
    out += ["", "| workload (a) | capacity r/s | search |", "|---|---:|---|"]
    for name, c in doc["capacity"].items():
        tried = ", ".join(
            f"{p['rate_scale']:g}× = {p['offered_rps']:.0f} r/s → {p['within_slo']:.1%}"
            for p in c["probes"]
        )
        search = f"{c['status']} (target {c['target']:.0%}); probes (offered → within SLO): {tried}"
        out.append(f"| {name} | {c['measured']} | {search} |")
    if doc.get("paired"):
        first = next(iter(doc["paired"].values()))
        out += [
            "",
            f"| paired runs at {first['rate_scale']:g}× ({first['rounds']} rounds of "
            f"{first['probe_s']:g} s, order reversed each round) | mean within SLO "
            "| mean goodput r/s | each run |",
            "|---|---:|---:|---|",
        ]
        for name, p in doc["paired"].items():
            each = ", ".join(f"{a:.1%}" for a in p["within_slo"])
            out.append(
                f"| {name} | {p['mean_within_slo']:.2%} | {p['mean_goodput_rps']:.0f} | {each} |"
            )
    k = doc["kill"]
    again = k["serving_again_after_s"]
    out += [
        "",
        "| kill | sent | answered | answered twice | errors | within SLO | down seen after s "
        "| serving again after s | daemon: down → up s |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
        f"| actor pid {k['killed_pid']} on {k['killed_on']} ({', '.join(k['devices_down'])}) | "
        f"{k['sent']} | {k['answered']} | {k['answered_twice']} | "
        f"{', '.join(f'{n}× {e}' for e, n in k['errors'].items()) or 'none'} | "
        f"{k['within_slo']:.1%} | {seconds(k['down_seen_after_s'])} | {seconds(again)} | "
        f"{seconds(k['daemon_down_to_up_s'])} |",
    ]
    return "\n".join(out)


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def failures(doc: dict[str, Any]) -> list[str]:
    """What the run shows wrong (empty: nothing)."""
    bad = []
    for kind in KINDS:
        if doc["outputs"][kind]["max_abs_delta"] > MAX_DELTA:
            bad.append(f"outputs of {kind} differ from the local executor's")
        if doc["overhead"][kind]["events"] != doc["overhead"][kind]["batches"]:
            bad.append(f"{kind}: not one event a batch")
    k = doc["kill"]
    if k["unanswered"] or k["answered_twice"]:
        bad.append(f"kill: {k['unanswered']} unanswered, {k['answered_twice']} answered twice")
    if k["serving_again_after_s"] is None:
        bad.append("kill: the device did not come back")
    return bad


# ------------------------------------------------------------------ run
@dataclasses.dataclass
class Options:
    batches: int
    probe_s: float
    max_runs: int
    kill_s: float
    paired_rounds: int = 0
    paired_scale: float = 1.0


def run(options: Options, cluster: LocalRayCluster, two_nodes: bool = False) -> dict[str, Any]:
    ray = import_ray()
    doc: dict[str, Any] = {}
    os.environ.update(NO_AUTH)
    handler = signal.getsignal(signal.SIGTERM)
    ray.init(address=cluster.address, log_to_driver=False)
    signal.signal(signal.SIGTERM, handler)  # ray.init's is sys.exit; ours tears down as well
    try:
        same = ray.get_runtime_context().get_node_id()
        (other,) = [n.node_id for n in cluster.nodes if n.node_id != same]
        doc["nodes"] = {
            str(n["NodeID"]): str(n["NodeManagerAddress"]) for n in ray.nodes() if n["Alive"]
        }
        log(
            f"driver on node {same[:8]} at {doc['nodes'][same]}; "
            f"other raylet {other[:8]} at {doc['nodes'][other]}"
        )
        with tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp:
            doc.update(asyncio.run(pool_steps(same, other, Path(tmp), options.batches, log)))
    finally:
        ray.shutdown()
    workload = load_workload(WORKLOAD)
    doc["capacity"] = {}
    worker = cluster.node("worker-0")
    daemons = two_node_daemons(worker.node_id) if two_nodes else DAEMONS
    killed_on = worker.name if two_nodes else None  # the other machine's actor
    for name, on_ray, ray_nodes in daemons:
        on = cluster if on_ray else None
        handle = start(on, ray_nodes)
        log(f"{name}: daemon ready in {handle.startup_s:.1f} s")
        try:
            found = capacity(handle.url, workload, options.probe_s, options.max_runs)
            doc["capacity"][name] = found
            log(f"{name}: capacity {found['measured']} r/s ({found['status']})")
            if name == daemons[-1][0]:
                load = dataclasses.replace(workload, duration_s=options.kill_s)
                doc["kill"] = asyncio.run(kill_step(handle, cluster, load, killed_on))
                k = doc["kill"]
                log(
                    f"kill: {k['answered']}/{k['sent']} answered, {k['answered_twice']} twice, "
                    f"back after {k['serving_again_after_s']} s"
                )
        finally:
            exit_status = stop_daemon(handle)
        # A graceful stop (SIGTERM) exits 0, its arenas unlinked.
        doc["capacity"][name].update(daemon_pid=handle.process.pid, daemon_exit=exit_status)
    if options.paired_rounds:
        doc["paired"] = paired(options, cluster, workload, daemons)
    return doc


def paired(
    options: Options,
    cluster: LocalRayCluster,
    workload: Workload,
    daemons: tuple[tuple[str, bool, str | None], ...],
) -> dict[str, Any]:
    """The capacity step's daemons, all up at once, probed in turn
    (`paired_probes`)."""
    handles: dict[str, DaemonHandle] = {}
    try:
        for name, on_ray, ray_nodes in daemons:
            handles[name] = start(cluster if on_ray else None, ray_nodes)
        found = asyncio.run(
            paired_probes(
                handles, workload, options.paired_scale, options.paired_rounds, options.probe_s
            )
        )
    finally:
        for handle in handles.values():
            stop_daemon(handle)
    for name, p in found.items():
        log(f"paired {name}: mean {p['mean_within_slo']:.2%} within SLO")
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ray_executors",
        description="Ray executors against local executors on a local two-raylet cluster: "
        "outputs, dispatch overhead, live capacity on workload (a), an actor killed.",
    )
    parser.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--probe", type=float, default=5.0, help="seconds per capacity probe")
    parser.add_argument("--max-runs", type=int, default=8, help="capacity probes per daemon")
    parser.add_argument("--kill-duration", type=float, default=10.0)
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="then the capacity step's daemons, all up at once, probed in turn at "
        "--paired-scale for ROUNDS rounds, the order reversed each round (default 0: none)",
    )
    parser.add_argument("--paired-scale", type=float, default=1.0)
    parser.add_argument(
        "--netns",
        action="store_true",
        help="the worker raylet in a network namespace of its own, joined by a veth pair "
        "(root; bench/netns.py); results to bench/results/ray-two-nodes",
    )
    parser.add_argument("--out-dir", type=Path, default=None)
    return parser


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.probe = min(args.batches, 50), min(args.probe, 3.0)
        args.max_runs, args.kill_duration = 1, min(args.kill_duration, 5.0)
    if args.batches < 1 or args.max_runs < 1 or args.probe <= 0 or args.kill_duration <= 0:
        parser.error("--batches and --max-runs must be ≥ 1, --probe and --kill-duration > 0")
    if args.paired < 0 or args.paired_scale <= 0:
        parser.error("--paired must be ≥ 0, --paired-scale > 0")
    options = Options(
        args.batches,
        args.probe,
        args.max_runs,
        args.kill_duration,
        args.paired,
        args.paired_scale,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # leave the cluster's context: torn down
    started = time.monotonic()
    if args.out_dir is None:
        args.out_dir = TWO_NODES_OUT_DIR if args.netns else OUT_DIR
    namespace: dict[str, str] | None = None
    with contextlib.ExitStack() as stack:
        if args.netns:
            ns = stack.enter_context(VethNamespace.create())
            namespace = {"name": ns.name, "host_ip": ns.host_ip, "ns_ip": ns.ns_ip}
            cluster = LocalRayCluster(
                workers=1, head_ip=ns.host_ip, worker_prefix=ns.prefix, worker_ip=ns.ns_ip
            )
            log(f"namespace {ns.name}: the worker raylet at {ns.ns_ip}, the head at {ns.host_ip}")
        else:
            cluster = LocalRayCluster(workers=1)
        stack.enter_context(cluster)
        log(f"cluster {cluster.address} up in {time.monotonic() - started:.1f} s")
        doc = run(options, cluster, two_nodes=args.netns)
    shown = render(doc)
    print(shown)
    document = {
        "command": "python -m bench.ray_executors" + (" " + " ".join(argv) if argv else ""),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "options": dataclasses.asdict(options),
        "wall_s": time.monotonic() - started,
        "namespace": namespace,
        **doc,
        "failures": failures(doc),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "ray.json").write_text(json.dumps(document, indent=2) + "\n")
    (args.out_dir / "ray.md").write_text(shown + "\n")
    for failure in document["failures"]:
        log(f"FAILED: {failure}")
    return 1 if document["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
