"""REALTIME_PRIORITY: SCHED_FIFO for the event loop and the executors."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from app.__main__ import main as app_main
from app.runtime import realtime
from app.runtime.arena import Arena
from app.runtime.devices import ExecutorDevice
from app.runtime.pool import ExecutorPool
from app.runtime.realtime import (
    RealtimeUnavailable,
    SchedState,
    check_priority,
    executor_priority,
    fifo_priority,
    fifo_while,
    restore,
    set_fifo,
)
from app.server.settings import Settings
from tests.fakes import PoolEvents, emulated_config

linux = pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling API")


def test_priority_range_and_executor_step():
    check_priority(0)
    check_priority(99)
    for bad in (-1, 100):
        with pytest.raises(ValueError, match=rf"--flag must be 0 \(off\) to 99, got {bad}"):
            check_priority(bad, "--flag")
    assert [executor_priority(p, "emulated") for p in (0, 1, 2, 10, 99)] == [0, 1, 1, 9, 98]
    assert executor_priority(10, "cuda") == 9
    assert executor_priority(10, "cpu") == 0  # computes: stays at normal priority


def test_settings_read_realtime_priority():
    assert Settings.from_env({}).realtime_priority == 0
    assert Settings.from_env({"REALTIME_PRIORITY": "7"}).realtime_priority == 7
    with pytest.raises(ValueError, match="REALTIME_PRIORITY must be 0 \\(off\\) to 99, got 100"):
        Settings.from_env({"REALTIME_PRIORITY": "100"})
    with pytest.raises(ValueError, match="REALTIME_PRIORITY='high' is not an integer"):
        Settings.from_env({"REALTIME_PRIORITY": "high"})


def test_realtime_priority_tightens_the_default_slack(monkeypatch):
    """At SCHED_FIFO the answer path needs less slack: margin / lead default
    to 1.5 / 0.5 ms instead of 3 / 2; what the operator sets wins."""

    def slack(env: dict[str, str]) -> tuple[float, float]:
        settings = Settings.from_env(env)
        return settings.deadline_margin_ms, settings.timer_lead_ms

    assert slack({}) == (2.0, 1.0) == (Settings().deadline_margin_ms, Settings().timer_lead_ms)
    assert slack({"REALTIME_PRIORITY": "0"}) == (2.0, 1.0)
    assert slack({"REALTIME_PRIORITY": "10"}) == (1.5, 0.5)
    both = {"DEADLINE_MARGIN_MS": "2", "TIMER_LEAD_MS": "1"}
    assert slack({"REALTIME_PRIORITY": "10", **both}) == (2.0, 1.0)
    assert slack(both) == (2.0, 1.0)
    with pytest.raises(ValueError, match="DEADLINE_MARGIN_MS must be ≥ 0"):
        Settings.from_env({"DEADLINE_MARGIN_MS": "-1"})
    # bench.inprocess's --realtime-priority brings the same defaults.
    from bench.inprocess import service_settings

    for name in ("REALTIME_PRIORITY", "DEADLINE_MARGIN_MS", "TIMER_LEAD_MS"):
        monkeypatch.delenv(name, raising=False)
    fifo = service_settings(Path("models"), 2, realtime_priority=10)
    assert (fifo.realtime_priority, fifo.deadline_margin_ms, fifo.timer_lead_ms) == (10, 1.5, 0.5)
    told = service_settings(Path("models"), 2, realtime_priority=10, deadline_margin_ms=1.0)
    assert (told.deadline_margin_ms, told.timer_lead_ms) == (1.0, 0.5)
    assert service_settings(Path("models"), 2).deadline_margin_ms == 2.0


@linux
def test_set_fifo_asks_the_kernel_and_restores(monkeypatch):
    calls: list[tuple[int, int, int]] = []
    state = {"policy": os.SCHED_OTHER, "priority": 0}

    def setscheduler(pid: int, policy: int, param: os.sched_param) -> None:
        calls.append((pid, policy, param.sched_priority))
        state.update(policy=policy, priority=param.sched_priority)

    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    monkeypatch.setattr(os, "sched_getscheduler", lambda pid: state["policy"])
    monkeypatch.setattr(os, "sched_getparam", lambda pid: os.sched_param(state["priority"]))

    assert set_fifo(0) == SchedState(os.SCHED_OTHER, 0)
    assert calls == []  # 0 is off: nothing asked
    before = set_fifo(12)
    assert calls == [(0, os.SCHED_FIFO, 12)]
    assert before == SchedState(os.SCHED_OTHER, 0)
    assert fifo_priority() == 12
    restore(before)
    assert calls[-1] == (0, os.SCHED_OTHER, 0)
    assert fifo_priority() == 0
    with pytest.raises(KeyError), fifo_while(30):
        assert fifo_priority() == 30
        raise KeyError("the block failed")
    assert fifo_priority() == 0  # restored all the same


@linux
def test_refusal_names_the_setting_and_the_fix(monkeypatch):
    def refuse(pid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with pytest.raises(RealtimeUnavailable) as info:
        set_fifo(5, "--realtime-priority")
    message = str(info.value)
    assert message.startswith("--realtime-priority=5: the kernel refused SCHED_FIFO")
    assert "CAP_SYS_NICE" in message and "--realtime-priority=0" in message


@linux
def test_real_kernel_fifo_on_a_thread_or_a_clear_refusal():
    """On a thread of its own, so the test process keeps its policy."""
    seen: dict[str, object] = {}

    def body() -> None:
        try:
            before = set_fifo(1)
        except RealtimeUnavailable as exc:
            seen["refused"] = str(exc)
            return
        seen["during"] = fifo_priority()
        restore(before)
        seen["after"] = fifo_priority()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "refused" in seen:
        assert "REALTIME_PRIORITY=1" in str(seen["refused"])
    else:
        assert seen == {"during": 1, "after": 0}
    assert fifo_priority() == 0


def test_serve_refuses_a_bad_or_refused_priority(monkeypatch, capsys):
    monkeypatch.delenv("REALTIME_PRIORITY", raising=False)
    before = dict(os.environ)
    assert app_main(["serve", "--realtime-priority", "100", "--port", "1"]) == 2
    assert "--realtime-priority must be 0 (off) to 99, got 100" in capsys.readouterr().err

    def refuse(priority: int, setting: str = "REALTIME_PRIORITY") -> None:
        raise RealtimeUnavailable(f"{setting}={priority}: the kernel refused SCHED_FIFO")

    monkeypatch.setattr(realtime, "check_permitted", refuse)
    assert app_main(["serve", "--realtime-priority", "3", "--port", "1"]) == 2
    assert "--realtime-priority=3: the kernel refused SCHED_FIFO" in capsys.readouterr().err
    monkeypatch.setenv("REALTIME_PRIORITY", "3")
    assert app_main(["serve", "--port", "1"]) == 2
    assert "REALTIME_PRIORITY=3: the kernel refused SCHED_FIFO" in capsys.readouterr().err
    # The flag went to the settings only: nothing the suite starts later sees it.
    monkeypatch.delenv("REALTIME_PRIORITY")
    assert dict(os.environ) == before


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
@linux
def test_executors_step_down_from_the_loop_cpu_ones_to_normal():
    """As under LiveService: the loop's thread is at SCHED_FIFO 3 when the
    executors spawn (they inherit it); the emulated one steps to 2, the CPU
    one back to normal scheduling."""
    try:
        realtime.check_permitted(3)
    except RealtimeUnavailable:
        pytest.skip("SCHED_FIFO not permitted here (needs root or CAP_SYS_NICE)")
    config = emulated_config("emu", alpha_ms=1.0, beta_ms=2.0)
    seen: dict[str, object] = {}

    async def scenario() -> None:
        arenas = {config.name: Arena.create(config, capacity=2)}
        devices = [
            ExecutorDevice(0, "emulated", "emulated:0"),
            ExecutorDevice(1, "cpu", "cpu:0", threads=1),
        ]
        pool = ExecutorPool(devices, [config], arenas, PoolEvents(), realtime_priority=3)
        try:
            await pool.start()
            for device in devices:
                pid = pool.pid(device.id)
                seen[device.kind] = (
                    os.sched_getscheduler(pid),
                    os.sched_getparam(pid).sched_priority,
                )
        finally:
            await pool.stop(timeout=5)

    def loop_thread() -> None:
        try:
            with fifo_while(3):
                asyncio.run(scenario())
        except BaseException as exc:  # reported below
            seen["error"] = exc

    thread = threading.Thread(target=loop_thread)
    thread.start()
    thread.join(60)
    assert "error" not in seen, seen.get("error")
    assert seen == {"emulated": (os.SCHED_FIFO, 2), "cpu": (os.SCHED_OTHER, 0)}
