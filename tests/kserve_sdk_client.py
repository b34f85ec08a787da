"""Run by the KServe SDK's own interpreter (its venv): the SDK's REST and
gRPC clients against a server, as a KServe user runs them. Prints one JSON
line of what came back; tests/test_kserve_sdk.py checks it.

    python tests/kserve_sdk_client.py REST_URL GRPC_ADDRESS
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import to_http_parameters

X = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


def request(binary: bool, parameters: dict | None = None) -> InferRequest:
    inp = InferInput(name="x", shape=[1, 4], datatype="FP32")
    inp.set_data_from_numpy(X, binary_data=binary)
    return InferRequest(
        model_name="add_one", infer_inputs=[inp], request_id="k1", parameters=parameters
    )


async def main(rest_url: str, grpc_address: str) -> dict:
    out: dict = {}
    rest = InferenceRESTClient(RESTConfig(protocol="v2", timeout=10))
    for binary in (False, True):
        answer = await rest.infer(rest_url, request(binary), model_name="add_one")
        out[f"rest_binary_{binary}"] = answer.outputs[0].as_numpy().tolist()
        out[f"rest_params_{binary}"] = answer.parameters
    await rest.close()

    client = InferenceGRPCClient(grpc_address, timeout=10)
    for binary in (False, True):
        answer = await client.infer(request(binary, {"priority": 1, "tenant": "k"}))
        out[f"grpc_binary_{binary}"] = answer.outputs[0].as_numpy().tolist()
        out[f"grpc_params_{binary}"] = to_http_parameters(answer.parameters)
    out["grpc_ready"] = await client.is_server_ready()
    await client.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
