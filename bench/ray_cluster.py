"""A Ray cluster of several raylets on this machine, for tests and benchmarks.

    with LocalRayCluster(workers=1) as cluster:
        ray.init(address=cluster.address)
        worker = cluster.node("worker-0")
        actor = Actor.options(resources={worker.resource: 0.01}).remote()
        ...
        ray.shutdown()

The head is `ray start --head` with the custom resource `node:head-label`;
worker i is `ray start --address HEAD` with the custom resource `worker-i`,
so work can be placed on a chosen raylet by resource (a small fraction, so
that many actors fit) or by node id (`NodeAffinitySchedulingStrategy`).
Executors placed on a worker raylet really run in that raylet's worker
processes, as they would on another machine.

The machine is shared, possibly with other Ray clusters, so this cluster
touches nothing outside itself:

- every port is a free one (the GCS, the client server, the dashboard and
  each node's agent, whose defaults are fixed numbers);
- every node has its own `--temp-dir` under a fresh directory, so sockets,
  logs and `ray_current_cluster` stay out of `/tmp/ray`;
- each `ray start` runs with `--block` in a new session, so that the
  `ray start` process stays the parent of its node's processes (GCS,
  raylet, agents; the raylet's workers below it) and they share its
  process group. Teardown kills exactly those trees — never `ray stop`,
  which stops every Ray cluster of the machine. It uses SIGKILL: after a
  SIGTERM, `ray start --block` waits for its children for many seconds, and
  a test cluster keeps nothing worth flushing;
- it runs with `RAY_AUTH_MODE=disabled`, so that it does not depend on
  whether `~/.ray/auth_token` exists (drivers connect with or without one).

Every step is bounded: a node that is not alive in the GCS within
`start_timeout_s` stops start-up with an error naming the node and the tail
of its `ray start` output, and everything started so far is torn down.

`python -m bench.ray_cluster --workers 1 --hold 5` starts one, prints its
address and nodes, holds it, and tears it down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.daemon_launcher import free_port

HEAD = "head"
HEAD_RESOURCE = "node:head-label"
# The object store's floor in Ray is 75 MiB; tests move small arrays.
DEFAULT_OBJECT_STORE_BYTES = 100 * 2**20
_POLL_S = 0.2
_OUTPUT_TAIL_CHARS = 2000


class RayClusterError(RuntimeError):
    """A node of the local cluster did not come up (or Ray is missing)."""


def import_ray() -> Any:
    """Ray (an optional extra of the package)."""
    try:
        import ray
    except ImportError as exc:  # optional extra
        raise RayClusterError("the local Ray cluster needs Ray: pip install 'ray==2.60.0'") from exc
    return ray


def worker_resource(index: int) -> str:
    """The custom resource that places work on worker raylet `index`."""
    return f"worker-{index}"


@dataclass(frozen=True)
class Proc:
    """A process, told apart from a later one with the same PID by its start
    time (clock ticks since boot, /proc/PID/stat field 22)."""

    pid: int
    start_ticks: int


@dataclass
class RayNode:
    """One raylet of the cluster and the processes this harness started for it.

    `recorded` (`pids`) are the `ray start --block` process and its
    descendants when the node came up; the raylet's workers start later,
    below the raylet, in the same process group `pgid`."""

    name: str
    resource: str
    temp_dir: Path
    process: subprocess.Popen
    output_path: Path
    node_id: str = ""
    recorded: frozenset[Proc] = frozenset()

    @property
    def pids(self) -> frozenset[int]:
        return frozenset(process.pid for process in self.recorded)

    @property
    def pgid(self) -> int:
        return self.process.pid

    def output_tail(self) -> str:
        try:
            return self.output_path.read_text(errors="replace")[-_OUTPUT_TAIL_CHARS:]
        except OSError:
            return "(no output)"

    def processes(self) -> list[Proc]:
        """Its live processes now: the `ray start` tree and its process group."""
        table = _process_table()
        found = {pid for pid, stat in table.items() if stat.pgid == self.pgid}
        if self.process.pid in table:
            found.add(self.process.pid)
        children: dict[int, list[int]] = {}
        for pid, stat in table.items():
            children.setdefault(stat.ppid, []).append(pid)
        stack = list(found)
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        live = {Proc(pid, table[pid].start_ticks) for pid in found if table[pid].state != "Z"}
        live |= {p for p in self.recorded if (stat := table.get(p.pid)) and _same(p, stat)}
        return sorted(live, key=lambda p: p.pid)


@dataclass
class LocalRayCluster:
    """A head and `workers` more raylets on this machine (see the module doc).

    `start()` (or entering the context) returns once every node is alive in
    the GCS; `stop()` (or leaving it) kills every process started and
    removes the temporary directory."""

    workers: int = 1
    head_cpus: int = 1
    worker_cpus: int = 1
    object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    # `ray start` of a worker gives up when its raylet is not registered in
    # the GCS within Ray's fixed 30 s; on a loaded 2-core box that happens
    # now and then, and a second start succeeds.
    worker_start_attempts: int = 2
    temp_root: Path | None = None
    # A head advertised at `head_ip` (e.g. a veth's address) rather than the
    # machine's; workers started under `worker_prefix` (e.g. `ip netns exec
    # NS`) and advertised at `worker_ip` (bench/netns.py).
    head_ip: str | None = None
    worker_prefix: tuple[str, ...] = ()
    worker_ip: str | None = None
    nodes: list[RayNode] = field(default_factory=list, init=False)
    temp_dir: Path | None = field(default=None, init=False)
    port: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"workers must be ≥ 0, got {self.workers}")
        for name in ("head_cpus", "worker_cpus"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        if self.start_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ValueError("start_timeout_s and stop_timeout_s must be > 0")
        if self.worker_start_attempts < 1:
            raise ValueError(f"worker_start_attempts must be ≥ 1, got {self.worker_start_attempts}")

    @property
    def address(self) -> str:
        """The GCS address to give `ray.init(address=...)` or `RAY_ADDRESS`."""
        if not self.port:
            raise RayClusterError("the cluster is not started")
        return f"{self.head_ip or '127.0.0.1'}:{self.port}"

    def node(self, name: str) -> RayNode:
        """The node called `name` (`head`, `worker-0`, …)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; nodes: {[n.name for n in self.nodes]}")

    def node_resources(self) -> dict[str, str]:
        """Each node's custom resource → its Ray node id (hex)."""
        return {node.resource: node.node_id for node in self.nodes}

    def recorded_pids(self) -> frozenset[int]:
        """Every PID recorded when the nodes came up."""
        return frozenset().union(*(node.pids for node in self.nodes))

    # --- start ---

    def start(self) -> LocalRayCluster:
        if self.nodes:
            raise RayClusterError("the cluster is already started")
        import_ray()
        ray_cli = Path(sys.executable).with_name("ray")
        if not ray_cli.exists():
            found = shutil.which("ray")
            if found is None:
                raise RayClusterError(f"no `ray` command next to {sys.executable} or on PATH")
            ray_cli = Path(found)
        # Short: Unix socket paths under it must stay below 108 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="raycl-", dir=self.temp_root or "/tmp"))
        self.port = free_port()
        try:
            head = self._launch(
                ray_cli,
                HEAD,
                HEAD_RESOURCE,
                [
                    "--head",
                    f"--port={self.port}",
                    f"--num-cpus={self.head_cpus}",
                    f"--ray-client-server-port={free_port()}",
                    f"--dashboard-port={free_port()}",
                    "--include-dashboard=false",
                    *([f"--node-ip-address={self.head_ip}"] if self.head_ip else []),
                ],
            )
            self._wait_alive([head])
            for attempt in range(1, self.worker_start_attempts + 1):
                workers = [self._launch_worker(ray_cli, i, attempt) for i in range(self.workers)]
                try:
                    self._wait_alive(workers)
                    break
                except RayClusterError as exc:
                    if attempt == self.worker_start_attempts:
                        raise
                    print(
                        f"Ray worker start-up failed (attempt {attempt} of "
                        f"{self.worker_start_attempts}), starting the workers again: {exc}",
                        file=sys.stderr,
                    )
                    self._discard(workers)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch_worker(self, ray_cli: Path, index: int, attempt: int) -> RayNode:
        return self._launch(
            ray_cli,
            worker_resource(index),
            worker_resource(index),
            [
                f"--address={self.address}",
                f"--num-cpus={self.worker_cpus}",
                *([f"--node-ip-address={self.worker_ip}"] if self.worker_ip else []),
            ],
            prefix=self.worker_prefix,
            attempt=attempt,
        )

    def _discard(self, nodes: list[RayNode]) -> None:
        """Kill the processes of `nodes` (a failed start) and forget them."""
        for node in nodes:
            self._kill_node(node)
            self.nodes.remove(node)

    def _kill_node(self, node: RayNode) -> None:
        processes = node.processes()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pgid, signal.SIGKILL)
        for process in processes:  # any that left the process group
            _kill(process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=self.stop_timeout_s)

    def _launch(
        self,
        ray_cli: Path,
        name: str,
        resource: str,
        args: list[str],
        prefix: tuple[str, ...] = (),
        attempt: int = 1,
    ) -> RayNode:
        assert self.temp_dir is not None
        label = name if attempt == 1 else f"{name}.{attempt}"
        node_dir = self.temp_dir / label
        node_dir.mkdir()
        output_path = self.temp_dir / f"{label}.out"
        command = [
            *prefix,  # `ip netns exec NS` execs the command: the same process
            str(ray_cli),
            "start",
            "--block",
            *args,
            f"--resources={json.dumps({resource: 1})}",
            f"--temp-dir={node_dir}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--disable-usage-stats",
        ]
        # Whatever cluster the caller's environment points at is not this one.
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        # Without RAY_AUTH_MODE, `ray start` turns token authentication on
        # whenever ~/.ray/auth_token exists (any local `ray.init()` writes
        # one), and this process's GCS client, sending none, is refused.
        env["RAY_AUTH_MODE"] = "disabled"
        with output_path.open("wb") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        node = RayNode(name, resource, node_dir, process, output_path)
        self.nodes.append(node)
        return node

    def _wait_alive(self, nodes: list[RayNode]) -> None:
        """Until the GCS lists each of `nodes` alive (found by its resource)."""
        ray = import_ray()
        deadline = time.monotonic() + self.start_timeout_s
        client = None
        last_error = "not yet asked"
        waiting = list(nodes)
        while waiting:
            for node in waiting:
                if node.process.poll() is not None:
                    raise RayClusterError(
                        f"`ray start` of node {node.name} exited with "
                        f"{node.process.returncode}:\n{node.output_tail()}"
                    )
            if time.monotonic() > deadline:
                names = ", ".join(node.name for node in waiting)
                raise RayClusterError(
                    f"Ray node(s) {names} not alive in the GCS at {self.address} within "
                    f"{self.start_timeout_s} s (last GCS query: {last_error or 'answered'}); "
                    f"`ray start` output of {waiting[0].name}:\n{waiting[0].output_tail()}"
                )
            try:
                if client is None:
                    client = ray._raylet.GcsClient(address=self.address)
                alive = _alive_nodes_by_resource(client)
                last_error = ""
            except Exception as exc:  # the GCS is not up yet, or refuses us
                alive, last_error = {}, f"{type(exc).__name__}: {exc}"
            for node in list(waiting):
                if node.resource in alive:
                    node.node_id = alive[node.resource]
                    node.recorded = frozenset(node.processes())
                    waiting.remove(node)
            if waiting:
                time.sleep(_POLL_S)

    # --- stop ---

    def stop(self) -> None:
        """Kill every process of every node (workers first), then remove the
        temporary directory. Raises if a process outlives `stop_timeout_s`."""
        for node in reversed(self.nodes):
            self._kill_node(node)
        deadline = time.monotonic() + self.stop_timeout_s
        while True:
            survivors = sorted(p.pid for node in self.nodes for p in node.processes() if _kill(p))
            if not survivors or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        if survivors:
            raise RayClusterError(
                f"Ray processes still running {self.stop_timeout_s} s after SIGKILL: {survivors}"
            )
        self.nodes = []
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.port = 0

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _alive_nodes_by_resource(client: Any) -> dict[str, str]:
    """Custom resource → node id (hex) of every alive node the GCS lists."""
    found: dict[str, str] = {}
    for info in client.get_all_node_info(timeout=5).values():
        if info.state != 0:  # GcsNodeInfo.ALIVE
            continue
        for resource in info.resources_total:
            found[resource] = info.node_id.hex()
    return found


