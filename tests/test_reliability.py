"""Reliability (issue 6): device faults in the scheduling core, executor
crashes and hangs in the live daemon, overload, and shutdown under load.

The core tests drive every policy with a virtual clock (no sleeping); the
daemon tests run `python -m app serve` on emulated devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from app.scheduling import Request
from app.scheduling.registry import make_scheduler, policy_names
from app.scheduling.types import Batch, Decision, Dispatch, Drop, DropReason, Preempt
from bench.daemon_launcher import stop_daemon
from bench.overload import CAPACITY_RPS, body, executor_pids, open_loop, write_repository
from tests.fakes import devices, model, segments_of

# ------------------------------------------------------------ core: device faults


class VirtualDriver:
    """A minimal simulator: carries out decisions on a virtual clock, finishes
    batches at their predicted time, and records every request's answer."""

    def __init__(self, core) -> None:
        self.core = core
        self.now = 0.0
        self.finishes: list[tuple[float, int, int]] = []  # (at, batch id, device)
        self.batches: dict[int, Batch] = {}
        self.answers: Counter[int] = Counter()
        self.finished: dict[int, float] = {}  # request id → finish time
        self.dropped: dict[int, DropReason] = {}
        self.dispatched: list[Batch] = []

    def apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Dispatch):
                b = d.batch
                self.batches[b.id] = b
                self.dispatched.append(b)
                heapq.heappush(self.finishes, (b.finish_at, b.id, b.device))
            elif isinstance(d, Drop):
                for r in d.requests:
                    self.answers[r.id] += 1
                    self.dropped[r.id] = d.reason
            elif isinstance(d, Preempt):
                self.batches.pop(d.batch_id, None)

    def run_until(self, t: float) -> None:
        while True:
            wake = self.core.next_wakeup()
            finish = self.finishes[0][0] if self.finishes else None
            nxt = min(x for x in (wake, finish, t) if x is not None)
            if nxt > t or (nxt == t and wake != t and finish != t):
                self.now = t
                return
            self.now = max(self.now, nxt)
            if finish is not None and finish <= nxt:
                _, batch_id, device = heapq.heappop(self.finishes)
                batch = self.batches.pop(batch_id, None)
                if batch is not None:
                    for r in batch.requests:
                        self.answers[r.id] += 1
                        self.finished[r.id] = self.now
                    self.apply(self.core.batch_finished(device, batch_id, self.now))
            else:
                self.apply(self.core.advance(self.now))
            if (
                nxt == t
                and self.core.next_wakeup() != t
                and (not self.finishes or self.finishes[0][0] > t)
            ):
                self.now = t
                return

    def add(self, request: Request) -> None:
        self.apply(self.core.add_request(request, self.now))

    def device_down(self, device: int) -> None:
        # The executor died: the batches running there never report success.
        for batch_id, batch in list(self.batches.items()):
            if batch.device == device:
                del self.batches[batch_id]
        self.apply(self.core.device_down(device, self.now))

    def device_up(self, device: int) -> None:
        self.apply(self.core.device_up(device, self.now))


_ids = iter(range(10**9))


def _req(name: str, arrival: float, slo: float) -> Request:
    return Request(next(_ids), name, arrival, arrival + slo)


def _core(policy: str, n_devices: int = 2, **model_kw):
    info = model(**{"alpha_ms": 1.0, "beta_ms": 5.0, "slo_ms": 100.0, **model_kw})
    return info, make_scheduler(policy, [info], devices(n_devices))


