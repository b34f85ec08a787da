"""bench/autoscale_live.py --quick: the daemon under AUTOSCALE=2:8 on
emulated devices starts parked devices after the load steps up, releases
them after it steps down, and answers every request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import autoscale_live


@pytest.mark.slow
def test_quick_run_grows_after_the_step_up_and_shrinks_after_the_step_down(tmp_path: Path):
    code = autoscale_live.main(["--quick", "--out-dir", str(tmp_path)])
    document = json.loads((tmp_path / "live.json").read_text())
    assert (tmp_path / "live.md").read_text().startswith("Load step 150 → 600 → 150 r/s")
    (row,) = document["systems"].values()
    phase_s = document["options"]["phase_s"]
    assert phase_s == 8.0

    assert code == 0
    assert row["requests"] > 0.9 * (150 + 600 + 150) * phase_s
    assert row["unanswered"] == 0 and row["answered"] == row["requests"], row["no_answer"]
    assert row["devices_at_step_up"] == 2
    assert row["devices_peak_after_step_up"] > 2
    assert row["first_added_alive_s"] is not None and 0 < row["first_added_alive_s"] < phase_s
    after_down = [n for t, n in row["devices_over_time"] if t > 2 * phase_s]
    assert after_down and min(after_down) < row["devices_peak_after_step_up"]
    # Device-seconds: fewer than keeping all 8 the whole run, more than 2.
    assert 2 * 3 * phase_s < row["device_seconds"] < 8 * 3 * phase_s
