"""Request parameters as Triton takes them, over HTTP v2 (JSON) and gRPC.

A Triton client's request passes here unchanged. Each request parameter is
checked the way Triton's own front ends check it (the same types, the same
error texts: triton-inference-server/server, src/http_server.cc and
src/grpc/infer_handler.cc), then:

- `slo_ms` (ours, a number) and `app_id` (ours, a string) act as before;
- `timeout` (µs, Triton's per-request timeout) becomes the request's
  deadline when it is tighter than the SLO the request has otherwise
  (`request_slo`); 0 is "no timeout", as in Triton;
- `priority` is accepted (a non-negative integer, as Triton checks it) and
  has no effect: no policy here has priority levels, every request is
  ordered by its deadline — a tighter `timeout` or `slo_ms` is how a
  request goes first;
- `sequence_id`, `sequence_start`, `sequence_end` (no model here is a
  sequence model),
  `triton_enable_empty_final_response` (gRPC: Triton's C++ client and
  perf_analyzer set it on every request; it concerns only decoupled
  streams), `headers` and any custom parameter (a string, integer, boolean
  or number, as Triton passes them to its backends) are accepted and
  have no effect.

A parameter accepted without effect is counted in the
`ignored_parameters_total{name}` metric (app/server/metrics.py: at most
`MAX_PARAMETER_NAMES` names, the rest as `other`) and logged once per name.
Input and output parameters are treated alike: `binary_data_size` (the
KServe SDK sets it on gRPC inputs as well) and `binary_data` are known, the
shared-memory and classification ones are refused as before (the
extensions are not supported), any other is accepted, counted and logged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.api.app_id import check_app_id
from app.api.security import short_repr
from app.api.tensors import resolve_slo
from app.errors import InvalidInput
from app.repository.config import ModelConfig
from app.server.metrics import Metrics

log = logging.getLogger(__name__)

# Triton's own request parameters (src/common.h: kReservedParameterKeys and
# TRITON_RESERVED_REQUEST_PARAMS).
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
TRITON_RESERVED = ("triton_enable_empty_final_response",)
# Parameters of inputs and outputs that only the shared-memory and
# classification extensions use (refused: not supported here).
SHARED_MEMORY_PARAMETERS = (
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
)


@dataclass(frozen=True)
class RequestParameters:
    """A request's parameters, checked: what acts, and what was accepted
    without effect (`unused`, by name)."""

    slo_ms: float | None = None
    app_id: str = ""
    timeout_us: int = 0  # Triton's `timeout`; 0: none
    priority: int = 0  # Triton's `priority`; accepted, no effect
    unused: tuple[str, ...] = ()


def request_slo(config: ModelConfig, params: RequestParameters) -> float | None:
    """The request's SLO in ms (None: the model's): `slo_ms` as
    `resolve_slo` takes it, tightened to `timeout` when that is shorter."""
    slo = resolve_slo(config, params.slo_ms)
    if params.timeout_us > 0:
        timeout_ms = params.timeout_us / 1000.0
        if timeout_ms < (slo if slo is not None else config.slo_ms):
            return timeout_ms
    return slo


def note_unused(metrics: Metrics | None, names: Iterable[str], where: str = "request") -> None:
    """Count each parameter accepted without effect and log its name the
    first time (bounded: app/server/metrics.py, `parameter_ignored`)."""
    for name in names:
        if metrics is None:
            continue
        label, first = metrics.parameter_ignored(name)
        if not first:
            continue
        if label == name:
            log.info(
                "%s parameter %s is accepted and has no effect here (counted in "
                "ignored_parameters_total{name=%s}; logged once)",
                where,
                short_repr(name),
                short_repr(label),
            )
        else:
            log.info(
                "%s parameter %s is accepted and has no effect here; more parameter names "
                "than the metric labels (counted as name=%s from now on; logged once)",
                where,
                short_repr(name),
                short_repr(label),
            )


# ------------------------------------------------------------------------------- gRPC


def _kind(param: Any) -> str | None:
    return param.WhichOneof("parameter_choice")


def from_grpc(parameters: Mapping[str, Any]) -> RequestParameters:
    """A ModelInferRequest's `parameters` (name → InferParameter), checked as
    Triton's gRPC front end checks them."""
    slo_ms: float | None = None
    app_id = ""
    timeout_us = 0
    priority = 0
    unused: list[str] = []
    for name in sorted(parameters):
        param = parameters[name]
        kind = _kind(param)
        if name == "slo_ms":
            if kind not in ("double_param", "int64_param", "uint64_param"):
                raise InvalidInput(f"parameter slo_ms must be a number of milliseconds, got {kind}")
            slo_ms = float(getattr(param, kind))
        elif name == "app_id":
            if kind != "string_param":
                raise InvalidInput(f"parameter app_id must be a string (string_param), got {kind}")
            app_id = check_app_id(param.string_param)
        elif name == "sequence_id":
            if kind not in ("int64_param", "string_param"):
                raise InvalidInput(
                    "invalid value type for 'sequence_id' parameter, expected "
                    "int64_param or string_param."
                )
            unused.append(name)
        elif name in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise InvalidInput(
                    f"invalid value type for '{name}' parameter, expected bool_param."
                )
            unused.append(name)
        elif name == "priority":
            if kind == "int64_param":
                if param.int64_param < 0:
                    raise InvalidInput("invalid value for 'priority', expected value >= 0.")
                priority = int(param.int64_param)
            elif kind == "uint64_param":
                priority = int(param.uint64_param)
            else:
                raise InvalidInput(
                    "invalid value type for 'priority' parameter, expected "
                    "int64_param or uint64_param."
                )
            unused.append(name)
        elif name == "timeout":
            if kind != "int64_param":
                raise InvalidInput(
                    "invalid value type for 'timeout' parameter, expected int64_param."
                )
            # Triton takes it as unsigned; a negative value is then no limit
            timeout_us = max(int(param.int64_param), 0)
        elif name.startswith("triton_"):
            if name not in TRITON_RESERVED:
                raise InvalidInput(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    "Only the following keys starting with 'triton_' are allowed: "
                    + " ".join(TRITON_RESERVED)
                )
            if kind != "bool_param":
                raise InvalidInput(
                    f"invalid value type for '{name}' parameter, expected bool_param."
                )
            unused.append(name)
        else:
            if kind not in ("int64_param", "bool_param", "string_param", "double_param"):
                raise InvalidInput(
                    f"invalid value type for {short_repr(name)} parameter, expected "
                    "int64_param, bool_param, or string_param."
                )
            unused.append(name)
    return RequestParameters(slo_ms, app_id, timeout_us, priority, tuple(unused))


