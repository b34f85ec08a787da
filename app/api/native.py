"""The native JSON API: `POST /infer`.

A request names the model, gives its inputs by name (a nested list, or
`{data, shape}`), and may set `slo_ms`, `id` and `app_id` (its application,
app/api/app_id.py); the answer gives each output's
shape, datatype and data, and the request's timing. An input's batch
dimension n (1 ≤ n ≤ the model's max_batch_size; omitted: 1) is the
request's items, and the outputs have batch dimension n.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api import models as m
from app.api.app_id import check_app_id
from app.api.bodies import TensorJSONResponse, parse_body, read_body, result_output
from app.api.context import ApiContext, lookup_model
from app.api.errors import PayloadTooLarge
from app.api.openapi import ERROR_RESPONSES, json_body
from app.api.received import received_at
from app.api.tensors import (
    batch_items,
    bytes_elements,
    check_input_names,
    check_shape,
    datatype_name,
    decode_json_tensor,
    json_data,
    resolve_slo,
    spec_map,
)


async def infer(ctx: ApiContext, request: Request) -> Response:
    """Run one inference (the route's endpoint and the fast path's)."""
    service = ctx.get_service()
    # all JSON text: under MAX_JSON_BYTES as well as the models' limits
    body = await read_body(request, ctx.limits.as_json(ctx.limits.any_model(service)))
    req = await parse_body(m.InferRequest, body)
    config = lookup_model(service, req.model)
    limit = ctx.limits.for_model(config)
    body_limit = ctx.limits.as_json(limit)
    if len(body) > body_limit.bytes:  # the body names its model: held to its limit once parsed
        raise PayloadTooLarge(body_limit.exceeded(f"request body of {len(body)} bytes"))
    check_input_names(config, list(req.inputs))
    specs = spec_map(config.inputs)
    inputs: dict[str, np.ndarray] = {}
    for name, value in req.inputs.items():
        spec = specs[name]
        if isinstance(value, m.TensorData):
            shape = check_shape(
                name,
                spec,
                value.shape,
                batch_optional=True,
                max_elements=limit.bytes,
                max_batch=config.max_batch_size,
            )
            inputs[name] = decode_json_tensor(name, spec, value.data, shape)
        else:
            inputs[name] = decode_json_tensor(
                name, spec, value, None, max_batch=config.max_batch_size
            )
    batch_items(inputs)
    slo_ms = resolve_slo(config, req.slo_ms)
    app = check_app_id(req.app_id)
    result = await service.infer(
        config.name,
        inputs,
        slo_ms=slo_ms,
        request_id=req.id,
        received_at=received_at(request.scope),
        app=app,
    )
    outputs = {}
    arrays = []
    for name in result.outputs:
        arr = np.ascontiguousarray(np.atleast_1d(result_output(result, name)))
        data: Any = arr
        if arr.dtype == object:  # BYTES: nested lists of strings
            data = bytes_elements(json_data(name, arr), arr.shape).tolist()
        else:
            arrays.append(arr)
        outputs[name] = {
            "shape": [int(d) for d in arr.shape],
            "datatype": datatype_name(arr.dtype),
            "data": data,
        }
    return TensorJSONResponse(
        {
            "model": req.model,
            "id": req.id if req.id is not None else result.request_id,
            "outputs": outputs,
            "timing": result.timing(),
        },
        arrays,
    )


def add_native_routes(router: APIRouter, ctx: ApiContext) -> None:
    """Add the native API's route to `router`, calling `infer` with `ctx` (the
    route is named after it; the adapter's own name differs so as not to shadow it)."""

    @router.post(
        "/infer",
        name="infer",
        response_model=m.InferResponse,
        responses=ERROR_RESPONSES,
        tags=["native"],
        summary="Run one inference (native JSON API)",
        operation_id="infer",
        openapi_extra=json_body(
            m.InferRequest,
            "Model, named input tensors, optional SLO, request id and application id.",
        ),
    )
    async def infer_route(request: Request) -> Response:
        return await infer(ctx, request)
