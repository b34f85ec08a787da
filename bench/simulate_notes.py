"""Notes under the simulator's tables: why a row looks odd.

A table of policies side by side invites misreading where a policy's own
rule cannot serve the load, or where it has nothing to work with:

- a policy under half within SLO: the throughput its batches give (its mean
  batch b̄ on every device, ℓ(b̄) each) against the offered load; a policy
  that does not drop for deadlines then serves late;
- gpulet and inss: batch rules made for devices shared between models
  (inss.txt), capped at the largest b with ℓ(b) ≤ SLO / 2 without a plan;
- an advised device change beyond the cluster's size: Symphony's rule
  ⌈N·r/(1 − r)⌉ grows without bound as the bad rate r nears 1;
- orloj on a workload without input-dependent models: its per-application
  histograms have one value each, and it orders as clockwork does.
"""

from __future__ import annotations

import math
from typing import Any

from app.workloads.spec import Workload

ODD_ATTAINMENT = 0.5  # rows below it get a note
SHARED_DEVICE_RULES = {
    "gpulet": "its batch is the largest with ℓ(b) ≤ SLO / 2, sent when full or SLO / 2 after "
    "its first request",
    "inss": "without a plan its batch is BDA's, the largest whose worst case (waiting for a "
    "full batch, then running it) meets the SLO",
}


def _base(label: str) -> str:
    return label.split(":", 1)[0]


def _load_note(label: str, entry: dict[str, Any], workload: Workload) -> str | None:
    """Why `label` serves under half within SLO: the device time its batches
    need for the offered load, when over 100 %."""
    n = len(workload.devices)
    if n == 0:
        return None
    need_s = 0.0  # device-seconds per second that the offered load takes
    batches = []
    for model in workload.models:
        m = entry["models"].get(model.name)
        if not m or not m.get("mean_batch_size"):
            continue
        b = max(1, round(m["mean_batch_size"]))
        latency_ms = model.profile.latency(b) * 1000.0
        need_s += m["offered_rps"] / b * latency_ms / 1000.0
        batches.append(f"{model.name}: b̄ {b}, ℓ {latency_ms:.1f} ms")
    if not batches:
        return None
    share = need_s / n
    o = entry["overall"]
    text = (
        f"{label}: {100 * o['slo_attainment']:.1f} % within SLO. At its mean batch "
        f"({'; '.join(batches[:3])}{'; …' if len(batches) > 3 else ''}) the offered load needs "
        f"{100 * share:.0f} % of the {n} devices' time"
    )
    if share > 1.0:
        text += f": it cannot serve this load (at most ~{o['offered_rps'] / share:,.0f} r/s)"
    if o["late_fraction"] > o["drop_fraction"]:
        text += "; it does not drop requests that will miss, so its queue grows and they are late"
    rule = SHARED_DEVICE_RULES.get(_base(label))
    if rule:
        text += f". {_base(label)} is made for devices shared between models (inss.txt): {rule}"
    return text + "."


def notes(doc: dict[str, Any], workload: Workload) -> list[str]:
    """One line per odd row of the document's tables."""
    out: list[str] = []
    n = len(workload.devices)
    policies = doc["policies"]
    for label, entry in policies.items():
        if entry["overall"]["slo_attainment"] < ODD_ATTAINMENT:
            note = _load_note(label, entry, workload)
            if note:
                out.append(note)
    huge = {
        label: e["autoscale"]
        for label, e in policies.items()
        if abs(e["autoscale"]["advised_device_change"]) > max(2 * n, 8)
    }
    if huge:
        shown = ", ".join(
            f"{label} {a['advised_device_change']:+d} at r = {100 * a['bad_rate']:.1f} %"
            for label, a in huge.items()
        )
        out.append(
            f"advised Δdev is Symphony's rule ⌈N·r/(1 − r)⌉ on the bad rate r, which grows "
            f"without bound as r nears 100 % ({shown}): read it as far more devices than "
            f"these {n}, not a count."
        )
    static = all(m.latency is None for m in workload.models)
    for label in policies:
        if _base(label) != "orloj" or not static:
            continue
        same = ""
        clockwork = policies.get("clockwork")
        if clockwork is not None and math.isclose(
            clockwork["overall"]["goodput_rps"], policies[label]["overall"]["goodput_rps"]
        ):
            same = ", hence clockwork's figures"
        out.append(
            f"{label}: no model here has input-dependent execution time (a `latency:` block), "
            f"so its per-application histograms hold one value each and it orders requests "
            f"by deadline as clockwork does{same}."
        )
    return out
