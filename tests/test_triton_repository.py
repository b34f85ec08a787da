"""Triton model repositories (config.pbtxt, version directories), start-up
checks (nothing loads, EXIT_ON_ERROR, STRICT_READINESS) and the profile cache
(location, poor fits measured again). The daemon serving such a repository:
tests/test_triton_daemon.py."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import yaml

from app.api.context import lookup_model
from app.api.security import InvalidModelName
from app.errors import ModelNotFound, ModelUnloaded
from app.repository.loader import load_model_config, load_repository
from app.repository.profiles import default_profile_cache_dir, fit_problems, read_profile_cache
from app.runtime.devices import ExecutorDevice
from app.scheduling.model import ModelInfo
from app.scheduling.profile import LatencyProfile
from app.scheduling.triton import TritonScheduler
from app.scheduling.types import DeviceInfo
from app.server import startup
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.profiling import device_tag, find_or_measure
from app.server.settings import Settings
from app.server.startup import ModelState, StartupFailed
from tests.triton_models import SIMPLE_PBTXT, scale_model, triton_model, triton_string_model

# ------------------------------------------------------------------ config.pbtxt


def test_a_triton_users_repository_loads_unchanged(tmp_path: Path) -> None:
    triton_model(tmp_path)
    index = load_repository(tmp_path)
    assert index.errors == {} and index.warnings == {}
    config = index.models["simple"]
    assert config.backend == "onnx" and config.version == "2"
    assert config.model_file == (tmp_path / "simple" / "2" / "model.onnx").resolve()
    assert [(t.name, t.datatype, t.shape) for t in config.inputs] == [("INPUT0", "FP32", (-1, 4))]
    assert [(t.name, t.datatype, t.shape) for t in config.outputs] == [("OUTPUT0", "FP32", (-1, 4))]
    assert config.max_batch_size == 8 and config.slo_ms == 50.0 and config.allow_slo_loosening
    assert config.devices == ("cpu",)
    assert config.batching is not None
    assert config.batching.policy_options() == {
        "max_queue_delay_ms": 0.5,
        "preferred_batch_sizes": (4, 8),
        "queue_timeout_ms": 20.0,
        "max_queue_size": 64,
    }
    assert config.versions == () and config.served_versions == ("2",)


@pytest.mark.parametrize(
    ("policy", "default", "others"),
    [
        ("", "2", ()),
        ("version_policy: { latest { num_versions: 1 } }", "2", ()),
        ("version_policy: { latest { num_versions: 2 } }", "2", ("1",)),
        ("version_policy: { all { } }", "2", ("1",)),
        ("version_policy: { specific { versions: [ 1 ] } }", "1", ()),
        ("version_policy: { specific { versions: [ 1, 2 ] } }", "2", ("1",)),
    ],
)
def test_version_policy_serves_every_selected_version(
    tmp_path: Path, policy: str, default: str, others: tuple[str, ...]
) -> None:
    triton_model(tmp_path, SIMPLE_PBTXT + policy)
    index = load_repository(tmp_path)
    assert sorted(index.models) == sorted(["simple", *(f"simple@{v}" for v in others)])
    config = index.models["simple"]
    assert config.version == default and config.model_name == "simple"
    assert config.served_versions == tuple(sorted((default, *others)))
    assert config.model_file is not None and config.model_file.parent.name == default
    for version in others:
        other = index.models[f"simple@{version}"]
        assert other.model_name == "simple" and other.version == version
        assert other.served_versions == config.served_versions
        assert other.model_file is not None and other.model_file.parent.name == version
        assert other.inputs == config.inputs and other.outputs == config.outputs
    assert index.warnings.get("simple", []) == []
    assert {(e["name"], e["version"]) for e in index.index()} == {
        ("simple", v) for v in config.served_versions
    }


def test_specific_version_without_directory_is_an_error(tmp_path: Path) -> None:
    triton_model(tmp_path, SIMPLE_PBTXT + "version_policy: { specific { versions: [ 3 ] } }")
    index = load_repository(tmp_path)
    assert index.models == {}
    assert "version_policy.specific: versions [3] have no directory" in index.errors["simple"]


def test_unsupported_fields_warn_by_name(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pbtxt = (
        SIMPLE_PBTXT.replace(
            "dims: [ 4 ] } ]\noutput", "dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]\noutput"
        )
        .replace("count: 1", "count: 2")
        .replace("dynamic_batching {", "dynamic_batching {\n  priority_levels: 2")
    )
    pbtxt += """