@dataclass(frozen=True)
class _Stat:
    ppid: int
    pgid: int
    state: str
    start_ticks: int


def _read_stat(pid: int) -> _Stat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone
        return None
    # The command name (field 2) may hold spaces and parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return _Stat(
        ppid=int(fields[1]), pgid=int(fields[2]), state=fields[0], start_ticks=int(fields[19])
    )


def _process_table() -> dict[int, _Stat]:
    """Every process of the machine (Linux /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _read_stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def _same(process: Proc, stat: _Stat) -> bool:
    """Whether `stat` is `process`, still running."""
    return stat.state != "Z" and stat.start_ticks == process.start_ticks


def _kill(process: Proc) -> bool:
    """SIGKILL `process` if it still runs (not a zombie, not a reused PID);
    whether it did."""
    stat = _read_stat(process.pid)
    if stat is None or not _same(process, stat):
        return False
    try:
        os.kill(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def is_live(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, an orphan waiting for init to
    reap it, does not)."""
    stat = _read_stat(pid)
    return stat is not None and stat.state != "Z"


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ray_cluster",
        description="Start a local Ray cluster (a head and worker raylets), print its "
        "address and nodes, hold it, tear it down.",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker raylets (default 1)")
    parser.add_argument("--head-cpus", type=int, default=1)
    parser.add_argument("--worker-cpus", type=int, default=1)
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to hold it (default 0)")
    parser.add_argument("--start-timeout", type=float, default=60.0, help="seconds (default 60)")
    args = parser.parse_args(argv)
    if args.workers < 0 or args.hold < 0:
        parser.error("--workers and --hold must be ≥ 0")
    # SIGTERM as Ctrl-C: leave the `with` block, so that the nodes are torn down.
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    with LocalRayCluster(
        workers=args.workers,
        head_cpus=args.head_cpus,
        worker_cpus=args.worker_cpus,
        start_timeout_s=args.start_timeout,
    ) as cluster:
        print(f"address {cluster.address} (up in {time.monotonic() - started:.1f} s)")
        for node in cluster.nodes:
            pids = ",".join(str(pid) for pid in sorted(node.pids))
            print(f"{node.name:10} resource {node.resource:16} node {node.node_id}  pids {pids}")
        sys.stdout.flush()
        time.sleep(args.hold)
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
