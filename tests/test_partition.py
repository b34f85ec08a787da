"""Cutting an ONNX model into blocks (app/repository/partition.py), the
`chain` model (app/repository/chain_model.py) and block profiles measured on
live CPU device classes (app/repository/block_profile.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.planning.ppipe.profiles import load_profile
from app.repository import block_profile
from app.repository.block_profile import (
    DeviceClass,
    block_seconds,
    cut_bytes,
    prepartition,
    profile_blocks,
    write_profile,
)
from app.repository.bundled import serialize
from app.repository.chain_model import build_chain, chain_config, write_chain
from app.repository.partition import (
    Partitioning,
    PartitionMismatch,
    find_cut_points,
    group_segments,
    load_model,
    load_partitioning,
    partition_by_runtime,
    partition_config,
    run,
    save_partitioning,
    segments,
    session,
    synthetic_inputs,
    verify_chain,
    write_partition,
)

WIDTH, SIZE = 4, 8  # a tiny chain: fast to build, run and time


def tiny_chain(blocks: int = 3) -> onnx.ModelProto:
    return load_model(build_chain(blocks=blocks, width=WIDTH, size=SIZE))


def fixed_timer(monkeypatch: pytest.MonkeyPatch, seconds: float = 1e-3) -> None:
    """Every timed run takes `seconds` (structure, not speed, is tested)."""
    monkeypatch.setattr(block_profile, "_timed", lambda sess, feed, warmup, repeats: seconds)


# ------------------------------------------------------------------ cut points


def test_chain_cut_points_are_between_blocks_never_inside_one():
    cuts = find_cut_points(tiny_chain(3))
    expected = ["stem", "stem.relu"]
    for i in range(3):
        expected += [f"block{i}.sum", f"block{i}"]
    assert [c.tensor for c in cuts] == [*expected, "gap", "flat"]
    # stem conv, its relu, then 5 nodes per block: conv0 relu0 conv1 add relu
    assert [c.position for c in cuts] == [1, 2, 6, 7, 11, 12, 16, 17, 18, 19]


def test_cut_points_skip_constants_and_skip_connections():
    """a is a cut (only a crosses); after b both a and b cross; a Constant
    used late is a weight, not an activation."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32(2))),
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Mul", ["s", "c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    model = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [(c.tensor, c.position) for c in find_cut_points(model)] == [("a", 1), ("s", 4)]
    p = segments(model, "g")
    assert p.blocks == 3
    verify_chain(p)
    # the block after "s" carries its own copy of the constant
    assert {n.op_type for n in p.extract(2, 3).graph.node} == {"Constant", "Mul"}