model_warmup [ { name: "w" batch_size: 1 } ]
response_cache { enable: true }
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
"""
    triton_model(tmp_path, pbtxt)
    with caplog.at_level(logging.WARNING):
        index = load_repository(tmp_path)
    assert "simple" in index.models
    notes = index.warnings["simple"]
    for field_name in (
        "model_warmup",
        "response_cache",
        "input[0] (INPUT0).reshape",
        "dynamic_batching.priority_levels",
        "instance_group[0].count 2",
        "parameters[intra_op_thread_count]",
    ):
        assert sum(field_name in note for note in notes) == 1, (field_name, notes)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(logged) == len(notes) == 6
    assert all(message.startswith("model simple: ") for message in logged)


def test_inputs_and_outputs_are_filled_from_the_onnx_file(tmp_path: Path) -> None:
    triton_model(tmp_path, 'backend: "onnxruntime"\n')
    index = load_repository(tmp_path)
    config = index.models["simple"]
    assert [(t.name, t.shape) for t in config.inputs] == [("INPUT0", (-1, 4))]
    assert [(t.name, t.shape) for t in config.outputs] == [("OUTPUT0", (-1, 4))]
    assert config.max_batch_size == 4  # Triton's default for a model that batches
    assert config.slo_ms == 1000.0
    assert any("no slo_ms" in note for note in index.warnings["simple"])


@pytest.mark.parametrize(
    ("pbtxt", "error"),
    [
        ('platform: "tensorrt_plan"', "platform: 'tensorrt_plan' is not supported"),
        ('name: "other"\nbackend: "onnxruntime"', "name: 'other' differs"),
        ("sequence_batching { }", "sequence_batching: sequence batching"),
        ("max_batch_size: [", "not a valid Triton model config"),
    ],
)
def test_bad_triton_configs_name_the_field(tmp_path: Path, pbtxt: str, error: str) -> None:
    triton_model(tmp_path, pbtxt)
    index = load_repository(tmp_path)
    assert index.models == {} and error in index.errors["simple"], index.errors


def test_pbtxt_without_the_triton_extra_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton_model(tmp_path)
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)  # import fails
    index = load_repository(tmp_path)
    assert "pip install 'deadline-serve[triton]'" in index.errors["simple"]


def test_directory_without_a_config_is_completed_from_its_onnx_file(tmp_path: Path) -> None:
    scale_model(tmp_path / "bare" / "1" / "model.onnx", 1.0)
    (tmp_path / "empty" / "1").mkdir(parents=True)  # nothing to complete from: skipped
    index = load_repository(tmp_path)
    config = index.models["bare"]
    assert [(t.name, t.datatype, t.shape) for t in config.inputs] == [("INPUT0", "FP32", (-1, 4))]
    assert config.max_batch_size == 4 and config.slo_ms == 1000.0 and index.errors == {}
    assert index.warnings["empty"] == [
        "skipped: the directory has no config.yaml or config.pbtxt (nor a version directory "
        "with a model.onnx to complete one from)"
    ]


def test_tritons_example_shapes_load_with_default_bounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TYPE_STRING without max_bytes, -1 without max_shape, max_batch_size 0,
    and no slo_ms in three models: one warning for the default SLO."""
    triton_string_model(tmp_path)  # Triton's simple_string, unchanged
    variable = SIMPLE_PBTXT.replace("dims: [ 4 ]", "dims: [ -1 ]").replace(
        'parameters { key: "slo_ms" value { string_value: "50" } }', ""
    )
    triton_model(tmp_path, variable.replace('name: "simple"', 'name: "var"'), name="var")
    unbatched = (
        SIMPLE_PBTXT.replace("max_batch_size: 8", "max_batch_size: 0")
        .replace("dims: [ 4 ]", "dims: [ 1, 4 ]")
        .replace("dynamic_batching {", "dynamic_batching_off {")
    )
    unbatched = (
        unbatched[: unbatched.index("dynamic_batching_off")]
        + unbatched[unbatched.index("instance_group") :]
    )
    triton_model(tmp_path, unbatched.replace('name: "simple"', 'name: "one"'), name="one")
    with caplog.at_level(logging.INFO):
        index = load_repository(tmp_path)
    assert index.errors == {}
    strings = index.models["simple_string"]
    assert [(t.datatype, t.shape, t.max_bytes) for t in strings.inputs] == [
        ("BYTES", (-1, 16), 256),
        ("BYTES", (-1, 16), 256),
    ]
    var = index.models["var"]
    assert var.inputs[0].shape == (-1, -1) and var.inputs[0].max_shape == (-1, 4096)
    one = index.models["one"]
    assert one.max_batch_size == 1 and one.inputs[0].shape == (-1, 4)
    slo_warnings = [r.getMessage() for r in caplog.records if "no slo_ms" in r.getMessage()]
    assert slo_warnings == [
        "model(s) simple_string, var: no slo_ms: using 1000 ms; set it with parameters "
        '{ key: "slo_ms" value { string_value: "50" } }'
    ]


