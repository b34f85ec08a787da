"""`python -m bench.ray_executors --quick` end to end on a local two-raylet
cluster (its second raylet in a network namespace where one can be made):
outputs of Ray executors equal to local ones on both data paths,
one event per batch, a capacity probe per daemon, and an executor actor
killed under load with every request answered exactly once and its device
back in service.

The bench runs as a subprocess under a hard limit; on expiry it gets
SIGTERM, which makes it tear its cluster and daemons down by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench import netns
from bench.daemon_launcher import REPO_ROOT
from bench.ray_cluster import is_live
from tests.conftest import peer_missing
from tests.fakes import segments_of

pytest.importorskip("ray")  # the `ray` extra; CI installs it (pyproject's test extra)

pytestmark = [pytest.mark.slow, pytest.mark.serial]

LIMIT_S = 240  # a quick run takes under a minute on 2 cores
TEARDOWN_S = 30


def run_quick(out_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "bench.ray_executors",
        "--quick",
        "--out-dir",
        str(out_dir),
        *options,
    ]
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = process.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the bench tears its cluster down
        try:
            stdout, stderr = process.communicate(timeout=TEARDOWN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"the quick Ray bench ran over {LIMIT_S} s:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_quick_ray_bench_equal_outputs_one_event_a_batch_kill_answered_once(tmp_path):
    """One quick run (a Ray cluster's start-up and three daemons take most of
    a minute on two cores): across a veth pair where a network namespace can
    be made, as CI can; on one host's two raylets where it cannot."""
    why = netns.available()
    if why is not None and os.environ.get("CI"):
        peer_missing(f"a network namespace for the second Ray node: {why}")
    two_nodes = why is None
    # 1.5-s capacity probes (the quick run's are 3 s). The paired probes
    # (--paired) are tested against stubs: tests/test_loadgen.py.
    done = run_quick(tmp_path, "--probe", "1.5", *(["--netns"] if two_nodes else []))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "ray.json").read_text())
    assert doc["failures"] == []
    kinds = ["local", "ray same node", "ray same node, Ray calls", "ray other node"]

    outputs = doc["outputs"]
    assert list(outputs) == kinds
    for kind in kinds:
        assert outputs[kind]["rows"] == 24
        assert outputs[kind]["max_abs_delta"] <= 1e-6
    same = outputs["ray same node"]["data_path"]
    assert same.startswith("shared-memory arena, batch channel (node ")
    calls = outputs["ray same node, Ray calls"]["data_path"]
    assert calls.startswith("shared-memory arena, Ray calls (node ")
    other = outputs["ray other node"]["data_path"]
    assert other.startswith("object store (node ")
    # pinned to two different raylets
    assert same.rpartition("(")[2] == calls.rpartition("(")[2]
    assert same.rpartition("(")[2] != other.rpartition("(")[2]

    overhead = doc["overhead"]
    for kind in kinds:
        assert overhead[kind]["batches"] == overhead[kind]["events"] == 50
        assert 0 < overhead[kind]["median_ms"] <= overhead[kind]["p99_ms"]

    capacity = doc["capacity"]
    placed = "Ray executors, one per node" if two_nodes else "Ray executors, placed by Ray"
    assert list(capacity) == ["local executors", "Ray executors, daemon's node", placed]
    for found in capacity.values():
        assert found["daemon_exit"] == 0  # stopped gracefully, on Ray too
        assert segments_of(found["daemon_pid"]) == set()  # its arenas unlinked
        (probe,) = found["probes"]
        assert 0 < probe["within_slo"] <= 1
        assert probe["offered_rps"] > 100  # workload (a): 400 r/s at 1×
        # what the probe measured, never "0" after it ran
        bound = "≥" if probe["passed"] else "<"
        assert found["measured"] == f"{bound} {probe['offered_rps']:.0f}"

    kill = doc["kill"]
    assert kill["sent"] > 100  # 5 s at half of 400 r/s
    assert kill["answered"] == kill["sent"] and kill["unanswered"] == 0
    assert kill["answered_twice"] == 0
    assert kill["server_successes"] == kill["ok"] > 0
    assert kill["killed_pid"] in kill["actor_pids"] and len(kill["actor_pids"]) == 2
    assert len(kill["devices_down"]) == 1
    assert kill["down_seen_after_s"] <= kill["serving_again_after_s"] < 60
    assert 0 <= kill["daemon_down_to_up_s"] <= kill["serving_again_after_s"]
    assert kill["new_actor_pid"] not in kill["actor_pids"]  # Ray restarted it in a new process
    # everything the bench started is gone
    assert not any(is_live(pid) for pid in [*kill["actor_pids"], kill["new_actor_pid"]])

    table = (tmp_path / "ray.md").read_text()
    assert table.strip() in done.stdout
    assert "| ray other node | object store" in table
    if two_nodes:
        _crossed_the_veth_pair(doc, other)


def _crossed_the_veth_pair(doc: dict, other: str) -> None:
    """The second node is the namespace's address, the head the host end of
    the pair; the killed actor the one on the namespace's node; the
    namespace removed on leaving."""
    ns = doc["namespace"]
    assert sorted(doc["nodes"].values()) == sorted([ns["host_ip"], ns["ns_ip"]])
    node = other.removeprefix("object store (node ").rstrip(")")
    (address,) = [a for n, a in doc["nodes"].items() if n.startswith(node)]
    assert address == ns["ns_ip"]
    assert doc["kill"]["killed_on"] == "worker-0"
    assert ns["name"].startswith("dsr")
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert ns["name"] not in names.stdout  # removed on leaving


def test_ray_channels_bench_prints_each_ways_round_trip():
    done = subprocess.run(
        [sys.executable, "-m", "bench.ray_channels", "--repeats", "20"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [r[0].strip() for r in rows[1:]] == [
        "Ray call",
        "Ray compiled graph",
        "batch channel (Unix socket)",
    ]
    for _, median, p99 in rows[1:]:
        assert 0 < float(median) <= float(p99)
