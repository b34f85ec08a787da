"""The open-loop driver: sends a schedule through a sender and records what
came back (`drive`). `bench.loadgen` drives HTTP clients with it, in one or
several processes; `bench.inprocess` drives the daemon's service directly.

**Open loop, no coordinated omission.** Request *i* is due at `t0 +
intended[i]` whatever happened to earlier requests; a slow server never
delays a send. A request sent late is still measured from its *intended*
send time (latency = response time − intended time), and the schedule is
never shifted to catch up. The driver waits for each send time on a Linux
timerfd (`bench/precise_sleep.py`): `asyncio.sleep` would wake up to 1 ms late
(the selector's millisecond timeouts), and every send with it.

**Bounded.** Each request has a hard timeout counted from its intended send
time; at `t0 + run_limit_s` the run stops, whatever is still outstanding then
counts as an error (`run_deadline`) and whatever was never sent as
`not_sent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from bench.loadgen.client import ConnectionLost, Sender, reply_reason, reply_timing
from bench.loadgen.records import NO_RESPONSE, Records, code_of
from bench.precise_sleep import PreciseSleeper

RUN_GRACE_S = 2.0  # after the last request's timeout, before the run is cut off
START_DELAY_S = 0.1  # from "ready" to t0, so every worker starts on time


@dataclass
class Schedule:
    """What one driver sends, and when (picklable: it crosses to worker
    processes). Times are seconds from t0."""

    intended: np.ndarray  # send time of each request
    model_index: np.ndarray  # its workload model
    timeouts_s: list[float]  # per model: SLO + margin, from the intended time
    run_limit_s: float  # stop everything then
    # Which body each request sends (an index into the sender's bodies); None:
    # its model's one body. Requests whose inputs differ (a dynamic model's
    # execution time depends on them) send one of several bodies per model.
    body_index: np.ndarray | None = None


def run_limit(duration_s: float, timeouts_s: list[float]) -> float:
    """When a run of `duration_s` stops: the longest timeout and a grace after."""
    return duration_s + max(timeouts_s) + RUN_GRACE_S


if sys.version_info >= (3, 11):

    def _deadline(when: float) -> Any:
        return asyncio.timeout_at(when)

else:  # pragma: no cover - Python 3.10

    @contextlib.asynccontextmanager
    async def _deadline(when: float) -> Any:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        handle = loop.call_at(when, task.cancel)
        try:
            yield
        except asyncio.CancelledError:
            if loop.time() >= when:
                raise TimeoutError from None
            raise
        finally:
            handle.cancel()


async def drive(
    schedule: Schedule,
    t0: float,
    sender: Sender,
    report: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> Records:
    """Send `schedule` from `t0` through `sender`; return the records. Times are
    `clock()` seconds (default: the loop's, which on the selector loop is
    time.monotonic(); uvloop's counts whole milliseconds)."""
    loop = asyncio.get_running_loop()
    clock = clock or loop.time
    rec = Records.empty(schedule.intended, schedule.model_index)
    intended = rec.intended
    model_index = rec.model_index
    sent, latency, status, reason = rec.sent, rec.latency_ms, rec.status, rec.reason
    queue_ms, exec_ms, batch, device = rec.queue_ms, rec.exec_ms, rec.batch_size, rec.device
    intake_ms, answer_ms = rec.intake_ms, rec.answer_ms
    reasons, devices = rec.reasons, rec.devices
    timeouts = schedule.timeouts_s
    body_index = schedule.body_index
    n = len(intended)
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        m = int(model_index[i])
        body = m if body_index is None else int(body_index[i])

        def on_sent() -> None:
            sent[i] = clock() - t0

        try:
            async with _deadline(t0 + intended[i] + timeouts[m]):
                reply = await sender.send(body, on_sent)
        except TimeoutError:
            reason[i] = code_of(reasons, "timeout")
        except ConnectionLost:
            reason[i] = code_of(reasons, "connection_lost")
        except (httpx.HTTPError, OSError) as exc:
            reason[i] = code_of(reasons, type(exc).__name__)
        else:
            latency[i] = (reply.end - t0 - intended[i]) * 1000.0
            code = reply.status
            status[i] = code
            if code == 200:
                timing = reply.timing if reply.timing is not None else reply_timing(reply.body)
                if timing is not None:
                    queue_ms[i] = timing.get("queue_ms", np.nan)
                    exec_ms[i] = timing.get("exec_ms", np.nan)
                    intake_ms[i] = timing.get("intake_ms", np.nan)
                    answer_ms[i] = timing.get("answer_ms", np.nan)
                    batch[i] = timing.get("batch_size", 0) or 0
                    dev = timing.get("device")
                    if dev is not None:
                        device[i] = code_of(devices, str(dev))
            else:
                reason[i] = code_of(reasons, reply_reason(code, reply.body))
        finally:
            done += 1

    pending: set[asyncio.Task[None]] = set()
    limit = t0 + schedule.run_limit_s
    ticker = None
    if report is not None:

        async def tick() -> None:
            while True:
                report(i, done)
                await asyncio.sleep(0.1)

        ticker = loop.create_task(tick())
    # asyncio.sleep would send up to 1 ms late (millisecond epoll timeouts).
    sleeper = PreciseSleeper(loop)
    i = 0
    try:
        while i < n:
            due = t0 + intended[i]
            if due > clock():
                # Never returns early; no re-check against `clock()`, which
                # on some loops (uvloop) lags time.monotonic() by up to 1 ms.
                await sleeper.sleep_until(due)
            now = clock()
            if now >= limit:
                break  # the rest was never sent: recorded as "not_sent"
            task = loop.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.wait(set(pending), timeout=max(0.0, limit - clock()))
    finally:
        sleeper.close()
        for task in list(pending):
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    dispatched = np.arange(n) < i
    cut = dispatched & (status == NO_RESPONSE) & (reason < 0)
    if cut.any():  # still outstanding at the run deadline
        reason[cut] = code_of(reasons, "run_deadline")
    if not dispatched.all():  # the run deadline came before their send time
        reason[~dispatched] = code_of(reasons, "not_sent")
    if report is not None:
        report(n, n)
    return rec