def test_max_batch_size_0_needs_a_first_dimension_of_one(tmp_path: Path) -> None:
    pbtxt = SIMPLE_PBTXT.replace("max_batch_size: 8", "max_batch_size: 0")
    triton_model(tmp_path, pbtxt)
    assert "0 (no batching) is served here only when" in load_repository(tmp_path).errors["simple"]


def test_config_yaml_takes_tritons_batching_keys(tmp_path: Path) -> None:
    directory = tmp_path / "y"
    scale_model(directory / "model.onnx", 1.0)
    doc = {
        "backend": "onnx",
        "model_file": "model.onnx",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [4]}],
        "max_batch_size": 8,
        "slo_ms": 40,
        "dynamic_batching": {"max_queue_delay_microseconds": 2000, "preferred_batch_size": [8]},
        "instance_group": [{"kind": "KIND_GPU", "gpus": [0, 1]}],
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(doc))
    config = load_model_config(directory)
    assert config.devices == ("cuda:0", "cuda:1")
    assert config.batching is not None
    assert config.batching.policy_options() == {
        "max_queue_delay_ms": 2.0,
        "preferred_batch_sizes": (8,),
    }
    doc["dynamic_batching"] = {"max_queue_delay": 5}  # not Triton's either: an error
    (directory / "config.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(
        ValueError, match=r"dynamic_batching: unknown key\(s\) \['max_queue_delay'\]"
    ):
        load_model_config(directory)
    doc["dynamic_batching"] = {}
    doc["devices"] = ["cpu"]
    (directory / "config.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="either devices or instance_group"):
        load_model_config(directory)


def test_model_batching_reaches_the_triton_policy_per_model() -> None:
    profile = LatencyProfile.linear(1.0, 2.0, 8)
    models = [ModelInfo("a", profile, 0.05, 8), ModelInfo("b", profile, 0.08, 8)]
    scheduler = TritonScheduler(
        models,
        [DeviceInfo(0)],
        max_queue_delay_ms=1.0,
        model_options={"a": {"max_queue_delay_ms": 0.5, "queue_timeout_ms": 20.0}},
    )
    assert scheduler.config["a"].max_queue_delay == pytest.approx(0.0005)
    assert scheduler.config["a"].queue_timeout == pytest.approx(0.020)
    assert scheduler.config["b"].max_queue_delay == pytest.approx(0.001)
    assert scheduler.config["b"].queue_timeout == pytest.approx(0.08)  # its SLO
    with pytest.raises(ValueError, match="unknown models"):
        TritonScheduler(models, [DeviceInfo(0)], model_options={"c": {}})


def test_batching_options_only_under_the_triton_policy(tmp_path: Path) -> None:
    triton_model(tmp_path)
    config = load_repository(tmp_path).models["simple"]
    options = startup.batching_options(Settings(policy="triton"), {"simple": config})
    assert options == {"model_options": {"simple": config.batching.policy_options()}}  # type: ignore[union-attr]
    assert startup.batching_options(Settings(policy="symphony"), {"simple": config}) == {}


# ------------------------------------------------------------------ start-up checks


def test_nothing_loaded_is_an_error_even_without_exit_on_error() -> None:
    settings = Settings(exit_on_error=False)
    with pytest.raises(StartupFailed, match=r"no model loaded .*\(simple: bad dims\)"):
        startup.check_loaded(settings, {}, {"simple": "bad dims"})
    with pytest.raises(StartupFailed, match="holds no model directory"):
        startup.check_loaded(settings, {}, {})


def test_exit_on_error_stops_naming_the_model_and_reason() -> None:
    with pytest.raises(StartupFailed, match=r"failed to load 1 model\(s\) \(b: no device"):
        startup.check_loaded(Settings(), {"a": object()}, {"b": "no device can run it"})
    startup.check_loaded(Settings(exit_on_error=False), {"a": object()}, {"b": "x"})


def test_a_load_error_is_the_reason_not_no_device(tmp_path: Path) -> None:
    triton_model(tmp_path)
    config = load_repository(tmp_path).models["simple"]
    devices = [ExecutorDevice(0, "cpu", "cpu:0"), ExecutorDevice(1, "cpu", "cpu:1", index=1)]

    class Pool:
        def load_errors(self, device_id: int) -> dict[str, str]:
            return {"simple": "input 'INPUT0': config says FP32, model has INT64"}

    reason = startup.why_not_loaded(Pool(), devices, config)  # type: ignore[arg-type]
    assert reason == (
        "failed to load on cpu:0, cpu:1: input 'INPUT0': config says FP32, model has INT64"
    )


class _AlivePool:
    def alive(self, device_id: int) -> bool:
        return True


def _started(tmp_path: Path, settings: Settings) -> LiveService:
    """A LiveService as start-up leaves it: `simple` served (versions 1 and
    2), `broken` failed."""
    triton_model(tmp_path / "models", SIMPLE_PBTXT + "version_policy: { all { } }")
    models = load_repository(tmp_path / "models").models
    service = LiveService(settings, Metrics())
    for key, config in models.items():
        service.models[key] = ModelState(config, arena=None, devices=(0,))  # type: ignore[arg-type]
    service.unavailable["broken"] = f"{tmp_path}/models/broken/config.pbtxt: max_batch_size: bad"
    service.pool = _AlivePool()  # type: ignore[assignment]
    service.ready = True
    return service


def test_strict_readiness(tmp_path: Path) -> None:
    strict = _started(tmp_path, Settings(repository=tmp_path / "models"))
    assert strict.model_ready("simple") and not strict.server_ready()
    assert strict.capacity()["models_failed"] == ["broken"]
    relaxed = _started(tmp_path, Settings(repository=tmp_path / "models", strict_readiness=False))
    assert relaxed.server_ready()
    relaxed.models.clear()
    assert not relaxed.server_ready()  # none loaded: never ready


def test_index_gives_the_reason_and_every_version_served(tmp_path: Path) -> None:
    service = _started(tmp_path, Settings(repository=tmp_path / "models"))
    assert service.repository_index() == [
        {
            "name": "broken",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "broken/config.pbtxt: max_batch_size: bad",
        },
        {"name": "simple", "version": "1", "state": "READY", "reason": ""},
        {"name": "simple", "version": "2", "state": "READY", "reason": ""},
    ]
    assert service.model_names() == ["simple"]


def test_a_name_and_version_resolve_to_the_versions_served_model(tmp_path: Path) -> None:
    service = _started(tmp_path, Settings(repository=tmp_path / "models"))
    default = lookup_model(service, "simple")
    assert (default.name, default.version) == ("simple", "2")
    assert lookup_model(service, "simple", "2") is default
    one = lookup_model(service, "simple", "1")
    assert (one.name, one.model_name, one.version) == ("simple@1", "simple", "1")
    assert one.model_file is not None and one.model_file.parent.name == "1"
    with pytest.raises(
        ModelNotFound, match="Request for unknown model: 'simple' version 3 is not found"
    ):
        lookup_model(service, "simple", "3")
    with pytest.raises(InvalidModelName):  # a key is no model name a request may give
        lookup_model(service, "simple@1")
    service.control_state["simple@1"] = "unloading"
    with pytest.raises(ModelUnloaded, match="model 'simple' version '1' is unloading"):
        lookup_model(service, "simple", "1")


# ------------------------------------------------------------------ profiles


def test_profile_cache_directory_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_profile_cache_dir({"XDG_CACHE_HOME": "/var/c"}) == Path(
        "/var/c/deadline-serve/profiles"
    )
    monkeypatch.setenv("HOME", "/home/u")
    assert default_profile_cache_dir({}) == Path("/home/u/.cache/deadline-serve/profiles")
    assert default_profile_cache_dir({"XDG_CACHE_HOME": "relative"}) == Path(
        "/home/u/.cache/deadline-serve/profiles"
    )


def test_fit_problems() -> None:
    assert fit_problems({1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0}, 0.9) == []
    nonsense = {1: 296.0, 2: 32.0, 4: 650.0}
    problems = fit_problems(nonsense, 0.9)
    assert len(problems) == 2
    assert problems[0].startswith("linear fit r² ") and problems[0].endswith(" < 0.9")
    assert problems[1] == "ℓ(2) = 32.00 ms below ℓ(1) = 296.00 ms"
    # A model this fast is flat within timer noise: nothing to say.
    assert fit_problems({1: 0.010, 2: 0.004, 4: 0.012}, 0.9) == []


GOOD = {1: 10.0, 2: 12.0, 4: 16.0, 8: 24.0}
POOR = {1: 296.0, 2: 32.0, 4: 650.0, 8: 100.0}


class FakeProfiler:
    """Answers profile requests with the given tables, in order."""

    def __init__(self, *tables: dict[int, float]) -> None:
        self.tables = list(tables)
        self.calls: list[list[int]] = []

    async def profile(self, device_id: int, model: str, batch_sizes: list[int]) -> dict[int, float]:
        self.calls.append(list(batch_sizes))
        return dict(self.tables.pop(0))


def _measure_setup(tmp_path: Path) -> tuple[Settings, ExecutorDevice, object]:
    triton_model(tmp_path / "models")
    config = load_repository(tmp_path / "models").models["simple"]
    settings = Settings(
        repository=tmp_path / "models",
        profile_cache_dir=tmp_path / "cache",
        profile_batch_sizes=(1, 2, 4, 8),
    )
    return settings, ExecutorDevice(0, "cpu", "cpu:0", threads=2), config


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tables", "calls", "warned"),
    [((GOOD,), 1, False), ((POOR, GOOD), 2, False), ((POOR, POOR), 2, True)],
)
async def test_poor_profile_is_measured_again_once(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    tables: tuple[dict[int, float], ...],
    calls: int,
    warned: bool,
) -> None:
    settings, device, config = _measure_setup(tmp_path)
    profiler = FakeProfiler(*tables)
    with caplog.at_level(logging.INFO):
        found = await find_or_measure(settings, profiler, device, config)  # type: ignore[arg-type]
    assert len(profiler.calls) == calls and profiler.calls[0] == [1, 2, 4, 8]
    assert found.latency_ms == tables[-1] and bool(found.problems) == warned
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if warned:
        assert len(warnings) == 1
        assert "ℓ(1)=296.00ms, ℓ(2)=32.00ms" in warnings[0]
        assert "python -m app profile simple --force" in warnings[0]
    else:
        assert warnings == []
    # Cached outside the repository, the last measurement.
    cached = read_profile_cache(config, device_tag(device), tmp_path / "cache")  # type: ignore[arg-type]
    assert cached is not None and cached.latency_ms == tables[-1]
    assert not list((tmp_path / "models").rglob("*.json"))


