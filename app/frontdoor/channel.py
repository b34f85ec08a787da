"""The ZeroMQ sockets between API workers and the scheduler process.

The scheduler binds one ROUTER on an `ipc://` path in a private directory;
each worker connects a DEALER whose identity is its number (`w0`, `w1`, …),
so that a worker started again in a killed one's place gets its
predecessor's answers (ROUTER_HANDOVER: the new connection takes the
identity over). Neither side limits its queues (HWM 0): the arena's slots
bound what is in flight, and a dropped descriptor would be a request never
answered. Nothing lingers at close: the other side is gone or going.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

import zmq
import zmq.asyncio


def new_address() -> str:
    """A fresh `ipc://` address in a directory only this user can enter."""
    folder = tempfile.mkdtemp(prefix="dsrv-front-")
    os.chmod(folder, 0o700)
    return f"ipc://{folder}/scheduler.sock"


def remove_address(address: str) -> None:
    """Remove the socket file and its directory (the scheduler, at exit)."""
    path = address.removeprefix("ipc://")
    for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        with contextlib.suppress(OSError):
            remove(target)


def _unlimited(socket: zmq.asyncio.Socket) -> zmq.asyncio.Socket:
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.setsockopt(zmq.LINGER, 0)
    return socket


def scheduler_socket(context: zmq.asyncio.Context, address: str) -> zmq.asyncio.Socket:
    socket = _unlimited(context.socket(zmq.ROUTER))
    socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
    socket.bind(address)
    return socket


def worker_identity(worker: int) -> bytes:
    return f"w{worker}".encode()


def worker_number(identity: bytes) -> int:
    return int(identity[1:])


def worker_socket(context: zmq.asyncio.Context, address: str, worker: int) -> zmq.asyncio.Socket:
    socket = _unlimited(context.socket(zmq.DEALER))
    socket.setsockopt(zmq.IDENTITY, worker_identity(worker))
    socket.connect(address)
    return socket


def waiting(socket: zmq.asyncio.Socket) -> Iterator[list[bytes]]:
    """The messages already queued on `socket`, without waiting: read after
    each awaited one, so that a burst costs one wake-up of the loop."""
    while True:
        try:
            yield socket.recv_multipart(flags=zmq.NOBLOCK).result()
        except zmq.Again:
            return
