"""The bundled dynamic models (app/repository/dynamic_models.py) and the
`dynamic` config key (app/repository/dynamic_fields.py):

- `earlyexit` takes the steps its input asks for (‖x‖² sets them), and a
  row of a batch mixing step counts gets what it gets alone (exited rows
  are frozen);
- `encoder` gives a request padded into a longer batch what it gets alone,
  in ONNX Runtime and through the executor's padding (one call per batch);
- the `dynamic` key is parsed and checked, and start-up turns it into
  ModelInfo.dynamic (c0 the profile's intercept, the prior the alone-times
  on the probes);
- both served end to end by the daemon (slow), answers equal to ONNX
  Runtime's run of each request alone.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from app.repository import BUNDLED_REPOSITORY, bundled
from app.repository import dynamic_models as dm
from app.repository.dynamic_fields import DEFAULT_PROBES
from app.repository.loader import load_model_config
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.executor import run_shape_groups
from app.runtime.onnx_backend import OnnxBackend
from app.server.settings import Settings
from app.server.startup import ModelState, measure_model

DYNAMIC = ("earlyexit", "encoder")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two dynamic models' directories, their files built."""
    root = tmp_path_factory.mktemp("dynamic") / "models"
    for name in DYNAMIC:
        (root / name).mkdir(parents=True)
        shutil.copy(BUNDLED_REPOSITORY / name / "config.yaml", root / name / "config.yaml")
    built = bundled.ensure_bundled_models(root, DYNAMIC)
    assert sorted(built) == sorted(
        f"{n}/{f}" for n in DYNAMIC for f in ("model.onnx", "probes.npz")
    )
    return root


