"""Request and response bodies: reading under the limit, parsing, JSON rendering.

Limits (each answered with a 4xx JSON error before anything is allocated for
the tensors):

- the body size: each model's own limit, derived from its inputs' shapes and
  datatypes plus 64 KiB of JSON around the data, and never more than
  `max_body_bytes` (default 64 MiB, env `MAX_BODY_BYTES` where the server
  reads its settings), which is also the limit of a model with a variable
  dimension (the formula: app.api.limits); JSON text (a JSON body, a binary
  request's JSON header) at most `max_json_bytes`. A `Content-Length` over the
  limit is a 413 before a byte of the body is read; a body without one (or
  lying) is counted as it streams and stops being read at the first chunk
  past the limit (413);
- a gzip/deflate body is decoded chunk by chunk as it arrives, the decoder
  never given room for more than the limit + 1 decoded bytes: the decoded
  size has the same limit (413 as soon as it is passed, so a bomb is never
  decoded whole) and the compressed body is never held whole before decoding.
  An unsupported Content-Encoding is a 415 before the body is read;
- up to max_batch_size items per request (the batch dimension), tensor
  shapes fixed by the model config but for its variable dimensions, each at
  most its bound (max_shape), BYTES elements at most max_bytes, numbers
  within their datatype's range (app.api.tensors), and a per-request SLO of
  at most `MAX_SLO_MS` (1 hour).

A JSON body over `PARSE_IN_THREAD_BYTES` (64 KiB) is parsed in a worker thread
(`parse_body`), a smaller one inline, where the parse costs less than the
thread hop. The thread alone does not bound how long one request holds the
event loop: pydantic-core keeps the GIL for the whole parse (measured: a
21 MB body, 70 ms of parsing, stalled the loop 77 ms from a thread), about
3 ms per MB of JSON. The limits bound it: every bundled model's limit is
at most 256 KiB, under 1 ms of parsing, and any request's JSON text is held
to `max_json_bytes` (MAX_JSON_BYTES, 2 MiB: ~6 ms; app.api.limits), so a
model with a variable dimension takes larger tensors as binary data only.

Nothing from the network is unpickled or evaluated: JSON is parsed by
pydantic/json, and binary tensor data is read with `numpy.frombuffer` as one
of the numeric datatypes of the model config; a BYTES tensor's elements are
sliced out as `bytes` by their length prefixes (an object array of bytes,
never unpickled).

Request bodies are read and validated by the handlers (not by FastAPI's body
parameters) so that binary bodies, gzip/deflate request compression and
clients that send no `Content-Type` (curl -d) all work; the OpenAPI document
still describes them (app.api.openapi).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from app.api.errors import (
    MalformedRequest,
    PayloadTooLarge,
    RequestSchemaError,
    UnsupportedEncoding,
    format_validation_errors,
)
from app.api.limits import BodyLimit
from app.server.service import InferResult

try:  # fast JSON for tensor data (30x faster than json.dumps on float arrays)
    import orjson as _orjson
except ImportError:  # pragma: no cover - optional
    _orjson = None

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024  # Triton's default --http-max-input-size
MAX_BODY_BYTES_ENV = "MAX_BODY_BYTES"  # where the server's settings read max_body_bytes
PARSE_IN_THREAD_BYTES = 64 * 1024  # JSON parsed in a worker thread above this (parse_body)

M = TypeVar("M", bound=BaseModel)


def is_uint(text: str) -> bool:
    """`text` is a non-negative decimal integer (surrounding whitespace allowed)."""
    text = text.strip()
    return text.isascii() and text.isdigit()


def content_encoding(request: Request) -> str:
    """The body's Content-Encoding: "" (none), "gzip" or "deflate"; any other is a 415,
    answered before a byte of the body is read."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return ""
    if encoding in ("gzip", "x-gzip"):
        return "gzip"
    if encoding == "deflate":
        return "deflate"
    raise UnsupportedEncoding(
        f"Content-Encoding {encoding!r} is not supported (use gzip, deflate or none)"
    )


