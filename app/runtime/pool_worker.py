"""One executor process as the pool sees it: its record, its start, its pipe.

`ExecutorPool` (app/runtime/pool.py) keeps a `Worker` per executor process:
the process and its two pipes, the models it loaded, its batches in flight
and the state the watchdog reads (app.runtime.watchdog). `start_process`
spawns the process for a worker's device; `attach_reader` has the event
loop call back with each reply read from its pipe (and once at EOF),
`drain` reads what is left in the pipe after the process ended, and
`detach_reader` stops the reading. What a reply means is the pool's to say.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import threading
from collections.abc import Callable
from typing import Any

from app.runtime.devices import ExecutorDevice
from app.runtime.executor import executor_main
from app.runtime.watchdog import Heartbeat


class Worker:
    """The pool's record of one executor process for `device`."""

    def __init__(self, device: ExecutorDevice) -> None:
        self.device = device
        self.process: Any = None
        self.conn: Any = None
        self.cancels: Any = None  # the one-way pipe for cancels (executor.py)
        self.models: list[str] = []
        self.load_errors: dict[str, str] = {}
        self.load_info: dict[str, str] = {}
        self.inflight: dict[int, str] = {}  # batch_id → model
        self.sizes: dict[int, tuple[int, float]] = {}  # batch_id → (size, start_at)
        # When the executor last made progress (a reply, or work given to an
        # idle executor): the oldest batch cannot have started before it.
        self.progress_at = 0.0
        self.heartbeat: Heartbeat | None = None  # this process's (see app.runtime.watchdog)
        self.serving_since = 0.0  # when it had loaded its models
        self.dead = False
        self.loading = False  # a respawned process (or a shadow) loading its models
        self.stopping = False
        # Replaced by a shadow (app.runtime.pool_reshare): it runs the batches
        # it holds and takes no new ones; `drained` is set once it holds none
        # (it is then told to stop), `ended` with why once it is gone. Its
        # death fails those batches without taking the device down.
        self.retiring = False
        self.drained: asyncio.Future[None] | None = None
        self.ended: asyncio.Future[str | None] | None = None
        self.down_since: float | None = None
        self.restarts = 0
        self.last_respawn_s: float | None = None
        self.reader_fd: int | None = None
        self.reader_thread: threading.Thread | None = None


def start_process(
    w: Worker,
    *,
    log_level: int,
    realtime_priority: int,
    heartbeat_timeout_s: float,
    env: dict[str, str],
) -> None:
    """Spawn an executor process for `w.device` and keep its pipes and
    heartbeat in `w` (not yet read: see `attach_reader`)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    cancels_in, cancels_out = ctx.Pipe(duplex=False)
    heartbeat = Heartbeat(ctx, heartbeat_timeout_s) if heartbeat_timeout_s > 0 else None
    process = ctx.Process(
        target=executor_main,
        args=(child, w.device.to_dict(), log_level, realtime_priority, cancels_in),
        kwargs={"heartbeat": heartbeat, "env": env},
        name=f"executor-{w.device.name}",
        daemon=True,
    )
    try:
        process.start()
    except BaseException:
        # Never started: nothing for stop() to join; the caller sees why.
        parent.close()
        cancels_out.close()
        raise
    finally:
        child.close()
        cancels_in.close()
    w.conn = parent
    w.cancels = cancels_out
    w.heartbeat = heartbeat
    w.dead = False
    w.process = process


def attach_reader(
    loop: asyncio.AbstractEventLoop,
    w: Worker,
    on_message: Callable[[Worker, Any], None],
    on_eof: Callable[[Worker], None],
) -> None:
    """Have `loop` call `on_message(w, reply)` for each reply on the pipe and
    `on_eof(w)` when it closes: with `add_reader` on its file descriptor, or
    a reader thread handing over with `call_soon_threadsafe` where the loop
    has no `add_reader`."""
    fd = w.conn.fileno()

    def on_readable() -> None:
        try:
            while w.conn.poll():
                on_message(w, w.conn.recv())
        except (EOFError, OSError):
            on_eof(w)

    try:
        loop.add_reader(fd, on_readable)
        w.reader_fd = fd
    except NotImplementedError:  # e.g. Windows proactor loop

        def pump() -> None:
            while True:
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    loop.call_soon_threadsafe(on_eof, w)
                    return
                loop.call_soon_threadsafe(on_message, w, msg)

        w.reader_thread = threading.Thread(target=pump, name=f"pool-{w.device.name}", daemon=True)
        w.reader_thread.start()


def detach_reader(loop: asyncio.AbstractEventLoop | None, w: Worker) -> None:
    """Stop watching the pipe (a reader thread ends at its EOF)."""
    if w.reader_fd is not None and loop is not None:
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            loop.remove_reader(w.reader_fd)
        w.reader_fd = None


def drain(w: Worker, on_message: Callable[[Worker, Any], None]) -> None:
    """Hand over the replies still in the pipe of an ended process."""
    if w.conn is None or w.conn.closed:
        return
    try:
        while w.conn.poll():
            on_message(w, w.conn.recv())
    except (EOFError, OSError):
        pass