def _session(repo: Path, name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(repo / name / "model.onnx"), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- earlyexit


def test_early_exit_takes_the_steps_its_input_asks_for(repo: Path) -> None:
    session = _session(repo, "earlyexit")
    every = list(range(1, dm.EARLY_EXIT_MAX_STEPS + 1))
    x = np.concatenate([dm.early_exit_input(s, seed=s) for s in every])
    scores, steps = session.run(None, {"input": x})
    assert steps.dtype == np.int64 and steps.shape == (len(every), 1)
    assert steps.ravel().tolist() == every == dm.early_exit_steps(x).tolist()
    assert scores.shape == (len(every), dm.EARLY_EXIT_CLASSES) and np.isfinite(scores).all()
    # Random normal inputs (‖x‖² ≈ 768) take the most; a zero input one step.
    noise = np.random.default_rng(0).standard_normal((3, *dm.EARLY_EXIT_SHAPE), np.float32)
    assert session.run(["steps"], {"input": noise})[0].ravel().tolist() == [16, 16, 16]
    assert session.run(["steps"], {"input": np.zeros_like(noise)})[0].ravel().tolist() == [1] * 3
    with pytest.raises(ValueError, match=r"steps must be in 1\.\.16"):
        dm.early_exit_input(17)


def test_early_exit_rows_of_a_mixed_batch_equal_their_run_alone(repo: Path) -> None:
    session = _session(repo, "earlyexit")
    asked = [1, 9, 3, 16, 2, 9, 5, 12]
    x = np.concatenate([dm.early_exit_input(s, seed=10 + i) for i, s in enumerate(asked)])
    scores, steps = session.run(None, {"input": x})
    assert steps.ravel().tolist() == asked
    for i in range(len(asked)):
        alone_scores, alone_steps = session.run(None, {"input": x[i : i + 1]})
        assert alone_steps.ravel().tolist() == [asked[i]]
        np.testing.assert_allclose(scores[i : i + 1], alone_scores, rtol=1e-5, atol=1e-6)
    # The scores move with the steps: an exited row is frozen, not run on.
    longer = session.run(["scores"], {"input": dm.early_exit_input(16, seed=10)})[0]
    assert np.abs(longer - scores[:1]).max() > 1e-4


# --------------------------------------------------------------------------- encoder


def test_encoder_padded_batch_equals_each_request_alone(repo: Path) -> None:
    session = _session(repo, "encoder")
    lengths = [5, 128, 1, 37, 37, 64]
    requests = [dm.encoder_input(n, seed=n + i) for i, n in enumerate(lengths)]
    batch = np.zeros((len(lengths), max(lengths)), np.int64)  # 0: padding
    for i, tokens in enumerate(requests):
        batch[i, : tokens.shape[1]] = tokens[0]
    hidden, pooled = session.run(None, {"tokens": batch})
    assert hidden.shape == (len(lengths), 128, dm.ENCODER_WIDTH)
    assert pooled.shape == (len(lengths), dm.ENCODER_WIDTH)
    for i, tokens in enumerate(requests):
        alone_hidden, alone_pooled = session.run(None, {"tokens": tokens})
        n = lengths[i]
        assert alone_hidden.shape == (1, n, dm.ENCODER_WIDTH)
        np.testing.assert_allclose(hidden[i : i + 1, :n], alone_hidden, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(pooled[i : i + 1], alone_pooled, rtol=1e-4, atol=1e-5)
    # Different requests give different answers (the mask is not all there is).
    assert np.abs(pooled[0] - pooled[1]).max() > 1e-2


def test_encoder_clips_ids_into_its_vocabulary(repo: Path) -> None:
    session = _session(repo, "encoder")
    top = np.array([[dm.ENCODER_VOCAB - 1, 7]], np.int64)
    over = np.array([[10**9, 7]], np.int64)
    np.testing.assert_array_equal(
        session.run(["pooled"], {"tokens": top})[0], session.run(["pooled"], {"tokens": over})[0]
    )


class _Counting:
    """An OnnxBackend that records the input shapes of each call."""

    def __init__(self, backend: OnnxBackend) -> None:
        self.backend = backend
        self.calls: list[dict[str, tuple[int, ...]]] = []

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append({k: v.shape for k, v in inputs.items()})
        return self.backend.run(inputs)


def test_executor_pads_a_mixed_length_batch_into_one_call(repo: Path, no_leftover_segments) -> None:
    config = load_model_config(repo / "encoder")
    backend = OnnxBackend()
    backend.load(config)
    counting = _Counting(backend)
    session = _session(repo, "encoder")
    lengths = [3, 20, 9, 20]
    requests = [dm.encoder_input(n, seed=100 + i) for i, n in enumerate(lengths)]
    arena = Arena.create(config, 8)
    try:
        rows = [arena.acquire_rows(1) for _ in lengths]
        for slots, tokens in zip(rows, requests, strict=True):
            arena.write_rows(slots, {"tokens": tokens})
        run_shape_groups(config, counting, arena, [s for r in rows for s in r])
        assert counting.calls == [{"tokens": (4, 20)}]  # one call, padded to the longest
        for slots, tokens in zip(rows, requests, strict=True):
            got = arena.read_rows(slots)
            hidden, pooled = session.run(None, {"tokens": tokens})
            assert got["hidden"].shape == hidden.shape  # cut back to its own length
            np.testing.assert_allclose(got["hidden"], hidden, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got["pooled"], pooled, rtol=1e-4, atol=1e-5)
    finally:
        arena.close_and_unlink()


# --------------------------------------------------------------------------- files


def test_dynamic_models_are_deterministic_and_checked() -> None:
    assert dm.serialize(dm.build_early_exit(0)) == dm.serialize(dm.build_early_exit(0))
    assert dm.serialize(dm.build_encoder(0)) == dm.serialize(dm.build_encoder(0))
    assert dm.serialize(dm.build_encoder(0)) != dm.serialize(dm.build_encoder(1))
    for name in DYNAMIC:
        gen = [g for g in bundled.GENERATED if g.model == name]
        assert [g.file for g in gen] == ["model.onnx", "probes.npz"]
        assert gen[1].build() == gen[1].build()
        model = bundled.onnx.load_from_string(gen[0].build())
        assert model.producer_version == bundled.BUILDER_VERSION


# --------------------------------------------------------------------------- config key


def _model_dir(repo: Path, tmp_path: Path, name: str, **changes: Any) -> Path:
    """A copy of `repo`'s model `name` with its config changed."""
    target = tmp_path / name
    shutil.copytree(repo / name, target)
    doc = yaml.safe_load((target / "config.yaml").read_text())
    doc.update(changes)
    (target / "config.yaml").write_text(yaml.safe_dump(doc))
    return target


def test_dynamic_key_reads_the_probes(repo: Path, tmp_path: Path) -> None:
    early = load_model_config(repo / "earlyexit")
    assert early.dynamic is not None
    assert early.dynamic.probes == (repo / "earlyexit" / DEFAULT_PROBES).resolve()
    assert early.dynamic.count == len(dm.EARLY_EXIT_PROBE_STEPS) == 7
    assert load_model_config(repo / "encoder").dynamic.count == len(dm.ENCODER_PROBE_LENGTHS)
    static = _model_dir(repo, tmp_path, "earlyexit", dynamic=False)
    assert load_model_config(static).dynamic is None
    moved = _model_dir(repo, tmp_path / "moved", "earlyexit", dynamic={"probes": "p/mine.npz"})
    (moved / "p").mkdir()
    (moved / DEFAULT_PROBES).rename(moved / "p" / "mine.npz")
    assert load_model_config(moved).dynamic.probes == (moved / "p" / "mine.npz").resolve()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("yes", r"dynamic: must be true, false or \{probes: FILE\}, got 'yes'"),
        (1, r"dynamic: must be true, false or \{probes: FILE\}, got 1"),
        ({"probe": "probes.npz"}, r"dynamic: unknown key\(s\) \['probe'\]"),
        ({"probes": "../x.npz"}, r"dynamic.probes: must be a relative path inside"),
        ({"probes": "none.npz"}, r"dynamic.probes: probes file not found: .*none.npz"),
        ({"probes": "config.yaml"}, r"dynamic.probes: .*config.yaml is not a readable .npz"),
    ],
)
def test_dynamic_key_refuses_bad_values(repo: Path, tmp_path: Path, value, error) -> None:
    model = _model_dir(repo, tmp_path, "earlyexit", dynamic=value)
    with pytest.raises(ValueError, match=error):
        load_model_config(model)


