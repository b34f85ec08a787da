"""What the OpenAPI document says beyond FastAPI's own inference from the routes.

The handlers read and validate request bodies themselves (app.api.bodies), so
FastAPI sees no body parameter; each route names its request model through
`openapi_extra` (`json_body`, `V2_INFER_EXTRA`), and `add_request_schemas` puts
those models into the document's components. Errors are documented as the
API's `ErrorResponse` (app.api.errors), FastAPI's HTTPValidationError never.

The document says what the server enforces, so that a client (or a fuzzer,
tests/test_fuzz.py) can trust it: every model name, in a path or in the native
body, declares the pattern and length `check_model_name` allows (a name
outside them is a 400, a name inside them that no model has a 404); each
operation lists every status it answers with; and OpenAPI links lead from the
repository index and from a model's metadata to the routes that take the
model's name, so that a stateful client walks from the index to real models.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.api import models as m
from app.api.v2 import HEADER_LENGTH

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": m.ErrorResponse,
        "description": "Invalid input, invalid model name or malformed body.",
    },
    404: {"model": m.ErrorResponse, "description": "Unknown model."},
    413: {"model": m.ErrorResponse, "description": "Body too large."},
    415: {"model": m.ErrorResponse, "description": "Unsupported Content-Encoding."},
    422: {"model": m.ErrorResponse, "description": "Body does not fit the schema."},
    429: {"model": m.ErrorResponse, "description": "Overloaded: retry later."},
    503: {
        "model": m.ErrorResponse,
        "description": "Dropped (its deadline cannot be met; `reason` says why), "
        "model not ready, or shutting down.",
    },
}
_UNAVAILABLE = {
    503: {
        "model": m.ErrorResponse,
        "description": "The model is unavailable (it did not load, or no device can run it), "
        "or the server is starting or shutting down.",
    }
}
# routes that look a model up by the name in their path
NOT_FOUND_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": m.ErrorResponse, "description": "Not a valid model name (e.g. '../x')."},
    404: ERROR_RESPONSES[404],
    **_UNAVAILABLE,
}


def schema_ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def json_body(model: type[BaseModel], description: str, required: bool = True) -> dict:
    """`openapi_extra` of a route whose handler reads a JSON body of `model`."""
    return {
        "requestBody": {
            "required": required,
            "description": description,
            "content": {"application/json": {"schema": schema_ref(model)}},
        }
    }


V2_INFER_EXTRA: dict[str, Any] = {
    "parameters": [
        {
            "name": HEADER_LENGTH,
            "in": "header",
            "required": False,
            "schema": {"type": "integer", "minimum": 0},
            "description": (
                "Binary tensor data extension: length of the JSON header at the start of "
                "the body; the inputs' binary data (parameters.binary_data_size each) "
                "follows it. Absent: the whole body is JSON."
            ),
        },
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]},
            "description": "Request body compression.",
        },
    ],
    "requestBody": {
        "required": True,
        "description": (
            "A V2InferRequest as JSON; or, with the binary tensor data extension, that JSON "
            f"({HEADER_LENGTH} bytes) followed by the binary data of the inputs that set "
            "parameters.binary_data_size, in input order (little-endian, row-major)."
        ),
        "content": {
            "application/json": {"schema": schema_ref(m.V2InferRequest)},
            "application/octet-stream": {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "JSON header followed by binary tensor data.",
                },
            },
        },
    },
}

V2_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "Outputs. When any output is binary (binary_data / binary_data_output), the body is "
            f"the V2InferResponse JSON ({HEADER_LENGTH} bytes, given in the response header) "
            "followed by those outputs' bytes in output order."
        ),
        "headers": {
            HEADER_LENGTH: {
                "schema": {"type": "integer"},
                "description": "Present when the body carries binary output data.",
            }
        },
        "content": {
            "application/octet-stream": {
                "schema": {"type": "string", "format": "binary"},
            }
        },
    },
    **ERROR_RESPONSES,
}


def _model_link(operation_id: str, name: str, version: str | None = None) -> dict[str, Any]:
    parameters = {"name": name}
    if version is not None:
        parameters["version"] = version
    return {"operationId": operation_id, "parameters": parameters}


def _links(name: str, version: str | None) -> dict[str, Any]:
    """Links from a response that names a model (`name`, `version`: runtime
    expressions) to the routes that take it."""
    links = {
        "ModelMetadata": _model_link("v2_model_metadata", name),
        "ModelConfig": _model_link("v2_model_config", name),
        "ModelReady": _model_link("v2_model_ready", name),
        "ModelInfer": _model_link("v2_infer", name),
        "ModelStats": _model_link("v2_model_stats", name),
        "NativeInfer": {"operationId": "infer", "requestBody": {"model": name}},
    }
    if version is not None:
        links["ModelVersionMetadata"] = _model_link("v2_model_version_metadata", name, version)
        links["ModelVersionConfig"] = _model_link("v2_model_version_config", name, version)
        links["ModelVersionReady"] = _model_link("v2_model_version_ready", name, version)
        links["ModelVersionInfer"] = _model_link("v2_infer_version", name, version)
    return links


# operationId → the links of its 200 answer
LINKS: dict[str, dict[str, Any]] = {
    "v2_repository_index": _links("$response.body#/0/name", "$response.body#/0/version"),
    "v2_model_metadata": _links("$response.body#/name", "$response.body#/versions/0"),
}
MODEL_NAME_PARAMETER = "name"  # the path parameter of every /v2/models/{name} route


def _declare_model_names(operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("name") == MODEL_NAME_PARAMETER:
            parameter["schema"].update(m.MODEL_NAME_SCHEMA)
            parameter.setdefault(
                "description",
                "Model name: letters, digits, '_', '.' and '-', without '..' (else 400).",
            )


def add_request_schemas(app: FastAPI) -> None:
    """Put the hand-validated request models into the OpenAPI components."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        _, defs = models_json_schema(
            [(model, "validation") for model in m.REQUEST_MODELS],
            ref_template="#/components/schemas/{model}",
        )
        for key, value in defs.get("$defs", {}).items():
            components.setdefault(key, value)
        # FastAPI documents its validation errors as HTTPValidationError; the
        # API's error handlers (app.api.errors) answer them as ErrorResponse.
        components.setdefault("ErrorResponse", m.ErrorResponse.model_json_schema())
        for ops in schema.get("paths", {}).values():
            for op in ops.values():
                resp = op.get("responses", {}).get("422")
                if resp and "HTTPValidationError" in json.dumps(resp):
                    if "requestBody" not in op:
                        # FastAPI's own for string path parameters, which
                        # cannot fail its validation: never answered
                        del op["responses"]["422"]
                    else:
                        resp["content"] = {
                            "application/json": {"schema": schema_ref(m.ErrorResponse)}
                        }
                _declare_model_names(op)
                links = LINKS.get(op.get("operationId", ""))
                if links and "200" in op.get("responses", {}):
                    op["responses"]["200"]["links"] = links
        if "HTTPValidationError" not in json.dumps(schema.get("paths", {})):
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