@pytest.mark.parametrize("policy", policy_names())
def test_device_down_requeues_its_batch_elsewhere_and_device_up_takes_it_back(policy):
    info, core = _core(policy)
    sim = VirtualDriver(core)
    first = [_req(info.name, 0.0, 0.1) for _ in range(4)]
    for r in first:
        sim.add(r)
    while not sim.dispatched:
        sim.run_until(sim.now + 0.001)
    failed = sim.dispatched[0]
    sim.run_until(max(sim.now, failed.start_at) + 0.001)  # mid-batch
    t_down = sim.now
    sim.device_down(failed.device)
    assert core.down == {failed.device}
    n_before = len(sim.dispatched)
    # Load while it is down: nothing goes to the dead device.
    during = []
    for k in range(20):
        sim.run_until(t_down + 0.005 * k)
        r = _req(info.name, sim.now, 0.1)
        during.append(r)
        sim.add(r)
    sim.run_until(t_down + 0.2)
    after_down = sim.dispatched[n_before:]
    assert after_down, "the failed batch's requests must run somewhere"
    assert all(b.device != failed.device for b in after_down)
    # The failed batch's requests could all still finish alone (100 ms SLO):
    # they ran on the other device, before their deadline, once.
    for r in failed.requests:
        assert sim.answers[r.id] == 1
        assert r.id in sim.finished and sim.finished[r.id] <= r.deadline
    # Back in service: it gets work again.
    sim.device_up(failed.device)
    assert not core.down
    n_up = len(sim.dispatched)
    later = []
    for k in range(40):
        sim.run_until(t_down + 0.2 + 0.004 * k)
        r = _req(info.name, sim.now, 0.1)
        later.append(r)
        sim.add(r)
    sim.run_until(t_down + 1.0)
    assert any(b.device == failed.device for b in sim.dispatched[n_up:])
    # Every request got exactly one answer.
    for r in first + during + later:
        assert sim.answers[r.id] == 1, (r, sim.answers[r.id])


@pytest.mark.parametrize("policy", policy_names())
def test_requests_of_a_failed_batch_that_cannot_finish_alone_are_dropped_at_once(policy):
    # ℓ(b) = b + 10 ms; 12 requests at t=0 with deadlines 30..41 ms. The
    # first batch of ≥ 2 fails 0.5 ms before its end. A request goes back to
    # the queue iff t_down + ℓ(1) ≤ its deadline, else it is answered
    # DEVICE_FAILED at once (for most policies here: all of that batch).
    info, core = _core(policy, alpha_ms=1.0, beta_ms=10.0, slo_ms=40.0)
    sim = VirtualDriver(core)
    reqs = [Request(next(_ids), info.name, 0.0, 0.030 + 0.001 * i) for i in range(12)]
    for r in reqs:
        sim.add(r)
    while not any(b.size >= 2 for b in sim.dispatched):
        sim.run_until(sim.now + 0.0005)
    failed = next(b for b in sim.dispatched if b.size >= 2)
    t_down = failed.finish_at - 0.0005
    sim.run_until(t_down)
    sim.device_down(failed.device)
    expect_drop = {r.id for r in failed.requests if t_down + 0.011 > r.deadline}
    got_drop = {i for i, why in sim.dropped.items() if why is DropReason.DEVICE_FAILED}
    assert got_drop == expect_drop
    sim.run_until(0.2)
    for r in reqs:
        assert sim.answers[r.id] == 1
        # Triton's, Gpulet's, InSS's and Clipper's batchers run late requests.
        if r.id in sim.finished and policy not in ("triton", "gpulet", "inss", "clipper"):
            assert sim.finished[r.id] <= r.deadline + 1e-9


@pytest.mark.parametrize("policy", policy_names())
def test_with_every_device_down_requests_are_still_answered(policy):
    info, core = _core(policy, n_devices=1)
    sim = VirtualDriver(core)
    sim.device_down(0)
    reqs = [_req(info.name, 0.001 * i, 0.1) for i in range(10)]
    for r in reqs:
        sim.run_until(r.arrival)
        sim.add(r)
    sim.run_until(0.5)
    assert not sim.dispatched
    assert all(sim.answers[r.id] == 1 for r in reqs)
    # Back up: served again.
    sim.device_up(0)
    r = _req(info.name, sim.now, 0.1)
    sim.add(r)
    sim.run_until(sim.now + 0.2)
    assert r.id in sim.finished


