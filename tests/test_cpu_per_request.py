"""bench.cpu_per_request and bench.proc_cpu: the CPU of a process tree per
answered request, on a fake /proc (no process is started)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from app.workloads.spec import load_workload
from bench.compare import SETUPS
from bench.cpu_per_request import cpu_probes, main, table
from bench.proc_cpu import TICKS_PER_S, parse_stat, read_tree, tree, usage

SCHEMA = json.loads((Path(__file__).parent.parent / "bench" / "compare_schema.json").read_text())


def stat_line(pid: int, ppid: int, name: str, utime: int, stime: int, start: int = 1) -> str:
    # Fields 1-22 of /proc/<pid>/stat as the kernel writes them (the rest cut).
    fields = ["S", ppid] + [0] * 9 + [utime, stime, 0, 0, 20, 0, 1, 0, start]
    return f"{pid} ({name}) " + " ".join(map(str, fields)) + " 3133440 394\n"


class FakeProc:
    """A /proc with the processes set in it (ticks of CPU each)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)
        (root / "self").mkdir()  # not a pid: skipped

    def set(self, pid: int, ppid: int, name: str, ticks: int, start: int = 1) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        (self.root / str(pid) / "stat").write_text(stat_line(pid, ppid, name, ticks, 0, start))

    def remove(self, pid: int) -> None:
        (self.root / str(pid) / "stat").unlink()
        (self.root / str(pid)).rmdir()


def test_a_stat_line_is_read_past_a_name_with_spaces_and_parentheses():
    stat = parse_stat(stat_line(42, 7, "a (b) c", utime=150, stime=50, start=99))
    assert (stat.pid, stat.ppid, stat.name, stat.start_ticks) == (42, 7, "a (b) c", 99)
    assert stat.cpu_s == pytest.approx(200 / TICKS_PER_S)
    own = parse_stat(Path("/proc/self/stat").read_text())
    assert own.cpu_s >= 0 and own.ppid > 0