def tensor_parameters_grpc(
    where: str, parameters: Mapping[str, Any], known: tuple[str, ...]
) -> list[str]:
    """An input's or output's parameters over gRPC: the names accepted
    without effect (`known` ones act; shared memory is refused)."""
    for name in parameters:
        if name in SHARED_MEMORY_PARAMETERS:
            raise InvalidInput(f"{where}: the shared-memory extension is not supported")
    return sorted(name for name in parameters if name not in known)


# ------------------------------------------------------------------------------- HTTP


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def from_json(
    slo_ms: float | None, app_id: str | None, extra: Mapping[str, Any]
) -> RequestParameters:
    """A v2 request's `parameters`: ours (validated by the pydantic model)
    and the others (`extra`), checked as Triton's HTTP front end checks them."""
    timeout_us = 0
    priority = 0
    unused: list[str] = []
    for name in sorted(extra):
        value = extra[name]
        if name == "sequence_id":
            if not (_is_uint(value) or isinstance(value, str)):
                raise InvalidInput(
                    "Unable to parse 'sequence_id': expected an unsigned integer or a string"
                )
            unused.append(name)
        elif name in ("sequence_start", "sequence_end"):
            if not isinstance(value, bool):
                raise InvalidInput(f"Unable to parse '{name}': expected a boolean")
            unused.append(name)
        elif name in ("priority", "timeout"):
            if not _is_uint(value):
                raise InvalidInput(f"Unable to parse '{name}': expected an unsigned integer")
            if name == "priority":
                priority = int(value)
                unused.append(name)
            else:
                timeout_us = int(value)
        elif name.startswith("triton_"):
            raise InvalidInput(
                "parameter keys starting with 'triton_' are reserved for Triton usage "
                "and should not be specified."
            )
        else:
            if not isinstance(value, (str, int, float)) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise InvalidInput(
                    f"parameter {short_repr(name)} has invalid type. It should be either "
                    "'int', 'bool', or 'string'."
                )
            unused.append(name)
    return RequestParameters(
        slo_ms=slo_ms,
        app_id=check_app_id(app_id),
        timeout_us=timeout_us,
        priority=priority,
        unused=tuple(unused),
    )


def tensor_parameters_json(where: str, extra: Mapping[str, Any]) -> list[str]:
    """An input's or output's parameters beyond the model's fields: the names
    accepted without effect (shared memory is refused)."""
    for name in extra:
        if name in SHARED_MEMORY_PARAMETERS:
            raise InvalidInput(f"{where}: the shared-memory extension is not supported")
    return sorted(extra)
