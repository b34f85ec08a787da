"""The executor process: one per device, driven by small control messages.

Started by `ExecutorPool` with the *spawn* context as
``executor_main(conn, device, log_level, realtime_priority, cancels, heartbeat, env)``.
The messages on its two pipes are the dataclasses of `app.runtime.messages`:
Load, Run, Profile and Stop on the main pipe, answered by Loaded, Ran or
Cancelled, Profiled and Stopped; Cancel on the second, one-way pipe. While
its inbox is empty it re-runs sampled requests alone, each answered by
RanAlone (the asynchronous profiler, app/runtime/alone_profiler.py).
A thread stamps the shared `heartbeat` while the process runs, idle or busy,
so the pool sees a stopped or frozen process (`app.runtime.watchdog`).

Messages are executed strictly in order by the main thread, which reads the
pipe itself: a batch reaches it with one wake-up, not two (a reader thread
handing it over through a queue). Cancels come on their own pipe to a thread
that acts on them at once, even mid-batch. An exception inside a batch
becomes the `error` of its Ran reply; a stopped batch answers Cancelled; the
loop keeps serving. The process exits on Stop or when the parent's end of
the pipe closes.

A model with variable dimensions runs a batch as one call per shape group
(`run_shape_groups`): a batch may mix request shapes, since the core counts
items only; ℓ(b) then underestimates a mixed batch (a documented deviation:
the groups run one after another). Declaring a dimension padded (`pad`)
makes requests that differ only along it one group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from app.repository.config import ModelConfig
from app.runtime.alone_profiler import IDLE_GRACE_S, AloneProfiler, timed_alone
from app.runtime.messages import (
    AloneMark,
    Cancel,
    Cancelled,
    Load,
    Loaded,
    Profile,
    Profiled,
    Ran,
    RanAlone,
    Run,
    Stop,
    Stopped,
    Unload,
    Unloaded,
    config_from_dict,
)
from app.runtime.realtime import (
    NORMAL,
    RealtimeUnavailable,
    executor_priority,
    restore,
    set_fifo,
)
from app.runtime.tensor_rows import padded_shape, shape_groups
from app.runtime.watchdog import Heartbeat, keep_beating

# The error text of a batch whose executor stopped it (internal: the reply
# to such a batch is Cancelled).
CANCELLED = "cancelled"

log = logging.getLogger("app.runtime.executor")


# ------------------------------------------------------------------ helpers
def synthetic_inputs(config: ModelConfig, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right dtype and shape: randn for floats, zeros otherwise
    (BYTES: the string "0" in each element, which a model that parses its
    strings as numbers takes too — Triton's simple_string casts STRING to
    INT32 — where an empty string fails). Variable dimensions are at their bound: a
    profile measured there is the slowest the model runs."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in config.inputs:
        shape = (batch, *spec.slot_shape)
        if spec.datatype == "BYTES":
            out[spec.name] = np.full(shape, b"0", dtype=object)
        elif spec.dtype.kind == "f":
            out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        else:
            out[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return out


def run_shape_groups(config: ModelConfig, backend: Any, arena: Any, slots: list[int]) -> None:
    """Run a batch whose model has variable dimensions: one backend call per
    group of rows with one input shape (padded dimensions aside: those rows
    are padded with 0 to the group's longest), each output row cut back to
    its request's length along the dimensions that `follow` a padded input
    one (app/runtime/tensor_rows.py).

    A deviation from the core's plan, on purpose: the core sizes and times a
    batch by its item count only (ℓ(b)), so a batch that mixes shapes runs
    as several smaller calls here and takes longer than ℓ(b) said — the
    core underestimates it. Keeping shape groups apart in the core instead
    would need every policy's batch selection to know shapes."""
    shapes = {spec.name: arena.item_shapes(spec.name, slots) for spec in config.inputs}
    padded = {spec.name: spec.padded for spec in config.inputs}
    for group in shape_groups(shapes, padded):
        rows = [slots[i] for i in group]
        inputs = {}
        for spec in config.inputs:
            shape = padded_shape([shapes[spec.name][i] for i in group])
            inputs[spec.name] = arena.gather(spec.name, rows, shape if spec.variable else None)
        outputs = backend.run(inputs)
        for spec in config.outputs:
            if spec.name not in outputs:
                raise KeyError(f"backend returned no output {spec.name!r}")
            out = np.asarray(outputs[spec.name])
            row_shapes = None
            if spec.variable:
                row_shapes = []
                for i in group:
                    item = list(out.shape[1:])
                    for d, ref in enumerate(spec.follows[1:]):
                        if ref is not None and d < len(item):
                            item[d] = shapes[ref[0]][i][ref[1] - 1]
                    row_shapes.append(tuple(item))
            arena.scatter(spec.name, rows, out, row_shapes)


def set_process_title(title: str) -> None:
    """Best effort: setproctitle if installed, else the Linux thread name."""
    try:
        import setproctitle  # type: ignore[import-not-found]

        setproctitle.setproctitle(title)
        return
    except ImportError:
        pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None)
            libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        except Exception:
            pass


