"""Worker processes: with `--workers N`, N processes (spawned) each take
every N-th arrival and start on a common CLOCK_MONOTONIC `t0`. Scripts that
call `run_load(workers>1)` need the usual `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.loadgen.client import ClientConfig, make_sender
from bench.loadgen.driver import START_DELAY_S, Schedule, drive
from bench.loadgen.errors import RunFailed
from bench.loadgen.records import Records


@dataclass
class WorkerPlan:
    """What one worker sends, and how (picklable)."""

    client: ClientConfig
    schedule: Schedule


def _worker_main(conn: Any, progress: Any, slot: int) -> None:
    # The plan comes through the pipe, not as a Process argument: a spawn
    # payload the child never reads (it died importing) blocks the parent.
    try:
        plan = conn.recv()
        asyncio.run(_worker_async(plan, conn, progress, slot))
    except BaseException as exc:  # report anything to the parent, then exit
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _worker_async(plan: WorkerPlan, conn: Any, progress: Any, slot: int) -> None:
    sender = make_sender(plan.client)
    try:
        await sender.warm(plan.client.warm_connections)
        conn.send(("ready", None))
        message, t0 = conn.recv()
        if message != "start":
            return

        def report(sent: int, done: int) -> None:
            progress[2 * slot] = sent
            progress[2 * slot + 1] = done

        records = await drive(plan.schedule, t0, sender, report)
    finally:
        await sender.aclose()
    conn.send(("done", records))


async def _recv(conn: Any, timeout: float) -> tuple[str, Any]:
    """One message from a worker pipe, without blocking the event loop."""
    ready = await asyncio.to_thread(conn.poll, max(0.0, timeout))
    if not ready:
        raise RunFailed(f"a load generator worker did not answer within {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        raise RunFailed("a load generator worker exited unexpectedly") from None


async def run_workers(
    plans: list[WorkerPlan], progress_cb: Callable[[int, int], None] | None
) -> tuple[list[Records], float]:
    """Run each plan in a worker process, all from one t0 (CLOCK_MONOTONIC);
    their records and t0. `progress_cb(sent, done)` about ten times a second.
    Raises RunFailed when a worker fails to start, fails or dies."""
    ctx = multiprocessing.get_context("spawn")
    shared = ctx.Array("q", 2 * len(plans), lock=False)
    pipes, procs = [], []
    try:
        for w in range(len(plans)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main, args=(child, shared, w), daemon=True, name=f"loadgen-{w}"
            )
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        for w, (plan, conn) in enumerate(zip(plans, pipes, strict=True)):
            try:
                await asyncio.to_thread(conn.send, plan)
            except OSError:
                raise RunFailed(f"load generator worker {w} exited on start") from None
        for conn in pipes:
            kind, payload = await _recv(conn, 60.0)
            if kind != "ready":
                raise RunFailed(f"load generator worker failed to start: {payload}")
        t0 = time.monotonic() + START_DELAY_S  # CLOCK_MONOTONIC: shared by all processes
        for conn in pipes:
            conn.send(("start", t0))
        limit = max(p.schedule.run_limit_s for p in plans)
        results: list[Records | None] = [None] * len(plans)
        while any(r is None for r in results):
            for w, conn in enumerate(pipes):
                if results[w] is None and conn.poll():
                    kind, payload = conn.recv()
                    if kind != "done":
                        raise RunFailed(f"load generator worker {w} failed: {payload}")
                    results[w] = payload
            if progress_cb is not None:
                progress_cb(sum(shared[0::2]), sum(shared[1::2]))
            if time.monotonic() > t0 + limit + 30.0:
                raise RunFailed("load generator workers did not finish by the run deadline")
            if any(
                r is None and not p.is_alive() and not c.poll()
                for r, p, c in zip(results, procs, pipes, strict=True)
            ):
                raise RunFailed("a load generator worker died during the run")
            await asyncio.sleep(0.1)
        return [r for r in results if r is not None], t0
    finally:
        for conn in pipes:
            with contextlib.suppress(Exception):
                conn.send(("stop", None))
            conn.close()
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
