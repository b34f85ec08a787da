"""A capacity probe starts once the server has drained the one before
(bench/loadgen/capacity.py `wait_drained`), on a fake server and clock."""

from __future__ import annotations

import httpx
import pytest

from bench.loadgen.capacity import wait_drained
from bench.loadgen.targets import ModelTarget

TARGETS = [
    ModelTarget("fast", 50.0, b"{}", "/v2/models/fast/infer"),
    ModelTarget("slow", 80.0, b"{}"),
]


class Backlog:
    """A server whose answers take `backlog` ms more than 10 ms, the backlog
    shrinking by `drains_ms` with each request; time passes on `now`."""

    def __init__(self, backlog_ms: float, drains_ms: float) -> None:
        self.backlog_ms, self.drains_ms = backlog_ms, drains_ms
        self.now = 0.0
        self.paths: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        assert request.headers["content-type"] == "application/json"
        self.now += (10.0 + self.backlog_ms) / 1000.0
        self.backlog_ms = max(0.0, self.backlog_ms - self.drains_ms)
        return httpx.Response(200, json={})

    def pause(self, seconds: float) -> None:
        self.now += seconds


def _wait(server: Backlog, timeout_s: float = 30.0) -> float | None:
    client = httpx.Client(base_url="http://server", transport=httpx.MockTransport(server.handle))
    return wait_drained(
        "http://server",
        TARGETS,
        timeout_s=timeout_s,
        client=client,
        clock=lambda: server.now,
        pause=server.pause,
    )


def test_a_drained_server_is_probed_at_once():
    server = Backlog(0.0, 0.0)
    assert _wait(server) == pytest.approx(0.02)  # one round: two answers of 10 ms
    assert server.paths == ["/v2/models/fast/infer", "/infer"]


def test_a_backlog_is_waited_out_until_every_model_answers_within_its_slo():
    # 400 ms of backlog, 100 ms of it gone per request: the third round is
    # the first whose two answers are both within 50 and 80 ms.
    server = Backlog(400.0, 100.0)
    waited = _wait(server)
    answers = [0.41, 0.31, 0.21, 0.11, 0.01, 0.01]
    assert waited == pytest.approx(sum(answers) + 2 * 0.1)
    assert len(server.paths) == 6


def test_a_server_that_never_drains_gives_up_after_the_timeout():
    server = Backlog(1000.0, 0.0)
    assert _wait(server, timeout_s=5.0) is None
    # Answers of 1.01 s: two rounds and a pause (4.24 s), one more request
    # sent with 0.76 s left; none after the timeout.
    assert server.now == pytest.approx(5.25)
    assert len(server.paths) == 5
