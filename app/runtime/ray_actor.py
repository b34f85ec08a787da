"""The executor as a Ray actor: one per device, driven by `RayExecutorPool`.

The actor wraps the executor process's own `Executor` (app/runtime/executor.py),
so loading, running a batch, cancelling it and profiling are the same code
as a local executor's; only the transport differs. Each call returns the
reply the executor would have sent on its pipe (Loaded, Ran or Cancelled,
Profiled).

Concurrency groups. `load`, `run`, `run_rows`, `profile` and `stop` run
one at a time in the default group, in the order they were sent (as the
local executor reads its pipe); `cancel`, `ping`, `where` and `echo` run in
the "control" group, so a cancel reaches a batch that is running: a running
synchronous method is not interrupted by `ray.cancel`, so the cancel sets
the executor's flag (and calls the backend's `terminate`), which the batch
checks while it waits for its start and between steps. `watch` blocks in a
group of its own until `stop`: the pool keeps one call pending, and it
fails the moment the actor dies, idle or busy.

Data. An actor on the daemon's node attaches the model's shared-memory
arena by its layout and reads and writes slots, as a local executor does
(`run`); its batches come as `Run` messages on the batch channel
(`open_channel`, app.runtime.ray_channel), served by a thread of its own
one at a time with the Ray calls that use the executor (`lock`). One on
another node keeps a scratch arena of its own per model (`max_batch_size`
slots, the same slot layout) and gets a batch's input bytes of each slot as
one uint8 array (`run_rows`; through Ray's object
store, a zero-copy read on its side), runs the batch on its scratch rows
and returns the slots' output bytes, which the pool copies into the
daemon's arena. Whole slots travel, so variable shapes and BYTES tensors
need nothing more; an item beyond its slot (an elastic tensor's,
app/runtime/spill.py) travels beside them as an array. Times in replies
are the actor's `time.monotonic()`; the pool converts them for an actor
on another node (`RayExecutorPool`).

Samples re-run alone (the asynchronous profiler, app/runtime/alone_profiler.py).
A batch's `alone` marks are kept as a local executor keeps them. A local
executor re-runs them when its pipe stays empty; an actor has no pipe, so
the pool asks (`rerun_alone`, in the default group, once the device is
idle) and, when it sends a batch meanwhile, stops the re-run through the
control group (`interrupt_alone`: a byte on a pipe of the actor's own that
the re-run watches in place of the executor's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

import numpy as np
import ray

from app.runtime import spill
from app.runtime.arena import Arena
from app.runtime.executor import Executor, tighten_timer_slack
from app.runtime.messages import (
    AloneMark,
    Cancelled,
    Loaded,
    Profiled,
    Ran,
    RanAlone,
    Run,
    config_from_dict,
)
from app.runtime.ray_channel import ChannelCount, dial, serve
from app.runtime.ray_records import inputs_end

log = logging.getLogger("app.runtime.ray_actor")

# The actor's concurrency groups (see the module docstring).
CONCURRENCY_GROUPS = {"control": 2, "watch": 1}
# How long `stop` and `unload` wait for the batches sent before them on the
# channel (the pool's own limit is shorter; this only bounds a lost count).
AFTER_LIMIT_S = 600.0


class _Replies:
    """Stands in for the executor's pipe: keeps the reply to the call in
    progress (calls that reply run one at a time, in the default group)."""

    def __init__(self) -> None:
        self.last: Any = None

    def send(self, msg: Any) -> None:
        self.last = msg

    def take(self) -> Any:
        msg, self.last = self.last, None
        return msg


class ExecutorActor:
    """One device's executor in a Ray worker process (`actor_class` makes
    the Ray actor class of it)."""

    def __init__(self, device: dict[str, Any], log_level: int) -> None:
        logging.basicConfig(
            level=log_level,
            format=f"%(asctime)s executor[{device.get('name')}] %(levelname)s %(message)s",
        )
        tighten_timer_slack()
        self.replies = _Replies()
        self.executor = Executor(self.replies, device)
        self.scratch_arenas: dict[str, Arena] = {}  # the daemon's are on another node
        self.stopped = threading.Event()
        # Batches come from Ray calls and from the channel's thread
        # (app.runtime.ray_channel): one at a time, as on the executor's pipe.
        self.lock = threading.Lock()
        self.channel_count = ChannelCount()
        self.channel: Any = None
        # A re-run alone watches this pipe's read end for `interrupt_alone`.
        self.interrupt_r, self.interrupt_w = os.pipe()
        os.set_blocking(self.interrupt_r, False)

    # ------------------------------------------------------------ control
    @ray.method(concurrency_group="control")
    def where(self) -> tuple[str, int]:
        """The actor's node id and worker pid."""
        return ray.get_runtime_context().get_node_id(), os.getpid()

    @ray.method(concurrency_group="control")
    def ping(self) -> float:
        """The actor's monotonic clock: the pool's probe of the control path
        and of the clock offset."""
        return time.monotonic()

    @ray.method(concurrency_group="control")
    def echo(self, data: np.ndarray) -> np.ndarray:
        """`data` back: the pool's probe of the data path, both ways."""
        return np.array(data, copy=True)

    @ray.method(concurrency_group="control")
    def cancel(self, batch_id: int) -> None:
        self.executor._cancel(int(batch_id))

    @ray.method(concurrency_group="control")
    def interrupt_alone(self) -> None:
        """Stop the re-run alone in progress (a batch was sent)."""
        os.write(self.interrupt_w, b"x")

    @ray.method(concurrency_group="control")
    def open_channel(self, path: str) -> None:
        """Connect to the pool's socket at `path` and serve batches from it
        in a thread of its own (app.runtime.ray_channel)."""
        if self.channel is not None:
            with contextlib.suppress(OSError):
                self.channel.close()
        self.channel = conn = dial(path)
        self.channel_count.reset()
        thread = threading.Thread(
            target=serve,
            args=(conn, self._run_message, self.channel_count),
            name="batch-channel",
            daemon=True,
        )
        thread.start()

    def _run_message(self, msg: Run) -> Ran | Cancelled:
        try:
            return self.run(msg.batch_id, msg.model, list(msg.slots), msg.start_at, msg.alone)
        except Exception as exc:  # the batch is answered, whatever happened
            now = time.monotonic()
            return Ran(int(msg.batch_id), now, now, f"{type(exc).__name__}: {exc}")

    def _after(self, sent: int) -> None:
        """Wait until the channel's thread has handled `sent` batches."""
        if sent > 0 and not self.channel_count.wait_for(sent, AFTER_LIMIT_S):
            log.error("%s: %d batches sent on the channel never came", self.executor.name, sent)

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Returns at `stop`; fails in the pool when the actor dies."""
        self.stopped.wait()

    # ------------------------------------------------------------ serving
    def load(self, configs: list[dict[str, Any]], layouts: dict[str, Any] | None) -> Loaded:
        """Load the models; `layouts` (the daemon's arenas) or, for an actor
        on another node (None), scratch arenas of its own."""
        if layouts is None:
            layouts = {}
            for raw in configs:
                config = config_from_dict(raw)
                if config.name not in self.scratch_arenas:
                    arena = Arena.create(config, max(1, config.max_batch_size))
                    self.scratch_arenas[config.name] = arena
                layouts[config.name] = self.scratch_arenas[config.name].layout
        with self.lock:
            self.executor.load(0, configs, layouts)
            return self.replies.take()

    def unload(self, models: list[str], after: int = 0) -> None:
        """Drop the models (after the batches sent before, `after` of them
        on the channel) and their scratch arenas."""
        self._after(after)
        with self.lock:
            self.executor.unload(0, list(models))
            self.replies.take()
        for name in models:
            arena = self.scratch_arenas.pop(name, None)
            if arena is not None:
                with contextlib.suppress(Exception):
                    arena.close_and_unlink()

    def run(
        self,
        batch_id: int,
        model: str,
        slots: list[int],
        start_at: float,
        alone: tuple[AloneMark, ...] = (),
    ) -> Ran | Cancelled:
        """Run a batch on the daemon's arena's `slots` at `start_at`;
        `alone` marks samples to re-run alone."""
        with self.lock:
            self.executor.run(int(batch_id), model, list(slots), float(start_at), tuple(alone))
            return self.replies.take()

    def rerun_alone(self) -> tuple[RanAlone | None, int]:
        """Re-run the oldest kept sample alone, unless `interrupt_alone`
        stops it; the report (None when there was nothing to run) and how
        many samples are left."""
        with self.lock:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.interrupt_r, 64):  # interrupts meant for earlier re-runs
                    pass
            if self.executor.profiler.backlog:
                self.executor.rerun_alone(wake=self.interrupt_r)
            report = self.replies.take()
            return report, len(self.executor.profiler.backlog)

    def run_rows(
        self,
        batch_id: int,
        model: str,
        inputs: np.ndarray,
        start_at: float,
        alone: tuple[AloneMark, ...] = (),
        spilled: dict[int, dict[str, np.ndarray]] | None = None,
    ) -> tuple[Ran | Cancelled, np.ndarray | None, dict[int, dict[str, np.ndarray]]]:
        """Run a batch whose slots' input bytes are `inputs` (one row per
        item) on the scratch arena, with the items that did not fit a slot
        (`spilled`, app/runtime/spill.py); the reply, the slots' output
        bytes (None when the batch did not run to its end) and the outputs
        that did not fit."""
        arena = self.scratch_arenas.get(model)
        if arena is None:
            error = f"model {model!r} is not loaded on {self.executor.name}"
            now = time.monotonic()
            return Ran(int(batch_id), now, now, error), None, {}
        rows = len(inputs)
        if rows > arena.capacity:
            now = time.monotonic()
            error = f"batch of {rows} items exceeds max_batch_size {arena.capacity}"
            return Ran(int(batch_id), now, now, error), None, {}
        cut = inputs_end(arena.layout)
        scratch = list(range(rows))
        with self.lock:
            arena.slot_bytes()[:rows, :cut] = inputs
            made = arena.spills.place("inputs", scratch, spilled or {})
            try:
                self.executor.run(int(batch_id), model, scratch, float(start_at), tuple(alone))
                reply = self.replies.take()
                outputs = arena.spills.items("outputs", scratch, take=True)
            finally:
                for name in made:
                    spill.unlink(name)
        if not isinstance(reply, Ran) or reply.error is not None:
            return reply, None, {}
        return reply, arena.slot_bytes()[:rows, cut:].copy(), outputs

    def profile(
        self,
        model: str,
        batch_sizes: list[int],
        warmup: int,
        repeats: int,
        given: dict[str, np.ndarray] | None,
    ) -> Profiled:
        with self.lock:
            self.executor.profile(0, model, batch_sizes, warmup, repeats, given)
            return self.replies.take()

    def stop(self, after: int = 0) -> None:
        """After the batches sent before it (`after` of them on the
        channel): let go of the arenas."""
        self._after(after)
        with self.lock:
            self.executor.shutdown(reply=False)
        for arena in self.scratch_arenas.values():
            with contextlib.suppress(Exception):
                arena.close_and_unlink()
        self.scratch_arenas.clear()
        self.stopped.set()


def actor_class() -> Any:
    """The Ray actor class of `ExecutorActor`."""
    return ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(ExecutorActor)
