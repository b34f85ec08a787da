"""The model repository: config parsing, bundled models, profile cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from app.repository import BUNDLED_REPOSITORY, bundled
from app.repository.config import ModelConfig, ProfileSpec
from app.repository.files import file_sha256
from app.repository.loader import load_model_config, load_repository, validate_model_name
from app.repository.profiles import (
    fit_linear,
    latency_profile,
    monotone_table,
    profile_cache_path,
    read_profile_cache,
    sanitize_device,
    write_profile_cache,
)
from app.repository.signatures import onnx_signature, ort_signature, signature_problems

REPO_MODELS = BUNDLED_REPOSITORY
EMULATED = ["bert-emulated", "densenet121-emulated", "efficientnetb3-emulated", "resnet50-emulated"]
DYNAMIC = ["earlyexit", "earlyexit-wide", "encoder"]


def _session(path_or_bytes) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    src = str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _write_model(root: Path, name: str, doc: dict, model_bytes: bytes | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(yaml.safe_dump(doc))
    if model_bytes is not None:
        (d / "model.onnx").write_bytes(model_bytes)
    return d


def _onnx_doc(**overrides) -> dict:
    doc = {
        "backend": "onnx",
        "model_file": "model.onnx",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [8]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 8]}],
        "max_batch_size": 16,
        "slo_ms": 50,
    }
    doc.update(overrides)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the bundled configs (no generated files) in a tmp dir."""
    root = tmp_path / "models"
    for cfg in REPO_MODELS.glob("*/config.yaml"):
        (root / cfg.parent.name).mkdir(parents=True)
        shutil.copy(cfg, root / cfg.parent.name / "config.yaml")
    return root


@pytest.fixture(scope="module")
def small_mlp() -> bytes:
    return bundled.serialize(bundled.build_mlp(width=8, layers=4, seed=0))


# --------------------------------------------------------------------------- parsing


def test_config_parses_and_normalises_shapes(tmp_path: Path, small_mlp: bytes) -> None:
    d = _write_model(tmp_path, "m1", _onnx_doc(description="hi", version=3), small_mlp)
    cfg = load_model_config(d)
    assert isinstance(cfg, ModelConfig)
    assert cfg.name == "m1" and cfg.backend == "onnx"
    assert cfg.model_file == (d / "model.onnx").resolve()
    assert cfg.inputs[0].shape == (-1, 8) and cfg.outputs[0].shape == (-1, 8)
    assert cfg.inputs[0].item_shape == (8,) and cfg.inputs[0].item_nbytes == 32
    assert cfg.max_batch_size == 16 and cfg.slo_ms == 50.0
    assert cfg.allow_slo_loosening is False and cfg.devices is None and cfg.profile is None
    assert cfg.version == "3" and cfg.description == "hi"


def test_profile_and_devices_parse(tmp_path: Path, small_mlp: bytes) -> None:
    doc = _onnx_doc(profile={"latency_ms": {1: 2.0, 8: 4.0}}, devices=["cpu"])
    cfg = load_model_config(_write_model(tmp_path, "m", doc, small_mlp))
    assert cfg.profile == ProfileSpec(latency_ms={1: 2.0, 8: 4.0})
    assert cfg.devices == ("cpu",)
    prof = latency_profile(cfg, "cpu-2t")
    assert prof is not None and prof.max_batch == 16
    assert prof.latency(1) == pytest.approx(0.002) and prof.latency(8) == pytest.approx(0.004)


