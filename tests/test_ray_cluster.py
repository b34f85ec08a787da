"""The local multi-node Ray cluster (bench/ray_cluster.py): a head and a worker
raylet come up, work placed by a node's custom resource (or node id) runs in
that raylet's worker processes, and teardown leaves no process and frees the
ports for the next cluster.

Every test is bounded: the harness's own start and stop timeouts, `ray.get`
timeouts, and a SIGALRM per test for anything else that could hang.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from bench.ray_cluster import (
    HEAD,
    HEAD_RESOURCE,
    LocalRayCluster,
    RayClusterError,
    is_live,
    worker_resource,
)
from tests.conftest import time_limit

pytestmark = [pytest.mark.slow, pytest.mark.serial]

TEST_LIMIT_S = 90
GET_TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def hard_timeout() -> Iterator[None]:
    with time_limit(TEST_LIMIT_S, "Ray cluster test"):
        yield


def where() -> tuple[str, int]:
    """The Ray node id and PID of the process running this."""
    return ray.get_runtime_context().get_node_id(), os.getpid()


@ray.remote(num_cpus=0)
class Probe:
    def where(self) -> tuple[str, int]:
        return where()


@ray.remote(num_cpus=0)
def probe() -> tuple[str, int]:
    return where()


def ancestors(pid: int) -> set[int]:
    """`pid`'s parent, its parent, … up to init (/proc)."""
    found: set[int] = set()
    while pid > 1:
        text = Path(f"/proc/{pid}/stat").read_text()
        pid = int(text[text.rindex(")") + 2 :].split()[1])
        found.add(pid)
    return found


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and is_live(int(entry)):
            found.append(int(entry))
    return found


def test_work_runs_on_the_raylet_it_is_placed_on_and_teardown_leaves_nothing() -> None:
    cluster = LocalRayCluster(workers=1, head_cpus=1, worker_cpus=1)
    with cluster:
        head, worker = cluster.node(HEAD), cluster.node("worker-0")
        assert [node.name for node in cluster.nodes] == [HEAD, "worker-0"]
        assert cluster.node_resources() == {
            HEAD_RESOURCE: head.node_id,
            "worker-0": worker.node_id,
        }
        assert len({head.node_id, worker.node_id}) == 2
        assert head.pids and worker.pids and not head.pids & worker.pids
        port = int(cluster.address.rsplit(":", 1)[1])
        temp_dir = cluster.temp_dir
        assert temp_dir is not None
        for node in cluster.nodes:  # each node's session under its own temp dir
            assert len(list(node.temp_dir.glob("session_2*/logs/raylet.out"))) == 1, node.name

        ray.init(address=cluster.address, log_to_driver=False)
        try:
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            assert alive == {head.node_id, worker.node_id}

            by_resource = Probe.options(resources={"worker-0": 0.01}).remote()
            by_node_id = Probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(worker.node_id, soft=False)
            ).remote()
            on_head = probe.options(resources={HEAD_RESOURCE: 0.01}).remote()
            actor_node, actor_pid = ray.get(by_resource.where.remote(), timeout=GET_TIMEOUT_S)
            affinity_node, affinity_pid = ray.get(by_node_id.where.remote(), timeout=GET_TIMEOUT_S)
            task_node, task_pid = ray.get(on_head, timeout=GET_TIMEOUT_S)

            assert actor_node == affinity_node == worker.node_id
            assert task_node == head.node_id
            assert os.getpid() not in {actor_pid, affinity_pid, task_pid}
            # Each runs below the processes the harness recorded for its node.
            assert ancestors(actor_pid) & worker.pids
            assert ancestors(affinity_pid) & worker.pids
            assert not ancestors(actor_pid) & head.pids
            assert ancestors(task_pid) & head.pids
            assert not ancestors(task_pid) & worker.pids
            started_later = {actor_pid, affinity_pid, task_pid}
        finally:
            ray.shutdown()
        recorded = cluster.recorded_pids()

    assert not [pid for pid in recorded | started_later if is_live(pid)]
    assert not processes_naming(str(temp_dir))
    assert not temp_dir.exists()
    assert cluster.nodes == []
    with socket.socket() as sock:  # the GCS port is free again
        sock.bind(("127.0.0.1", port))

    # A second cluster right after the first.
    with LocalRayCluster(workers=0) as second:
        assert [node.name for node in second.nodes] == [HEAD]
        second_dir = second.temp_dir
    assert second_dir is not None and not processes_naming(str(second_dir))


def test_a_node_that_does_not_come_up_in_time_is_named_and_everything_is_stopped() -> None:
    cluster = LocalRayCluster(workers=1, start_timeout_s=0.5)
    with pytest.raises(RayClusterError, match=r"node\(s\) head not alive in the GCS"):
        cluster.start()
    assert cluster.nodes == []
    assert cluster.temp_dir is not None and not cluster.temp_dir.exists()
    assert not processes_naming(str(cluster.temp_dir))


def test_a_worker_whose_first_start_fails_is_started_again(tmp_path, capsys) -> None:
    # The first `ray start` of the worker exits at once, as one whose raylet
    # missed Ray's 30-s registration window does; the second runs.
    mark = tmp_path / "failed-once"
    fail_once = (
        "bash",
        "-c",
        f'if [ ! -e {mark} ]; then touch {mark}; echo "timed out during startup"; exit 1; fi; '
        'exec "$@"',
        "bash",
    )
    with LocalRayCluster(workers=1, worker_prefix=fail_once) as cluster:
        assert [node.name for node in cluster.nodes] == [HEAD, worker_resource(0)]
        assert set(cluster.node_resources()) == {HEAD_RESOURCE, worker_resource(0)}
        temp_dir = cluster.temp_dir
    assert mark.exists()
    err = capsys.readouterr().err
    assert "Ray worker start-up failed (attempt 1 of 2)" in err
    assert "timed out during startup" in err
    assert temp_dir is not None and not processes_naming(str(temp_dir))

    mark.unlink()
    once = LocalRayCluster(workers=1, worker_prefix=fail_once, worker_start_attempts=1)
    with pytest.raises(RayClusterError, match="`ray start` of node worker-0 exited with 1"):
        once.start()
    assert once.nodes == [] and not processes_naming(str(once.temp_dir))


def test_bad_sizes_are_named() -> None:
    with pytest.raises(ValueError, match="workers must be ≥ 0, got -1"):
        LocalRayCluster(workers=-1)
    with pytest.raises(ValueError, match="worker_cpus must be ≥ 0, got -2"):
        LocalRayCluster(worker_cpus=-2)
    with pytest.raises(ValueError, match="worker_start_attempts must be ≥ 1, got 0"):
        LocalRayCluster(worker_start_attempts=0)