def test_the_tree_is_the_root_and_every_descendant_only(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.set(10, 1, "daemon", 100)
    proc.set(11, 10, "executor", 10)
    proc.set(12, 11, "grandchild", 5)
    proc.set(20, 1, "other", 999)  # not under the root
    assert [s.pid for s in read_tree(10, proc.root)] == [10, 11, 12]
    assert read_tree(99, proc.root) == []
    assert [s.pid for s in tree(11, {s.pid: s for s in read_tree(10, proc.root)})] == [11, 12]


def test_usage_counts_differences_new_processes_whole_and_names_the_gone(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.set(10, 1, "daemon", 100)
    proc.set(11, 10, "executor", 10)
    proc.set(12, 10, "exits", 7)
    before = read_tree(10, proc.root)
    proc.set(10, 1, "daemon", 160)  # +60 ticks
    proc.set(11, 10, "executor", 30)  # +20
    proc.remove(12)
    proc.set(13, 10, "new", 4)  # started during the run: all 4
    used = usage(before, read_tree(10, proc.root))
    spent = {p.pid: round(p.cpu_s * TICKS_PER_S) for p in used.processes}
    assert spent == {10: 60, 11: 20, 13: 4}
    assert [p.role for p in used.processes] == ["main", "child", "child"]
    assert used.gone == 1
    assert used.total_s * TICKS_PER_S == pytest.approx(84)


def test_a_reused_pid_is_a_new_process(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.set(10, 1, "daemon", 100)
    proc.set(11, 10, "old", 50, start=5)
    before = read_tree(10, proc.root)
    proc.set(11, 10, "new", 8, start=9)  # the pid came back for another process
    used = usage(before, read_tree(10, proc.root))
    assert {p.pid: round(p.cpu_s * TICKS_PER_S) for p in used.processes} == {10: 0, 11: 8}
    assert used.gone == 1


def test_cpu_probes_divide_each_process_by_the_answered_requests(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.set(10, 1, "daemon", 0)
    proc.set(11, 10, "executor", 0)
    workload = load_workload(SETUPS["a"].workload)
    runs = []

    def fake_run(url, wl, scale, targets):
        runs.append((wl.duration_s, scale * workload.offered_rate()))
        if len(runs) > 1:  # the warm-up uses no CPU here
            proc.set(10, 1, "daemon", int(0.5 * TICKS_PER_S))  # 0.5 s
            proc.set(11, 10, "executor", int(0.25 * TICKS_PER_S))  # 0.25 s
        return 1000

    rows = cpu_probes("http://x", 10, workload, [], [250.0], 4.0, run=fake_run, proc=proc.root)
    assert runs == [(2.0, pytest.approx(250.0)), (4.0, pytest.approx(250.0))]
    (row,) = rows
    assert row["answered"] == 1000 and row["answered_rps"] == 250.0
    assert row["cpu_ms_per_request"] == pytest.approx(0.75)
    per = {p["name"]: p["cpu_ms_per_request"] for p in row["processes"]}
    assert per == {"daemon": pytest.approx(0.5), "executor": pytest.approx(0.25)}
    # The rows are what bench.compare's results hold under cpu_per_request.
    jsonschema.validate(row, {"$defs": SCHEMA["$defs"], "$ref": "#/$defs/cpu_probe"})
    text = table([{"system": "symphony", "label": "daemon", "cpu_per_request": rows}])
    assert "| daemon | 250 | 250 | 0.750 | 0.500 | 0.250 |" in text


def test_no_answer_gives_no_figure_rather_than_a_division_by_zero(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.set(10, 1, "daemon", 0)
    workload = load_workload(SETUPS["a"].workload)
    rows = cpu_probes("u", 10, workload, [], [100.0], 1.0, run=lambda *a: 0, proc=proc.root)
    assert rows[0]["cpu_ms_per_request"] is None
    assert rows[0]["processes"][0]["cpu_ms_per_request"] is None


def test_a_peer_that_is_not_installed_is_reported_not_skipped(tmp_path, monkeypatch, capsys):
    from bench.compare.peers import PEERS, PeerUnavailable

    def missing():
        raise PeerUnavailable("peer 'bentoml' needs its venv: install it")

    monkeypatch.setattr(PEERS["bentoml"], "check", missing)
    out = tmp_path / "cpu.json"
    assert main(["--systems", "none", "--peers", "bentoml", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["systems"] == [
        {"system": "bentoml", "unavailable": "peer 'bentoml' needs its venv: install it"}
    ]
    assert "bentoml | not installed: peer 'bentoml' needs its venv" in capsys.readouterr().out


def test_rates_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["--rates", "0"])
    assert "rates must be > 0" in capsys.readouterr().err


def _probe(total_ms: float, main_ms: float, answered: int = 1000) -> dict:
    """A probe row at 250 r/s: `main_ms` in the main process, the rest in one child."""
    child_ms = total_ms - main_ms
    return {
        "offered_rps": 250.0,
        "answered": answered,
        "answered_rps": answered / 4.0,
        "cpu_ms_per_request": total_ms,
        "processes_gone": 0,
        "processes": [
            {"pid": 1, "name": "d", "role": "main", "cpu_s": main_ms * answered / 1000,
             "cpu_ms_per_request": main_ms},
            {"pid": 2, "name": "e", "role": "child", "cpu_s": child_ms * answered / 1000,
             "cpu_ms_per_request": child_ms},
        ],
    }  # fmt: skip


def test_rounds_alternate_the_order_and_the_table_gives_each_figures_median(
    tmp_path, monkeypatch, capsys
):
    import bench.cpu_per_request as cpu
    from bench.compare.peers import PEERS

    calls: list[str] = []
    daemon_totals = iter([0.9, 1.3, 1.0])  # rounds 1, 2, 3
    triton_totals = iter([0.6, 0.7, 0.65])

    def fake_daemon(setup, workload, policy, args):
        calls.append(policy)
        total = next(daemon_totals)
        return {"system": policy, "label": "daemon", "cpu_per_request": [_probe(total, 0.7)]}

    def fake_peer(setup, workload, name, args):
        calls.append(name)
        total = next(triton_totals)
        return {"system": name, "label": "Triton", "cpu_per_request": [_probe(total, 0.2)]}

    monkeypatch.setattr(cpu, "measure_daemon", fake_daemon)
    monkeypatch.setattr(cpu, "measure_peer", fake_peer)
    monkeypatch.setattr(PEERS["tritonserver"], "check", lambda: None)
    out = tmp_path / "cpu.json"
    argv = ["--rounds", "3", "--systems", "symphony", "--peers", "tritonserver", "--out", str(out)]
    assert cpu.main(argv) == 0
    # A B, B A, A B: a drift of the machine falls on both alike.
    assert calls == ["symphony", "tritonserver", "tritonserver", "symphony", "symphony",
                     "tritonserver"]  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["rounds"] == 3
    daemon, triton = doc["systems"]
    assert [r["round"] for r in daemon["cpu_per_request"]] == [1, 2, 3]
    assert [r["cpu_ms_per_request"] for r in triton["cpu_per_request"]] == [0.6, 0.7, 0.65]
    for row in daemon["cpu_per_request"]:
        jsonschema.validate(row, {"$defs": SCHEMA["$defs"], "$ref": "#/$defs/cpu_probe"})
    text = capsys.readouterr().out
    # Medians: daemon 1.0 (main 0.7, children 0.3), Triton 0.65 (0.2, 0.45).
    assert "| daemon | 250 | 250 | 1.000 | 0.700 | 0.300 | 0.900 / 1.300 / 1.000 |" in text
    assert "| Triton | 250 | 250 | 0.650 | 0.200 | 0.450 | 0.600 / 0.700 / 0.650 |" in text


def test_an_unavailable_peer_is_tried_once_however_many_rounds(tmp_path, monkeypatch):
    import bench.cpu_per_request as cpu

    tried: list[str] = []

    def missing(setup, workload, name, args):
        tried.append(name)
        return {"system": name, "unavailable": "not here"}

    monkeypatch.setattr(cpu, "measure_peer", missing)
    out = tmp_path / "cpu.json"
    assert cpu.main(["--rounds", "4", "--systems", "none", "--peers", "bentoml",
                     "--out", str(out)]) == 0  # fmt: skip
    assert tried == ["bentoml"]
    (system,) = json.loads(out.read_text())["systems"]
    assert system == {"system": "bentoml", "unavailable": "not here"}


@pytest.mark.parametrize("rounds", ["0", "-1", "1.5", "x"])
def test_rounds_must_be_a_whole_number_of_at_least_one(rounds, capsys):
    with pytest.raises(SystemExit):
        main(["--rounds", rounds])
    assert "rounds must be a whole number" in capsys.readouterr().err