def test_bundled_configs_all_parse(repo: Path) -> None:
    # Without the generated files the ONNX models are unavailable, the
    # emulated ones load; then building the files makes everything load.
    index = load_repository(repo)
    assert sorted(index.models) == EMULATED
    assert sorted(index.errors) == [
        "cnn",
        "earlyexit",
        "earlyexit-wide",
        "encoder",
        "mlp",
        "torchcnn",
    ]
    assert "model file not found" in index.errors["mlp"]
    (repo / "mlp" / "model.onnx").write_bytes(b"placeholder")  # not the 256 MiB one
    (repo / "torchcnn" / "model.pt").write_bytes(b"placeholder")  # torch may be missing
    from app.repository import dynamic_models

    wide = repo / "earlyexit-wide"
    (wide / "model.onnx").write_bytes(b"placeholder")  # not the 64 MiB head
    (wide / "probes.npz").write_bytes(
        dynamic_models.probes_bytes(dynamic_models.probe_inputs("earlyexit-wide"))
    )
    assert bundled.ensure_bundled_models(repo, ["cnn", "earlyexit", "encoder"]) == [
        "cnn/model.onnx",
        "earlyexit/model.onnx",
        "earlyexit/probes.npz",
        "encoder/model.onnx",
        "encoder/probes.npz",
    ]
    index = load_repository(repo)
    assert index.errors == {}
    assert sorted(index.models) == sorted([*DYNAMIC, "cnn", "mlp", "torchcnn", *EMULATED])
    assert [index.models[n].dynamic is not None for n in DYNAMIC] == [True, True, True]
    mlp = index.models["mlp"]
    assert mlp.inputs[0].name == "input" and mlp.inputs[0].shape == (-1, 4096)
    assert mlp.outputs[0].shape == (-1, 4096) and mlp.profile is None
    r50 = index.models["resnet50-emulated"]
    assert r50.backend == "emulated" and r50.model_file is None
    assert r50.profile == ProfileSpec(alpha_ms=2.050, beta_ms=5.378)
    assert r50.slo_ms == 27 and r50.devices == ("emulated",)
    prof = latency_profile(r50, "emulated")
    assert prof is not None and prof.latency(4) == pytest.approx((2.050 * 4 + 5.378) / 1000)
    gains = sorted(
        index.models[n].profile.beta_ms / index.models[n].profile.alpha_ms for n in EMULATED
    )
    assert gains[0] < 0.1 and gains[-1] > 5  # a spread of batching gains
    rows = {r["name"]: r for r in index.index()}
    assert rows["cnn"]["state"] == "READY" and len(rows) == 10


def test_committed_repository_lists_every_bundled_model() -> None:
    names = {p.parent.name for p in REPO_MODELS.glob("*/config.yaml")}
    assert names == {"mlp", "cnn", "torchcnn", *DYNAMIC, *EMULATED}
    ignored = (REPO_MODELS / ".gitignore").read_text().split()
    for gen in bundled.GENERATED:
        assert f"/{gen.relpath}" in ignored


# --------------------------------------------------------------------------- bundled models


def test_cnn_runs_in_onnxruntime_and_matches_config(repo: Path) -> None:
    built = bundled.ensure_bundled_models(repo, ["cnn"])
    assert built == ["cnn/model.onnx"]
    cfg = load_model_config(repo / "cnn")
    size = cfg.model_file.stat().st_size
    assert size < 4 * 2**20
    sess = _session(cfg.model_file)
    assert signature_problems(cfg, *ort_signature(sess)) == []
    assert signature_problems(cfg, *onnx_signature(cfg.model_file)) == []
    x = np.random.default_rng(0).standard_normal((5, 3, 32, 32), dtype=np.float32)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == (5, 10) and y.dtype == np.float32 and np.isfinite(y).all()
    # Batched and one-by-one agree (the batch dimension is really dynamic).
    (y0,) = sess.run(None, {"input": x[:1]})
    np.testing.assert_allclose(y0, y[:1], rtol=1e-4, atol=1e-5)


def test_mlp_builder_reduced_width_runs() -> None:
    model = bundled.build_mlp(width=64, layers=4, seed=3)
    sess = _session(bundled.serialize(model))
    x = np.random.default_rng(1).standard_normal((7, 64), dtype=np.float32)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == (7, 64) and np.isfinite(y).all()
    assert 0.05 < float(np.abs(y).std()) < 20  # He init keeps activations O(1)
    inputs, outputs = ort_signature(sess)
    assert inputs == [("input", "FP32", [None, 64])]
    assert outputs == [("output", "FP32", [None, 64])]
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Relu"] * 3 + ["Gemm"]


