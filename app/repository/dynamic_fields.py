"""A model config's `dynamic` key: the model's execution time depends on its
input (orloj.txt), and these are the inputs to measure it on.

    dynamic: false                 the default: one ℓ(b) describes the model
    dynamic: true                  the same as {probes: probes.npz}
    dynamic: {probes: FILE}        FILE: an .npz in the model directory

A dynamic model is served with `ModelInfo.dynamic` set
(app/scheduling/model.py's InputDependence): at start-up its latency profile
ℓ(b) is measured as for any model (on synthetic inputs, the same for every
row, so ℓ(b) = c0 + b·x and the fitted intercept is c0), and then its
alone-time on each probe, one request at a time; those times are the prior
of its execution-time histogram (app/server/profiling.py).

The probes file holds one array per probe and input, named
`<probe>/<input>` (`0/tokens`, `1/tokens`, ...; probes numbered from 0 with
no gap), each a batch of one request of the input's datatype and a shape
the config accepts (variable dimensions within `max_shape`). It is checked
when the config loads, and every error names the file, the field and the
array. BYTES inputs cannot be probed (an .npz would need pickled objects);
emulated models have no input to depend on.

In a Triton config.pbtxt: `parameters { key: "dynamic" value { string_value:
"true" } }` (or `"{probes: FILE}"`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.config_fields import FieldReader
from app.repository.config import DynamicSpec, TensorSpec

DEFAULT_PROBES = "probes.npz"
_DYNAMIC_KEYS = frozenset({"probes"})


def parse_dynamic(
    ctx: FieldReader,
    raw: Any,
    backend: str,
    directory: Path,
    inputs: tuple[TensorSpec, ...],
) -> DynamicSpec | None:
    """The `dynamic` key's spec, None for a static model; its probes file is
    read and checked against `inputs`."""
    if raw is None or raw is False:
        return None
    if raw is True:
        filename: Any = DEFAULT_PROBES
    elif isinstance(raw, dict):
        ctx.keys(raw, "dynamic", _DYNAMIC_KEYS, required=("probes",))
        filename = raw["probes"]
    else:
        ctx.fail("dynamic", f"must be true, false or {{probes: FILE}}, got {raw!r}")
    if backend == "emulated":
        ctx.fail("dynamic", "an emulated model has no input its time could depend on")
    path = _probes_path(ctx, filename, directory)
    count = len(check_probes(ctx, load_probes(path, ctx), inputs))
    return DynamicSpec(probes=path, count=count)


def _probes_path(ctx: FieldReader, raw: Any, directory: Path) -> Path:
    where = "dynamic.probes"
    if not isinstance(raw, str) or not raw:
        ctx.fail(where, f"must be a file name relative to the model directory, got {raw!r}")
    rel = Path(raw)
    base = directory.resolve()
    path = (base / rel).resolve()
    if rel.is_absolute() or ".." in rel.parts or not path.is_relative_to(base):
        ctx.fail(where, f"must be a relative path inside {directory}, got {raw!r}")
    if not path.is_file():
        ctx.fail(
            where,
            f"probes file not found: {path} (an .npz of representative inputs, arrays named "
            "<probe>/<input>)",
        )
    return path


def load_probes(path: Path, ctx: FieldReader | None = None) -> list[dict[str, np.ndarray]]:
    """The probes of an .npz file, in order: [{input name: array}, ...].
    ValueError (naming the file) when it is not such a file."""
    ctx = ctx or FieldReader(str(path))
    where = "dynamic.probes"
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError) as exc:
        ctx.fail(where, f"{path} is not a readable .npz without pickled objects: {exc}")
    probes: dict[int, dict[str, np.ndarray]] = {}
    for key, array in arrays.items():
        index, sep, name = key.partition("/")
        if not sep or not index.isdigit() or not name:
            ctx.fail(where, f"{path}: array {key!r} is not named <probe>/<input> (e.g. 0/tokens)")
        probes.setdefault(int(index), {})[name] = array
    if not probes:
        ctx.fail(where, f"{path} holds no probe")
    if sorted(probes) != list(range(len(probes))):
        ctx.fail(
            where, f"{path}: probes must be numbered 0..{len(probes) - 1}, got {sorted(probes)}"
        )
    return [probes[i] for i in range(len(probes))]


def check_probes(
    ctx: FieldReader, probes: list[dict[str, np.ndarray]], inputs: tuple[TensorSpec, ...]
) -> list[dict[str, np.ndarray]]:
    """Each probe: exactly the model's inputs, each a batch of one of the
    input's datatype and an accepted shape."""
    names = sorted(spec.name for spec in inputs)
    for i, probe in enumerate(probes):
        where = f"dynamic.probes[{i}]"
        if sorted(probe) != names:
            ctx.fail(where, f"has inputs {sorted(probe)}; the model's are {names}")
        for spec in inputs:
            array = probe[spec.name]
            what = f"{where}.{spec.name}"
            if spec.datatype == "BYTES":
                ctx.fail(what, "a BYTES input cannot be probed (an .npz holds no bytes objects)")
            if array.dtype != spec.dtype:
                ctx.fail(what, f"datatype {array.dtype} is not the input's {spec.datatype}")
            if array.ndim != len(spec.shape) or array.shape[0] != 1:
                ctx.fail(
                    what,
                    f"shape {list(array.shape)} is not one request of shape {list(spec.shape)} "
                    "(a batch of one first)",
                )
            for d, (n, fixed, bound) in enumerate(
                zip(array.shape[1:], spec.item_shape, spec.slot_shape, strict=True), start=1
            ):
                if (fixed >= 0 and n != fixed) or not 1 <= n <= bound:
                    ctx.fail(
                        what,
                        f"dimension {d} is {n}; the input's shape {list(spec.shape)} "
                        f"(bounds {list(spec.max_shape or spec.shape)}) does not allow it",
                    )
    return probes