def test_symphony_pushes_back_batches_queued_behind_a_batch_that_ended_late():
    # One device, ℓ(b) = b + 10 ms. B1 (1 request) runs 0–11 ms; B2 (4) is
    # dispatched for when B1 should end (11 ms). B1 really ends at 17 ms, so
    # B2 ends at 31 ms, not 25: the next batch must be planned from 31 ms.
    # (Under sustained load the device is never idle, and without this the
    # overruns of every batch add up: answers planned on time come late.)
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=200.0, max_batch=4)
    core = make_scheduler("symphony-wc", [info], devices(1))

    def add(t: float, n: int) -> list[Batch]:
        out = []
        for _ in range(n):
            out += [
                d.batch
                for d in core.add_request(_req(info.name, t, 0.2), t)
                if isinstance(d, Dispatch)
            ]
        return out

    (b1,) = add(0.0, 1)
    assert (b1.start_at, b1.size) == (0.0, 1)
    assert add(0.001, 4) == []
    (b2,) = [d.batch for d in core.advance(core.next_wakeup()) if isinstance(d, Dispatch)]
    assert (b2.start_at, b2.size) == (pytest.approx(0.011), 4)
    core.batch_finished(0, b1.id, 0.017)  # 6 ms late
    assert add(0.018, 4) == []
    (b3,) = [d.batch for d in core.advance(core.next_wakeup()) if isinstance(d, Dispatch)]
    assert b3.start_at == pytest.approx(0.031)


# ----------------------------------------------------------- the live daemon

# bench.overload's setup: one emulated model, ℓ(b) = 10·b + 50 ms, batches of
# ≤ 4, on two devices: CAPACITY_RPS ≈ 89 req/s. Its 2 s SLO leaves room to
# re-queue a stuck batch's requests; the other tests tighten it per request.
_EXPLICIT_503 = {"device_failed", "deadline", "executor_failed", "shutting_down"}


def _start(launch_daemon, tmp: Path):
    repo = write_repository(tmp / "repo")
    env = {
        "CPU_SLICES": "0",
        "EMULATED_HANG_FILE": str(tmp / "hang"),
        "STUCK_MARGIN_S": "0.3",
        "HEARTBEAT_TIMEOUT_S": "0.5",
        "MAX_QUEUE": "48",
        "SHUTDOWN_GRACE_S": "2",
        # HTTP and client overhead on two shared cores is 10–30 ms under
        # overload: plan batches to end this much before the deadline.
        "DEADLINE_MARGIN_MS": "50",
    }
    return launch_daemon(repo, emulated_devices=2, extra_env=env)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, launch_daemon):
    tmp = tmp_path_factory.mktemp("reliability")
    return _start(launch_daemon, tmp), tmp


def _ready(url: str) -> tuple[int, dict]:
    r = httpx.get(f"{url}/v2/health/ready", timeout=5)
    return r.status_code, r.json()


def _wait_alive(url: str, alive: int, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        code, body = _ready(url)
        if code == 200 and body.get("devices_alive") == alive:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"not {alive} devices alive after {timeout} s: {_ready(url)}")


@pytest.mark.slow
def test_sigkilled_executor_mid_batch_is_respawned_and_no_request_is_lost(daemon):
    handle, _ = daemon
    url, pid = handle.url, handle.process.pid
    assert _ready(url) == (200, {"ready": True, "devices_alive": 2, "devices_total": 2})
    segments = segments_of(pid)
    assert segments
    victim = executor_pids(pid)["emulated:0"]
    seen: list[tuple[int, dict]] = []

    async def scenario():
        load = asyncio.create_task(open_loop(url, [(40, 3.0)]))
        await asyncio.sleep(1.0)  # both devices busy: ℓ(b) ≥ 60 ms per batch
        os.kill(victim, signal.SIGKILL)
        # Until the readiness check reports the loss (at most 5 s: the
        # executor's respawn takes longer than one 20 ms look).
        give_up = time.monotonic() + 5.0
        while time.monotonic() < give_up:
            await asyncio.sleep(0.02)
            seen.append(await asyncio.to_thread(_ready, url))
            if seen[-1][1].get("devices_alive") == 1:
                break
        return await load

    results = asyncio.run(scenario())
    # While it is down the server stays ready (the model has another device)
    # and says so: 1 of 2 devices alive.
    assert (200, {"ready": True, "devices_alive": 1, "devices_total": 2}) in seen
    _wait_alive(url, 2)
    assert executor_pids(pid)["emulated:0"] != victim
    # One answer per request, none hung: a result or an explicit 503.
    assert len(results) == 120
    statuses = Counter(a.status for a in results)
    assert set(statuses) <= {200, 503}, statuses
    assert {a.reason for a in results if a.status == 503} <= _EXPLICIT_503
    assert statuses[200] >= 0.9 * len(results), statuses
    log = handle.log_path.read_text()
    respawn = re.findall(r"serving slow again ([0-9.]+) s after it failed", log)
    assert respawn, log[-2000:]
    print(f"respawn: executor serving again {float(respawn[-1]):.3f} s after SIGKILL")
    # The respawned executor re-attached the same arenas: nothing new, nothing leaked.
    assert segments_of(pid) == segments
    # And it serves: a burst that needs both devices runs batches on emulated:0.
    before = _batches_on(url, "emulated:0")
    burst = asyncio.run(open_loop(url, [(80, 0.5)], slo_ms=None))
    assert all(a.status == 200 for a in burst), Counter(a.status for a in burst)
    assert _batches_on(url, "emulated:0") > before
    metrics = httpx.get(f"{url}/metrics").text
    assert 'deadline_serve_executor_failures_total{device="emulated:0"} 1.0' in metrics


