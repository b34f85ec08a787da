"""bench.attack: its payloads, /proc parsing, percentiles, targets and tables,
a raw exchange against a server that answers early, and one attack end to end."""

from __future__ import annotations

import asyncio
import json
import math
import os
import zlib

import pytest

from bench.attack.catalog import ATTACKS, select
from bench.attack.net import Exchange, count_outcomes, exchange
from bench.attack.payloads import (
    CHUNK,
    MB,
    decoded_size,
    gzip_bomb,
    header_flood,
    json_body,
    request_head,
)
from bench.attack.proc import RssSampler, memory_mb, status_fields
from bench.attack.report import (
    AttackResult,
    Check,
    ClientStats,
    check_rows,
    format_statuses,
    markdown,
    percentile,
    summary_rows,
)

# ------------------------------------------------------------------ payloads


def test_gzip_bomb_is_about_59_kb_and_decodes_to_60_mb_of_json():
    bomb = gzip_bomb(60 * MB)
    assert 50_000 < len(bomb) < 65_000, len(bomb)
    assert bomb[:2] == b"\x1f\x8b"  # gzip framing: Content-Encoding: gzip
    assert decoded_size(bomb) == 60 * MB
    # The start and end of the decoded text: a v2 request for tensor x.
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)
    start = decoder.decompress(bomb, 100)
    assert start.startswith(b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0')


def test_decoded_size_decodes_in_steps_and_reads_zlib_framing_too():
    data = b"abc" * 100_000
    assert decoded_size(zlib.compress(data), step=1000) == len(data)
    assert decoded_size(gzip_bomb(1000), step=7) == 1000


@pytest.mark.parametrize("size", [68, 69, 1000, 3 * CHUNK + 5])
def test_json_body_has_the_exact_size_in_bounded_chunks_and_is_valid_json(size):
    chunks = list(json_body(size))
    assert sum(map(len, chunks)) == size
    assert max(map(len, chunks)) <= CHUNK
    doc = json.loads(b"".join(chunks))
    assert doc["inputs"][0]["name"] == "x"
    assert set(doc["inputs"][0]["data"]) == {0}


def test_json_body_too_small_names_the_minimum():
    with pytest.raises(ValueError, match="at least 68 bytes, not 10"):
        list(json_body(10))


def test_header_flood_never_ends_its_header_block():
    chunks = list(header_flood("/v2/health/live", "h:1", 3 * CHUNK))
    assert chunks[0] == b"GET /v2/health/live HTTP/1.1\r\nHost: h:1\r\n"
    flood = b"".join(chunks)
    assert 3 * CHUNK <= len(flood) < 5 * CHUNK
    assert b"\r\n\r\n" not in flood
    assert max(map(len, chunks)) <= CHUNK


def test_request_head_ends_with_a_blank_line():
    head = request_head("POST", "/p", "h:1", length=5, headers={"Content-Encoding": "gzip"})
    assert head == (
        b"POST /p HTTP/1.1\r\nHost: h:1\r\nContent-Length: 5\r\nContent-Encoding: gzip\r\n\r\n"
    )


# ---------------------------------------------------------------------- /proc

_STATUS = """Name:\tpython
Umask:\t0022
State:\tS (sleeping)
VmPeak:\t 1700000 kB
VmHWM:\t  1572864 kB
VmRSS:\t  104448 kB
Threads:\t5
"""


def test_status_fields_reads_the_kb_fields_only():
    fields = status_fields(_STATUS)
    assert fields == {"VmPeak": 1_700_000, "VmHWM": 1_572_864, "VmRSS": 104_448}


def test_memory_mb_of_this_process_and_of_none():
    rss, hwm = memory_mb(os.getpid())
    assert 1 < rss <= hwm
    assert memory_mb(2**22 + 12345) is None  # above the kernel's pid limit


def test_rss_sampler_baseline_median_and_peak_with_the_high_water_mark():
    sampler = RssSampler(pid=0)
    sampler.samples = [(0.0, 100.0), (0.1, 90.0), (0.2, 110.0), (1.0, 300.0), (1.1, 150.0)]
    assert sampler.baseline_mb(before=0.5) == 100.0
    assert sampler.peak_mb(after=0.5) == 300.0
    assert sampler.peak_mb(after=5.0) is None
    # The kernel's high-water mark rose while sampling: a spike between samples.
    sampler._hwm_start, sampler._hwm_end = 120.0, 1600.0
    assert sampler.peak_mb(after=0.5) == 1600.0
    sampler._hwm_start = 1600.0  # it did not rise: the startup's mark, not the attack's
    assert sampler.peak_mb(after=0.5) == 300.0


# ------------------------------------------------------------ numbers, targets


def test_percentile_is_nearest_rank_and_keeps_infinity():
    values = [float(x) for x in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 50) == 50.0
    assert percentile(values, 100) == 100.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 99) is None
    # Two of 100 never answered: the p99 is one of them.
    assert percentile([1.0] * 98 + [math.inf] * 2, 99) == math.inf
    assert percentile([1.0] * 99 + [math.inf], 99) == 1.0
    with pytest.raises(ValueError, match="101"):
        percentile(values, 101)


