"""A model's configuration as the server uses it (parsed from config.yaml,
or from a Triton config.pbtxt by app/repository/triton_config.py).

Datatypes are the KServe v2 names (FP32, INT64, ..., BYTES). Shapes include
the batch dimension first as -1, as in Triton's config for models with
batching; another dimension may be -1 too (variable, e.g. a sequence length)
when `max_shape` bounds it.

Shared memory holds every tensor at its bound (`TensorSpec.slot_shape`):
variable dimensions at their `max_shape`, a BYTES element as a 4-byte
length and `max_bytes` bytes (`BYTES_HEADER` + max_bytes). A request's own
shape travels with it in its slot (app/runtime/arena.py). An `elastic`
tensor's bounds size the slot only: a larger item is spilled to a segment
of its own (app/runtime/spill.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# KServe v2 / Triton datatype names → numpy dtypes (BYTES: an object array of
# bytes, one element per string).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
BYTES_HEADER = 4  # a BYTES element's length prefix: 4 bytes, little-endian


@dataclass(frozen=True)
class TensorSpec:
    """One input or output. Every per-dimension tuple is aligned with
    `shape` (batch dimension first); the loader checks how they agree."""

    name: str
    datatype: str  # a key of DATATYPES
    shape: tuple[int, ...]  # batch dimension first, as -1; -1 elsewhere: variable
    # The bound of each variable dimension (-1 at the batch dimension, the
    # fixed size elsewhere); None when no dimension but the batch one varies.
    max_shape: tuple[int, ...] | None = None
    # Inputs: dimensions along which requests of different lengths share a
    # batch, padded with 0 to the batch's longest; () when none.
    pad: tuple[bool, ...] = ()
    # Outputs: per dimension, the (input, dimension) whose length in its
    # request this dimension has (a padded answer is cut back to it); ().
    follows: tuple[tuple[str, int] | None, ...] = ()
    max_bytes: int | None = None  # BYTES: the longest element, in bytes
    # An item beyond its bounds (max_shape, max_bytes) is taken all the same
    # and travels in a shared-memory segment of its own (app/runtime/spill.py):
    # bounds the server chose (a Triton config declares none), not the model's.
    elastic: bool = False

    @property
    def dtype(self) -> np.dtype:
        return DATATYPES[self.datatype]

    @property
    def item_shape(self) -> tuple[int, ...]:
        """Shape of one request's tensor without the batch dimension (-1:
        variable)."""
        return self.shape[1:]

    @property
    def variable(self) -> bool:
        """Whether a dimension other than the batch one varies."""
        return any(d < 0 for d in self.item_shape)

    @property
    def slot_shape(self) -> tuple[int, ...]:
        """One item's shape at its bounds: what a shared-memory slot holds."""
        return self.item_shape if self.max_shape is None else self.max_shape[1:]

    @property
    def padded(self) -> tuple[bool, ...]:
        """`pad` for the item dimensions (batch dimension left out)."""
        return self.pad[1:] if self.pad else (False,) * len(self.item_shape)

    @property
    def element_nbytes(self) -> int:
        """Bytes of one element in shared memory."""
        if self.datatype == "BYTES":
            return BYTES_HEADER + int(self.max_bytes or 0)
        return self.dtype.itemsize

    @property
    def item_nbytes(self) -> int:
        return int(np.prod(self.slot_shape, dtype=np.int64)) * self.element_nbytes


@dataclass(frozen=True)
class ProfileSpec:
    """A latency profile from the config or the profiler cache (milliseconds)."""

    alpha_ms: float | None = None
    beta_ms: float | None = None
    latency_ms: dict[int, float] | None = None  # batch size → ms
    device: str | None = None  # where it was measured (cache only)


@dataclass(frozen=True)
class BatchingSpec:
    """A model's own dynamic-batching settings (Triton's `dynamic_batching`),
    the `triton` policy's per-model options; None: the policy's default."""

    max_queue_delay_ms: float | None = None
    preferred_batch_sizes: tuple[int, ...] = ()
    queue_timeout_ms: float | None = None
    max_queue_size: int | None = None

    def policy_options(self) -> dict[str, object]:
        """The options of app.scheduling.triton.TritonScheduler it sets."""
        options: dict[str, object] = {}
        if self.max_queue_delay_ms is not None:
            options["max_queue_delay_ms"] = self.max_queue_delay_ms
        if self.preferred_batch_sizes:
            options["preferred_batch_sizes"] = self.preferred_batch_sizes
        if self.queue_timeout_ms is not None:
            options["queue_timeout_ms"] = self.queue_timeout_ms
        if self.max_queue_size is not None:
            options["max_queue_size"] = self.max_queue_size
        return options


@dataclass(frozen=True)
class DynamicSpec:
    """A model whose execution time depends on its input (config key
    `dynamic`, app/repository/dynamic_fields.py): its representative inputs,
    `count` probes in the .npz at `probes`, whose alone-times are measured
    at start-up."""

    probes: Path  # absolute
    count: int


@dataclass(frozen=True)
class ModelConfig:
    name: str
    backend: str  # "onnx" | "emulated"
    directory: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    slo_ms: float
    model_file: Path | None = None  # absolute; None for emulated models
    profile: ProfileSpec | None = None
    allow_slo_loosening: bool = False
    # Device kinds/names this model may run on (None: every device of a kind
    # its backend supports).
    devices: tuple[str, ...] | None = None
    version: str = "1"
    description: str = ""
    extra: dict[str, object] = field(default_factory=dict)
    batching: BatchingSpec | None = None  # dynamic_batching, when the config has one
    # Every version of the model that is served (its version policy's
    # selection), in increasing order; () means just `version`.
    versions: tuple[str, ...] = ()
    dynamic: DynamicSpec | None = None  # set: execution time depends on the input

    @property
    def model_name(self) -> str:
        """The model's name as users know it: `name` is the served model's
        key, which for a version other than the default one is
        `version_key(model_name, version)`."""
        return self.name.partition(VERSION_KEY_SEP)[0]

    @property
    def served_versions(self) -> tuple[str, ...]:
        return self.versions or (self.version,)


# A model with several versions serves each as a model of its own. The
# default version (the highest selected, used when a request names none, as
# Triton does) is served under the model's name; every other one under
# `name@version`, a key no model name can be ('@' is not allowed in one), so
# it never collides and is never reachable by a name a user sends.
VERSION_KEY_SEP = "@"


def version_key(name: str, version: str) -> str:
    """The served-model key of `name`'s version `version` (not the default one)."""
    return f"{name}{VERSION_KEY_SEP}{version}"


def shown_model(key: str, quote: bool = True) -> str:
    """A served model's key as users read it: the model's name, and the
    version when the key is not the name (`'simple' version '1'`)."""
    name, _, version = key.partition(VERSION_KEY_SEP)
    if quote:
        return f"{name!r} version {version!r}" if version else repr(name)
    return f"{name} version {version}" if version else name