def _counter(url: str, series: str) -> float:
    """The value of one series on /metrics, e.g.
    `deadline_serve_goodput_total{model="slow"}` (0 if absent)."""
    metrics = httpx.get(f"{url}/metrics").text
    values = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(series)]
    return values[0] if values else 0.0


def _batches_on(url: str, device: str) -> float:
    return _counter(url, f'deadline_serve_batches_total{{device="{device}",model="slow"}} ')


def _wait_served(url: str, timeout: float = 30.0) -> None:
    """Until the daemon has finished at least one request (in or past its SLO)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        served = [
            _counter(url, f'deadline_serve_{name}_total{{model="slow"}} ')
            for name in ("goodput", "late")
        ]
        if sum(served):
            return
        time.sleep(0.05)
    raise AssertionError(f"no request served after {timeout} s")


@pytest.mark.slow
def test_stuck_executor_is_killed_and_its_requests_run_elsewhere(daemon):
    handle, tmp = daemon
    url, pid = handle.url, handle.process.pid
    _wait_alive(url, 2)
    victim = executor_pids(pid)["emulated:1"]
    hang = tmp / "hang"
    hang.write_text(str(victim))  # only this executor's batches hang
    try:
        # Default 2 s SLO: the stuck batch is detected after 10·ℓ(b) + 0.3 s
        # ≤ 1.2 s, and its requests still make their deadline on emulated:0.
        results = asyncio.run(open_loop(url, [(20, 1.5)], slo_ms=None))
    finally:
        hang.unlink()
    statuses = Counter(a.status for a in results)
    assert statuses[200] == len(results) == 30, (statuses, results)
    log = handle.log_path.read_text()
    assert "executor emulated:1 stuck" in log
    _wait_alive(url, 2)
    assert executor_pids(pid)["emulated:1"] != victim


def _infer(url: str, results: list[tuple[int, str, float]]) -> None:
    """One request with the model's SLO (2 s): (status, reason, seconds)."""
    sent = time.monotonic()
    reply = httpx.post(f"{url}/infer", content=body(None), timeout=10)
    reason = "" if reply.status_code == 200 else reply.json().get("reason", "")
    results.append((reply.status_code, reason, time.monotonic() - sent))


