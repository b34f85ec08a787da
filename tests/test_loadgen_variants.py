"""bench.loadgen and dynamic models: each request carries its application
(`app_id`) and, where the workload gives an application `inputs` (.npz), one
of its rows as its inputs (bench/loadgen/variants.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload
from bench.loadgen import LoadGenError
from bench.loadgen.targets import build_targets
from bench.loadgen.variants import workload_variants

WORKLOAD = """\
name: dyn
duration_s: 2
seed: 5
devices: 1
models:
  - name: static
    profile: {alpha_ms: 1.0, beta_ms: 5.0}
    slo_ms: 100
    max_batch: 8
    rate: 50
  - name: dyn
    max_batch: 8
    rate: 100
    slo_ms: 200
    latency:
      batch: {c0_ms: 5.0, c1: 0.1}
      apps:
        - {name: short, share: 0.5, modes: [{mean_ms: 20, std_ms: 2}], inputs: short.npz}
        - {name: long, share: 0.5, modes: [{mean_ms: 60, std_ms: 2}]}
"""
META = [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]


def _workload(tmp_path: Path):
    rows = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]], dtype=np.float32)
    np.savez(tmp_path / "short.npz", x=rows)
    (tmp_path / "dyn.yaml").write_text(WORKLOAD)
    return load_workload(tmp_path / "dyn.yaml")


def test_each_request_sends_its_application_and_its_applications_inputs(tmp_path) -> None:
    workload = _workload(tmp_path)
    assert workload.models[1].latency.apps[0].inputs == (tmp_path / "short.npz").resolve()
    arrivals = generate_arrivals(workload, 1.0)
    targets = build_targets(workload, {"static": META, "dyn": META})
    made = workload_variants(workload, arrivals, targets)
    assert made is not None
    bodies, index = made
    assert len(index) == len(arrivals) > 100
    seen_rows = set()
    for i, (m, app) in enumerate(zip(arrivals.model_index, arrivals.apps, strict=True)):
        doc = json.loads(bodies[index[i]])
        if m == 0:  # the static model: its one body, no application
            assert index[i] == 0 and "app_id" not in doc
            continue
        assert doc["model"] == "dyn" and doc["app_id"] == app
        if app == "short":  # a row of short.npz, as a batch of one
            (row,) = doc["inputs"]["x"]
            assert row[0] in (1.0, 2.0, 3.0) and len(set(row)) == 1
            seen_rows.add(row[0])
        else:  # the model's generated input
            assert doc["inputs"] == json.loads(targets[1].body)["inputs"]
    assert seen_rows == {1.0, 2.0, 3.0}
    # The same workload sends the same requests again.
    again_bodies, again = workload_variants(workload, arrivals, targets)
    assert (again == index).all() and again_bodies == bodies


def test_inputs_that_are_not_the_models_are_refused(tmp_path) -> None:
    workload = _workload(tmp_path)
    np.savez(tmp_path / "short.npz", y=np.zeros((2, 3), dtype=np.float32))
    arrivals = generate_arrivals(workload, 1.0)
    targets = build_targets(workload, {"static": META, "dyn": META})
    with pytest.raises(LoadGenError, match=r"inputs \['y'\] are not the model's"):
        workload_variants(workload, arrivals, targets)


def test_a_static_workload_has_no_variants(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(WORKLOAD.split("  - name: dyn")[0])
    workload = load_workload(path)
    arrivals = generate_arrivals(workload, 1.0)
    assert workload_variants(workload, arrivals, build_targets(workload, {"static": META})) is None


def test_an_application_inputs_file_must_exist(tmp_path) -> None:
    (tmp_path / "dyn.yaml").write_text(WORKLOAD)
    with pytest.raises(ValueError, match=r"inputs.*no such file"):
        load_workload(tmp_path / "dyn.yaml")


LIVE = """\
name: earlyexit-apps
duration_s: 1
seed: 1
devices: 1
models:
  - name: earlyexit
    max_batch: 8
    rate: 40
    slo_ms: 200
    latency:
      batch: {c0_ms: 1.0, c1: 0.1}
      apps:
        - {name: short, share: 0.5, modes: [{mean_ms: 10, std_ms: 1}], inputs: short.npz}
        - {name: long, share: 0.5, modes: [{mean_ms: 100, std_ms: 1}], inputs: long.npz}
"""


@pytest.mark.slow
def test_the_daemon_serves_each_applications_inputs(tmp_path, launch_daemon) -> None:
    """Live: the bundled early-exit model, two applications whose inputs take
    2 and 12 steps; every request answered, and a variant body's answer
    names its application and ran its steps."""
    import asyncio
    import shutil

    import httpx

    from app.repository import BUNDLED_REPOSITORY
    from app.repository.bundled import ensure_bundled_models
    from app.repository.dynamic_models import early_exit_input
    from bench.loadgen import prepare_targets, run_load

    repository = tmp_path / "models"
    shutil.copytree(BUNDLED_REPOSITORY / "earlyexit", repository / "earlyexit")
    ensure_bundled_models(repository, ["earlyexit"])
    for app, steps in (("short", 2), ("long", 12)):
        np.savez(tmp_path / f"{app}.npz", input=early_exit_input(steps))
    (tmp_path / "w.yaml").write_text(LIVE)
    workload = load_workload(tmp_path / "w.yaml")
    url = launch_daemon(repository, emulated_devices=0).url
    targets = asyncio.run(prepare_targets(url, workload))
    result = asyncio.run(run_load(url, workload, targets=targets))
    assert result.summary["overall"]["requests"] > 10
    assert result.summary["overall"]["error_fraction"] == 0.0, result.summary["overall"]
    bodies, _ = workload_variants(workload, generate_arrivals(workload, 1.0), targets)
    for body in bodies[1:]:
        sent = json.loads(body)
        answer = httpx.post(f"{url}/infer", content=body, timeout=30).json()
        steps = answer["outputs"]["steps"]["data"][0][0]
        assert answer["timing"]["app_id"] == sent["app_id"], answer["timing"]
        assert steps == {"short": 2, "long": 12}[sent["app_id"]]