@pytest.mark.anyio
async def test_cached_profile_is_used_when_good_and_measured_again_when_poor(
    tmp_path: Path,
) -> None:
    settings, device, config = _measure_setup(tmp_path)
    await find_or_measure(settings, FakeProfiler(GOOD), device, config)  # type: ignore[arg-type]
    untouched = FakeProfiler()
    found = await find_or_measure(settings, untouched, device, config)  # type: ignore[arg-type]
    assert untouched.calls == [] and found.source == "cache" and found.latency_ms == GOOD
    forced = FakeProfiler(GOOD)
    await find_or_measure(settings, forced, device, config, force=True)  # type: ignore[arg-type]
    assert len(forced.calls) == 1

    poor = FakeProfiler(POOR, POOR)
    await find_or_measure(settings, poor, device, config, force=True)  # type: ignore[arg-type]
    again = FakeProfiler(GOOD)  # the poor cached table is measured again, once
    found = await find_or_measure(settings, again, device, config)  # type: ignore[arg-type]
    assert len(again.calls) == 1 and found.source == "measured" and not found.problems


def test_outputs_of_both_versions_differ(tmp_path: Path) -> None:
    """The versions built above are distinct models (×1, ×2)."""
    directory = triton_model(tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    results = []
    for version in ("1", "2"):
        session = onnxruntime.InferenceSession(str(directory / version / "model.onnx"))
        results.append(session.run(None, {"INPUT0": x})[0])
    np.testing.assert_array_equal(results[1], 2 * results[0])


@pytest.mark.anyio
async def test_a_profile_measured_while_serving_keeps_the_lower_of_two_runs_uncached(tmp_path):
    """Issue 42, item 10: a reload under load measured ℓ(1) 25.5 ms for a
    3.8 ms model (other models' batches ran between its own) and cached it."""
    settings, device, config = _measure_setup(tmp_path)
    loaded = {1: 25.5, 2: 12.0, 4: 40.0, 8: 24.0}
    quiet = {1: 3.8, 2: 30.0, 4: 16.0, 8: 60.0}
    profiler = FakeProfiler(loaded, quiet)
    found = await find_or_measure(settings, profiler, device, config, serving=True)  # type: ignore[arg-type]
    assert len(profiler.calls) == 2
    assert found.latency_ms == {1: 3.8, 2: 12.0, 4: 16.0, 8: 24.0}
    assert not list((tmp_path / "cache").rglob("*"))  # not cached
    profiler = FakeProfiler(GOOD)
    await find_or_measure(settings, profiler, device, config)  # type: ignore[arg-type]
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1  # at start-up: cached
