"""Attacks through what a request carries: a gzip bomb, huge JSON bodies,
uploads that never finish, and an endless header block (issue 19, items 1–2).

Each is sent on raw connections (`bench.attack.net.exchange`) from
generators, so the client holds one chunk per connection, never a body.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterable, Iterator

from bench.attack.daemon import NORMAL_MODEL
from bench.attack.net import Exchange, count_outcomes, exchange
from bench.attack.payloads import (
    MB,
    gzip_bomb,
    header_flood,
    json_body,
    request_head,
    v2_infer_body,
)
from bench.attack.report import Check, percentile
from bench.attack.runner import Context

INFER_PATH = f"/v2/models/{NORMAL_MODEL}/infer"
BOMB_DECODED = 60 * MB
BOMB_ANSWER_TARGET_MS = 50.0
BOMB_RSS_TARGET_MB = 20.0
BIG_BODY = 60 * MB
NORMAL_WAIT_S = 10.0  # the normal requests beside the big bodies: unanswered after this
STALLED_RSS_TARGET_MB = 50.0
FLOOD_RSS_TARGET_MB = 20.0


def _host(ctx: Context) -> str:
    return f"{ctx.host}:{ctx.port}"


def _record(ctx: Context, exchanges: list[Exchange]) -> None:
    ctx.result.sent = len(exchanges)
    ctx.result.statuses, ctx.result.unanswered = count_outcomes(exchanges)


async def gzip_bomb_attack(ctx: Context) -> None:
    """~59 KB of gzip decoding to 60 MB of JSON, sent `count` times spread
    over `spread_s` to the small model's v2 infer route."""
    count, spread_s = (2, 3.0) if ctx.quick else (6, 16.0)
    bomb = gzip_bomb(BOMB_DECODED)
    head = request_head(
        "POST",
        INFER_PATH,
        _host(ctx),
        length=len(bomb),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    ctx.result.details.update(compressed_bytes=len(bomb), decoded_bytes=BOMB_DECODED)
    exchanges: list[Exchange] = []
    ctx.result.sent = count

    async def one(at: float) -> None:
        await asyncio.sleep(at)
        result = await exchange(ctx.host, ctx.port, [head, bomb], timeout_s=60.0)
        exchanges.append(result)
        _record(ctx, exchanges)

    await asyncio.gather(*(one(i * spread_s / max(1, count - 1)) for i in range(count)))
    _record(ctx, exchanges)
    answer_ms = [e.answer_s * 1000 if e.answer_s is not None else float("inf") for e in exchanges]
    ctx.result.details["answer_ms"] = [round(x, 1) for x in answer_ms]
    ctx.result.checks += [
        Check("bombs answered 413", ctx.result.statuses.get("413", 0), "==", count),
        Check("slowest answer", max(answer_ms), "<", BOMB_ANSWER_TARGET_MS, "ms"),
    ]


async def big_json_attack(ctx: Context) -> None:
    """Three huge JSON bodies on three connections and, once they are
    through, a burst of normal requests (each on its own connection) that
    must all be answered within `NORMAL_WAIT_S`. The normal client's window
    is the big bodies' (at least MIN_WINDOW_S): the burst is load of its
    own, reported apart (its answers' p99)."""
    size, burst = (20 * MB, 200) if ctx.quick else (BIG_BODY, 1000)
    head = request_head(
        "POST", INFER_PATH, _host(ctx), length=size, headers={"Content-Type": "application/json"}
    )
    normal = request_head(
        "POST",
        INFER_PATH,
        _host(ctx),
        length=len(v2_infer_body()),
        headers={"Content-Type": "application/json"},
    )
    sent = [asyncio.Event() for _ in range(3)]
    big = [
        asyncio.create_task(
            exchange(ctx.host, ctx.port, _chain(head, _until(json_body(size), done)), timeout_s=60)
        )
        for done in sent
    ]
    for task, done in zip(big, sent, strict=True):  # answered early: through as well
        task.add_done_callback(lambda _, done=done: done.set())
    # The burst starts once the bodies are through, while the server works on them.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in sent)), 30.0)
    await ctx.hold_window()
    ctx.window_end = time.monotonic()
    burst_results = await asyncio.gather(
        *(
            exchange(ctx.host, ctx.port, [normal, v2_infer_body()], timeout_s=NORMAL_WAIT_S)
            for _ in range(burst)
        )
    )
    big_results = await asyncio.gather(*big)
    _record(ctx, big_results)
    burst_statuses, burst_unanswered = count_outcomes(burst_results)
    ctx.result.details.update(
        body_bytes=size,
        burst=burst,
        burst_statuses=burst_statuses,
        burst_unanswered=burst_unanswered,
        burst_p99_ms=_p99_ms([e.answer_s for e in burst_results]),
        big_answer_s=[e.answer_s for e in big_results],
    )
    ctx.result.checks += [
        Check(
            f"normal requests unanswered after {NORMAL_WAIT_S:g} s (of {burst})",
            burst_unanswered,
            "==",
            0,
        ),
        Check("big bodies answered 413", ctx.result.statuses.get("413", 0), "==", 3),
    ]


def _until(chunks: Iterator[bytes], done: asyncio.Event) -> Iterator[bytes]:
    """`chunks`, then `done` is set (once the writer has taken the last one)."""
    yield from chunks
    done.set()


def _chain(*parts: bytes | Iterable[bytes]) -> Iterator[bytes]:
    """One iterator of chunks from byte strings and iterators of them."""
    return itertools.chain.from_iterable([p] if isinstance(p, bytes) else p for p in parts)


async def stalled_uploads_attack(ctx: Context) -> None:
    """Connections each announcing a body one byte longer than they send:
    all but the last byte arrives, then nothing. Held for `hold_s` after
    the last one is through; the server may close them (or answer)."""
    count, size, hold_s = (5, 20 * MB, 8.0) if ctx.quick else (20, BIG_BODY, 30.0)
    head = request_head(
        "POST",
        INFER_PATH,
        _host(ctx),
        length=size + 1,
        headers={"Content-Type": "application/json"},
    )
    # Each connection waits for its answer until everything has been sent and held.
    upload_s = 20.0 if ctx.quick else 60.0
    exchanges = await asyncio.gather(
        *(
            exchange(
                ctx.host,
                ctx.port,
                _chain(head, json_body(size)),
                timeout_s=upload_s + hold_s,
                after_sent_s=hold_s,
            )
            for _ in range(count)
        )
    )
    _record(ctx, exchanges)
    closed = [e for e in exchanges if e.status is not None or e.closed_s is not None]
    ctx.result.details.update(
        body_bytes=size + 1,
        sent_bytes=[e.sent_bytes for e in exchanges],
        closed_after_s=[
            round(e.answer_s if e.answer_s is not None else e.closed_s, 2)
            for e in exchanges
            if e.answer_s is not None or e.closed_s is not None
        ],
    )
    ctx.result.checks += [
        Check("connections closed or answered by the server", len(closed), "==", count),
    ]


def _p99_ms(answer_s: list[float | None]) -> float | None:
    p99 = percentile([s * 1000 for s in answer_s if s is not None], 99)
    return None if p99 is None else round(p99, 1)


async def header_flood_attack(ctx: Context) -> None:
    """One connection sending header lines without end (1 GB; 100 MB quick)
    until the server answers or closes it."""
    total = 100 * MB if ctx.quick else 1000 * MB
    started = time.monotonic()
    flood = header_flood("/v2/health/live", _host(ctx), total)
    result = await exchange(ctx.host, ctx.port, flood, timeout_s=180.0, after_sent_s=5.0)
    _record(ctx, [result])
    ctx.result.details.update(
        flood_bytes=total,
        sent_mb_before_stop=round(result.sent_bytes / MB, 1),
        stopped_after_s=result.answer_s if result.answer_s is not None else result.closed_s,
        wall_s=round(time.monotonic() - started, 1),
    )
    ctx.result.checks += [
        Check(
            "MB sent before the server answered or closed",
            result.sent_bytes / MB if (result.status or result.closed_s) else None,
            "<",
            total / MB,
            "MB",
            note="never stopped",
        ),
    ]
