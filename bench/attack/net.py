"""The attacks' HTTP: raw asyncio connections for what a normal client would
never send, and httpx for the normal client that runs beside them.

`exchange` writes a request from an iterator of chunks (so a 60 MB body is
never in memory), reads the answer at the same time (a server may answer 413
and close before the body is through), and stops at whichever comes first:
an answer, the server closing the connection, or its deadline. It never
raises for what the server does; the `Exchange` says what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import httpx

from bench.attack.payloads import v2_infer_body
from bench.attack.report import ClientStats, percentile

_HEAD_LIMIT = 65536  # bytes of response head read before giving up on it


@dataclass
class Exchange:
    """One raw request: the HTTP status of its answer (None: none came),
    seconds from the first byte written to the status line (`answer_s`) or to
    the server closing the connection without an answer (`closed_s`), bytes
    written, and the error that ended the writing (e.g. a reset), if any."""

    status: int | None = None
    answer_s: float | None = None
    closed_s: float | None = None
    sent_bytes: int = 0
    refused: bool = False
    error: str = ""

    @property
    def outcome(self) -> str:
        """The key it is counted under: the status, `closed`, `refused` or
        `unanswered`."""
        if self.status is not None:
            return str(self.status)
        if self.refused:
            return "refused"
        return "closed" if self.closed_s is not None else "unanswered"


Chunks = Iterable[bytes] | AsyncIterator[bytes]


async def _write_all(writer: asyncio.StreamWriter, chunks: Chunks, result: Exchange) -> None:
    try:
        if isinstance(chunks, AsyncIterator):
            async for chunk in chunks:
                writer.write(chunk)
                await writer.drain()
                result.sent_bytes += len(chunk)
        else:
            for chunk in chunks:
                writer.write(chunk)
                await writer.drain()
                result.sent_bytes += len(chunk)
    except (ConnectionError, OSError) as exc:
        result.error = type(exc).__name__


async def _read_status(reader: asyncio.StreamReader, started: float, result: Exchange) -> None:
    head = b""
    try:
        while b"\r\n" not in head:
            data = await reader.read(4096)
            if not data:
                result.closed_s = time.monotonic() - started
                return
            head += data
            if len(head) > _HEAD_LIMIT:
                result.error = "response head too long"
                return
    except (ConnectionError, OSError):
        result.closed_s = time.monotonic() - started
        return
    parts = head.split(b"\r\n", 1)[0].split(b" ", 2)
    if len(parts) >= 2 and parts[1].isdigit():
        result.status = int(parts[1])
        result.answer_s = time.monotonic() - started
    else:
        result.error = f"bad status line {head[:60]!r}"


async def exchange(
    host: str,
    port: int,
    chunks: Chunks,
    *,
    timeout_s: float,
    after_sent_s: float | None = None,
) -> Exchange:
    """Send `chunks` on a new connection and wait, at most `timeout_s` in
    all and at most `after_sent_s` once everything is written, for an
    answer or the server's close. Writing stops with it; times are from the
    connection's opening."""
    result = Exchange()
    deadline = time.monotonic() + timeout_s
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        result.refused = True
        result.error = type(exc).__name__
        return result
    started = time.monotonic()
    writing = asyncio.create_task(_write_all(writer, chunks, result))
    reading = asyncio.create_task(_read_status(reader, started, result))
    try:
        done, _ = await asyncio.wait(
            {writing, reading},
            timeout=deadline - time.monotonic(),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if reading not in done and writing in done and after_sent_s is not None:
            deadline = min(deadline, time.monotonic() + after_sent_s)
        remaining = max(0.0, deadline - time.monotonic())
        await asyncio.wait({reading}, timeout=remaining)
    finally:
        for task in (writing, reading):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        writer.transport.abort()
    return result


def count_outcomes(exchanges: Iterable[Exchange]) -> tuple[dict[str, int], int]:
    """Answers per outcome (every one but `unanswered`), and how many are unanswered."""
    counts = Counter(e.outcome for e in exchanges)
    unanswered = counts.pop("unanswered", 0)
    return dict(counts), unanswered


@dataclass
class NormalAnswer:
    sent: float  # monotonic
    status: str  # HTTP status, "unanswered" (timed out), "refused" (no connection), "error"
    latency_s: float  # inf when unanswered


class NormalClient:
    """A steady, open-loop client of the attacks' small model: `rate_rps`
    v2 requests a second, each on a new connection (so it also measures
    whether the server still accepts one), each given `timeout_s`."""

    def __init__(self, url: str, model: str, rate_rps: float, timeout_s: float = 5.0) -> None:
        if rate_rps <= 0:
            raise ValueError(f"normal client rate must be > 0 requests/s, not {rate_rps}")
        self.url = f"{url}/v2/models/{model}/infer"
        self.rate_rps = rate_rps
        self.timeout_s = timeout_s
        self.answers: list[NormalAnswer] = []
        self._body = v2_infer_body()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _one(self, client: httpx.AsyncClient) -> None:
        sent = time.monotonic()
        try:
            reply = await client.post(
                self.url, content=self._body, headers={"Content-Type": "application/json"}
            )
            status = str(reply.status_code)
            latency = time.monotonic() - sent
        except httpx.TimeoutException:
            status, latency = "unanswered", float("inf")
        except httpx.ConnectError:
            status, latency = "refused", float("inf")
        except httpx.HTTPError:
            status, latency = "error", float("inf")
        self.answers.append(NormalAnswer(sent, status, latency))

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            tasks: set[asyncio.Task[None]] = set()
            start = time.monotonic()
            n = 0
            while not self._stop.is_set():
                delay = start + n / self.rate_rps - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                    continue
                task = asyncio.create_task(self._one(client))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
            if tasks:
                await asyncio.wait(tasks, timeout=self.timeout_s + 1)

    async def stop(self) -> ClientStats:
        """Stop sending, wait for what is in flight (at most its timeout)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.stats()

    def stats(self, since: float = 0.0, until: float = float("inf")) -> ClientStats:
        """Over the requests sent from `since` to `until` (monotonic)."""
        chosen = [a for a in self.answers if since <= a.sent <= until]
        p99 = percentile((a.latency_s for a in chosen), 99)
        return ClientStats(
            sent=len(chosen),
            statuses=dict(Counter(a.status for a in chosen)),
            p99_ms=None if p99 is None else p99 * 1000,
        )


async def hold_open(
    host: str, port: int, started: float, connected: list[float] | None = None
) -> tuple[float | None, str]:
    """Open a connection, send nothing; (seconds from `started` until the
    server closed it, or None while it stays open) — cancel to give up. The
    second item is "refused" if it could not connect. When the connection is
    up, its time (from `started`) is appended to `connected`."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as exc:
        return None, f"refused ({type(exc).__name__})"
    if connected is not None:
        connected.append(time.monotonic() - started)
    try:
        with contextlib.suppress(ConnectionError, OSError):
            await reader.read(1)
        return time.monotonic() - started, ""
    finally:
        writer.transport.abort()
