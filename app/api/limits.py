"""How large a request body may be: a limit per model, derived from its inputs.

One limit for every model would let a request for a model whose input is 64
bytes carry 64 MiB, all of it read, decompressed and parsed as JSON before
the server finds out that the tensors do not fit. So each model's limit is
what its largest well-formed request can take, generously counted:

    limit = min(max_body_bytes,
                HEADER_ALLOWANCE + max_batch_size × Σ_inputs item elements × per-element bytes)

- item elements: the elements of one item of the input (its shape without
  the batch dimension); a request carries up to max_batch_size items;

- per-element bytes: the longest JSON text of one number of the input's
  datatype (24 for FP16/FP32/FP64, which clients write as the shortest
  float64 text, e.g. `-2.2250738585072014e-308`; 20 for INT64 and UINT64,
  11 for INT32, ...; 5 for BOOL's `false`) plus `ELEMENT_SLACK` bytes for
  the separator and the brackets and indentation of nested, lightly
  pretty-printed lists. It is never less than the element's binary size, so
  the same bound covers binary tensor data (exactly elements × itemsize
  bytes) and any mix of binary and JSON inputs;
- a BYTES element: its longest JSON string, `max_bytes` bytes each
  written as a 6-byte \\u escape (`\\u00XX`) at worst, plus the quotes and
  `ELEMENT_SLACK` — never less than its binary form, 4 + max_bytes;
- `HEADER_ALLOWANCE` (64 KiB): the JSON around the data — tensor names,
  shapes, datatypes, parameters, the request id, requested outputs;
- an input with a variable dimension (-1 beyond the batch one) counts at
  its bound (`max_shape`); one without a bound (a config read before
  bounds were required), or an `elastic` one (a Triton config's, which
  takes items beyond its bounds), falls back to `max_body_bytes`
  (MAX_BODY_BYTES), which is also the ceiling of every model's limit.

The limit applies to the body as sent and, for a gzip/deflate body, to its
decoded size as well (app.api.bodies). The v2 routes know the model from the
path before reading the body; the native `/infer` names it inside the body,
so its body is read under the largest limit of the served models and then
held to its own model's limit (`RequestLimits.any_model`).

A model's limit is computed once per model config (`RequestLimits`). The
body of `POST /v2/repository/index`, which carries no tensors, is limited to
`HEADER_ALLOWANCE`.

JSON text has a limit of its own, `max_json_bytes` (MAX_JSON_BYTES, default
2 MiB), whatever the model: the whole body of a JSON request, the JSON
header (`Inference-Header-Content-Length`) of a binary-tensor one. Parsing
holds the event loop, and with it every other client, for its whole length:
pydantic-core keeps the GIL, so a worker thread does not help (measured on
a 2-core EPYC: 2.2–2.7 ms per MB to parse a v2 request of FP32 data, a third
more to turn it into tensors — 2 MiB is ~6 ms). Tensors larger than that go
as binary tensor data, read with `numpy.frombuffer` at memory speed; the 413
says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.errors import ServingError
from app.repository.config import ModelConfig, TensorSpec
from app.server.service import InferenceService

HEADER_ALLOWANCE = 64 * 1024
DEFAULT_MAX_JSON_BYTES = 2 * 1024 * 1024  # ~6 ms of parsing (module docstring)
ELEMENT_SLACK = 24

# The longest JSON text of one value of each datatype (floats: the shortest
# float64 text that round-trips, as json.dumps and orjson write it).
_NUMBER_TEXT = {
    "BOOL": len("false"),
    "UINT8": len("255"),
    "UINT16": len("65535"),
    "UINT32": len("4294967295"),
    "UINT64": len("18446744073709551615"),
    "INT8": len("-128"),
    "INT16": len("-32768"),
    "INT32": len("-2147483648"),
    "INT64": len("-9223372036854775808"),
    "FP16": len("-2.2250738585072014e-308"),
    "FP32": len("-2.2250738585072014e-308"),
    "FP64": len("-2.2250738585072014e-308"),
}


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a request body may have (as sent, and decoded), and
    where that number comes from, for the 413 message."""

    bytes: int
    source: str  # e.g. "the limit for model 'mlp', from its input shapes"

    def exceeded(self, what: str) -> str:
        """The 413 message: `what` (e.g. "request body of 80000 bytes") exceeds it."""
        return f"{what} exceeds {self.bytes} bytes ({self.source})"