@pytest.mark.parametrize(
    ("probes", "error"),
    [
        ({"0/input": np.zeros((1, 3, 16, 16), np.float64)}, r"\[0\].input: datatype float64"),
        ({"0/input": np.zeros((2, 3, 16, 16), np.float32)}, r"is not one request of shape"),
        ({"0/input": np.zeros((1, 3, 8, 16), np.float32)}, r"dimension 2 is 8"),
        ({"0/x": np.zeros((1, 3, 16, 16), np.float32)}, r"has inputs \['x'\]; the model's"),
        ({"1/input": np.zeros((1, 3, 16, 16), np.float32)}, r"numbered 0..0, got \[1\]"),
        ({"input": np.zeros((1, 3, 16, 16), np.float32)}, r"'input' is not named <probe>/<input>"),
        ({}, r"holds no probe"),
    ],
)
def test_dynamic_probes_are_checked_against_the_inputs(repo, tmp_path, probes, error) -> None:
    model = _model_dir(repo, tmp_path, "earlyexit")
    np.savez(model / DEFAULT_PROBES, **probes)
    with pytest.raises(ValueError, match=f"config.yaml: dynamic.probes.*{error}"):
        load_model_config(model)


def test_encoder_probe_beyond_the_bound_and_emulated_models_are_refused(repo, tmp_path) -> None:
    model = _model_dir(repo, tmp_path, "encoder")
    np.savez(model / DEFAULT_PROBES, **{"0/tokens": np.ones((1, 129), np.int64)})
    with pytest.raises(ValueError, match=r"dimension 1 is 129"):
        load_model_config(model)
    emulated = tmp_path / "emu"
    shutil.copytree(BUNDLED_REPOSITORY / "bert-emulated", emulated)
    doc = yaml.safe_load((emulated / "config.yaml").read_text())
    (emulated / "config.yaml").write_text(yaml.safe_dump({**doc, "dynamic": True}))
    with pytest.raises(ValueError, match="dynamic: an emulated model has no input"):
        load_model_config(emulated)


