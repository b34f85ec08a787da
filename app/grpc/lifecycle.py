"""Starting and stopping the gRPC endpoint in the app's lifespan.

The app's lifespan (app/main.py) starts the endpoint once the service has
started, on the running event loop — uvicorn's, so HTTP and gRPC share one
loop, one process and one service — and stops it after the service:

- `GRPC_PORT` 0: nothing is started. Without grpcio and tritonclient's
  protos (default dependencies; a broken install), `GRPC_PORT` > 0 logs an
  error saying how to install them and the server serves HTTP only;
- the port is bound on `HOST`, as HTTP's is, without SO_REUSEPORT (grpcio's
  default on Linux would let a second server share the port and take half
  its connections silently): a port that cannot be bound stops the start-up
  with an error naming `GRPC_PORT`, as a busy HTTP port does;
- the largest message the server receives is the largest of the models'
  request limits (app.api.limits, computed at start from the models then
  served); each request is then held to its own model's limit;
- connections: one idle for `KEEP_ALIVE_TIMEOUT_S` is closed (gRPC's
  `max_connection_idle`, a GOAWAY the client's channel reconnects after),
  one with calls in flight is not; calls in progress at once are capped at
  the HTTP connection cap (`MAX_CONNECTIONS`), beyond which a call is
  refused at once with RESOURCE_EXHAUSTED `overloaded`, counted and logged
  (app/grpc/admission.py; grpcio's own cap would end it without a reason).
  Calls arriving faster than the server takes them wait in grpcio's core,
  up to `PENDING_PER_CALL` × that cap, at least `PENDING_MIN` (grpcio's
  default, 1,000 to 3,000,
  cancelled the rest of a burst silently: 63 % of 10,000);
  grpcio has no cap on connections themselves or timeout on a slow
  request's head: what HTTP's guarded protocol does
  per connection (app.api.connection) is not done here;
- at shutdown the endpoint keeps accepting while the service drains, so a
  call that arrives then is answered UNAVAILABLE `shutting_down` by the
  service (LiveService.begin_shutdown), like an HTTP request; those
  accepted are answered by the drain. Only after the service has stopped
  does the server stop, giving its last answers `STOP_GRACE_S` to go out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from app.server.metrics import Metrics
from app.server.service import InferenceService
from app.server.settings import Settings

log = logging.getLogger("app.server")

EXTRA = "pip install 'deadline-serve[triton]'"
# After the service's drain every accepted call has its answer: this only
# lets the last ones be sent before the connections close.
STOP_GRACE_S = 1.0
# Calls grpcio's core may hold before the server takes them, per call the
# server takes at once (MAX_CONNECTIONS): see start_grpc_endpoint.
PENDING_PER_CALL = 16
PENDING_MIN = 16384


class GrpcEndpoint:
    """A started gRPC server (or none: `server` None), stopped by `stop`."""

    def __init__(self, server: Any = None, address: str = "") -> None:
        self.server = server
        self.address = address

    @property
    def running(self) -> bool:
        return self.server is not None

    async def stop(self) -> None:
        """Stop accepting calls; answers already being sent get STOP_GRACE_S.
        Never raises: shutdown goes on whatever happens here."""
        server, self.server = self.server, None
        if server is None:
            return
        try:
            await server.stop(STOP_GRACE_S)
            log.info("gRPC endpoint on %s stopped", self.address)
        except Exception:
            log.exception("stopping the gRPC endpoint on %s", self.address)


def grpc_address(host: str, port: int) -> str:
    """`host:port` as grpcio binds it (an IPv6 address in brackets)."""
    host = host.strip()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _server_options(
    largest_bytes: int, connections: Any, reuse_port: bool = False
) -> list[tuple[str, Any]]:
    """grpcio's channel options: message sizes, idle connections, and how
    many calls it holds before Admission sees them; SO_REUSEPORT only for
    the API workers that share the port (app/frontdoor/)."""
    options: list[tuple[str, Any]] = [
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.max_receive_message_length", largest_bytes),
        ("grpc.max_send_message_length", -1),
    ]
    if connections.keep_alive_timeout_s > 0:
        idle_ms = max(1, int(connections.keep_alive_timeout_s * 1000))
        options.append(("grpc.max_connection_idle_ms", idle_ms))
    # grpcio's core cancels calls (CANCELLED, no details) it holds unmatched
    # beyond grpc.server.max_pending_requests (1,000; at random up to the
    # hard limit, 3,000): a burst would lose them silently before Admission
    # sees them. Held up to PENDING_PER_CALL × the call limit instead (at
    # least PENDING_MIN): one waiting holds its headers, its message at most
    # what the connection's flow-control window lets in.
    pending = max(PENDING_MIN, PENDING_PER_CALL * connections.max_connections)
    options += [
        ("grpc.server.max_pending_requests", pending),
        ("grpc.server.max_pending_requests_hard_limit", pending),
    ]
    return options


async def start_grpc_endpoint(
    settings: Settings,
    get_service: Callable[[], InferenceService],
    metrics: Metrics | None = None,
    *,
    reuse_port: bool = False,
) -> GrpcEndpoint:
    """Serve `inference.GRPCInferenceService` on GRPC_PORT (see the module
    docstring); raises RuntimeError when the port cannot be bound.
    `reuse_port`: bound with SO_REUSEPORT, beside the other API workers."""
    if settings.grpc_port == 0:
        return GrpcEndpoint()
    try:
        import grpc

        from app.grpc.servicer import InferenceServicer
    except ImportError as exc:  # the optional extra
        log.error(  # a default dependency: its absence is a broken install, said loudly
            "NO gRPC: GRPC_PORT is %d but grpcio or tritonclient's protos are not installed "
            "(%s; missing: %s): serving HTTP only (GRPC_PORT=0 turns gRPC off without this)",
            settings.grpc_port,
            EXTRA,
            exc.name or exc,
        )
        return GrpcEndpoint()
    from tritonclient.grpc import service_pb2_grpc

    from app.api.context import server_version
    from app.api.limits import RequestLimits
    from app.grpc.admission import Admission
    from app.server.connection_limits import connection_limits

    limits = RequestLimits(settings.max_body_bytes, settings.max_json_bytes)
    largest = limits.any_model(get_service())
    connections = connection_limits(settings)
    options = _server_options(largest.bytes, connections, reuse_port)
    admission = Admission(
        connections.max_connections,
        metrics.grpc_call_refused if metrics is not None else lambda method: None,
    )
    server = grpc.aio.server(options=options, interceptors=[admission])
    servicer = InferenceServicer(
        get_service,
        limits,
        server_version(),
        admin_token=settings.admin_token,
        bind_host=settings.host,
        metrics=metrics,
        server_name=settings.server_name,
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    address = grpc_address(settings.host, settings.grpc_port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        bound, why = 0, str(exc)
    else:
        why = "bind failed"
    if not bound:
        await server.stop(None)
        raise RuntimeError(
            f"gRPC endpoint: cannot listen on {address} ({why}; in use?): set GRPC_PORT "
            "(--grpc-port) to a free port, or 0 to turn gRPC off"
        )
    await server.start()
    log.info(
        "gRPC endpoint (KServe v2, inference.GRPCInferenceService) on %s; messages up to %d bytes",
        address,
        largest.bytes,
    )
    return GrpcEndpoint(server, address)
