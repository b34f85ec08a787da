"""The application id a request may carry (native `app_id`, KServe v2
`parameters.app_id`, gRPC `parameters["app_id"]`).

Requests of one application to one model share an execution-time
distribution, which policies for input-dependent models track per
application (orloj.txt §3; `Request.app` in the scheduling core). Not given,
a request belongs to its model's default application, "".

An id is 1 to 128 printable ASCII characters (space to '~'): it is echoed in
answers and may be logged, so nothing that could break a line or a terminal
gets in. Anything else — another type, empty, too long, a control or
non-ASCII character — is a 400 (gRPC: INVALID_ARGUMENT) naming `app_id`, over
every protocol alike; the HTTP schema is deliberately loose so that a wrong
type gets that 400 rather than the schema's 422.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import WithJsonSchema

from app.api.security import short_repr
from app.errors import InvalidInput

MAX_APP_ID_LENGTH = 128
APP_ID_PATTERN = r"^[ -~]+$"
_APP_ID = re.compile(r"[ -~]+")
APP_ID_DESCRIPTION = (
    "Application the request comes from: 1 to 128 printable ASCII characters (space to '~'). "
    "Requests of one application share an execution-time distribution, which the scheduler "
    'may track per application; omitted or null, the model\'s default application (""). '
    "Echoed in the answer's timing; any other value is refused with 400."
)

# The pydantic type of the field: any JSON value (checked by `check_app_id`),
# documented as what the server takes.
AppId = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_APP_ID_LENGTH,
                    "pattern": APP_ID_PATTERN,
                },
                {"type": "null"},
            ],
            "description": APP_ID_DESCRIPTION,
        }
    ),
]


def check_app_id(value: object) -> str:
    """The application id `value` names: "" for None (the default
    application); anything but 1–128 printable ASCII characters is a 400."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(
            f"app_id must be a string of 1 to {MAX_APP_ID_LENGTH} printable ASCII characters, "
            f"got {type(value).__name__} {short_repr(str(value))}"
        )
    if not 1 <= len(value) <= MAX_APP_ID_LENGTH or _APP_ID.fullmatch(value) is None:
        raise InvalidInput(
            f"app_id must be 1 to {MAX_APP_ID_LENGTH} printable ASCII characters "
            f"(space to '~'), got {short_repr(value)}"
        )
    return value