def test_checks_compare_measured_with_target():
    assert Check("a", 12.0, "<", 50.0, "ms").passed
    assert not Check("a", 50.0, "<", 50.0, "ms").passed
    assert Check("a", 4.0, "<=", 4.0, "s").passed
    assert Check("a", 0, "==", 0).passed
    assert not Check("a", 2, "==", 0).passed
    assert not Check("a", math.inf, "<", 50.0).passed
    missing = Check("respawn", None, "<", 2.0, "s", note="not respawned within 10 s")
    assert not missing.passed
    assert missing.shown_measured() == "not respawned within 10 s"
    assert Check("a", 1518.28, "<", 20.0, "MB").shown_measured() == "1,518.3 MB"
    assert Check("a", 1518.28, "<", 20.0, "MB").shown_target() == "< 20 MB"
    with pytest.raises(ValueError, match="'~'"):
        Check("a", 1.0, "~", 1.0)


def test_format_statuses_orders_http_codes_then_the_rest():
    assert format_statuses({"503": 44, "closed": 3, "200": 950, "413": 6}) == (
        "200: 950, 413: 6, 503: 44, closed: 3"
    )
    assert format_statuses({}) == "—"


def _result() -> AttackResult:
    result = AttackResult(
        name="gzip-bomb",
        description="bombs",
        sent=6,
        statuses={"400": 6},
        rss_baseline_mb=92.0,
        rss_peak_mb=1610.0,
        client=ClientStats(sent=800, statuses={"200": 620, "503": 180}, p99_ms=math.inf),
    )
    result.checks = [
        Check("slowest answer", 5797.0, "<", 50.0, "ms"),
        Check("normal client p99 during the attack", 12.5, "<", 50.0, "ms"),
    ]
    return result


def test_rows_show_statuses_rss_growth_client_and_verdicts():
    result = _result()
    assert result.rss_growth_mb == 1518.0
    assert not result.passed
    assert summary_rows([result]) == [
        ("gzip-bomb", "6", "400: 6", "0", "1,610 (+1,518)", "∞", "180 of 800", "1 of 2")
    ]
    assert check_rows([result]) == [
        ("gzip-bomb", "slowest answer", "5,797 ms", "< 50 ms", "FAIL"),
        ("gzip-bomb", "normal client p99 during the attack", "12.5 ms", "< 50 ms", "pass"),
    ]
    result.timed_out.append("the attack, within its 90 s budget")
    assert summary_rows([result])[0][-1] == "1 of 2 (timed out)"
    assert check_rows([result])[-1][2:] == ("timed out", "finishes", "FAIL")


def test_markdown_has_the_command_and_both_tables():
    text = markdown([_result()], "python -m bench.attack --quick")
    lines = text.splitlines()
    assert lines[0] == "`python -m bench.attack --quick`"
    assert "| gzip-bomb | 6 | 400: 6 | 0 | 1,610 (+1,518) | ∞ | 180 of 800 | 1 of 2 |" in lines
    assert "| gzip-bomb | slowest answer | 5,797 ms | < 50 ms | FAIL |" in lines


