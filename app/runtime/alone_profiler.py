"""The executors' asynchronous profiler (orloj.txt §3, "Long-Term Feedback Loop").

A policy that plans with per-application distributions of *alone*-times
(how long one request runs by itself) cannot read them off live batches: a
request in a batch runs as long as the batch's longest. So a sample of the
finished requests is re-run alone, off the critical path:

* The driver marks the sampled requests of a batch when it dispatches it
  (`Run.alone`: the rate is the PROFILE_SAMPLE_RATE setting, only models
  declared dynamic; app/server/alone_sampling.py). Drawing the sample then
  rather than at the end is the same draw, and the executor needs no rate.
* When the batch has run to its end, before it is answered, the executor
  copies each marked request's input rows out of the shared-memory arena
  (its slots are freed and reused once it is answered) into a bounded
  backlog (`AloneProfiler`): the oldest sample is dropped beyond
  `BACKLOG_LIMIT` and counted, and the count rides on the next report.
* Only when its inbox has stayed empty for `IDLE_GRACE_S` — the device
  would otherwise idle — the executor re-runs ONE sample alone (`timed_alone`), timed with the
  monotonic clock. A message that arrives meanwhile (a planned batch) must
  not wait for it: a watcher thread stops the re-run through the backend's
  `terminate()`, the executor's preemption mechanism, and its time is
  discarded. A stopped sample goes back to the end of the backlog, up to
  `MAX_STOPS` times: the longest requests are the likeliest to be stopped,
  and dropping them at once would bias the histogram towards short ones.
* Each re-run is reported (`RanAlone`; `AloneTimed` / `AloneStopped` events
  on the parent's side), and the driver hands the time to the scheduling
  core (`Scheduler.record_alone_time`).

A backend without `terminate()` cannot be stopped for a planned batch: its
samples are dropped, not re-run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from app.repository.config import ModelConfig
from app.runtime.backend import Terminated
from app.runtime.events import AloneStopped, AloneTimed
from app.runtime.messages import AloneMark, RanAlone
from app.runtime.tensor_rows import padded_shape

log = logging.getLogger("app.runtime.alone_profiler")

# Samples kept per executor: a few seconds of a busy device's sampled
# requests. Beyond it the oldest goes (a busy device yields more samples
# than its idle time can re-run; recent ones say more about the workload).
BACKLOG_LIMIT = 64
# A sample stopped this many times is discarded.
MAX_STOPS = 3
# How often the watcher repeats terminate() until the re-run has stopped: a
# stop that arrives before the backend's run has armed its flag (ONNX
# Runtime's RunOptions exist only during run) would otherwise be lost.
STOP_REPEAT_S = 0.001
# How long the inbox must stay empty before a re-run starts. Between
# back-to-back batches the daemon needs a fraction of a millisecond to send
# the next one; a re-run started in that gap is stopped at once, and the
# stop (up to one step of the model: ONNX Runtime checks its flag between
# kernels) delays that batch. Measured with bench.orloj_live: re-runs
# started at once cost orloj ~5 points of finish rate on a busy device.
IDLE_GRACE_S = 0.002


@dataclass(slots=True)
class Sample:
    """A request's inputs, copied out of the arena, waiting to be re-run."""

    model: str
    app: str
    items: int
    inputs: dict[str, np.ndarray]
    stops: int = 0


def copy_rows(config: ModelConfig, arena: Any, rows: list[int]) -> dict[str, np.ndarray]:
    """One request's inputs, out of the arena: variable inputs at the
    request's own shape (one request has one shape, so no padding)."""
    inputs = {}
    for spec in config.inputs:
        shape = padded_shape(arena.item_shapes(spec.name, rows)) if spec.variable else None
        inputs[spec.name] = arena.gather(spec.name, rows, shape)
    return inputs


class AloneProfiler:
    """An executor's backlog of sampled requests and its drop counter."""

    def __init__(self, limit: int = BACKLOG_LIMIT, max_stops: int = MAX_STOPS) -> None:
        if limit < 1 or max_stops < 1:
            raise ValueError(f"limit and max_stops must be ≥ 1, got {limit}, {max_stops}")
        self.limit = limit
        self.max_stops = max_stops
        self.backlog: deque[Sample] = deque()
        self.dropped = 0  # since the last report

    def keep(
        self,
        model: str,
        config: ModelConfig,
        arena: Any,
        slots: Sequence[int],
        marks: Sequence[AloneMark],
    ) -> None:
        """Copy the marked requests of a batch that ran to its end (before
        it is answered: its slots are reused after)."""
        for first, items, app in marks:
            rows = list(slots[first : first + items])
            if len(rows) != items or items < 1:
                raise ValueError(
                    f"sample at row {first} with {items} rows does not fit a batch of "
                    f"{len(slots)} rows"
                )
            self._add(Sample(model, str(app), items, copy_rows(config, arena, rows)))

    def _add(self, sample: Sample) -> None:
        if len(self.backlog) >= self.limit:
            self.backlog.popleft()
            self.dropped += 1
        self.backlog.append(sample)

    def next(self) -> Sample | None:
        return self.backlog.popleft() if self.backlog else None

    def forget(self, models: Sequence[str]) -> None:
        """Samples of unloaded models are no use any more (not counted as
        dropped: no histogram waits for them)."""
        gone = set(models)
        self.backlog = deque(s for s in self.backlog if s.model not in gone)

    def report(self, sample: Sample, seconds: float | None) -> RanAlone:
        """The message for a re-run: timed, or stopped (`seconds` None; the
        sample is kept for another try unless stopped `max_stops` times)."""
        if seconds is None:
            sample.stops += 1
            if sample.stops < self.max_stops:
                self._add(sample)
        dropped, self.dropped = self.dropped, 0
        return RanAlone(sample.model, sample.app, sample.items, seconds, dropped)


def timed_alone(conn: Any, run: Callable[[], object], stop: Callable[[], None]) -> float | None:
    """Seconds `run()` took on this thread, or None when a message arrived
    on `conn` meanwhile and the run was stopped (`stop()`, repeated until
    `run` returns; a `Terminated` it raises is that stop). The watcher only
    polls `conn`; the caller's thread reads it, as always."""
    wake_r, wake_w = os.pipe()
    done = threading.Event()
    stopped = threading.Event()

    def watch() -> None:
        if wake_r in wait([conn, wake_r]):
            return  # the run ended first
        stopped.set()
        stop()
        while not done.wait(STOP_REPEAT_S):
            stop()

    watcher = threading.Thread(target=watch, name="alone-watch", daemon=True)
    watcher.start()
    try:
        started = time.monotonic()
        try:
            run()
        except Terminated:
            return None
        seconds = time.monotonic() - started
    finally:
        done.set()
        os.write(wake_w, b"x")
        watcher.join()
        os.close(wake_r)
        os.close(wake_w)
    # A run that ended before the stop reached it is a valid measurement.
    return seconds


def alone_event(device: int, msg: RanAlone) -> AloneTimed | AloneStopped:
    """The pool's event for an executor's RanAlone."""
    if msg.seconds is None:
        return AloneStopped(device, msg.model, msg.app, msg.items, msg.dropped)
    return AloneTimed(device, msg.model, msg.app, msg.items, msg.seconds, msg.dropped)
