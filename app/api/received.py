"""When a request reached the server: the start of its SLO clock.

A request's deadline is its arrival plus its SLO, and the client counts the
SLO from when it sent the request. The HTTP layer handles requests one at a
time on one event loop: in a burst of N requests the last one is parsed,
decoded and handed to the scheduler up to N × (~0.5–1 ms) after its bytes
arrived. Stamping the arrival there would give the core deadlines later than
the client's, and batches planned to finish just in time would come back
late by the client's clock.

So the arrival is stamped as early as the server can see it:

- under `python -m app serve`, uvicorn runs `ReceiveStampingProtocol` (as
  the base of app.api.connection's `GuardedProtocol`), which stamps
  `time.monotonic()` when the parser meets the first byte of a request.
  uvicorn parses every socket that the poll reported ready before it runs
  any request task, so a burst's stamps are not delayed by the processing
  of the requests ahead of them;
- when embedding the app in uvicorn from Python, pass
  `http=ReceiveStampingProtocol` (or app.api.connection's
  `uvicorn_connection_options`) to `uvicorn.run`/`uvicorn.Config` for the
  same; under the plain `uvicorn app.main:app` command line (unless given
  `--http app.api.connection:GuardedProtocol`), any other ASGI server or
  h11, the inference fast path stamps when the request reaches the app
  (`stamp_if_missing`).

The stamp travels in the ASGI scope under `RECEIVED_AT`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import Scope

log = logging.getLogger(__name__)

# An ASGI scope key of this server (servers may add their own keys).
RECEIVED_AT = "deadline_serve.received_at"


def received_at(scope: Scope) -> float | None:
    """The monotonic time the request was received, if stamped."""
    value = scope.get(RECEIVED_AT)
    return value if isinstance(value, float) else None


def stamp_if_missing(scope: Scope) -> None:
    if RECEIVED_AT not in scope:
        scope[RECEIVED_AT] = time.monotonic()


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # uvicorn without the [standard] extra (no httptools)
    HttpToolsProtocol = None


if HttpToolsProtocol is not None:

    class ReceiveStampingProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, stamping each request's scope at its
        first byte (`uvicorn.run(app, http=ReceiveStampingProtocol)`)."""

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[RECEIVED_AT] = time.monotonic()  # type: ignore[literal-required]

else:
    ReceiveStampingProtocol = None  # type: ignore[assignment,misc]


def receive_stamping_protocol() -> Any:
    """The `http=` argument for uvicorn: `ReceiveStampingProtocol`, or "auto"
    (uvicorn's default; the app stamps at entry) without httptools."""
    if HttpToolsProtocol is None:
        log.info("httptools not installed: arrival stamped when the app sees a request")
        return "auto"
    return ReceiveStampingProtocol