def element_bytes(spec: TensorSpec) -> int:
    """The most bytes one element of `spec` takes in a request body (JSON or binary)."""
    if spec.datatype == "BYTES":
        longest = int(spec.max_bytes or 0)
        return max(6 * longest + 2 + ELEMENT_SLACK, 4 + longest)
    return max(_NUMBER_TEXT[spec.datatype] + ELEMENT_SLACK, spec.dtype.itemsize)


def tensor_bytes(spec: TensorSpec) -> int | None:
    """The most bytes one item of a tensor of `spec` takes (batch dimension
    1), variable dimensions at their bound; None when one has no bound, or
    the tensor is elastic (its bounds size shared memory only)."""
    if spec.elastic or any(d < 0 for d in spec.slot_shape):
        return None
    return math.prod(spec.slot_shape) * element_bytes(spec)


def model_body_limit(config: ModelConfig, max_body_bytes: int) -> int:
    """The module docstring's formula for one model."""
    total = 0
    for spec in config.inputs:
        size = tensor_bytes(spec)
        if size is None:
            return max_body_bytes
        total += size
    return min(HEADER_ALLOWANCE + config.max_batch_size * total, max_body_bytes)


class RequestLimits:
    """Each model's body limit, computed once per model config (a config that
    is replaced, e.g. a reloaded model, gets its limit computed anew)."""

    def __init__(self, max_body_bytes: int, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
        self.max_body_bytes = max_body_bytes
        self.server = BodyLimit(max_body_bytes, "MAX_BODY_BYTES")
        self.json = BodyLimit(
            max_json_bytes,
            "MAX_JSON_BYTES, the limit of a request's JSON text: "
            "send large tensors as binary tensor data",
        )
        # a repository index request is at most `{"ready": true}`: no tensors
        self.index = BodyLimit(
            min(HEADER_ALLOWANCE, max_body_bytes), "the limit of a repository index request"
        )
        self._by_model: dict[tuple[str, str], tuple[ModelConfig, BodyLimit]] = {}
        self._any_model: tuple[InferenceService, tuple[str, ...], BodyLimit] | None = None

    def for_model(self, config: ModelConfig) -> BodyLimit:
        key = (config.name, config.version)
        cached = self._by_model.get(key)
        if cached is not None and cached[0] is config:
            return cached[1]
        size = model_body_limit(config, self.max_body_bytes)
        if size == self.max_body_bytes:
            limit = self.server
        else:
            limit = BodyLimit(
                size, f"the limit for model '{config.model_name}', from its input shapes"
            )
        self._by_model[key] = (config, limit)
        return limit

    def any_model(self, service: InferenceService) -> BodyLimit:
        """The largest limit among the service's models: the native `/infer`
        reads its body under it, before the body says which model it is for.
        Computed again only when the service or its list of models changes."""
        names = tuple(service.model_names())
        cached = self._any_model
        if cached is not None and cached[0] is service and cached[1] == names:
            return cached[2]
        best = 0
        for name in names:
            try:
                best = max(best, self.for_model(service.model_config(name)).bytes)
            except ServingError:  # gone or unavailable meanwhile: it cannot be served now
                continue
        if best == 0 or best >= self.max_body_bytes:  # no model known: the server's cap
            limit = self.server
        else:
            limit = BodyLimit(best, "the largest of the models' limits, from their input shapes")
        self._any_model = (service, names, limit)
        return limit

    def as_json(self, limit: BodyLimit) -> BodyLimit:
        """`limit` for a body that is all JSON text: at most `max_json_bytes`."""
        return self.json if self.json.bytes < limit.bytes else limit
