"""Requests that differ: each request of a dynamic model (one with a
`latency:` block, app/workloads/dynamic.py) is sent its application as
`app_id`, and, where the application gives `inputs` (an .npz of one array
per model input, a row per variant), one of those rows as its inputs — drawn
from the workload's seed, so that a run sends the same requests again.

Static models keep their one body. A workload without dynamic models needs
none of this (`workload_variants` is None).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from app.workloads.arrivals import Arrivals
from app.workloads.spec import Workload
from bench.loadgen.errors import LoadGenError
from bench.loadgen.targets import ModelTarget

SEED_OFFSET = 0x5EED  # the rows' draws, apart from the arrivals' own


def _rows(path: Path, model: str, app: str) -> list[dict[str, np.ndarray]]:
    """The .npz's request variants: one dict of input → row (batch of one)."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    counts = {len(a) for a in arrays.values()}
    if not arrays or len(counts) != 1 or 0 in counts:
        raise LoadGenError(
            f"model {model!r}, application {app!r}: {path} must hold one array per input, "
            "all with the same number (≥ 1) of rows"
        )
    (count,) = counts
    return [{name: a[i : i + 1] for name, a in arrays.items()} for i in range(count)]


def _body(default: bytes, app: str, inputs: dict[str, np.ndarray] | None) -> bytes:
    doc = json.loads(default)
    doc["app_id"] = app
    if inputs is not None:
        unknown = set(inputs) - set(doc["inputs"])
        if unknown:
            raise LoadGenError(
                f"model {doc['model']!r}: inputs {sorted(unknown)} are not the model's "
                f"({sorted(doc['inputs'])})"
            )
        doc["inputs"] = {**doc["inputs"], **{n: a.tolist() for n, a in inputs.items()}}
    return json.dumps(doc, separators=(",", ":")).encode()


def workload_variants(
    workload: Workload, arrivals: Arrivals, targets: Sequence[ModelTarget]
) -> tuple[list[bytes], np.ndarray] | None:
    """The bodies and which one each arrival sends, or None when no model of
    the workload is dynamic."""
    if arrivals.apps is None or all(m.latency is None for m in workload.models):
        return None
    bodies = [t.body for t in targets]  # body m: model m's own, as without variants
    index: dict[tuple[int, str, int], int] = {}
    rows: dict[tuple[int, str], list[dict[str, np.ndarray]]] = {}
    rng = np.random.default_rng(workload.seed + SEED_OFFSET)
    body_index = np.empty(len(arrivals), dtype=np.int64)
    for i, (m, app) in enumerate(zip(arrivals.model_index, arrivals.apps, strict=True)):
        model, app = workload.models[int(m)], str(app)
        if model.latency is None or not app:
            body_index[i] = int(m)
            continue
        if (int(m), app) not in rows:
            spec = next(a for a in model.latency.apps if a.name == app)
            rows[int(m), app] = [] if spec.inputs is None else _rows(spec.inputs, model.name, app)
        variants = rows[int(m), app]
        row = int(rng.integers(len(variants))) if variants else -1
        key = (int(m), app, row)
        if key not in index:
            index[key] = len(bodies)
            bodies.append(_body(targets[int(m)].body, app, variants[row] if variants else None))
        body_index[i] = index[key]
    return bodies, body_index
