"""A Triton model directory: `config.pbtxt` and version directories.

    <repository>/<model>/config.pbtxt
    <repository>/<model>/<version>/model.onnx      (or default_model_filename)

`config.pbtxt` is parsed with protobuf's text format against Triton's own
ModelConfig message (`tritonclient.grpc.model_config_pb2`, the `triton`
extra) and turned into a config.yaml document, so both formats go through
the same checks (app/repository/loader.py). What maps:

* `platform: onnxruntime_onnx` / `backend: onnxruntime` → backend onnx
  (`model.onnx`); `pytorch_libtorch` / `pytorch` → backend torch
  (`model.pt`, a TorchScript file; its inputs and outputs are the config's
  in order, or by name through dicts: app/runtime/torch_model.py). Neither given:
  whichever default file the version directory holds.
* `version_policy`: `latest {num_versions}` (Triton's default, 1), `all`,
  `specific {versions}` over the numeric subdirectories. Every version
  selected is served (app/repository/config.py: `version_key`); the
  highest is the default, used when a request names no version.
* `max_batch_size` (≥ 1: requests are batched along an implicit first
  dimension that `dims` leave out), `input`/`output` with `data_type`
  (TYPE_FP32 → FP32 …) and `dims`. For ONNX both may be left out: they are
  filled from the model file as Triton's auto-complete does (and
  `max_batch_size` 4, Triton's default, when the model batches).
* `dynamic_batching` and `instance_group`: app/repository/triton_fields.py.
* Ours through `parameters` (string values): `slo_ms` (default
  DEFAULT_SLO_MS, with a warning), `allow_slo_loosening`, `profile` (YAML,
  e.g. `"{alpha_ms: 0.5, beta_ms: 2}"`), `description`, `dynamic` (YAML:
  `"true"` or `"{probes: FILE}"`, app/repository/dynamic_fields.py), and the backend
  options `exit_points` (torch) and `preemption_delay_ms` (emulated).
* A tensor's keys beyond `dims` (app/repository/tensor_fields.py) through
  `parameters` too, each a YAML mapping of tensor name → value written as
  in config.yaml, the batch dimension left out as in `dims`: `max_shape`
  bounds dims -1, `pad` lets requests of different lengths share a padded
  batch, `follows` cuts an output back to each request's length,
  `max_bytes` bounds a TYPE_STRING (BYTES) element. A tensor that declares
  neither bound gets slots of DEFAULT_MAX_ELEMENTS elements and
  DEFAULT_MAX_BYTES bytes per string and is `elastic`: a longer request is
  served all the same, its item in a segment of its own, as Triton takes
  any length; a declared bound is the model's and is enforced (400)::

      input [{ name: "tokens" data_type: TYPE_FP32 dims: [ -1 ] }]
      output [{ name: "scores" data_type: TYPE_FP32 dims: [ -1 ] }]
      parameters { key: "max_shape" value { string_value: "{tokens: [128], scores: [128]}" } }
      parameters { key: "pad" value { string_value: "{tokens: [true]}" } }
      parameters { key: "follows" value { string_value: "{scores: [tokens:1]}" } }

Every other field the file sets (ListFields) is a warning naming it, except
sequence batching and ensembles, whose requests cannot be served one by one
as independent requests: those are errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from app.config_fields import FieldReader
from app.repository.signatures import onnx_signature

log = logging.getLogger(__name__)

TRITON_CONFIG_FILE = "config.pbtxt"
TRITON_EXTRA = "pip install 'deadline-serve[triton]'"
DEFAULT_SLO_MS = 1000.0
DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default-max-batch-size for auto-complete
# What a model without slo_ms is told (load_repository says it once for all).
NO_SLO_NOTE = (
    f"no slo_ms: using {DEFAULT_SLO_MS:g} ms; set it with "
    'parameters { key: "slo_ms" value { string_value: "50" } }'
)
# Bounds of a Triton tensor that sets none (Triton has none; ours size the
# shared-memory slots): a TYPE_STRING element's bytes, and the elements of
# one item of a tensor with variable dimensions (each -1 dimension bounded
# alike so that the item holds at most this many elements).
DEFAULT_MAX_BYTES = 256
DEFAULT_MAX_ELEMENTS = 4096

# (platform, backend) names → (our backend, Triton's default model file name)
_ONNX = ("onnx", "model.onnx")
_TORCH = ("torch", "model.pt")
_PLATFORMS = {"onnxruntime_onnx": _ONNX, "pytorch_libtorch": _TORCH}
_BACKENDS = {"onnxruntime": _ONNX, "pytorch": _TORCH}
# Our backend → Triton's (platform, backend) names, as model metadata and
# model configs report them (Triton's clients and dashboards read them).
_TRITON_NAMES = {
    "onnx": ("onnxruntime_onnx", "onnxruntime"),
    "torch": ("pytorch_libtorch", "pytorch"),
}


def triton_platform(backend: str) -> str:
    """Triton's `platform` of a model on our `backend` (`onnxruntime_onnx`,
    `pytorch_libtorch`; others, e.g. `emulated`, keep our name)."""
    return _TRITON_NAMES.get(backend, (backend, backend))[0]


def config_parameters(config: Any) -> dict[str, str]:
    """The model config's `parameters` as both endpoints answer them
    (Triton's string map): what of ours a Triton client can read there."""
    return {
        "slo_ms": f"{config.slo_ms:g}",
        "allow_slo_loosening": str(config.allow_slo_loosening).lower(),
    }


def triton_backend(backend: str) -> str:
    """Triton's `backend` of a model on our `backend` (`onnxruntime`, `pytorch`)."""
    return _TRITON_NAMES.get(backend, (backend, backend))[1]


_SUPPORTED = frozenset(
    {
        "name",
        "platform",
        "backend",
        "version_policy",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "instance_group",
        "default_model_filename",
        "parameters",
    }
)
_REFUSED = {
    "sequence_batching": "sequence batching (stateful models) is not supported",
    "ensemble_scheduling": "ensembles are not supported",
}
_INPUT_SUPPORTED = frozenset({"name", "data_type", "dims", "allow_ragged_batch"})
_OUTPUT_SUPPORTED = frozenset({"name", "data_type", "dims"})
_OUR_PARAMETERS = ("slo_ms", "allow_slo_loosening", "profile", "description", "dynamic")
_BACKEND_PARAMETERS = ("exit_points", "preemption_delay_ms")
_TENSOR_PARAMETERS = ("max_shape", "pad", "follows", "max_bytes")


def auto_completes(directory: Path) -> bool:
    """Whether Triton would complete a config for `directory`, which has
    none: a version directory holding a `model.onnx` (Triton's default
    `--strict-model-config=false`)."""
    return any(
        sub.is_dir() and sub.name.isdigit() and (sub / "model.onnx").is_file()
        for sub in directory.iterdir()
    )


def model_config_pb2() -> Any:
    """Triton's model-config protobuf module (the `triton` extra)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as exc:
        raise ValueError(
            f"Triton model configs ({TRITON_CONFIG_FILE}) need the triton extra: {TRITON_EXTRA}"
        ) from exc
    return model_config_pb2


def triton_document(
    directory: Path, warn: Callable[[str], None]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`<directory>/config.pbtxt` as a config.yaml document (what
    app.repository.loader.parse_model_config takes), for the default
    version (the highest selected), and the other versions the policy
    selects (each served from `<version>/<file>` with the same config);
    unsupported fields go to `warn`.
    Raises ValueError naming the file and the field."""
    from google.protobuf import json_format, text_format

    pb2 = model_config_pb2()
    path = directory / TRITON_CONFIG_FILE
    ctx = FieldReader(str(path))
    try:
        # no config.pbtxt: everything from the model file (Triton's auto-complete)
        text = path.read_text() if path.exists() else ""
        msg = text_format.Parse(text, pb2.ModelConfig())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the model config: {exc}") from exc
    except text_format.ParseError as exc:
        raise ValueError(f"{path}: not a valid Triton model config: {exc}") from None
    set_fields = [f.name for f, _ in msg.ListFields()]
    for name in set_fields:
        if name in _REFUSED:
            ctx.fail(name, _REFUSED[name])
        if name not in _SUPPORTED:
            warn(f"{name} is not supported and has no effect")
    if msg.name and msg.name != directory.name:
        ctx.fail("name", f"{msg.name!r} differs from the model directory's name {directory.name!r}")

    backend, default_file = _backend(ctx, msg, directory)
    filename = msg.default_model_filename or default_file
    served, others = _select_versions(ctx, msg, directory, filename)
    model_file = f"{served}/{filename}"
    max_batch = msg.max_batch_size
    inputs = [
        _tensor(ctx, t, f"input[{i}]", _INPUT_SUPPORTED, warn) for i, t in enumerate(msg.input)
    ]
    outputs = [
        _tensor(ctx, t, f"output[{i}]", _OUTPUT_SUPPORTED, warn) for i, t in enumerate(msg.output)
    ]
    if not inputs or not outputs:
        if backend != "onnx":
            ctx.fail("input", f"backend {backend} models must declare input and output")
        max_batch, found_in, found_out = _autocomplete(ctx, directory / model_file, max_batch)
        inputs, outputs = inputs or found_in, outputs or found_out
    elif max_batch == 0:
        max_batch = _unbatched(ctx, inputs, outputs)
    if max_batch < 1:
        ctx.fail("max_batch_size", f"{max_batch}: must be 0 (no batching) or more")
    doc: dict[str, Any] = {
        "backend": backend,
        "model_file": model_file,
        "version": served,
        "max_batch_size": max_batch,
        "inputs": inputs,
        "outputs": outputs,
    }
    if msg.HasField("dynamic_batching"):
        doc["dynamic_batching"] = _as_dict(json_format, msg.dynamic_batching)
    if msg.instance_group:
        doc["instance_group"] = [_as_dict(json_format, g) for g in msg.instance_group]
    _parameters(ctx, {k: v.string_value for k, v in msg.parameters.items()}, doc, warn)
    return doc, others


def _as_dict(json_format: Any, message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _backend(ctx: FieldReader, msg: Any, directory: Path) -> tuple[str, str]:
    if msg.platform and msg.platform not in _PLATFORMS:
        ctx.fail("platform", f"{msg.platform!r} is not supported; use {sorted(_PLATFORMS)}")
    if msg.backend and msg.backend not in _BACKENDS:
        ctx.fail("backend", f"{msg.backend!r} is not supported; use {sorted(_BACKENDS)}")
    chosen = [_PLATFORMS[msg.platform]] if msg.platform else []
    chosen += [_BACKENDS[msg.backend]] if msg.backend else []
    if len(set(chosen)) > 1:
        ctx.fail("backend", f"backend {msg.backend!r} contradicts platform {msg.platform!r}")
    if chosen:
        return chosen[0]
    # Neither given: as Triton, go by the model file's name.
    filename = msg.default_model_filename
    if filename:
        for backend, default_file in (_ONNX, _TORCH):
            if Path(filename).suffix == Path(default_file).suffix:
                return backend, default_file
    else:
        for backend, default_file in (_ONNX, _TORCH):
            if any((v / default_file).is_file() for v in _version_dirs(directory)):
                return backend, default_file
    ctx.fail("platform", "not given, and no version directory holds model.onnx or model.pt")


def _version_dirs(directory: Path) -> list[Path]:
    return sorted(
        (p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )


def _select_versions(
    ctx: FieldReader, msg: Any, directory: Path, filename: str
) -> tuple[str, tuple[str, ...]]:
    """The default version (the highest selected) and the other versions
    the policy selects, in increasing order."""
    available = [int(p.name) for p in _version_dirs(directory)]
    if not available:
        ctx.fail("version_policy", f"no version directory (e.g. {directory.name}/1/{filename})")
    policy = msg.version_policy
    choice = policy.WhichOneof("policy_choice") if msg.HasField("version_policy") else None
    if choice == "all":
        selected = available
    elif choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        if not wanted:
            ctx.fail("version_policy.specific", "lists no versions")
        missing = [v for v in wanted if v not in available]
        if missing:
            ctx.fail(
                "version_policy.specific",
                f"versions {missing} have no directory; the model has {available}",
            )
        selected = wanted
    else:
        n = policy.latest.num_versions if choice == "latest" else 1
        selected = available[-max(1, n) :]
    for version in selected:
        if not (directory / str(version) / filename).is_file():
            ctx.fail("version_policy", f"version {version} has no {version}/{filename}")
    served = str(max(selected))
    return served, tuple(str(v) for v in sorted(selected) if str(v) != served)


def _tensor(
    ctx: FieldReader,
    tensor: Any,
    where: str,
    supported: frozenset[str],
    warn: Callable[[str], None],
) -> dict[str, Any]:
    where = f"{where} ({tensor.name})"
    for field_desc, _ in tensor.ListFields():
        if field_desc.name not in supported:
            warn(f"{where}.{field_desc.name} is not supported and has no effect")
    type_name = (
        tensor.DESCRIPTOR.fields_by_name["data_type"]
        .enum_type.values_by_number[tensor.data_type]
        .name
    )
    if type_name == "TYPE_INVALID":
        ctx.fail(f"{where}.data_type", "missing")
    datatype = "BYTES" if type_name == "TYPE_STRING" else type_name.removeprefix("TYPE_")
    # The batch dimension is implicit in Triton's dims; ours is written first.
    doc = {"name": tensor.name, "datatype": datatype, "shape": [-1, *tensor.dims]}
    if getattr(tensor, "allow_ragged_batch", False) and any(d < 0 for d in tensor.dims):
        # Requests of different lengths share a batch: here padded with 0 to
        # the batch's longest along the variable dimensions (Triton hands the
        # model the items end to end instead; a model written for that form
        # needs its own `pad`/`follows` parameters).
        doc["pad"] = [False, *(d < 0 for d in tensor.dims)]
    return doc


def _autocomplete(
    ctx: FieldReader, model_file: Path, max_batch: int
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    """Inputs and outputs read from the ONNX file (Triton's auto-complete)."""
    try:
        inputs, outputs = onnx_signature(model_file)
    except Exception as exc:  # onnx raises its own errors for a bad file
        ctx.fail("input", f"inputs not given and the model file cannot be read: {exc}")
    batched = all(dims and dims[0] is None for _, _, dims in [*inputs, *outputs])
    if max_batch == 0 and batched:
        max_batch = DEFAULT_MAX_BATCH_SIZE
    elif max_batch == 0:
        # fixed first dimensions: served one request at a time if they are 1
        if not all(dims and dims[0] == 1 for _, _, dims in [*inputs, *outputs]):
            ctx.fail(
                "max_batch_size",
                "0 (no batching) is served here only when every tensor's first dimension is "
                "1 or -1 (a request is then a batch of one)",
            )
        max_batch = 1
    if max_batch > 0 and not batched and max_batch != 1:
        ctx.fail("max_batch_size", "the model's first dimensions are fixed: it cannot batch")

    def specs(signature: Any, kind: str) -> list[dict[str, Any]]:
        out = []
        for name, datatype, dims in signature:
            if datatype is None:
                ctx.fail(kind, f"{name!r} has a datatype this server does not support")
            shape = [-1 if d is None else d for d in dims[1:]]
            out.append({"name": name, "datatype": datatype, "shape": [-1, *shape]})
        return out

    return max_batch, specs(inputs, "input"), specs(outputs, "output")


def _parameters(
    ctx: FieldReader,
    params: dict[str, str],
    doc: dict[str, Any],
    warn: Callable[[str], None],
) -> None:
    backend_options: dict[str, Any] = {}
    for key, text in sorted(params.items()):
        where = f"parameters[{key}]"
        if key in ("slo_ms", "description"):
            doc[key] = text
        elif key == "allow_slo_loosening":
            if text.strip().lower() not in ("true", "false"):
                ctx.fail(where, f'must be "true" or "false", got {text!r}')
            doc[key] = text.strip().lower() == "true"
        elif key in _TENSOR_PARAMETERS:
            _tensor_parameter(ctx, where, key, text, doc)
        elif key in ("profile", "dynamic") or key in _BACKEND_PARAMETERS:
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                ctx.fail(where, f"not valid YAML: {exc}")
            if key in ("profile", "dynamic"):
                doc[key] = value
            else:
                backend_options[key] = value
        else:
            warn(
                f"{where} is not used by this server (ours: "
                f"{', '.join(_OUR_PARAMETERS + _BACKEND_PARAMETERS + _TENSOR_PARAMETERS)})"
            )
    if "slo_ms" not in doc:
        warn(NO_SLO_NOTE)
        doc["slo_ms"] = DEFAULT_SLO_MS
    if backend_options:
        doc["parameters"] = backend_options
    for tensor in [*doc["inputs"], *doc["outputs"]]:
        # Bounds this server picks for the slot, not the model's: beyond them
        # an item is taken all the same (spilled), as Triton takes it.
        declared = "max_shape" in tensor or "max_bytes" in tensor
        chosen = (-1 in tensor["shape"][1:] and "max_shape" not in tensor) or (
            tensor["datatype"] == "BYTES" and "max_bytes" not in tensor
        )
        if chosen and not declared:
            tensor["elastic"] = True
        if -1 in tensor["shape"][1:] and "max_shape" not in tensor:
            tensor["max_shape"] = default_max_shape(tensor["shape"][1:])
            log.info(
                "model %s: %s %s has no max_shape: bounded at %s (set max_shape to change it)",
                Path(ctx.source).parent.name,
                tensor["name"],
                tensor["shape"][1:],
                tensor["max_shape"],
            )
        if tensor["datatype"] == "BYTES" and "max_bytes" not in tensor:
            tensor["max_bytes"] = DEFAULT_MAX_BYTES


def default_max_shape(dims: list[int]) -> list[int]:
    """Bounds for `dims` (batch dimension left out) with variable ones: each
    -1 the same bound, so that an item holds at most DEFAULT_MAX_ELEMENTS."""
    fixed = 1
    for d in dims:
        if d > 0:
            fixed *= d
    variable = sum(1 for d in dims if d < 0)
    room = max(DEFAULT_MAX_ELEMENTS // max(fixed, 1), 1)
    bound = max(int(room ** (1.0 / variable) + 1e-9), 1)
    return [bound if d < 0 else d for d in dims]


def _unbatched(
    ctx: FieldReader, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]
) -> int:
    """max_batch_size 0 (Triton: no batching; `dims` are the whole shape):
    served one request per execution when every tensor's first dimension
    is 1 or -1 — it becomes the batch dimension, of at most one item."""
    for tensor in [*inputs, *outputs]:
        dims = tensor["shape"][1:]  # _tensor put our batch dimension first
        if not dims or dims[0] not in (1, -1):
            ctx.fail(
                "max_batch_size",
                f"0 (no batching) is served here only when every tensor's first dimension is "
                f"1 or -1 (a request is then a batch of one); {tensor['name']} has dims {dims}",
            )
        tensor["shape"] = [-1, *dims[1:]]
    return 1


def _tensor_parameter(
    ctx: FieldReader, where: str, key: str, text: str, doc: dict[str, Any]
) -> None:
    """`parameters[max_shape]` etc.: {tensor name: value} onto the document's
    tensors (values written without the batch dimension, as `dims`)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        ctx.fail(where, f"not valid YAML: {exc}")
    if not isinstance(value, dict) or not value:
        ctx.fail(where, f'must map tensor names to values, e.g. "{{x: [128]}}", got {text!r}')
    tensors = {t["name"]: t for t in [*doc["inputs"], *doc["outputs"]]}
    for name, entry in value.items():
        if name not in tensors:
            ctx.fail(where, f"no tensor {name!r} (the model has {sorted(tensors)})")
        tensors[name][key] = entry