class _Inflater:
    """A gzip/deflate body decoded chunk by chunk as it arrives, never past
    `limit` + 1 decoded bytes: the decoder is given at most the room left
    under the limit plus one byte, so a bomb stops at the first byte over it
    (413). A gzip body may have several members (RFC 1952); a deflate (zlib)
    stream is one."""

    def __init__(self, encoding: str, limit: BodyLimit) -> None:
        self.encoding = encoding
        self.limit = limit
        self.decoded = 0  # bytes produced so far
        self._decoder = self._new_decoder()

    @staticmethod
    def _new_decoder() -> Any:
        return zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip header, auto-detected

    def feed(self, data: bytes, out: list[bytes]) -> None:
        """Decode `data`, appending what it gives to `out`."""
        while data:
            room = self.limit.bytes - self.decoded + 1
            try:
                piece = self._decoder.decompress(data, room)
            except zlib.error as e:
                raise MalformedRequest(f"body is not valid {self.encoding} data: {e}") from None
            self.decoded += len(piece)
            if self.decoded > self.limit.bytes:
                raise PayloadTooLarge(self.limit.exceeded("decompressed request body"))
            out.append(piece)
            if not self._decoder.eof:
                data = self._decoder.unconsumed_tail
            elif self._decoder.unused_data:
                if self.encoding != "gzip":
                    raise MalformedRequest("data after the end of the deflate stream")
                data = self._decoder.unused_data  # the next gzip member
                self._decoder = self._new_decoder()
            else:
                data = b""

    def finish(self) -> None:
        if not self._decoder.eof:
            raise MalformedRequest(f"{self.encoding} body is truncated")


async def read_body(request: Request, limit: BodyLimit) -> bytes:
    """The raw body, at most `limit.bytes` bytes as sent and after gzip/deflate
    decoding: a Content-Length over the limit is answered (413) before the body
    is read, and a body that passes it while streaming stops being read there."""
    encoding = content_encoding(request)
    length = request.headers.get("content-length")
    if length is not None and is_uint(length) and int(length) > limit.bytes:
        raise PayloadTooLarge(limit.exceeded(f"request body of {int(length)} bytes"))
    inflater = _Inflater(encoding, limit) if encoding else None
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit.bytes:
                raise PayloadTooLarge(limit.exceeded("request body"))
            if inflater is None:
                chunks.append(chunk)
            else:
                inflater.feed(chunk, chunks)
    except ClientDisconnect:
        raise MalformedRequest("client disconnected before sending the whole body") from None
    if inflater is not None:
        inflater.finish()
    return b"".join(chunks)


async def parse_body(model: type[M], data: bytes, what: str = "request body") -> M:
    """`parse_model`, in a worker thread for a body over `PARSE_IN_THREAD_BYTES`
    (a smaller one is parsed inline: the thread hop costs more than its parse)."""
    if len(data) > PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(parse_model, model, data, what)
    return parse_model(model, data, what)


def parse_model(model: type[M], data: bytes, what: str = "request body") -> M:
    """Parse and validate a JSON body (NaN/Infinity literals allowed) in one pass."""
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        bad_json = next((err for err in errors if err["type"] == "json_invalid"), None)
        if bad_json is not None:
            detail = str(bad_json.get("ctx", {}).get("error", bad_json["msg"]))
            raise MalformedRequest(f"{what} is not valid JSON: {detail}") from None
        try:  # only to name v2 tensors in the message
            raw = json.loads(data)
        except (ValueError, RecursionError):
            raw = None
        raise RequestSchemaError(format_validation_errors(errors, raw)) from None


# ------------------------------------------------------------------ responses


def _np_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def dumps_json(content: Any, arrays: Sequence[np.ndarray] = ()) -> bytes:
    """Compact JSON of `content`, whose tensor data are numpy arrays (`arrays`).

    orjson when available and every float is finite; else the json module,
    which writes NaN/Infinity literals (as Triton does; Python's json and
    tritonclient read them) instead of failing or writing null.
    """
    if _orjson is not None and all(
        a.dtype.kind != "f" or bool(np.isfinite(a).all()) for a in arrays
    ):
        try:
            return _orjson.dumps(content, default=_np_default, option=_orjson.OPT_SERIALIZE_NUMPY)
        except TypeError:
            pass
    return json.dumps(content, default=_np_default, allow_nan=True, separators=(",", ":")).encode()


class TensorJSONResponse(JSONResponse):
    """A JSON response whose content holds numpy arrays (`arrays`), rendered by dumps_json."""

    def __init__(self, content: Any, arrays: Sequence[np.ndarray] = (), **kw: Any) -> None:
        self._arrays = arrays
        super().__init__(content, **kw)

    def render(self, content: Any) -> bytes:
        return dumps_json(content, self._arrays)


def result_output(result: InferResult, name: str) -> np.ndarray:
    """The output `name` of an inference result (a model that returned none is a bug: 500)."""
    try:
        return np.asarray(result.outputs[name])
    except KeyError:
        raise RuntimeError(
            f"model '{result.model}' returned no output '{name}' "
            f"(returned: {', '.join(result.outputs)})"
        ) from None
