"""One shared-memory arena for a model served as a pipeline of partitions:
every stage's executor reads its inputs from, and writes its outputs to, the
request's own slots, so a tensor handed from stage k to stage k + 1 never
leaves shared memory and never passes through the daemon.

Layout. A slot holds every tensor the pipeline passes along, one item's
worth each, at fixed 64-byte aligned offsets (app/runtime/arena.py's layout
rules, computed by its `compute_layout`)::

    slot k: [model inputs | cut tensor 1 | ... | cut tensor D−1 | model outputs]

Stage s's executor attaches the same segment through a *stage layout*: a
plain arena layout whose `inputs` are the tensors before cut s and whose
`outputs` those after it, at their offsets in the shared slot. To the
executor that is an ordinary model arena: `Load(configs=[stage s's
partition config], layouts={its name: stage_layout(layout, s)})` and
`Run(batch_id, its name, slots, start_at)`, answered `Ran`, run it with no
new message and no change to the executor: it gathers its inputs from the
slots, runs the partition, scatters its outputs into the same slots.

The daemon's part, per batch of a D-stage pipeline: take n slots for the
request (`acquire_rows`) and write its inputs (`write_rows`, the one copy
in, as for a whole model); send stage 0's Run to an executor of stage 0's
pool; on its Ran, send stage 1's Run, over the same slots, to an executor
of the next pool; and so on; after the last stage's Ran, read the outputs
(`read_rows`, the one copy out) and release the slots. The slots belong to
the request from its first stage to its last, whichever executors run it.
A stage must not start before the previous one has finished writing: the
daemon sends the next Run only on the previous Ran (the reservation plan
knows when that will be; a Run's `start_at` may still hold it later).

Ownership as for any arena: the daemon creates the segment and is the only
side that unlinks it; executors attach and close.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

from app.repository.config import ModelConfig
from app.runtime.arena import SEGMENT_PREFIX, Arena, compute_layout


def _check_chain(model: str, stages: Sequence[ModelConfig]) -> None:
    if not stages:
        raise ValueError(f"pipeline {model!r}: no stages")
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"pipeline {model!r}: stage names repeat: {names}")
    for k in range(len(stages) - 1):
        given = {t.name: t for t in stages[k].outputs}
        taken = {t.name: t for t in stages[k + 1].inputs}
        if set(given) != set(taken):
            raise ValueError(
                f"pipeline {model!r}: stage {k} ({names[k]}) gives {sorted(given)} but stage "
                f"{k + 1} ({names[k + 1]}) takes {sorted(taken)}"
            )
        for name, spec in given.items():
            other = taken[name]
            if (spec.datatype, spec.slot_shape) != (other.datatype, other.slot_shape):
                raise ValueError(
                    f"pipeline {model!r}: tensor {name!r} is {spec.datatype} "
                    f"{list(spec.shape)} out of stage {k} but {other.datatype} "
                    f"{list(other.shape)} into stage {k + 1}"
                )


def pipeline_layout(
    model: str, stages: Sequence[ModelConfig], capacity: int, name: str
) -> dict[str, Any]:
    """The plain-dict layout of a pipeline arena for `stages` (partition
    configs in order: each stage's outputs are the next one's inputs),
    `capacity` slots, segment `name`. No segment is created."""
    _check_chain(model, stages)
    carried = [*stages[0].inputs, *(t for stage in stages for t in stage.outputs)]
    every = ModelConfig(
        name=model,
        backend="onnx",
        directory=Path("."),
        inputs=tuple(carried),
        outputs=(),
        max_batch_size=max(s.max_batch_size for s in stages),
        slo_ms=stages[0].slo_ms,
    )
    layout = compute_layout(every, capacity, name)
    return {
        "name": name,
        "model": model,
        "capacity": layout["capacity"],
        "slot_nbytes": layout["slot_nbytes"],
        "size": layout["size"],
        "tensors": layout["inputs"],
        "stages": [
            {
                "model": stage.name,
                "inputs": [t.name for t in stage.inputs],
                "outputs": [t.name for t in stage.outputs],
            }
            for stage in stages
        ],
    }


def _arena_layout(
    layout: Mapping[str, Any], model: str, inputs: Sequence[str], outputs: Sequence[str]
) -> dict[str, Any]:
    tensors = layout["tensors"]
    return {
        "name": layout["name"],
        "model": model,
        "capacity": layout["capacity"],
        "slot_nbytes": layout["slot_nbytes"],
        "size": layout["size"],
        "inputs": {n: dict(tensors[n]) for n in inputs},
        "outputs": {n: dict(tensors[n]) for n in outputs},
    }


def stage_layout(layout: Mapping[str, Any], stage: int) -> dict[str, Any]:
    """The arena layout stage `stage`'s executor attaches (`Arena.attach`),
    named after that stage's partition."""
    stages = layout["stages"]
    if not 0 <= stage < len(stages):
        raise ValueError(
            f"pipeline {layout['model']!r} has stages 0..{len(stages) - 1}, not {stage}"
        )
    entry = stages[stage]
    return _arena_layout(layout, entry["model"], entry["inputs"], entry["outputs"])


def partition_view(
    layout: Mapping[str, Any], model: str, inputs: Sequence[str], outputs: Sequence[str]
) -> dict[str, Any]:
    """The arena layout of partition `model` taking tensors `inputs` and
    giving `outputs` of the pipeline arena: a partition spanning several of
    its stages (a model served by pipelines cut at different blocks shares
    one arena cut at all of them)."""
    missing = [n for n in (*inputs, *outputs) if n not in layout["tensors"]]
    if missing:
        raise ValueError(f"pipeline arena of {layout['model']!r} carries no tensor {missing}")
    return _arena_layout(layout, model, inputs, outputs)


def request_layout(layout: Mapping[str, Any]) -> dict[str, Any]:
    """The daemon's view: the model's inputs and outputs (first stage's
    inputs, last stage's outputs)."""
    stages = layout["stages"]
    return _arena_layout(layout, layout["model"], stages[0]["inputs"], stages[-1]["outputs"])


def create_pipeline_arena(
    model: str, stages: Sequence[ModelConfig], capacity: int
) -> tuple[Arena, dict[str, Any]]:
    """Create (daemon side) the segment of a pipeline arena. Returns the
    daemon's Arena over it (the owner: acquire_rows, write_rows, read_rows,
    release_rows, close_and_unlink) and the pipeline layout, from which
    `stage_layout` gives each stage's."""
    safe = re.sub(r"[^A-Za-z0-9]", "", model)[:16] or "m"
    name = f"{SEGMENT_PREFIX}{os.getpid()}_{safe}_p{secrets.token_hex(4)}"
    layout = pipeline_layout(model, stages, capacity, name)
    shm = shared_memory.SharedMemory(name=name, create=True, size=layout["size"])
    try:
        return Arena(shm, request_layout(layout), owner=True), layout
    except BaseException:
        shm.close()
        shm.unlink()
        raise