# A batch's start is awaited by sleeping, then spinning only this long: with
# the timer slack at 1 µs (tighten_timer_slack) a wake-up is ~0.1 ms late, and
# a longer spin per batch would cost a core per busy device on a small box.
START_SPIN_S = 0.0002


def tighten_timer_slack(slack_ns: int = 1000) -> None:
    """Linux coalesces a sleeping thread's wake-up by up to 50 µs by default;
    batch start times are planned to the millisecond, so ask for 1 µs."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(29, slack_ns, 0, 0, 0)  # PR_SET_TIMERSLACK
        except Exception:
            pass


def pin_to_cores(cpus: Iterable[int]) -> None:
    """Pin every thread of this process to `cpus`. Threads started later
    inherit the caller's mask, but some started at import keep their own
    (OpenBLAS's pool, started by importing numpy), so each is pinned."""
    mask = {int(c) for c in cpus}
    os.sched_setaffinity(0, mask)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return  # no /proc: the calling thread only
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.sched_setaffinity(tid, mask)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 2000 else text[:2000] + "…"


# -------------------------------------------------------------- the process
class Executor:
    """State of one executor process (used by `executor_main`)."""

    def __init__(self, conn: Any, device: dict[str, Any]) -> None:
        from app.runtime.arena import Arena  # noqa: F401  (import cost up front)

        self.conn = conn
        self.device = device
        self.name: str = device["name"]
        self.slowdown = float(device.get("slowdown", 1.0))
        self.threads = max(1, int(device.get("threads", 1)))
        self.configs: dict[str, ModelConfig] = {}
        self.backends: dict[str, Any] = {}
        self.arenas: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._cancelled: OrderedDict[int, None] = OrderedDict()
        self._current: int | None = None
        self._current_backend: Any = None
        self._wake = threading.Event()
        self.profiler = AloneProfiler()

    # cancel thread ---------------------------------------------------------
    def read_cancels(self, cancels: Any) -> None:
        while True:
            try:
                msg = cancels.recv()
            except (EOFError, OSError):
                return  # the parent is gone or stopping us: the main pipe says which
            if isinstance(msg, Cancel):
                self._cancel(int(msg.batch_id))
            else:
                log.error("%s: unknown message %r on the cancel pipe", self.name, msg)

    def _cancel(self, batch_id: int) -> None:
        with self._lock:
            self._cancelled[batch_id] = None
            while len(self._cancelled) > 4096:
                self._cancelled.popitem(last=False)
            if self._current == batch_id:
                self._wake.set()
                backend = self._current_backend
                if backend is not None and hasattr(backend, "terminate"):
                    backend.terminate()

    # main thread -----------------------------------------------------------
    def serve(self) -> None:
        while True:
            try:
                if self.profiler.backlog and not self.conn.poll(IDLE_GRACE_S):
                    self.rerun_alone()  # the device would idle: profile
                    continue
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.shutdown(reply=False)
                return
            try:
                if isinstance(msg, Run):
                    slots, start_at = list(msg.slots), float(msg.start_at)
                    self.run(msg.batch_id, msg.model, slots, start_at, msg.alone)
                elif isinstance(msg, Load):
                    self.load(msg.req_id, msg.configs, msg.layouts)
                elif isinstance(msg, Unload):
                    self.unload(msg.req_id, msg.models)
                elif isinstance(msg, Profile):
                    self.profile(
                        msg.req_id, msg.model, msg.batch_sizes, msg.warmup, msg.repeats, msg.inputs
                    )
                elif isinstance(msg, Stop):
                    self.shutdown()
                    return
                else:
                    log.error("%s: unknown message %r", self.name, type(msg).__name__)
            except (BrokenPipeError, EOFError, ConnectionResetError):
                self.shutdown(reply=False)
                return
            except Exception:  # a malformed message must not kill the loop
                log.exception("%s: failed to handle %s", self.name, type(msg).__name__)

    def send(
        self, msg: Loaded | Unloaded | Ran | Cancelled | Profiled | RanAlone | Stopped
    ) -> None:
        self.conn.send(msg)

    def load(self, req_id: int, configs: list[Any], layouts: dict[str, Any]) -> None:
        from app.runtime.arena import Arena
        from app.runtime.backends import make_backend

        errors: dict[str, str | None] = {}
        info: dict[str, str] = {}
        for raw in configs:
            name = raw.name if isinstance(raw, ModelConfig) else str(raw.get("name"))
            try:
                config = config_from_dict(raw)
                backend = make_backend(
                    config,
                    self.device["kind"],
                    int(self.device.get("index", 0)),
                    int(self.device.get("threads", 1)),
                    share=float(self.device.get("share", 1.0)),
                )
                backend.load(config)
                arena = Arena.attach(layouts[name]) if name in layouts else None
                old = self.arenas.pop(name, None)
                if old is not None:
                    old.close()
                self.configs[name] = config
                self.backends[name] = backend
                if arena is not None:
                    self.arenas[name] = arena
                providers = getattr(backend, "providers", None)
                info[name] = f"{config.backend}" + (f" {providers}" if providers else "")
                errors[name] = None
                log.info("%s: loaded %s (%s)", self.name, name, info[name])
            except Exception as exc:
                log.warning("%s: loading %s failed: %s", self.name, name, exc)
                errors[name] = _error_text(exc)
        self.send(Loaded(req_id, errors, info))

    def unload(self, req_id: int, models: list[str]) -> None:
        """Drop the models' backends and detach their arenas (the parent
        unlinks them once this is answered)."""
        self.profiler.forget(models)
        for name in models:
            self.configs.pop(name, None)
            self.backends.pop(name, None)
            arena = self.arenas.pop(name, None)
            if arena is not None:
                arena.close()
            log.info("%s: unloaded %s", self.name, name)
        self.send(Unloaded(req_id))

    def _wait_until(self, start_at: float) -> None:
        remaining = start_at - time.monotonic()
        if remaining > START_SPIN_S and self._wake.wait(remaining - START_SPIN_S):
            return  # cancelled while waiting
        while time.monotonic() < start_at and not self._wake.is_set():
            pass

    def run(
        self,
        batch_id: int,
        model: str,
        slots: list[int],
        start_at: float,
        alone: tuple[AloneMark, ...] = (),
    ) -> None:
        backend = self.backends.get(model)
        # Backends with a preemption flag (Torch) have it cleared under the
        # lock that guards terminate(), when the batch starts and ends: a stop
        # for this batch is never lost nor left over for the next one.
        reset = getattr(backend, "reset", None)
        with self._lock:
            cancelled = batch_id in self._cancelled
            self._cancelled.pop(batch_id, None)
            self._current = batch_id
            self._current_backend = backend
            self._wake.clear()
            if reset is not None:
                reset()
        error: str | None = None
        started = time.monotonic()
        try:
            if cancelled:
                error = CANCELLED
            else:
                self._wait_until(start_at)
                started = time.monotonic()
                error = (
                    CANCELLED
                    if self._wake.is_set()
                    else self._execute(model, backend, slots, started)
                )
        finally:
            with self._lock:
                self._current = None
                self._current_backend = None
                self._cancelled.pop(batch_id, None)
                if reset is not None:
                    reset()
        finished = time.monotonic()
        if error is None and alone:
            self._keep_alone(model, slots, alone)
        if error == CANCELLED:
            self.send(Cancelled(batch_id, started, finished))
        else:
            self.send(Ran(batch_id, started, finished, error))

    def _keep_alone(self, model: str, slots: list[int], alone: tuple[AloneMark, ...]) -> None:
        """Copy the batch's sampled requests out of the arena before it is
        answered; a failure costs the samples, never the batch."""
        try:
            self.profiler.keep(model, self.configs[model], self.arenas[model], slots, alone)
        except Exception:
            log.exception("%s: keeping samples of %s failed", self.name, model)

    def rerun_alone(self, wake: Any = None) -> None:
        """Re-run the oldest sample alone, stopped at once if a message
        arrives meanwhile (app/runtime/alone_profiler.py) on the pipe, or on
        `wake` (a waitable: a Ray actor has no pipe)."""
        sample = self.profiler.next()
        backend = None if sample is None else self.backends.get(sample.model)
        if sample is None or backend is None or not hasattr(backend, "terminate"):
            return  # its model is gone, or its backend cannot be stopped
        reset = getattr(backend, "reset", None)

        def stop() -> None:
            with self._lock:
                backend.terminate()

        with self._lock:
            if reset is not None:
                reset()
        try:
            watched = self.conn if wake is None else wake
            seconds = timed_alone(watched, lambda: backend.run(sample.inputs), stop)
        except Exception:
            log.exception("%s: re-running a sample of %s failed", self.name, sample.model)
            return
        finally:
            with self._lock:
                if reset is not None:
                    reset()
        self.send(self.profiler.report(sample, seconds))

    def _execute(self, model: str, backend: Any, slots: list[int], started: float) -> str | None:
        from app.runtime.backend import Terminated
        from app.runtime.emulated import EmulatedBackend

        cpu_at = time.process_time()
        try:
            if backend is None:
                raise KeyError(f"model {model!r} is not loaded on {self.name}")
            arena = self.arenas.get(model)
            if arena is None:
                raise KeyError(f"model {model!r} has no arena on {self.name}")
            if not slots:
                raise ValueError("empty batch")
            for s in slots:
                if not 0 <= s < arena.capacity:
                    raise IndexError(f"slot {s} out of range (capacity {arena.capacity})")
            config = self.configs.get(model)
            if config is not None and any(s.variable for s in config.inputs + config.outputs):
                run_shape_groups(config, backend, arena, slots)
                return None
            inputs = {n: arena.gather(n, slots) for n in arena.input_names}
            emulated = isinstance(backend, EmulatedBackend)
            # An emulated device finishes ℓ(b) after the batch started, its
            # copies in and out included, as a profiled ℓ(b) would: outputs
            # are written first, then the device is held. (Host copies on a
            # just-woken core cost 0.1–0.2 ms here; after the hold they made
            # every batch finish that much later than the core planned.)
            outputs = backend.outputs(inputs) if emulated else backend.run(inputs)
            for n in arena.output_names:
                if n not in outputs:
                    raise KeyError(f"backend returned no output {n!r}")
                arena.scatter(n, slots, outputs[n])
            if emulated:
                backend.hold(started + backend.latency(len(slots)))
            elif self.slowdown > 1.0:
                # An emulated slower device (ExecutorDevice.slowdown): held
                # until start + slowdown × the batch's compute, its CPU time
                # per thread (so that time other processes take from it on a
                # busy machine is not multiplied too); a Cancel ends it early.
                compute = (time.process_time() - cpu_at) / self.threads
                self._wait_until(started + self.slowdown * compute)
            return None
        except Terminated:
            return CANCELLED
        except Exception as exc:
            log.debug("%s: batch on %s failed:\n%s", self.name, model, traceback.format_exc())
            return _error_text(exc)

    def profile(
        self,
        req_id: int,
        model: str,
        batch_sizes: list[int],
        warmup: int,
        repeats: int,
        given: dict[str, np.ndarray] | None = None,
    ) -> None:
        try:
            backend = self.backends.get(model)
            if backend is None:
                raise KeyError(f"model {model!r} is not loaded on {self.name}")
            config = self.configs[model]
            result: dict[int, float] = {}
            for b in batch_sizes:
                b = int(b)
                inputs = synthetic_inputs(config, b) if given is None else given
                for _ in range(max(0, warmup)):
                    backend.run(inputs)
                times = []
                for _ in range(max(1, repeats)):
                    t0 = time.perf_counter()
                    backend.run(inputs)
                    times.append((time.perf_counter() - t0) * 1000.0)
                result[b] = float(np.median(times))
            self.send(Profiled(req_id, result, None))
        except (BrokenPipeError, EOFError, ConnectionResetError):
            raise
        except Exception as exc:
            self.send(Profiled(req_id, None, _error_text(exc)))

    def shutdown(self, reply: bool = True) -> None:
        for arena in self.arenas.values():
            arena.close()
        self.arenas.clear()
        self.backends.clear()
        if reply:
            with contextlib.suppress(BrokenPipeError, EOFError, ConnectionResetError, OSError):
                self.send(Stopped())


def executor_main(
    conn: Any,
    device: dict[str, Any],
    log_level: int = logging.WARNING,
    realtime_priority: int = 0,
    cancels: Any = None,
    heartbeat: Heartbeat | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Entry point of an executor process (spawn target). `realtime_priority`
    is the event loop's; the executor runs one below it (app.runtime.realtime).
    `heartbeat`, if given, is stamped by a thread of its own, started after
    the priority is set (it inherits it). `env` is added to the process's
    environment first, before any backend reads it (a GPU share's MPS
    settings, app.runtime.mps). Every thread of the process is pinned to the
    device's `cpus` (`pin_to_cores`) before its own threads start and before
    any backend loads, so those inherit it."""
    os.environ.update(env or {})
    name = str(device.get("name", "executor"))
    logging.basicConfig(
        level=log_level,
        format=f"%(asctime)s executor[{name}] %(levelname)s %(message)s",
    )
    # Ctrl-C, and a SIGTERM to the process group (systemd's default kill
    # mode, `kill -TERM -<pgid>`), reach us too; the parent drains and then
    # stops us in order, so dying at once would only trigger a respawn.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_process_title(f"dsrv-{name}")
    tighten_timer_slack()
    if realtime_priority:  # inherited from the event loop's thread: step down
        priority = executor_priority(realtime_priority, str(device.get("kind")))
        try:
            if priority:
                set_fifo(priority)
            else:
                restore(NORMAL)
        except RealtimeUnavailable as exc:  # the parent could; say so and run on
            log.warning("%s: %s", name, exc)
    cpus = device.get("cpus")
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            pin_to_cores(cpus)
        except OSError as exc:
            log.warning("%s: cannot pin to CPUs %s: %s", name, cpus, exc)
    stop_beating = threading.Event()
    if heartbeat is not None:
        threading.Thread(
            target=keep_beating,
            args=(heartbeat, stop_beating),
            name=f"{name}-heartbeat",
            daemon=True,
        ).start()
    executor = Executor(conn, device)
    if cancels is not None:
        threading.Thread(
            target=executor.read_cancels, args=(cancels,), name=f"{name}-cancels", daemon=True
        ).start()
    try:
        executor.serve()
    finally:
        stop_beating.set()
        with contextlib.suppress(OSError):
            conn.close()