def test_a_graph_out_of_topological_order_is_refused():
    nodes = [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(ValueError, match="uses 'a' before any node makes it"):
        find_cut_points(helper.make_model(graph))


# ----------------------------------------------------------------- grouping


def test_partition_by_runtime_groups_greedily():
    assert partition_by_runtime([1, 1, 1, 1], 2) == [2, 4]
    assert partition_by_runtime([3, 1, 1, 1], 2) == [1, 4]
    assert partition_by_runtime([1, 1, 1, 3], 2) == [3, 4]
    assert partition_by_runtime([1, 2, 3], 10) == [1, 2, 3]  # fewer segments than blocks
    assert partition_by_runtime([5.0], 1) == [1]
    # the later blocks keep a segment each even when the first is cheap
    assert partition_by_runtime([1, 1, 1, 1, 100], 3) == [3, 4, 5]


def test_partition_by_runtime_balances_many_segments():
    times = np.random.default_rng(3).uniform(1.0, 2.0, 60)
    ends = partition_by_runtime(times, 10)
    assert len(ends) == 10 and ends[-1] == 60 and ends == sorted(set(ends))
    sums = [times[a:b].sum() for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    assert sum(sums) == pytest.approx(times.sum())
    # each block within one segment's worth (≤ 2) of the mean 9.0
    assert max(abs(s - times.sum() / 10) for s in sums) < 2.0


@pytest.mark.parametrize(
    ("times", "blocks", "message"),
    [
        ([], 3, "no segments"),
        ([1.0, 0.0], 2, "finite and > 0"),
        ([1.0, float("nan")], 2, "finite and > 0"),
        ([1.0], 0, "blocks must be ≥ 1"),
    ],
)
def test_partition_by_runtime_rejects_bad_input(times, blocks, message):
    with pytest.raises(ValueError, match=message):
        partition_by_runtime(times, blocks)


# --------------------------------------------------------------- partitions


def test_prepartition_makes_ten_blocks_and_the_chain_gives_the_whole_outputs(monkeypatch):
    fixed_timer(monkeypatch)
    model = tiny_chain(12)  # 2 + 2·12 + 2 = 28 cut points, 29 segments
    whole = segments(model, "chain")
    assert whole.blocks == 29
    p = prepartition(model, "chain", reference=DeviceClass("ref", 1))
    assert p.blocks == 10
    order = [c.tensor for c in find_cut_points(model)]
    assert [order.index(t) for t in p.boundaries] == sorted(order.index(t) for t in p.boundaries)
    # equal segment times: 29 segments → blocks of 3 (the last ones 2 or 3)
    sizes = np.diff([0, *[order.index(t) + 1 for t in p.boundaries], 29])
    assert sizes.sum() == 29 and set(sizes) <= {2, 3, 4}
    verify_chain(p, batch=3)
    # the whole range is the whole model
    feed = synthetic_inputs(model, 2, seed=5)
    want = run(session(model), feed)["output"]
    got = run(session(p.extract(0, p.blocks)), feed)["output"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # blocks [0, 4) then [4, 10), as two partitions of a pipeline
    mid = run(session(p.extract(0, 4)), feed)
    assert list(mid) == [p.boundaries[3]]
    out = run(session(p.extract(4, p.blocks)), mid)["output"]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_fewer_cut_points_give_fewer_blocks(monkeypatch):
    fixed_timer(monkeypatch)
    p = prepartition(tiny_chain(1), "chain", blocks=10)
    assert p.blocks == 7  # stem, stem.relu, block0.sum, block0, gap, flat: 6 cuts
    verify_chain(p)


def test_a_wrong_block_is_named(monkeypatch):
    p = Partitioning("chain", tiny_chain(3), ("stem.relu", "block0", "block1", "block2"))
    extract = Partitioning.extract

    def spoiled(self, start, end):
        model = extract(self, start, end)
        if start == 2:  # block1's first conv: weights doubled
            for t in model.graph.initializer:
                if t.name == "block1.conv0.weight":
                    t.CopyFrom(numpy_helper.from_array(2 * numpy_helper.to_array(t), t.name))
        return model

    monkeypatch.setattr(Partitioning, "extract", spoiled)
    message = "block 2 of 5, fed its own input: tensor 'block1' differs"
    with pytest.raises(PartitionMismatch, match=message):
        verify_chain(p)


def test_boundaries_must_be_cut_points_in_order():
    model = tiny_chain(2)
    with pytest.raises(ValueError, match=r"'block0\.relu0' is not a cut point"):
        Partitioning("chain", model, ("block0.relu0",))
    with pytest.raises(ValueError, match="not distinct and in topological order"):
        Partitioning("chain", model, ("block1", "block0"))
    p = Partitioning("chain", model, ("block0",))
    for start, end in [(0, 0), (1, 3), (-1, 1)]:
        with pytest.raises(ValueError, match=r"block range .* outside its 2 blocks"):
            p.extract(start, end)
    with pytest.raises(ValueError, match="must increase"):
        group_segments(segments(model), [3, 2, 9])


def test_a_saved_partitioning_loads_onto_the_model(tmp_path):
    path = write_chain(tmp_path / "chain", blocks=3, width=WIDTH, size=SIZE)
    p = Partitioning("chain", load_model(path), ("block0", "block2"))
    save_partitioning(p, tmp_path / "chain.json")
    again = load_partitioning(tmp_path / "chain.json", path)
    assert again == p and again.blocks == 3
    (tmp_path / "bad.json").write_text(json.dumps({"boundaries": ["nope"]}))
    with pytest.raises(ValueError, match="'nope' is not a cut point"):
        load_partitioning(tmp_path / "bad.json", path)
    (tmp_path / "worse.json").write_text("[]")
    with pytest.raises(ValueError, match="not a partitioning"):
        load_partitioning(tmp_path / "worse.json", path)


def test_partition_files_and_configs(tmp_path):
    p = Partitioning("chain", tiny_chain(2), ("block0",))
    path = write_partition(p, 1, 2, tmp_path)
    assert path.name == "chain.blocks1-2.onnx"
    config = partition_config(p, 1, 2, path, max_batch_size=4)
    assert config.name == "chain.blocks1-2" and config.model_file == path.resolve()
    assert [(t.name, t.shape) for t in config.inputs] == [("block0", (-1, WIDTH, SIZE, SIZE))]
    assert [(t.name, t.shape) for t in config.outputs] == [("output", (-1, 10))]
    assert onnx.load(str(path)).graph.name == "chain.blocks1-2"


# ---------------------------------------------------------------- the model


def test_chain_model_is_deterministic_and_written_as_a_repository_entry(tmp_path):
    a = serialize(build_chain(blocks=2, width=WIDTH, size=SIZE))
    assert a == serialize(build_chain(blocks=2, width=WIDTH, size=SIZE))
    assert a != serialize(build_chain(1, blocks=2, width=WIDTH, size=SIZE))
    path = write_chain(tmp_path / "chain", blocks=2, width=WIDTH, size=SIZE)
    assert path.read_bytes() == a
    assert "model_file: model.onnx" in (tmp_path / "chain" / "config.yaml").read_text()
    config = chain_config(path, size=SIZE)
    out = run(session(onnx.load(str(path))), synthetic_inputs(load_model(path), 3))["output"]
    assert out.shape == (3, 10) and np.all(np.isfinite(out)) and config.model_file == path
    with pytest.raises(ValueError, match="must be ≥ 1"):
        build_chain(blocks=0)


# ----------------------------------------------------------------- profiles


def test_device_classes_and_their_shares():
    fast = DeviceClass("cpu2t", 2)
    assert fast.shares([1, 2, 3, 4]) == [1, 2] and fast.threads_at(2) == 1
    assert DeviceClass("cpu1t", 1).shares([2, 4]) == [1]
    assert DeviceClass.parse("slow_1:1:2.5") == DeviceClass("slow_1", 1, 2.5)
    with pytest.raises(ValueError, match="letters, digits and '_' only"):
        DeviceClass("cpu-2t", 2)
    with pytest.raises(ValueError, match="threads must be ≥ 1"):
        DeviceClass("c", 0)
    with pytest.raises(ValueError, match="slowdown must be ≥ 1"):
        DeviceClass("c", 1, 0.5)
    with pytest.raises(ValueError, match="share 1/3 is not a whole number of threads"):
        fast.threads_at(3)
    for text in ["c", "c:x", "c:1:fast", "c:1:2:3"]:
        with pytest.raises(ValueError, match="device class"):
            DeviceClass.parse(text)


def test_profiles_are_written_in_the_artifacts_layout_and_read_back(tmp_path, monkeypatch):
    fixed_timer(monkeypatch, 2e-3)
    p = Partitioning("chain", tiny_chain(3), ("stem.relu", "block1", "gap"))
    classes = [DeviceClass("cpu2t", 2), DeviceClass("cpu1t", 1, slowdown=3.0)]
    profile = profile_blocks(p, classes, shares=(1, 2), max_batch=3, warmup=0, repeats=1)
    assert profile.placements == [("cpu1t", 1), ("cpu2t", 1), ("cpu2t", 2)]
    assert profile.latency[("cpu2t", 2)].shape == (4, 3)
    np.testing.assert_allclose(profile.latency[("cpu1t", 1)], 6e-3)  # the slowdown
    item = WIDTH * SIZE * SIZE * 4
    np.testing.assert_array_equal(profile.cut_bytes, [item, item, WIDTH * 4])
    written = write_profile(profile, tmp_path)
    assert sorted(f.name for f in written) == [
        "chain-cpu1t-1.csv",
        "chain-cpu2t-1.csv",
        "chain-cpu2t-2.csv",
        "chain.csv",
    ]
    assert (tmp_path / "block-timing" / "chain-cpu2t-1.csv").read_text().splitlines()[0] == (
        "2000.000,2000.000,2000.000"
    )
    back = load_profile("chain", tmp_path)
    assert back.placements == profile.placements and back.blocks == 4
    for key, table in profile.latency.items():
        np.testing.assert_allclose(back.latency[key], table, atol=1e-9)
    np.testing.assert_array_equal(back.cut_bytes, profile.cut_bytes)
    assert back.partition_latency(1, 3, 2, "cpu1t") == pytest.approx(12e-3)


def test_measured_block_times_have_the_right_shape():
    """A real (tiny) measurement: one row per block, one column per batch."""
    p = Partitioning("chain", tiny_chain(2), ("block0",))
    table = block_seconds(p, DeviceClass("c", 1), batch_sizes=(1, 2), warmup=0, repeats=1)
    assert table.shape == (2, 2) and np.all(table > 0)
    assert list(cut_bytes(p)) == [WIDTH * SIZE * SIZE * 4]
    with pytest.raises(ValueError, match="need max_batch ≥ 1"):
        profile_blocks(p, max_batch=0)
    with pytest.raises(ValueError, match="no device classes"):
        profile_blocks(p, [])
    with pytest.raises(ValueError, match="names repeat"):
        profile_blocks(p, [DeviceClass("c", 1), DeviceClass("c", 2)])


def test_the_command_writes_profiles_load_profile_reads(tmp_path, monkeypatch, capsys):
    fixed_timer(monkeypatch)
    path = write_chain(tmp_path / "src", blocks=4, width=WIDTH, size=SIZE)
    out = tmp_path / "out"
    argv = [str(path), "--out", str(out), "--name", "tiny", "--blocks", "3"]
    argv += ["--class", "fast:2", "--class", "slow:1:2", "--shares", "1,2", "--max-batch", "2"]
    assert block_profile.main(argv) == 0
    profile = load_profile("tiny", out)
    assert profile.blocks == 3
    assert profile.placements == [("fast", 1), ("fast", 2), ("slow", 1)]
    np.testing.assert_allclose(profile.latency[("slow", 1)], 2e-3)
    p = load_partitioning(out / "partitions" / "tiny.json", path)
    assert p.blocks == 3
    assert "tiny: 3 blocks" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "x"], "either an ONNX file or --chain"),
        (["m.onnx", "--chain", "--out", "x"], "either an ONNX file or --chain"),
        (["m.onnx", "--out", "x", "--class", "a-b:1"], "letters, digits"),
        (["m.onnx", "--out", "x", "--reference", "gpu"], "--reference 'gpu' is not one of"),
        (["missing.onnx", "--out", "x"], "is not a file"),
    ],
)
def test_the_command_rejects_bad_arguments(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        block_profile.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