def test_json_is_strict_with_infinity_as_a_string():
    doc = _result().to_json()
    text = json.dumps(doc, allow_nan=False)
    back = json.loads(text)
    assert back["client"]["p99_ms"] == "inf"
    assert back["client"]["not_ok"] == 180
    assert back["rss_growth_mb"] == 1518.0
    assert [c["passed"] for c in back["checks"]] == [False, True]


def test_select_keeps_run_order_and_names_unknown_attacks():
    assert [s.name for s in select("slowloris,gzip-bomb")] == ["gzip-bomb", "slowloris"]
    assert len(select(None)) == len(ATTACKS) == 8
    with pytest.raises(ValueError, match=r"unknown attack\(s\) nope; known: gzip-bomb"):
        select("gzip-bomb,nope")


# ------------------------------------------------------------ raw exchanges


def test_count_outcomes_separates_the_unanswered():
    exchanges = [Exchange(status=413), Exchange(status=413), Exchange(closed_s=1.0), Exchange()]
    exchanges.append(Exchange(refused=True))
    assert count_outcomes(exchanges) == ({"413": 2, "closed": 1, "refused": 1}, 1)


def test_exchange_stops_streaming_when_the_server_answers_early():
    """A server that answers 413 after the head and closes: the client sees
    413, and does not push the rest of a 50 MB body."""

    async def scenario() -> tuple[Exchange, Exchange]:
        async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.5)  # leave the status line time to arrive
            writer.close()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(10)

        answering = await asyncio.start_server(early, "127.0.0.1", 0)
        quiet = await asyncio.start_server(silent, "127.0.0.1", 0)
        ports = [s.sockets[0].getsockname()[1] for s in (answering, quiet)]
        head = request_head("POST", "/x", "h", length=50 * MB)
        body = json_body(50 * MB)
        answered = await exchange("127.0.0.1", ports[0], [head, *body], timeout_s=5.0)
        waited = await exchange("127.0.0.1", ports[1], [head], timeout_s=5.0, after_sent_s=0.1)
        for server in (answering, quiet):
            server.close()
        return answered, waited

    answered, waited = asyncio.run(scenario())
    assert answered.status == 413 and answered.outcome == "413"
    assert answered.sent_bytes < 50 * MB
    assert waited.status is None and waited.closed_s is None
    assert waited.outcome == "unanswered"


# ----------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_gzip_bomb_end_to_end_writes_the_json_and_the_tables(run_module, tmp_path):
    proc = run_module(
        "bench.attack", "--quick", "--only", "gzip-bomb", "--out", str(tmp_path), timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| gzip-bomb |" in proc.stdout  # the markdown table
    doc = json.loads((tmp_path / "attack.json").read_text())
    assert doc["quick"] is True
    (result,) = doc["results"]
    assert result["name"] == "gzip-bomb"
    assert result["sent"] == 2
    # Both bombs got an answer of some kind (what kind is the server's business).
    assert sum(result["statuses"].values()) + result["unanswered"] == 2
    assert result["details"]["compressed_bytes"] < 65_000
    assert result["details"]["decoded_bytes"] == 60 * MB
    assert len(result["details"]["answer_ms"]) == 2
    assert result["rss_baseline_mb"] > 10
    assert result["rss_peak_mb"] >= result["rss_baseline_mb"]
    assert result["client"]["sent"] > 0
    checks = {c["what"]: c for c in result["checks"]}
    assert set(checks) == {
        "bombs answered 413",
        "slowest answer",
        "normal client p99 during the attack",
        "front-end RSS growth",
    }
    assert checks["front-end RSS growth"]["target"] == 20.0
    assert all(isinstance(c["passed"], bool) for c in checks.values())
    assert (tmp_path / "summary.md").read_text().startswith("`python -m bench.attack")
