"""Errors a request can end in; the HTTP layer maps each to a status code."""

from __future__ import annotations

import re


class ServingError(Exception):
    """Base class: `status` is the HTTP status, `reason` a stable short code."""

    status = 500
    reason = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFound(ServingError):
    status = 404
    reason = "model_not_found"


class ModelNotReady(ServingError):
    status = 503
    reason = "model_not_ready"


class ModelUnloaded(ModelNotReady):
    """The model was unloaded (or is being unloaded or loaded) on request."""

    reason = "unloaded"


class ControlBusy(ServingError):
    """A model-control call that cannot be carried out now (an executor it
    needs is restarting): nothing was changed; retry."""

    status = 503
    reason = "executor_restarting"


class LoadFailed(ServingError):
    """A model-control load that could not be carried out (Triton: 400)."""

    status = 400
    reason = "load_failed"


class InvalidInput(ServingError):
    status = 400
    reason = "invalid_input"


class Dropped(ServingError):
    """The deadline cannot be met (the scheduler dropped the request)."""

    status = 503
    reason = "deadline"

    def __init__(self, message: str, reason: str = "deadline") -> None:
        super().__init__(message)
        self.reason = reason


class Overloaded(ServingError):
    """Queue or shared-memory arena full: come back later."""

    status = 429
    reason = "overloaded"

    def __init__(self, message: str, reason: str = "overloaded") -> None:
        super().__init__(message)
        self.reason = reason


class ExecutorFailed(ServingError):
    status = 503
    reason = "executor_failed"


class ShuttingDown(ServingError):
    status = 503
    reason = "shutting_down"


# The answer to a request the scheduling core dropped, by its reason
# (app.scheduling.types.DropReason's values), for every driver of a core.
DROP_MESSAGES = {
    "deadline": "dropped: the deadline cannot be met",
    "queue_timeout": "dropped: waited longer than the queue timeout",
    "preempted": "dropped: preempted and the deadline can no longer be met",
    "overloaded": "dropped: server overloaded",
    "not_served": "dropped: nothing that can run this model serves it",
    "device_failed": "dropped: its device failed and the deadline can no longer be met",
    "unloaded": "dropped: its model was unloaded before it ran",
}


def dropped(reason: str) -> Dropped:
    """The error a request dropped for `reason` (a DropReason value) gets."""
    return Dropped(DROP_MESSAGES.get(reason, f"dropped: {reason}"), reason)


# An absolute path: a '/' that starts a word (not after a letter, digit, '.',
# ':' or '/', so neither "1/2", "a/b" nor a URL's "//"), and what follows it up
# to a space, quote, bracket, comma or colon.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s'\"()\[\],:;]*/)*([^\s'\"()\[\],:;/]*)")


def hide_paths(text: str) -> str:
    """`text` with each absolute path cut to its last component
    ("/srv/models/x/config.yaml: ..." → "config.yaml: ...")."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1) or "<path>", text)
