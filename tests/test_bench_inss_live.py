"""bench.inss_live (two models sharing the CPU vs in turn) and
bench.inss_shadow (reallocation under load): their set-ups, and short runs
end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.inss_live import SETUPS, repository, workload
from bench.inss_shadow import SCHEDULE

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.name)
def test_each_setup_places_the_two_models_as_it_says(tmp_path: Path, setup) -> None:
    root = repository(tmp_path / "models", ["mlp", "cnn"], setup)
    devices = {
        name: yaml.safe_load((root / name / "config.yaml").read_text())["devices"]
        for name in ("mlp", "cnn")
    }
    if setup.shares:
        assert devices == {"mlp": ["cpu:0/0"], "cnn": ["cpu:0/1"]}
        assert setup.env() == {"CPU_SLICES": "1", "DEVICE_SHARES": "cpu=0.5,0.5"}
    else:
        assert devices == {"mlp": ["cpu:0"], "cnn": ["cpu:0"]}
        assert setup.env() == {"CPU_SLICES": "1", "THREADS_PER_SLICE": str(setup.threads)}
    assert (root / "mlp" / "model.onnx").is_file()
    load = workload(["mlp", "cnn"], [300, 100], 5.0)
    assert [(m.name, m.rate, m.slo_ms) for m in load.models] == [
        ("mlp", 300, 100.0),
        ("cnn", 100, 100.0),
    ]


def test_the_reshare_schedule_keeps_each_step_within_the_device() -> None:
    shares = {"emulated:0/0": 0.5, "emulated:0/1": 0.5}
    for _, device, share in SCHEDULE:
        shares[device] = share
        assert sum(shares.values()) <= 1.0 + 1e-9
    assert shares == {"emulated:0/0": 0.5, "emulated:0/1": 0.5}


@pytest.mark.slow
def test_shadow_quick_run_answers_every_request_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.inss_shadow",
            "--quick",
            "--duration",
            "3",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    body = json.loads((tmp_path / "shadow.json").read_text())
    for name in ("steady", "reshare"):
        run = body["runs"][name]
        assert run["sent"] == run["answered"] > 0 and run["unanswered"] == 0
        assert run["answered_twice"] == 0
        assert run["server_successes"] == run["client_answers_with_outputs"]
    switches = body["runs"]["reshare"]["switches"]
    assert [(s["name"], s["new_share"]) for s in switches] == [(d, s) for _, d, s in SCHEDULE]
    assert all(s["old_failure"] is None and s["switch_s"] < s["total_s"] for s in switches)
    assert (tmp_path / "shadow.md").read_text().startswith("| run |")


def test_the_moves_plans_put_the_models_apart_then_on_halves_of_one_device(
    tmp_path: Path,
) -> None:
    from app.planning.plan_files import read_plan_file
    from app.server.plans import inss_placement
    from bench.inss_shadow import MOVES_START, MOVES_TOGETHER, changes, plan_file

    apart = inss_placement(read_plan_file(plan_file(tmp_path / "a.json", MOVES_START)))
    assert apart.shares == {} and apart.device_of == {"alpha": "emulated:0", "beta": "emulated:1"}
    together = inss_placement(read_plan_file(plan_file(tmp_path / "t.json", MOVES_TOGETHER)))
    assert together.shares == {"emulated:0": (0.5, 0.5)}
    assert together.device_of == {"alpha": "emulated:0/0", "beta": "emulated:0/1"}
    assert together.batch == {"alpha": 6, "beta": 2}
    answer = {
        "added": ["emulated:0/0", "emulated:0/1"],
        "removed": ["emulated:0"],
        "reshared": [{"device": "emulated:1/0", "share": 0.3, "total_s": 0.2}],
    }
    assert changes(answer, timed=True) == [
        "+emulated:0/0",
        "+emulated:0/1",
        "−emulated:0",
        "emulated:1/0 → 0.3 (0.200)",
    ]


@pytest.mark.slow
def test_plans_quick_run_takes_up_both_posted_plans_and_answers_every_request_once(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.inss_shadow", "--quick", "--duration", "3", "--plans",
         "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    body = json.loads((tmp_path / "plan-switch.json").read_text())
    for name in ("steady", "reshare"):
        run = body["runs"][name]
        assert run["sent"] == run["answered"] > 0 and run["unanswered"] == 0
        assert run["answered_twice"] == 0
    switches = body["runs"]["reshare"]["switches"]
    assert [[(r["device"], r["share"]) for r in s["reshared"]] for s in switches] == [
        [("emulated:0/1", 0.3), ("emulated:0/0", 0.7)],  # shrink first
        [("emulated:0/0", 0.5), ("emulated:0/1", 0.5)],
    ]
    assert [s["batch"] for s in switches] == [{"alpha": 4, "beta": 3}, {"alpha": 6, "beta": 2}]
    assert (tmp_path / "plan-switch.md").read_text().startswith("| run |")


@pytest.mark.slow
def test_live_quick_run_of_one_setup_measures_the_co_location(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.inss_live",
            "--quick",
            "--setups",
            "shares/symphony",
            "--rates",
            "40,40",
            "--out-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    body = json.loads((tmp_path / "live.json").read_text())
    (row,) = body["setups"]
    assert (row["setup"], row["policy"]) == ("shares/symphony", "symphony")
    assert len(row["probes"]) == 1 and row["probes"][0]["offered_rps"] > 0
    # Each model measured beside the other, on its own core.
    assert sorted(line.split("model ")[1].split(":")[0] for line in row["colocation"]) == [
        "cnn on cpu",
        "mlp on cpu",
    ]
