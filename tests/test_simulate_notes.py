"""The simulator's notes under its tables say why a row looks odd, with the
numbers behind it (bench/simulate_notes.py)."""

from __future__ import annotations

from app.workloads.spec import load_workload
from bench.simulate_notes import notes
from tests.conftest import ROOT

TABLE4 = ROOT / "bench" / "workloads" / "symphony-table4-resnet50.yaml"


def _entry(attainment, late, drop, batch, advised=0, bad=0.0, goodput=5000.0):
    overall = {
        "slo_attainment": attainment,
        "late_fraction": late,
        "drop_fraction": drop,
        "mean_batch_size": batch,
        "offered_rps": 5024.1,
        "goodput_rps": goodput,
    }
    return {
        "overall": overall,
        "models": {"resnet50": dict(overall)},
        "autoscale": {"advised_device_change": advised, "bad_rate": bad},
    }


def test_odd_rows_are_explained_with_their_numbers() -> None:
    workload = load_workload(TABLE4)
    doc = {
        "policies": {
            "symphony": _entry(0.9998, 0.0, 0.0002, 15.5, advised=-1, bad=0.0002),
            "gpulet": _entry(0.0052, 0.8917, 0.1031, 7.0, advised=1535, bad=0.9948, goodput=26.1),
            "clockwork": _entry(0.743, 0.0, 0.257, 10.8, advised=3, goodput=3732.8),
            "orloj": _entry(0.743, 0.0, 0.257, 10.8, advised=3, goodput=3732.8),
        }
    }
    said = notes(doc, workload)
    (gpulet,) = [n for n in said if n.startswith("gpulet:")]
    # ℓ(7) = 7 × 1.053 + 5.072 = 12.443 ms; 5,024.1 / 7 × 12.443 ms / 8 devices = 112 %.
    assert "b̄ 7, ℓ 12.4 ms" in gpulet and "112 % of the 8 devices' time" in gpulet
    assert "cannot serve this load" in gpulet and "late" in gpulet and "SLO / 2" in gpulet
    (advised,) = [n for n in said if n.startswith("advised Δdev")]
    assert "gpulet +1535 at r = 99.5 %" in advised and "symphony" not in advised
    (orloj,) = [n for n in said if n.startswith("orloj:")]
    assert "hence clockwork's figures" in orloj
    assert not [n for n in said if n.startswith(("symphony", "clockwork"))]
