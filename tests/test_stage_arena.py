"""A model served as a pipeline of partitions over one shared-memory arena
(app/runtime/stage_arena.py): each stage's executor reads what the previous
one wrote in the request's own slots."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.repository.chain_model import build_chain
from app.repository.config import ModelConfig, TensorSpec
from app.repository.partition import (
    Partitioning,
    load_model,
    run,
    session,
    synthetic_inputs,
    write_pipeline,
)
from app.runtime.arena import Arena
from app.runtime.executor import executor_main
from app.runtime.messages import Load, Loaded, Ran, Run, Stop, Stopped, config_to_dict
from app.runtime.onnx_backend import OnnxBackend
from app.runtime.stage_arena import (
    create_pipeline_arena,
    pipeline_layout,
    request_layout,
    stage_layout,
)
from tests.fakes import our_segments

WIDTH, SIZE = 8, 8


def two_stages(tmp_path: Path) -> tuple[Partitioning, list[ModelConfig]]:
    """The chain (6 blocks) cut as blocks [0, 3) and [3, 6)."""
    model = load_model(build_chain(blocks=4, width=WIDTH, size=SIZE))
    p = Partitioning("chain", model, ("stem.relu", "block0", "block1", "block2", "block3"))
    return p, write_pipeline(p, [(0, 3), (3, p.blocks)], tmp_path)


def whole_outputs(p: Partitioning, inputs: np.ndarray) -> np.ndarray:
    return run(session(p.model), {"input": inputs})["output"]


def test_the_layout_carries_every_tensor_once_and_each_stage_sees_its_own(tmp_path):
    _, stages = two_stages(tmp_path)
    layout = pipeline_layout("chain", stages, capacity=4, name="seg")
    assert list(layout["tensors"]) == ["input", "block1", "output"]
    item = {"input": 3 * SIZE * SIZE * 4, "block1": WIDTH * SIZE * SIZE * 4, "output": 40}
    offsets = [layout["tensors"][n]["offset"] for n in item]
    assert offsets == [0, item["input"], item["input"] + item["block1"]]  # all 64-aligned
    assert layout["slot_nbytes"] == 768 + 2048 + 64 and layout["size"] == 4 * 2880
    first, second = stage_layout(layout, 0), stage_layout(layout, 1)
    assert (first["model"], list(first["inputs"]), list(first["outputs"])) == (
        "chain.blocks0-3",
        ["input"],
        ["block1"],
    )
    assert (second["model"], list(second["inputs"]), list(second["outputs"])) == (
        "chain.blocks3-6",
        ["block1"],
        ["output"],
    )
    assert first["outputs"]["block1"] == second["inputs"]["block1"]  # the same bytes
    daemon = request_layout(layout)
    assert (list(daemon["inputs"]), list(daemon["outputs"])) == (["input"], ["output"])
    with pytest.raises(ValueError, match=r"has stages 0\.\.1, not 2"):
        stage_layout(layout, 2)


def test_stages_that_do_not_chain_are_refused(tmp_path):
    p, (first, second) = two_stages(tmp_path)
    for ranges in ([], [(0, 3)], [(0, 3), (4, 6)], [(1, 6)], [(0, 7)]):
        with pytest.raises(ValueError, match="must follow each other from 0 to 6"):
            write_pipeline(p, ranges, tmp_path)
    with pytest.raises(ValueError, match="no stages"):
        pipeline_layout("chain", [], 1, "seg")
    with pytest.raises(ValueError, match=r"stage 0 \(chain.blocks3-6\) gives \['output'\]"):
        pipeline_layout("chain", [second, first], 1, "seg")
    other = replace(second, inputs=(TensorSpec("block1", "FP32", (-1, WIDTH, SIZE, 1)),))
    with pytest.raises(ValueError, match=r"tensor 'block1' is FP32 .* into stage 1"):
        pipeline_layout("chain", [first, other], 1, "seg")
    with pytest.raises(ValueError, match="stage names repeat"):
        pipeline_layout("chain", [first, first], 1, "seg")


def test_two_stages_in_one_process_give_the_whole_models_outputs(tmp_path):
    p, stages = two_stages(tmp_path)
    daemon, layout = create_pipeline_arena("chain", stages, capacity=6)
    try:
        attached = [Arena.attach(stage_layout(layout, k)) for k in range(2)]
        backends = [OnnxBackend(threads=t) for t in (2, 1)]
        for backend, config in zip(backends, stages, strict=True):
            backend.load(config)
        x = synthetic_inputs(p.model, 3, seed=7)["input"]
        daemon.acquire_rows(2)  # occupied by another request
        slots = daemon.acquire_rows(3)
        daemon.write_rows(slots, {"input": x})
        for arena, backend in zip(attached, backends, strict=True):
            inputs = {n: arena.gather(n, slots) for n in arena.input_names}
            for name, out in backend.run(inputs).items():
                arena.scatter(name, slots, out)
        got = daemon.read_rows(slots)["output"]
        np.testing.assert_allclose(got, whole_outputs(p, x), rtol=1e-4, atol=1e-5)
        for arena in attached:
            arena.close()
    finally:
        daemon.close_and_unlink()
    assert our_segments() == []


def _start_executor(name: str, threads: int) -> tuple[mp.process.BaseProcess, object]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=True)
    device = {"name": name, "kind": "cpu", "index": 0, "threads": threads, "cpus": None}
    process = ctx.Process(target=executor_main, args=(child, device), daemon=True)
    process.start()
    child.close()
    return process, parent


def _answer(conn, kind: type, timeout: float = 60.0):
    assert conn.poll(timeout), f"no {kind.__name__} within {timeout} s"
    msg = conn.recv()
    assert isinstance(msg, kind), msg
    return msg


@pytest.mark.slow
def test_two_executor_processes_run_a_batch_through_both_stages(tmp_path):
    """Stage 0 on an executor with 2 threads, stage 1 on one with 1: the
    daemon's side only writes the inputs, relays Run/Ran and reads the
    outputs; the tensor between the stages stays in the shared slots."""
    p, stages = two_stages(tmp_path)
    daemon, layout = create_pipeline_arena("chain", stages, capacity=8)
    executors = [_start_executor(f"cpu{t}t-0", t) for t in (2, 1)]
    try:
        for k, ((_, conn), config) in enumerate(zip(executors, stages, strict=True)):
            conn.send(Load(k, [config_to_dict(config)], {config.name: stage_layout(layout, k)}))
            loaded = _answer(conn, Loaded)
            assert loaded.errors == {config.name: None}
        x = synthetic_inputs(p.model, 4, seed=11)["input"]
        daemon.acquire_rows(1)
        slots = daemon.acquire_rows(4)
        daemon.write_rows(slots, {"input": x})
        finished = 0.0
        for k, ((_, conn), config) in enumerate(zip(executors, stages, strict=True)):
            conn.send(Run(100 + k, config.name, slots, 0.0))
            ran = _answer(conn, Ran)
            assert (ran.batch_id, ran.error) == (100 + k, None)
            assert ran.started_at >= finished  # stage k + 1 starts after stage k's end
            finished = ran.finished_at
        got = daemon.read_rows(slots)["output"]
        np.testing.assert_allclose(got, whole_outputs(p, x), rtol=1e-4, atol=1e-5)
        daemon.release_rows(slots)
        # a stage run on slots the previous stage has not written gives other answers
        fresh = daemon.acquire_rows(4)
        daemon.write_rows(fresh, {"input": x})
        process, conn = executors[1]
        conn.send(Run(200, stages[1].name, fresh, 0.0))
        assert _answer(conn, Ran).error is None
        assert not np.allclose(daemon.read_rows(fresh)["output"], got)
    finally:
        for process, conn in executors:
            conn.send(Stop())
            _answer(conn, Stopped)
            process.join(10)
        daemon.close_and_unlink()
    assert [process.exitcode for process, _ in executors] == [0, 0]
    assert our_segments() == []
