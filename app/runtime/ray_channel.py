"""The batch channel to a Ray actor on the daemon's node: a Unix socket
carrying the local executor's small messages, the tensors staying in the
shared-memory arena.

A Ray call costs about a millisecond (the call's task spec, the core
worker's queues, the reply through the object store); a local executor's
`Run` on its pipe costs less than a tenth of that. An actor on the daemon's
node reads and writes the daemon's arena already, so only the control
message has to travel: the pool listens on a socket in a private directory
(mode 0700), asks the actor to connect (`open_channel`, a Ray call in its
control group), and from then on sends each batch as a pickled `Run` on
the socket; a thread of the actor reads it, runs the batch with the same
`Executor` the Ray calls use (one at a time with them, under the actor's
lock) and writes the `Ran` or `Cancelled` back. The pool reads replies on
its event loop (`loop.add_reader`), as it reads a local executor's pipe.

Ordering. Calls that must come after the batches sent before them (`stop`,
`unload`) carry how many batches the pool has sent on the channel; the
actor waits until its thread has handled that many (`ChannelCount`).

Faults. The socket closes when the actor's process dies: the pool hears
of it at once (before Ray's notice), and takes the actor down as a dead one
(app.runtime.ray_faults). Each life of the actor has its own channel.

`ChannelPing` / `ChannelPong` measure the channel's round trip at start:
the core's d_ctrl for that actor.

Actors on other nodes keep Ray's calls and object store (their tensors must
travel anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger("app.runtime.ray_pool")

PING_REPEATS = 12  # round trips measured at start (the first two dropped)


@dataclass(frozen=True, slots=True)
class ChannelPing:
    seq: int


@dataclass(frozen=True, slots=True)
class ChannelPong:
    seq: int
    at: float  # the actor's monotonic clock


# ---------------------------------------------------------------- pool side
class ChannelDirectory:
    """A private directory for the pool's listening sockets."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="ds-ray-")
        os.chmod(self.path, 0o700)
        self._names = itertools.count()

    def socket_path(self) -> str:
        return os.path.join(self.path, f"{next(self._names)}.sock")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class Channel:
    """The daemon's end of one actor life's channel: `send` a message;
    `on_reply(msg)` is called on the loop for each reply, `on_closed()`
    once when the socket closes."""

    def __init__(
        self,
        conn: Connection,
        loop: asyncio.AbstractEventLoop,
        on_reply: Callable[[Any], None],
        on_closed: Callable[[], None],
    ) -> None:
        self.conn = conn
        self.loop = loop
        self.on_reply = on_reply
        self.on_closed = on_closed
        self.sent = 0  # Run messages sent (the ordering count)
        self.closed = False
        self._pongs: dict[int, asyncio.Future] = {}
        self._seq = itertools.count()
        self._fd = conn.fileno()
        loop.add_reader(self._fd, self._readable)

    def send(self, msg: Any) -> None:
        """Send a message (raises OSError when the actor is gone)."""
        if self.closed:
            raise BrokenPipeError("the channel is closed")
        self.conn.send(msg)

    def run(self, msg: Any) -> None:
        self.send(msg)
        self.sent += 1

    async def round_trip(self, timeout: float) -> float:
        """The median round trip of an empty message (s)."""
        return statistics.median((await self.round_trips(PING_REPEATS, timeout))[2:])

    async def round_trips(self, count: int, timeout: float) -> list[float]:
        """`count` round trips of an empty message, one after another (s)."""
        times = []
        for _ in range(count):
            seq = next(self._seq)
            pong = self.loop.create_future()
            self._pongs[seq] = pong
            t0 = time.perf_counter()
            self.send(ChannelPing(seq))
            await asyncio.wait_for(pong, timeout)
            times.append(time.perf_counter() - t0)
        return times

    def _readable(self) -> None:
        try:
            while self.conn.poll():
                msg = self.conn.recv()
                if isinstance(msg, ChannelPong):
                    pong = self._pongs.pop(msg.seq, None)
                    if pong is not None and not pong.done():
                        pong.set_result(msg.at)
                else:
                    self.on_reply(msg)
        except (EOFError, OSError):
            self.close()

    def close(self) -> None:
        """Stop reading and close the socket; `on_closed` once."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            self.loop.remove_reader(self._fd)
        with contextlib.suppress(OSError):
            self.conn.close()
        for pong in self._pongs.values():
            if not pong.done():
                pong.set_exception(EOFError("the channel closed"))
        self._pongs.clear()
        self.on_closed()


async def connect(handle: Any, path: str, timeout: float) -> Connection:
    """Listen at `path`, have the actor connect (its `open_channel`), and
    return the daemon's end."""
    loop = asyncio.get_running_loop()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(1)
        listener.setblocking(False)
        opened = handle.open_channel.remote(path)
        accepted, _ = await asyncio.wait_for(loop.sock_accept(listener), timeout)
        await asyncio.wait_for(opened, timeout)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
    accepted.setblocking(True)
    return Connection(accepted.detach())


# --------------------------------------------------------------- actor side
class ChannelCount:
    """How many Run messages the actor's channel thread has handled; calls
    that come after them wait for a count."""

    def __init__(self) -> None:
        self.done = 0
        self._changed = threading.Condition()

    def bump(self) -> None:
        with self._changed:
            self.done += 1
            self._changed.notify_all()

    def reset(self) -> None:
        with self._changed:
            self.done = 0
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.done >= count, timeout)


def dial(path: str) -> Connection:
    """The actor's end: connect to the pool's socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return Connection(sock.detach())


def serve(conn: Connection, handle_run: Callable[[Any], Any], count: ChannelCount) -> None:
    """The actor's channel thread: each message in, its reply out, until the
    daemon's end closes."""
    from app.runtime.messages import Run

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if isinstance(msg, ChannelPing):
            reply: Any = ChannelPong(msg.seq, time.monotonic())
        elif isinstance(msg, Run):
            try:
                reply = handle_run(msg)
            finally:
                count.bump()
        else:
            log.error("unknown message %r on the batch channel", type(msg).__name__)
            continue
        try:
            conn.send(reply)
        except OSError:
            break
    with contextlib.suppress(OSError):
        conn.close()
