"""Quiet, useful logs: no line per request unless ACCESS_LOG asks for it,
executors only where a model may run, and a failed start-up said in one
line without a traceback (unless the log level is debug)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.main import _StartupTraceback, create_app
from app.server.settings import Settings
from app.server.startup import StartupFailed, device_layout
from tests.fakes import emulated_config, onnx_config


def test_the_access_log_is_off_unless_access_log_asks_for_it() -> None:
    assert Settings.from_env({}).access_log is False
    assert Settings.from_env({"ACCESS_LOG": "1"}).access_log is True
    access = logging.getLogger("uvicorn.access")
    create_app(Settings())
    assert access.disabled
    create_app(Settings(access_log=True))
    assert not access.disabled
    create_app(Settings())
    assert access.disabled


def _names(devices) -> list[str]:
    return [d.name for d in devices]


def test_executors_only_for_devices_a_model_may_run_on(tmp_path: Path) -> None:
    settings = Settings(cpu_slices=1, emulated_devices=2)
    onnx = onnx_config("m", tmp_path / "m.onnx")
    # The whole layout without the models; with only an ONNX model, no
    # emulated executor; with only emulated ones, no CPU executor, and the
    # emulated devices numbered from 0.
    assert _names(device_layout(settings)) == ["cpu:0", "emulated:0", "emulated:1"]
    assert _names(device_layout(settings, [onnx])) == ["cpu:0"]
    only_emulated = device_layout(settings, [emulated_config()])
    assert _names(only_emulated) == ["emulated:0", "emulated:1"]
    assert [d.id for d in only_emulated] == [0, 1]
    assert len(device_layout(settings, [onnx, emulated_config()])) == 3


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, message, (), None)


@pytest.fixture
def info_level():
    app_log = logging.getLogger("app.server")
    before = app_log.level
    app_log.setLevel(logging.INFO)
    yield app_log
    app_log.setLevel(before)


def test_a_failed_start_up_is_one_line_without_its_traceback(info_level) -> None:
    failed = f"{StartupFailed.__module__}.StartupFailed: no model loaded"
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
    drop = _StartupTraceback()
    assert not drop.filter(_record(traceback + failed + "\n"))  # said once already
    other = _record(traceback + "PermissionError: cannot write app/models/mlp\n")
    assert drop.filter(other)
    assert other.getMessage() == "start-up failed: PermissionError: cannot write app/models/mlp"
    assert drop.filter(_record("Application startup failed. Exiting."))
    info_level.setLevel(logging.DEBUG)  # asked for: the traceback stays
    assert drop.filter(_record(traceback + failed))


@pytest.mark.slow
def test_a_broken_repository_stops_the_server_with_its_reason_once(run_module, tmp_path) -> None:
    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.yaml").write_text(
        "backend: onnx\nmodel_file: model.onnx\nmax_batch_size: 4\nslo_ms: 100\n"
        "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]\n"
        "outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]\n"
    )
    done = run_module("app", "serve", "--repository", str(tmp_path), "--port", "0")
    assert done.returncode != 0
    log = done.stdout + done.stderr
    assert "Traceback" not in log, log
    assert log.count("model file not found") == 1, log
    assert "start-up stopped: no model loaded" in log