@pytest.mark.parametrize("splits", [2, 5, 64])
def test_split_mlp_computes_the_unsplit_function(splits: int) -> None:
    whole = _session(bundled.serialize(bundled.build_mlp(width=64, layers=3, seed=4)))
    model = bundled.build_mlp(width=64, layers=3, seed=4, splits=splits)
    x = np.random.default_rng(2).standard_normal((5, 64), dtype=np.float32)
    (expected,) = whole.run(None, {"input": x})
    (y,) = _session(bundled.serialize(model)).run(None, {"input": x})
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Gemm") == 3 * splits and ops.count("Relu") == 2 * splits
    assert ops.count("Concat") == 3 and len(ops) == 5 * splits + 3
    widths = {t.dims[1] for t in model.graph.initializer if t.name.endswith(".weight")}
    assert widths <= {64 // splits, -(-64 // splits)}  # chunks differ by at most 1 column


@pytest.mark.parametrize("splits", [2, 4, 32])
def test_split_cnn_computes_the_unsplit_function(splits: int) -> None:
    whole = _session(bundled.serialize(bundled.build_cnn(seed=0)))
    model = bundled.build_cnn(seed=0, splits=splits)
    x = np.random.default_rng(3).standard_normal((3, 3, 32, 32), dtype=np.float32)
    (expected,) = whole.run(None, {"input": x})
    (y,) = _session(bundled.serialize(model)).run(None, {"input": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 5 * splits and ops.count("Relu") == 5 * splits
    assert ops.count("Concat") == 5 and ops.count("Gemm") == 1


def test_splits_must_fit_the_narrowest_layer() -> None:
    with pytest.raises(ValueError, match="splits"):
        bundled.build_mlp(width=8, splits=9)
    with pytest.raises(ValueError, match="splits"):
        bundled.build_cnn(splits=0)


def test_bundled_onnx_models_are_split_and_versioned() -> None:
    for name in ("mlp", "cnn"):
        gen = bundled.generated(name)
        assert gen is not None and gen.version == bundled.BUILDER_VERSION
        assert gen.unsplit is not None
    assert bundled.MLP_SPLITS > 1  # cnn: see the module docstring
    cnn = bundled.onnx.load_from_string(bundled.generated("cnn").build())
    assert sum(n.op_type == "Conv" for n in cnn.graph.node) == 5 * bundled.CNN_SPLITS
    assert cnn.producer_version == bundled.BUILDER_VERSION


def test_onnx_producer_reads_the_head_only(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    model = bundled.build_mlp(width=8, seed=0)
    model.producer_version = "7"
    path.write_bytes(bundled.serialize(model))
    assert bundled.onnx_producer(path) == (bundled.PRODUCER, "7")
    # The weights after the head are never read: truncating them changes nothing.
    path.write_bytes(bundled.serialize(model)[:200])
    assert bundled.onnx_producer(path) == (bundled.PRODUCER, "7")
    path.write_bytes(b"placeholder")
    assert bundled.onnx_producer(path) is None
    path.write_bytes(b"")
    assert bundled.onnx_producer(path) is None


def test_stale_generated_file_is_rebuilt(repo: Path) -> None:
    # A cnn/model.onnx generated before the split (builder version 1) is
    # replaced by the current one on the next ensure, then kept.
    target = repo / "cnn" / "model.onnx"
    old = bundled.build_cnn(seed=0)
    old.producer_version = "1"
    target.write_bytes(bundled.serialize(old))
    assert bundled.ensure_bundled_models(repo, ["cnn"]) == ["cnn/model.onnx"]
    assert bundled.onnx_producer(target) == (bundled.PRODUCER, bundled.BUILDER_VERSION)
    assert target.read_bytes() == bundled.generated("cnn").build()
    assert bundled.ensure_bundled_models(repo, ["cnn"]) == []


def test_a_users_own_model_file_is_kept(repo: Path) -> None:
    target = repo / "cnn" / "model.onnx"
    theirs = bundled.build_cnn(seed=1)
    theirs.producer_name = "someone else"
    target.write_bytes(bundled.serialize(theirs))
    data = target.read_bytes()
    assert bundled.ensure_bundled_models(repo, ["cnn"]) == []
    assert target.read_bytes() == data


def test_builds_are_deterministic(tmp_path: Path) -> None:
    assert bundled.serialize(bundled.build_cnn(seed=0)) == bundled.serialize(bundled.build_cnn(0))
    a = bundled.serialize(bundled.build_mlp(width=32, seed=5))
    assert a == bundled.serialize(bundled.build_mlp(width=32, seed=5))
    assert a != bundled.serialize(bundled.build_mlp(width=32, seed=6))


def test_ensure_is_idempotent_and_atomic(repo: Path, tmp_path: Path) -> None:
    first = bundled.ensure_bundled_models(repo, ["cnn"])
    target = repo / "cnn" / "model.onnx"
    data, mtime = target.read_bytes(), target.stat().st_mtime_ns
    assert first == ["cnn/model.onnx"]
    assert bundled.ensure_bundled_models(repo, ["cnn"]) == []
    assert target.stat().st_mtime_ns == mtime
    assert bundled.ensure_bundled_models(repo, ["cnn"], force=True) == ["cnn/model.onnx"]
    assert target.read_bytes() == data
    assert not list((repo / "cnn").glob(".*.tmp"))
    # A repository without the bundled model directories gets nothing built.
    other = tmp_path / "other"
    other.mkdir()
    assert bundled.ensure_bundled_models(other) == []
    assert list(other.iterdir()) == []


def test_cli_builds_missing_files(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bundled.main(["--root", str(repo), "cnn"]) == 0
    assert "cnn/model.onnx" in capsys.readouterr().out
    assert bundled.main(["--root", str(repo), "cnn"]) == 0
    assert "nothing" in capsys.readouterr().out


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"colour": "red"}, "top level: unknown key(s) ['colour']"),
        ({"backend": "tensorrt"}, "backend: unknown backend 'tensorrt'"),
        ({"slo_ms": None}, "top level: missing required key 'slo_ms'"),
        ({"slo_ms": 0}, "slo_ms: must be > 0, got 0"),
        ({"slo_ms": -5}, "slo_ms: must be > 0"),
        ({"max_batch_size": 0}, "max_batch_size: must be ≥ 1, got 0"),
        ({"max_batch_size": 2.5}, "max_batch_size: must be an integer"),
        ({"model_file": None}, "model_file: missing required key 'model_file'"),
        ({"model_file": "nope.onnx"}, "model_file: model file not found"),
        ({"model_file": "../other/model.onnx"}, "model_file: must be a relative path inside"),
        ({"model_file": "/etc/passwd"}, "model_file: must be a relative path inside"),
        (
            {"inputs": [{"name": "input", "datatype": "FLOAT", "shape": [8]}]},
            "inputs[0] (input).datatype: unknown datatype 'FLOAT'",
        ),
        (
            {"inputs": [{"name": "input", "datatype": "FP32", "shape": [8, 0]}]},
            "inputs[0] (input).shape: dimension 0 in [8, 0] must be a positive integer",
        ),
        (
            {"outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, -1]}]},
            "outputs[0] (y).max_shape: shape [-1, -1] has variable dimension(s) [1]: "
            "add max_shape, their bounds (e.g. max_shape: [-1, 128])",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1]}]},
            "inputs[0] (t).max_bytes: a BYTES tensor needs max_bytes, its longest element",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8], "max_bytes": 4}]},
            "inputs[0] (x).max_bytes: only BYTES tensors have max_bytes, this one is FP32",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1], "max_shape": [0]}]},
            "inputs[0] (x).max_shape: dimension 1 is variable: its bound must be ≥ 1, got 0",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8], "pad": [True]}]},
            "inputs[0] (x).pad: dimension(s) [1] are fixed in shape [-1, 8]: only -1 pads",
        ),
        (
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1], "max_shape": [9]}],
                "outputs": [
                    {
                        "name": "y",
                        "datatype": "FP32",
                        "shape": [-1, -1],
                        "max_shape": [9],
                        "follows": ["x:1"],
                    }
                ],
            },
            "outputs[0] (y).follows: dimension 1: input 'x' has no padded dimension 1",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "dims": [2]}]},
            "inputs[0]: unknown key(s) ['dims']",
        ),
        (
            {"inputs": [{"name": "x", "datatype": "FP32"}]},
            "inputs[0]: missing required key 'shape'",
        ),
        (
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "shape": [2]},
                    {"name": "x", "datatype": "FP32", "shape": [2]},
                ]
            },
            "inputs[1].name: duplicate tensor name 'x'",
        ),
        ({"inputs": []}, "inputs: must be a non-empty list"),
        ({"allow_slo_loosening": "yes"}, "allow_slo_loosening: must be true or false"),
        ({"profile": {"alpha_ms": 1.0}}, "profile: needs both alpha_ms and beta_ms"),
        (
            {"profile": {"alpha_ms": 1, "beta_ms": 2, "latency_ms": {1: 3}}},
            "profile: give either alpha_ms/beta_ms or latency_ms, not both",
        ),
        ({"profile": {"latency_ms": {1: 5.0, 4: 3.0}}}, "profile.latency_ms: latency table"),
        ({"profile": {"latency_ms": {0: 5.0}}}, "profile.latency_ms: batch size 0 must be"),
        ({"profile": {"alpha_ms": -1, "beta_ms": 2}}, "profile.alpha_ms: must be ≥ 0"),
        ({"devices": []}, "devices: must be a non-empty list"),
        ({"devices": ["cpu", 3]}, "devices[1]: must be a non-empty string"),
    ],
)
def test_bad_config_errors_name_file_and_field(
    tmp_path: Path, small_mlp: bytes, overrides: dict, message: str
) -> None:
    doc = _onnx_doc()
    for k, v in overrides.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    d = _write_model(tmp_path, "bad", doc, small_mlp)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model.onnx").write_bytes(small_mlp)
    with pytest.raises(ValueError) as err:
        load_model_config(d)
    text = str(err.value)
    assert text.startswith(f"{d / 'config.yaml'}: "), text
    assert message in text, text