def test_dynamic_parameter_in_a_triton_config(repo: Path, tmp_path: Path) -> None:
    model = tmp_path / "earlyexit"
    (model / "1").mkdir(parents=True)
    shutil.copy(repo / "earlyexit" / "model.onnx", model / "1" / "model.onnx")
    shutil.copy(repo / "earlyexit" / DEFAULT_PROBES, model / DEFAULT_PROBES)
    pbtxt = """
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        parameters { key: "slo_ms" value { string_value: "200" } }
        parameters { key: "dynamic" value { string_value: "%s" } }
    """
    (model / "config.pbtxt").write_text(pbtxt % "true")
    assert load_model_config(model).dynamic.count == 7
    (model / "config.pbtxt").write_text(pbtxt % "false")
    assert load_model_config(model).dynamic is None
    (model / "config.pbtxt").write_text(pbtxt % "often")
    with pytest.raises(ValueError, match="dynamic: must be true, false"):
        load_model_config(model)


# --------------------------------------------------------------------------- start-up


class _FakePool:
    """ℓ(b) = 1.5·b + 4 ms on synthetic inputs; k rows of a probe take 4 ms
    plus k ms per unit of its first value (the probes below say their time;
    c0 = 4 ms, as eq. 3 has it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], bool]] = []

    async def profile(self, device_id, model, batch_sizes, warmup=3, repeats=10, inputs=None):
        self.calls.append((list(batch_sizes), inputs is not None))
        if inputs is None:
            return {b: 1.5 * b + 4.0 for b in batch_sizes}
        (array,) = inputs.values()
        return {batch_sizes[0]: 4.0 + len(array) * float(array.flat[0])}


def _measure(config, tmp_path: Path) -> ModelState:
    state = ModelState(config, arena=None, devices=(0,))  # type: ignore[arg-type]
    settings = Settings(profile_cache_dir=tmp_path / "cache")
    device = ExecutorDevice(0, "cpu", "cpu:0")
    asyncio.run(measure_model(settings, _FakePool(), device, state))
    return state


def test_startup_sets_model_info_dynamic_from_the_profile_and_probes(repo, tmp_path) -> None:
    model = _model_dir(repo, tmp_path, "earlyexit")
    probes = {f"{i}/input": np.full((1, 3, 16, 16), t, np.float32) for i, t in enumerate([2, 9])}
    np.savez(model / DEFAULT_PROBES, **probes)
    state = _measure(load_model_config(model), tmp_path)
    info = state.info()
    assert info.dynamic is not None
    # c0: the intercept of the fastest probe (2 ms a row) over 1, 2, 4 rows.
    assert info.dynamic.c0 == pytest.approx(0.004)
    ((app, prior),) = info.dynamic.prior
    assert app == "" and prior == pytest.approx((0.006, 0.013))
    assert info.profile.latency(8) == pytest.approx(0.016)
    static = _model_dir(repo, tmp_path / "static", "earlyexit", dynamic=False)
    assert _measure(load_model_config(static), tmp_path).info().dynamic is None


class _FixedCostPool(_FakePool):
    """As _FakePool, but a probe's batch has a fixed cost of 7 ms: the
    synthetic profile's β (4 ms) understates it."""

    async def profile(self, device_id, model, batch_sizes, warmup=3, repeats=10, inputs=None):
        if inputs is None:
            return await super().profile(device_id, model, batch_sizes, warmup, repeats)
        self.calls.append((list(batch_sizes), True))
        (array,) = inputs.values()
        return {batch_sizes[0]: 7.0 + len(array) * float(array.flat[0])}