@pytest.mark.slow
def test_stopped_idle_executors_make_the_daemon_not_ready_and_are_respawned(daemon):
    """SIGSTOP on every (idle) executor: with HEARTBEAT_TIMEOUT_S = 0.5 the
    readiness check reports no live device within 3 s (not 200 with all
    devices alive), a request sent at the stop is answered within 3 s, and
    respawned executors serve."""
    handle, _ = daemon
    url, pid = handle.url, handle.process.pid
    _wait_alive(url, 2)
    victims = executor_pids(pid)
    answers: list[tuple[int, str, float]] = []
    try:
        for victim in victims.values():
            os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        request = threading.Thread(target=_infer, args=(url, answers))
        request.start()
        seen = None
        while seen is None and time.monotonic() - stopped_at < 5.0:
            code, reply = _ready(url)
            if code != 200:
                seen = time.monotonic() - stopped_at, reply
        request.join(10)
    finally:  # on a failure, leave no executor stopped for the next tests
        for victim in victims.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
    assert seen is not None, "still ready 5 s after every executor was stopped"
    print(f"not ready {seen[0]:.3f} s after SIGSTOP; the request at the stop: {answers}")
    assert seen[0] < 3.0
    assert seen[1] == {
        "error": "server not ready: no live device for slow (0/2 devices alive)",
        "reason": "not_ready",
    }
    # Re-planned onto a respawned executor (its SLO is 2 s) or refused
    # explicitly, within 3 s: not held until the batch watchdog fires.
    [(status, reason, seconds)] = answers
    assert (status == 200 or reason in _EXPLICIT_503) and seconds < 3.0, answers
    _wait_alive(url, 2)
    assert not set(executor_pids(pid).values()) & set(victims.values())
    log = handle.log_path.read_text()
    for device in victims:
        assert f"executor {device} hung: no heartbeat for 0." in log, log[-2000:]
    again: list[tuple[int, str, float]] = []
    _infer(url, again)
    assert again[0][0] == 200, again