def test_emulated_rejects_model_file_and_yaml_errors(tmp_path: Path) -> None:
    doc = {
        "backend": "emulated",
        "model_file": "x.onnx",
        "inputs": [{"name": "i", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "o", "datatype": "FP32", "shape": [4]}],
        "max_batch_size": 4,
        "slo_ms": 10,
    }
    d = _write_model(tmp_path, "emu", doc)
    with pytest.raises(ValueError, match="model_file: emulated models have no model file"):
        load_model_config(d)
    (d / "config.yaml").write_text("backend: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_model_config(d)
    (d / "config.yaml").write_text("")
    with pytest.raises(ValueError, match="the file is empty"):
        load_model_config(d)
    (d / "config.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match="top level: must be a mapping, got list"):
        load_model_config(d)


def test_bad_model_does_not_stop_the_others(tmp_path: Path, small_mlp: bytes) -> None:
    root = tmp_path / "repo"
    _write_model(root, "good", _onnx_doc(), small_mlp)
    _write_model(root, "bad", _onnx_doc(slo_ms=-1), small_mlp)
    _write_model(root, "nofile", _onnx_doc())
    (root / "not-a-model").mkdir()  # no config.yaml: ignored
    (root / "README.md").write_text("notes")
    index = load_repository(root)
    assert list(index.models) == ["good"]
    assert sorted(index.errors) == ["bad", "nofile"]
    assert "slo_ms: must be > 0" in index.errors["bad"]
    assert "model file not found" in index.errors["nofile"]
    rows = index.index()
    assert [r["state"] for r in rows] == ["UNAVAILABLE", "READY", "UNAVAILABLE"]
    assert rows[0]["reason"] == index.errors["bad"]
    with pytest.raises(ValueError, match="is not a directory"):
        load_repository(tmp_path / "missing")


@pytest.mark.parametrize("name", ["..", ".", "a..b", "a/b", "a b", "", "naïve", "x;rm"])
def test_unsafe_model_names_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="invalid model name"):
        validate_model_name(name)


def test_good_model_names_accepted() -> None:
    for name in ("mlp", "resnet50-emulated", "model_v1.2", "A-b_c.d"):
        assert validate_model_name(name) == name


def test_repository_rejects_bad_directory_name(tmp_path: Path, small_mlp: bytes) -> None:
    root = tmp_path / "repo"
    _write_model(root, "has space", _onnx_doc(), small_mlp)
    index = load_repository(root)
    assert index.models == {}
    assert "invalid model name 'has space'" in index.errors["has space"]


def test_model_file_symlink_out_of_directory_rejected(tmp_path: Path, small_mlp: bytes) -> None:
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(small_mlp)
    d = _write_model(tmp_path, "sym", _onnx_doc(model_file="link.onnx"))
    (d / "link.onnx").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the model directory"):
        load_model_config(d)


def test_signature_problems_report_mismatches(tmp_path: Path, small_mlp: bytes) -> None:
    doc = _onnx_doc(
        inputs=[{"name": "input", "datatype": "FP16", "shape": [9]}],
        outputs=[{"name": "logits", "datatype": "FP32", "shape": [8]}],
    )
    cfg = load_model_config(_write_model(tmp_path, "m", doc, small_mlp))
    problems = signature_problems(cfg, *onnx_signature(cfg.model_file))
    assert "input 'input': config says FP16, model has FP32" in problems
    assert "input 'input': config shape [-1, 9], model shape [-1, 8]" in problems
    assert any("output 'logits' is not in the model" in p for p in problems)


# --------------------------------------------------------------------------- profiles


def test_fit_linear_exact() -> None:
    table = {b: 2.05 * b + 5.378 for b in (1, 2, 4, 8, 16, 32)}
    alpha, beta, r2 = fit_linear(table)
    assert alpha == pytest.approx(2.05, rel=1e-12)
    assert beta == pytest.approx(5.378, rel=1e-12)
    assert r2 == pytest.approx(1.0, abs=1e-12)
    assert fit_linear({4: 8.0}) == (2.0, 0.0, 1.0)
    assert fit_linear({1: 3.0, 2: 3.0}) == pytest.approx((0.0, 3.0, 1.0))
    _, _, r2_noisy = fit_linear({1: 1.0, 2: 5.0, 3: 2.0, 4: 6.0})
    assert 0 < r2_noisy < 1
    with pytest.raises(ValueError):
        fit_linear({})


def test_sanitize_device() -> None:
    assert sanitize_device("cpu-2t") == "cpu-2t"
    assert sanitize_device("cuda:0") == "cuda-0"
    assert sanitize_device("../../etc") == "etc"
    with pytest.raises(ValueError):
        sanitize_device("///")


def test_profile_cache_round_trip_and_staleness(tmp_path: Path, small_mlp: bytes) -> None:
    d = _write_model(tmp_path, "m", _onnx_doc(), small_mlp)
    cfg = load_model_config(d)
    cache = tmp_path / "cache"
    assert read_profile_cache(cfg, "cpu-2t", cache) is None
    assert latency_profile(cfg, "cpu-2t", cache) is None
    table = {1: 11.5, 8: 15.0, 16: 20.0}
    alpha, beta, r2 = fit_linear(table)
    path = write_profile_cache(
        cfg, "cpu-2t", table, fit={"alpha_ms": alpha, "beta_ms": beta, "r2": r2}, cache_dir=cache
    )
    # Named after the model, its file's content and the device; not in the repository.
    key = file_sha256(d / "model.onnx")[:16]
    assert path == cache / f"m.{key}.cpu-2t.json" == profile_cache_path(cfg, "cpu-2t", cache)
    assert not list(d.glob("*.json"))
    doc = json.loads(path.read_text())
    assert doc["device"] == "cpu-2t" and doc["model"] == "m"
    assert doc["onnxruntime_version"] == ort.__version__
    assert len(doc["model_sha256"]) == 64 and doc["measured_at"] and doc["device_description"]
    assert doc["fit"]["r2"] == pytest.approx(r2)

    spec = read_profile_cache(cfg, "cpu-2t", cache)
    assert spec == ProfileSpec(alpha_ms=alpha, beta_ms=beta, latency_ms=table, device="cpu-2t")
    assert read_profile_cache(cfg, "cuda-0", cache) is None  # other device: nothing cached
    prof = latency_profile(cfg, "cpu-2t", cache)
    assert prof is not None and prof.latency(8) == pytest.approx(0.015)
    assert prof.max_batch == cfg.max_batch_size

    # A device name with odd characters lands in a sanitised file name.
    p2 = write_profile_cache(
        cfg, "cuda:0", {1: 1.0}, fit={"alpha_ms": 1.0, "beta_ms": 0.0}, cache_dir=cache
    )
    assert p2.name == f"m.{key}.cuda-0.json"
    assert read_profile_cache(cfg, "cuda:0", cache).latency_ms == {1: 1.0}

    # The model file changes: another key, nothing cached for it.
    (d / "model.onnx").write_bytes(bundled.serialize(bundled.build_mlp(width=9, seed=1)))
    assert profile_cache_path(cfg, "cpu-2t", cache) != path
    assert read_profile_cache(cfg, "cpu-2t", cache) is None
    assert latency_profile(cfg, "cpu-2t", cache) is None

    # A corrupt cache file is ignored, not fatal.
    path = profile_cache_path(cfg, "cpu-2t", cache)
    path.write_text("{not json")
    assert read_profile_cache(cfg, "cpu-2t", cache) is None


def test_config_profile_wins_over_cache(tmp_path: Path, small_mlp: bytes) -> None:
    doc = _onnx_doc(profile={"alpha_ms": 1.0, "beta_ms": 10.0})
    cfg = load_model_config(_write_model(tmp_path, "m", doc, small_mlp))
    fit = {"alpha_ms": 100.0, "beta_ms": 0.0}
    write_profile_cache(cfg, "cpu", {1: 100.0}, fit=fit, cache_dir=tmp_path)
    prof = latency_profile(cfg, "cpu", tmp_path)
    assert prof is not None and prof.latency(1) == pytest.approx(0.011)


def test_noisy_cached_table_is_made_monotone(tmp_path: Path, small_mlp: bytes) -> None:
    cfg = load_model_config(_write_model(tmp_path, "m", _onnx_doc(), small_mlp))
    noisy = {1: 10.0, 8: 14.0, 12: 13.5, 16: 18.0}
    assert monotone_table(noisy) == {1: 10.0, 8: 14.0, 12: 14.0, 16: 18.0}
    fit = {"alpha_ms": 0.5, "beta_ms": 10.0}
    write_profile_cache(cfg, "cpu", noisy, fit=fit, cache_dir=tmp_path / "cache")
    prof = latency_profile(cfg, "cpu", tmp_path / "cache")
    assert prof is not None and prof.latency(12) == pytest.approx(0.014)
