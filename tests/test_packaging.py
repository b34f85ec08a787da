"""The project as a user installs and runs it: a built wheel (not an editable
install) serves the bundled models from outside the checkout, and several
uvicorn workers are refused (one scheduler per box)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.daemon_launcher import free_port
from tests.conftest import ROOT

# What a fresh clone does not have: build output, caches, generated models.
_NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git",
    ".venv*",  # the server's and the peers' (1 GB) environments
    ".mypy_cache",
    ".hypothesis",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    "*.onnx",
    "*.pt",
    "profile.*.json",
)


def _clean_env(cli_env: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in cli_env.items() if k not in ("PYTHONPATH", "WEB_CONCURRENCY")}
    return {**env, **extra}


def _wait_ready(process: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"server not ready in {timeout_s} s:\n{log.read_text()}")


def _stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


@pytest.mark.slow
def test_a_built_wheel_serves_the_bundled_models_from_outside_the_checkout(tmp_path, cli_env):
    source, dist, target, elsewhere = (tmp_path / d for d in ("src", "dist", "site", "elsewhere"))
    shutil.copytree(ROOT, source, ignore=_NOT_IN_A_CLONE)
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), "."],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = dist.glob("deadline_serve-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    # The dependencies come from this environment; `app` only from the wheel
    # (PYTHONPATH comes before the editable install's finder).
    env = _clean_env(cli_env, PYTHONPATH=str(target))
    where = subprocess.run(
        [sys.executable, "-c", "import app; print(app.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()) == target / "app" / "__init__.py"
    # No top-level `bench` in the wheel; the console script, which says where
    # the benchmarks run from.
    assert not (target / "bench").exists()
    script = target / "bin" / "deadline-serve"
    done = subprocess.run(
        [sys.executable, str(script), "simulate"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "not installed with the wheel" in done.stderr, done
    assert sorted(p.parent.name for p in (target / "app" / "models").glob("*/config.yaml")) == [
        p.parent.name for p in sorted((ROOT / "app" / "models").glob("*/config.yaml"))
    ]

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port), "--log-level", "info"],
            cwd=elsewhere,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(process, url, log, timeout_s=90)
        # The generated model was built inside the installed package.
        assert (target / "app" / "models" / "cnn" / "model.onnx").is_file()
        x = np.linspace(-1, 1, 3 * 32 * 32, dtype=np.float32)
        body = {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32"}]}
        body["inputs"][0]["data"] = x.tolist()
        reply = httpx.post(f"{url}/v2/models/cnn/infer", json=body, timeout=10)
        assert reply.status_code == 200, reply.text
        (output,) = reply.json()["outputs"]
        assert output["shape"] == [1, 10]
        assert np.isfinite(output["data"]).all()
    finally:
        assert _stop(process) == 0, log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_several_uvicorn_workers_are_refused(how, tmp_path, cli_env):
    """`uvicorn app.main:app --workers 2` (or WEB_CONCURRENCY=2, which uvicorn
    reads when no --workers is given) exits non-zero saying why, before any
    executor starts."""
    port = free_port()
    args = ["--workers", "2"] if how == "flag" else []
    extra = {"WEB_CONCURRENCY": "2"} if how == "environment" else {}
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), *args],
        cwd=ROOT,
        env=_clean_env(cli_env, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "one scheduler per box" in output, output
    assert "uvicorn runs 2 worker processes" in output, output
    assert "Application startup complete" not in output, output


@pytest.mark.slow
def test_one_uvicorn_worker_is_accepted(tmp_path, cli_env):
    """--workers 1 is the one process the design wants: it serves."""
    repository = tmp_path / "models"
    shutil.copytree(ROOT / "app" / "models" / "resnet50-emulated", repository / "resnet50-emulated")
    port = free_port()
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--workers=1"],
            cwd=ROOT,
            env=_clean_env(cli_env, MODEL_REPOSITORY=str(repository), EMULATED_DEVICES="1"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(process, f"http://127.0.0.1:{port}", log, timeout_s=60)
    finally:
        assert _stop(process) == 0, log.read_text()


def test_an_unwritable_bundled_repository_says_how_to_build_it(tmp_path, monkeypatch):
    """A read-only install cannot build the generated files next to the
    configs: the error names the file and both ways out, before building."""
    from app.repository import bundled

    shutil.copytree(ROOT / "app" / "models" / "cnn", tmp_path / "cnn", ignore=_NOT_IN_A_CLONE)
    monkeypatch.setattr(bundled.os, "access", lambda path, mode: False)
    built: list[str] = []
    monkeypatch.setattr(bundled, "atomic_write_bytes", lambda path, data: built.append(path))
    with pytest.raises(PermissionError) as caught:
        bundled.ensure_bundled_models(tmp_path, ["cnn"])
    message = str(caught.value)
    assert str(tmp_path / "cnn" / "model.onnx") in message
    assert "python -m app.repository.bundled" in message
    assert "MODEL_REPOSITORY" in message
    assert built == []