def test_c0_is_the_fastest_probes_intercept_over_small_batches(repo, tmp_path) -> None:
    model = _model_dir(repo, tmp_path, "earlyexit")
    probes = {f"{i}/input": np.full((1, 3, 16, 16), t, np.float32) for i, t in enumerate([9, 2])}
    np.savez(model / DEFAULT_PROBES, **probes)
    state = ModelState(load_model_config(model), arena=None, devices=(0,))  # type: ignore[arg-type]
    pool = _FixedCostPool()
    settings = Settings(profile_cache_dir=tmp_path / "cache")
    asyncio.run(measure_model(settings, pool, ExecutorDevice(0, "cpu", "cpu:0"), state))
    info = state.info()
    assert info.dynamic.c0 == pytest.approx(0.007)
    assert info.dynamic.prior[0][1] == pytest.approx((0.016, 0.009))
    # One call per probe, then the fastest (2 ms a row) at 1, 2 and 4 rows.
    assert [c for c in pool.calls if c[1]] == [
        ([1], True),
        ([1], True),
        ([1], True),
        ([2], True),
        ([4], True),
    ]


def test_c0_is_capped_at_the_shortest_alone_time(repo, tmp_path) -> None:
    model = _model_dir(repo, tmp_path, "earlyexit")
    np.savez(model / DEFAULT_PROBES, **{"0/input": np.full((1, 3, 16, 16), -1.0, np.float32)})
    info = _measure(load_model_config(model), tmp_path).info()
    assert info.dynamic.c0 == pytest.approx(0.003) and info.dynamic.prior[0][1] == (
        pytest.approx(0.003),
    )


# --------------------------------------------------------------------------- the daemon


def _infer(client: httpx.Client, model: str, name: str, array: np.ndarray) -> dict[str, Any]:
    datatype = {np.float32: "FP32", np.int64: "INT64"}[array.dtype.type]
    body = {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype,
                "data": array.ravel().tolist(),
            }
        ]
    }
    reply = client.post(f"/v2/models/{model}/infer", json=body)
    assert reply.status_code == 200, reply.text
    return {o["name"]: np.reshape(o["data"], o["shape"]) for o in reply.json()["outputs"]}


@pytest.mark.slow
def test_daemon_serves_dynamic_models_equal_to_onnx_runtime_alone(repo, launch_daemon) -> None:
    daemon = launch_daemon(
        repo,
        policy="symphony-wc",
        emulated_devices=0,
        cpu_slices=1,
        startup_timeout_s=300,
        log_level="info",
    )
    log_text = daemon.log_path.read_text()
    for name in DYNAMIC:
        found = re.search(rf"model {name} is dynamic: c0 = ([0-9.]+) ms; alone-times", log_text)
        assert found is not None, log_text[-2000:]
        assert float(found.group(1)) >= 0.0
    early, encoder = _session(repo, "earlyexit"), _session(repo, "encoder")
    steps = [1, 16, 4, 9, 2, 12, 7, 3]
    lengths = [4, 128, 17, 60, 1, 33, 90, 8]
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(8) as workers:  # concurrent: the batches mix sizes
            early_replies = list(
                workers.map(
                    lambda s: _infer(client, "earlyexit", "input", dm.early_exit_input(s, seed=s)),
                    steps,
                )
            )
            encoder_replies = list(
                workers.map(
                    lambda n: _infer(client, "encoder", "tokens", dm.encoder_input(n, seed=n)),
                    lengths,
                )
            )
    for s, got in zip(steps, early_replies, strict=True):
        scores, taken = early.run(None, {"input": dm.early_exit_input(s, seed=s)})
        assert got["steps"].tolist() == taken.tolist() == [[s]]
        np.testing.assert_allclose(got["scores"], scores, rtol=1e-5, atol=1e-6)
    for n, got in zip(lengths, encoder_replies, strict=True):
        hidden, pooled = encoder.run(None, {"tokens": dm.encoder_input(n, seed=n)})
        assert got["hidden"].shape == hidden.shape == (1, n, dm.ENCODER_WIDTH)
        np.testing.assert_allclose(got["hidden"], hidden, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["pooled"], pooled, rtol=1e-4, atol=1e-5)
