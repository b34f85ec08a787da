"""One server process per box: refuse to run as one of several uvicorn workers.

The scheduling core plans every device of the box from one place (DESIGN.md):
each process runs its own scheduler and starts its own executor on every
device. `uvicorn app.main:app --workers N` (or `WEB_CONCURRENCY=N`) would
start N schedulers that each believe they own the devices, and N copies of
every executor and model, competing for the same cores and GPU memory with
none of the deadlines planned.

uvicorn's parent process (the multiprocess supervisor) never imports the
app: it binds the socket and spawns the workers, each of which loads
`app.main:app`. So the check runs in a worker, as the app is created: the
worker is a `multiprocessing` spawn child whose target is uvicorn's
`subprocess_started`, given the supervisor's `Config` (with `workers`, after
`--workers` and `WEB_CONCURRENCY`) as an argument. A worker that finds more
than one exits with uvicorn's start-up failure status, which stops the
supervisor; the supervisor itself would then exit 0, so the worker ends it
(SIGKILL: it handles SIGTERM and SIGINT as an orderly stop) to make the
command fail as it should. `uvicorn --reload` runs one worker the same way
and is accepted.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys

# uvicorn.config.STARTUP_FAILURE: what a worker that cannot start exits with.
STARTUP_FAILURE = 3


def uvicorn_workers() -> int:
    """How many worker processes the uvicorn supervisor that started this
    process runs; 1 when this process is not a uvicorn worker."""
    process = multiprocessing.current_process()
    target = getattr(process, "_target", None)
    if multiprocessing.parent_process() is None or target is None:
        return 1
    if getattr(target, "__module__", "") != "uvicorn._subprocess":
        return 1
    config = (getattr(process, "_kwargs", None) or {}).get("config")
    return int(getattr(config, "workers", 1) or 1)


def several_workers_message(workers: int) -> str:
    return (
        f"deadline-serve runs one scheduler per box, but uvicorn runs {workers} worker "
        "processes (--workers or WEB_CONCURRENCY): each would start its own scheduler and "
        "its own executor on every device, competing for the same devices. Run one "
        "process (`python -m app serve`, or uvicorn with --workers 1 and no "
        "WEB_CONCURRENCY); for more capacity give this box more devices (CPU_SLICES, "
        "GPUs) or run one server on each of several boxes behind a load balancer."
    )


def refuse_several_workers() -> None:
    """Exit (status STARTUP_FAILURE, and the supervisor's too) when this
    process is one of several uvicorn workers; return otherwise."""
    workers = uvicorn_workers()
    if workers <= 1:
        return
    print(f"error: {several_workers_message(workers)}", file=sys.stderr, flush=True)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == os.getppid():
        os.kill(parent.pid, signal.SIGKILL)
    raise SystemExit(STARTUP_FAILURE)
