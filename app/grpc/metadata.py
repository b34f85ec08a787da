"""Model metadata and Triton's `ModelConfig` message from our ModelConfig.

The same facts as the HTTP API's `/v2/models/{m}` and `/config` routes
(app.api.v2_routes): the platform and backend are Triton's names
(`onnxruntime_onnx` / `onnxruntime`, `pytorch_libtorch` / `pytorch`; the
emulator's `emulated`), shapes in metadata carry the batch dimension as -1 and `dims`
in the config leave it out (Triton's convention for a model with
`max_batch_size` > 0). Our own fields that Triton's schema lacks, the SLO and
whether a request may loosen it, go in the config's `parameters`, as a
`config.pbtxt` gives them to us.
"""

from __future__ import annotations

from collections.abc import Sequence

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from app.repository.config import ModelConfig, TensorSpec
from app.repository.triton_config import config_parameters, triton_backend, triton_platform

# Triton's name for a datatype where it is not TYPE_<v2 name>.
_TRITON_TYPE_NAMES = {"BYTES": "TYPE_STRING"}


def triton_data_type(datatype: str) -> int:
    """Triton's DataType enum value of a v2 datatype name."""
    return mc.DataType.Value(_TRITON_TYPE_NAMES.get(datatype, f"TYPE_{datatype}"))


def model_metadata(config: ModelConfig) -> pb.ModelMetadataResponse:
    def tensors(specs: Sequence[TensorSpec]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(
                name=spec.name, datatype=spec.datatype, shape=list(spec.shape)
            )
            for spec in specs
        ]

    return pb.ModelMetadataResponse(
        name=config.model_name,
        versions=list(config.served_versions),
        platform=triton_platform(config.backend),
        inputs=tensors(config.inputs),
        outputs=tensors(config.outputs),
    )


def model_config(config: ModelConfig) -> mc.ModelConfig:
    out = mc.ModelConfig(
        name=config.model_name,
        platform=triton_platform(config.backend),
        backend=triton_backend(config.backend),
        max_batch_size=config.max_batch_size,
        input=[
            mc.ModelInput(
                name=spec.name,
                data_type=triton_data_type(spec.datatype),  # type: ignore[arg-type]
                dims=list(spec.item_shape),
            )
            for spec in config.inputs
        ],
        output=[
            mc.ModelOutput(
                name=spec.name,
                data_type=triton_data_type(spec.datatype),  # type: ignore[arg-type]
                dims=list(spec.item_shape),
            )
            for spec in config.outputs
        ],
    )
    for name, value in config_parameters(config).items():
        out.parameters[name].string_value = value
    return out