@pytest.mark.slow
def test_overload_keeps_goodput_near_capacity_answers_the_excess_fast_and_recovers(daemon):
    handle, _ = daemon
    url = handle.url
    _wait_alive(url, 2)
    # 3 s at 3× capacity, then 2 s at 0.3×, open loop (bench.overload's raw
    # client: httpx alone cannot send 270 req/s on two shared cores).
    slo = 0.3  # s; the claims below are against it and the capacity
    answers = asyncio.run(
        open_loop(url, [(3 * CAPACITY_RPS, 3.0), (0.3 * CAPACITY_RPS, 2.0)], slo_ms=1000 * slo)
    )
    over = [a for a in answers if a.at < 3.0]
    calm = [a for a in answers if a.at >= 3.0]
    statuses = Counter(a.status for a in over)
    assert set(statuses) <= {200, 429, 503}, statuses  # no hang, no 5xx crash
    # Served over the overloaded window (past the first 0.5 s): Symphony's
    # flat top near the ≈ 89 req/s the two devices can do, most within SLO.
    window = [a for a in over if a.at >= 0.5]
    served = sum(1 for a in window if a.status == 200) / 2.5
    within = sum(1 for a in window if a.status == 200 and a.latency <= slo) / 2.5
    print(f"overload 3x: served {served:.0f} req/s, within SLO {within:.0f} of {CAPACITY_RPS:.0f}")
    assert served >= 0.75 * CAPACITY_RPS
    assert within >= 0.5 * CAPACITY_RPS
    # The excess is refused explicitly and fast: 429 queue full at once
    # (before the deadline the request asked for), 503 no later than the
    # deadline it could not meet.
    refused = [a for a in over if a.status in (429, 503)]
    assert len(refused) >= 0.5 * len(over)
    assert {a.reason for a in refused} <= {"queue_full", "overloaded", "deadline"}
    assert statuses[429] and max(a.latency for a in refused if a.status == 429) < slo
    # (A stall of the shared box delays single answers: the bulk is judged by
    # the median, with 100 ms for the answer's way back, the worst one only
    # against being held far past the SLO.)
    dropped = sorted(a.latency for a in refused if a.status == 503)
    if dropped:
        assert dropped[len(dropped) // 2] < slo + 0.1 and dropped[-1] < slo + 0.5, dropped
    # Recovery once the load drops: in the first SLO after it, calm requests
    # still queue behind the overload's earlier deadlines, so they may be
    # refused explicitly (503 past their deadline, or 429 while the queue is
    # still full of the overload's requests); once those have all come due,
    # none is refused for a full queue and all are served within SLO.
    recovered = [a for a in calm if a.at >= 3.0 + slo]
    assert {a.status for a in calm if a.at < 3.0 + slo} <= {200, 429, 503}
    assert {a.status for a in recovered} <= {200, 503}
    on_time = sum(1 for a in recovered if a.status == 200 and a.latency <= slo)
    print(f"after the overload's last deadline: {on_time} of {len(recovered)} within SLO")
    assert on_time >= 0.95 * len(recovered)


# After SIGTERM the daemon takes SHUTDOWN_GRACE_S (_start sets 2 s) to let
# requests finish and answer the rest, then at most 2 s to stop its executors
# and free shared memory (tests/test_shutdown.py); plus room for a loaded machine.
_SIGTERM_EXIT_BOUND_S = 2 + 2 + 5


def _wait(process: subprocess.Popen, timeout: float) -> int | None:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.slow
def test_sigterm_under_load_answers_everything_frees_shared_memory_and_restarts(
    tmp_path, launch_daemon
):
    handle = _start(launch_daemon, tmp_path)
    pid = handle.process.pid
    assert segments_of(pid)
    rate, seconds = 0.8 * CAPACITY_RPS, 3.0

    async def scenario():
        load = asyncio.create_task(open_loop(handle.url, [(rate, seconds)], slo_ms=None))
        await asyncio.sleep(1.0)
        # Under load, and once at least one request has been served (so that
        # "some served" below does not depend on how busy the machine is).
        await asyncio.to_thread(_wait_served, handle.url)
        t_term = time.monotonic()
        handle.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(_wait, handle.process, _SIGTERM_EXIT_BOUND_S)
        exit_s = time.monotonic() - t_term
        return await load, code, exit_s, t_term

    try:
        answers, code, exit_s, t_term = asyncio.run(scenario())
    finally:
        stop_daemon(handle)  # nothing to do once it has exited; else it is killed
    # It exits, cleanly, within its bound.
    assert code is not None, f"daemon still running {_SIGTERM_EXIT_BOUND_S} s after SIGTERM"
    assert code == 0
    print(f"SIGTERM under load: exited in {exit_s:.2f} s")
    # Every request sent has exactly one answer: none lost, none twice.
    assert sorted(a.at for a in answers) == [i / rate for i in range(int(rate * seconds))]
    # Each answer is explicit: served, refused with 503 shutting_down, or
    # (sent once the listener had closed) not connected. Nothing hangs.
    statuses = Counter(a.status for a in answers)
    assert -1 not in statuses, statuses
    assert set(statuses) <= {200, 503, -2}, statuses
    assert {a.reason for a in answers if a.status == 503} <= {"shutting_down"}
    # A connection only fails because of the shutdown: none before SIGTERM
    # (an accepted request cut off before then would show here).
    early = [a for a in answers if a.status == -2 and a.sent + a.latency < t_term]
    assert not early, early[:5]
    # Served before SIGTERM (waited for above): whatever the machine's load.
    assert statuses[200] >= 1, statuses
    assert "Traceback" not in handle.log_path.read_text()
    assert not segments_of(pid)  # every arena unlinked
    assert not executor_pids(pid)
    # A restart serves again.
    again = _start(launch_daemon, tmp_path)
    try:
        reply = httpx.post(
            f"{again.url}/infer", json={"model": "slow", "inputs": {"x": [[1, 2, 3, 4]]}}
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"]["y"]["data"] == [[1.0, 2.0, 3.0, 4.0]]
    finally:
        stop_daemon(again)
    assert not segments_of(again.process.pid)


class _DegradedService:
    """Just enough of a service for /v2/health/ready."""

    def __init__(self, alive: int, unavailable: list[str]) -> None:
        self.alive, self.unavailable = alive, unavailable

    def server_ready(self) -> bool:
        return not self.unavailable

    def capacity(self) -> dict[str, object]:
        return {
            "devices_alive": self.alive,
            "devices_total": 2,
            "models_unavailable": self.unavailable,
        }


@pytest.mark.parametrize(
    ("alive", "unavailable", "status"),
    [(2, [], 200), (1, [], 200), (0, ["slow"], 400)],
)
def test_readiness_reports_capacity_and_fails_when_a_model_has_no_live_device(
    alive, unavailable, status
):
    from app.api import create_api
    from app.server.metrics import Metrics

    app = create_api(lambda: _DegradedService(alive, unavailable), Metrics())

    async def get():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get("/v2/health/ready")

    reply = asyncio.run(get())
    assert reply.status_code == status
    if status == 200:
        assert reply.json() == {"ready": True, "devices_alive": alive, "devices_total": 2}
    else:
        assert reply.json()["reason"] == "not_ready"
        assert "no live device for slow (0/2 devices alive)" in reply.json()["error"]
