"""CPU per answered request, per process of the daemon, for API_WORKERS = 0, 1, 2, …

    python -m bench.api_workers_cpu [--workers 0,1,2] [--rate 400] [--duration 10]

For each count of API workers: the daemon on one emulated device serving
the ceiling's model (ℓ(b) ≈ 0, bench/workloads/live-ceiling.yaml), the load
generator (`python -m bench.loadgen`, Poisson) at `--rate` requests per
second for `--duration` seconds, and the CPU time (user + system, from
/proc) each process of the daemon spent meanwhile: the scheduler process
(the whole daemon at API_WORKERS=0), the API workers together, the
executor. Divided by the requests the daemon counted
(`deadline_serve_requests_total`), it is the CPU each request costs there.
It prints one row per worker count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench.daemon_launcher import REPO_ROOT, free_port, start_daemon, stop_daemon

WORKLOAD = REPO_ROOT / "bench" / "workloads" / "live-ceiling.yaml"
REPOSITORY = REPO_ROOT / "bench" / "repositories" / "live"
BASE_RATE = 500.0  # the workload file's rate
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _role(pid: int) -> str:
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    if comm.startswith("dsrv-"):
        return "executor"
    if b"resource_tracker" in cmdline:
        return "tracker"
    return "workers"


def cpu_by_role(daemon: int) -> dict[str, float]:
    """CPU seconds so far of the daemon's process and of its children, by role."""
    total = {"scheduler": 0.0, "workers": 0.0, "executor": 0.0, "tracker": 0.0}
    own = _stat(daemon)
    total["scheduler"] = own[1] if own else 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] == daemon:
                with contextlib.suppress(OSError):
                    total[_role(int(entry.name))] += stat[1]
    return total


def requests_counted(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    prefix = "deadline_serve_requests_total{"
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def measure(workers: int, rate: float, duration: float) -> dict[str, float]:
    handle = start_daemon(
        REPOSITORY, free_port(), emulated_devices=1, extra_env={"API_WORKERS": str(workers)}
    )
    try:
        pid = handle.process.pid
        before, counted = cpu_by_role(pid), requests_counted(handle.url)
        command = [
            sys.executable, "-m", "bench.loadgen", "--url", handle.url, "--workload",
            str(WORKLOAD), "--rate-scale", str(rate / BASE_RATE), "--duration", str(duration),
            "--json", "--quiet",
        ]  # fmt: skip
        with tempfile.TemporaryFile() as out:
            subprocess.run(command, cwd=REPO_ROOT, stdout=out, check=True)
        after, answered = cpu_by_role(pid), requests_counted(handle.url) - counted
    finally:
        stop_daemon(handle)
    row = {role: (after[role] - before[role]) * 1e3 / max(answered, 1) for role in after}
    return {"workers": workers, "requests": answered, **row}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_workers_cpu", description=__doc__)
    parser.add_argument("--workers", default="0,1,2", help="API_WORKERS values, comma-separated")
    parser.add_argument("--rate", type=float, default=400.0, help="offered requests per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    args = parser.parse_args(argv)
    print(f"CPU ms per request at {args.rate:.0f} r/s for {args.duration:.0f} s (ℓ ≈ 0, 1 device)")
    print("| API_WORKERS | requests | scheduler | API workers | executor | daemon |")
    print("|---|---|---|---|---|---|")
    for workers in (int(w) for w in args.workers.split(",")):
        r = measure(workers, args.rate, args.duration)
        daemon = r["scheduler"] + r["workers"] + r["executor"]
        print(
            f"| {workers} | {r['requests']:.0f} | {r['scheduler']:.3f} | {r['workers']:.3f} "
            f"| {r['executor']:.3f} | {daemon:.3f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
