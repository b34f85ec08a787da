"""The optional compiled core (app/build_fast.py): the pure-Python modules are
the fallback and what the suite runs where nothing is built, and a build
makes the same decisions as they do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from app import build_fast
from tests.conftest import ROOT

WORKLOAD = ROOT / "bench" / "workloads" / "symphony-table4-resnet50.yaml"

# Runs in a child whose `app` is a copy: one simulation per policy (Symphony,
# compiled; Clockwork, interpreted on the compiled Scheduler), its trace
# hashed; and the options each policy takes (read from its signature).
_SIMULATE = """
import hashlib, json, sys
import numpy as np
from app.build_fast import compiled_modules
from app.scheduling.registry import policy_names, policy_options
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload

workload = load_workload(sys.argv[1])
arrivals = generate_arrivals(workload, 0.5)
out = {"compiled": compiled_modules(), "options": {p: policy_options(p) for p in policy_names()}}
for policy in ("symphony", "symphony-wc", "clockwork"):
    trace = simulate(workload, policy, arrivals=arrivals).trace
    digest = hashlib.sha256()
    for column in (trace.status, trace.finish, trace.start, trace.batch_size, trace.drop_reason):
        digest.update(np.ascontiguousarray(column).tobytes())
    out[policy] = {
        "hash": digest.hexdigest(),
        "good": int((trace.status == 1).sum()),
        "requests": len(trace.status),
        "batches": trace.batches,
    }
print(json.dumps(out))
"""


def test_a_module_loads_compiled_exactly_when_its_extension_is_built() -> None:
    built = {p.name.split(".")[0] for p in build_fast.extensions()}
    compiled = build_fast.compiled_modules()
    assert list(compiled) == [build_fast.module_name(p) for p in build_fast.MODULES]
    for name, is_compiled in compiled.items():
        assert is_compiled == (name.rsplit(".", 1)[1] in built), name
    if os.environ.get("CI"):
        # CI tests the pure-Python core: nothing is built in its checkout.
        assert not any(compiled.values()) and not built


def test_the_core_imports_without_mypy_installed() -> None:
    # mypy_extensions comes with mypy, never with the server: the stand-in
    # decorator must leave Scheduler an ordinary class that policies subclass.
    code = (
        "import sys; sys.modules['mypy_extensions'] = None\n"
        "from app.scheduling.compiled import mypyc_attr\n"
        "from app.scheduling.registry import make_scheduler\n"
        "@mypyc_attr(allow_interpreted_subclasses=True)\n"
        "class Plain: pass\n"
        "assert Plain.__name__ == 'Plain'\n"
        "from app.scheduling.clockwork import ClockworkScheduler\n"
        "print(ClockworkScheduler.name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clockwork"


def _copy_package(into: Path) -> Path:
    shutil.copytree(
        ROOT / "app",
        into / "app",
        # built models (up to 256 MiB each) play no part in a simulation
        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.onnx", "*.pt", "*.npz"),
    )
    return into


def _simulate(root: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _SIMULATE, str(WORKLOAD)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _needs_a_build() -> str | None:
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "the compiled build needs the `fast` extra (mypy): pip install -e '.[fast]'"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"the compiled build needs a C compiler ({compiler} not found)"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_needs_a_build() is not None, reason=str(_needs_a_build()))
def test_a_compiled_core_decides_as_the_pure_python_one(tmp_path: Path) -> None:
    pure = _copy_package(tmp_path / "pure")
    compiled = _copy_package(tmp_path / "compiled")
    built = build_fast.build(compiled, opt_level="0")  # decides as -O3 does, 3x sooner
    assert len(built) == len(build_fast.MODULES) + 1
    assert not build_fast.extensions(pure)
    a, b = _simulate(pure), _simulate(compiled)
    assert not any(a.pop("compiled").values())
    assert all(b.pop("compiled").values())
    assert a == b
    assert "pruning" in a["options"]["symphony"] and "timer_lead" in a["options"]["symphony"]
    assert a["symphony"]["requests"] > 40_000 and a["symphony"]["good"] > 0.9 * 40_000
    assert build_fast.clean(compiled) == built and not build_fast.extensions(compiled)
