"""Every attack by name, in the order they run, with its budget and the
daemon settings it needs."""

from __future__ import annotations

from bench.attack.bodies import (
    BOMB_RSS_TARGET_MB,
    FLOOD_RSS_TARGET_MB,
    STALLED_RSS_TARGET_MB,
    big_json_attack,
    gzip_bomb_attack,
    header_flood_attack,
    stalled_uploads_attack,
)
from bench.attack.connections import (
    DAEMON_NOFILE,
    idle_connections_attack,
    slowloris_attack,
)
from bench.attack.lifecycle import hung_executors_attack, sigterm_attack
from bench.attack.runner import AttackSpec

ATTACKS = (
    AttackSpec(
        "gzip-bomb",
        "~59 KB gzip bodies decoding to 60 MB of JSON, 6 over 16 s (quick: 2 over 3 s)",
        gzip_bomb_attack,
        budget_s=(240.0, 90.0),
        rss_target_mb=BOMB_RSS_TARGET_MB,
    ),
    AttackSpec(
        "big-json",
        "3 × 60 MB JSON bodies, then 1,000 concurrent normal requests (quick: 20 MB, 200)",
        big_json_attack,
        budget_s=(180.0, 90.0),
    ),
    AttackSpec(
        "stalled-uploads",
        "20 connections each sending 60 MB of a 60 MB + 1 byte body, held 30 s "
        "(quick: 5 × 20 MB, 8 s)",
        stalled_uploads_attack,
        budget_s=(150.0, 60.0),
        rss_target_mb=STALLED_RSS_TARGET_MB,
    ),
    AttackSpec(
        "header-flood",
        "one connection sending 1 GB of headers (quick: 100 MB) until answered or closed",
        header_flood_attack,
        budget_s=(240.0, 90.0),
        rss_target_mb=FLOOD_RSS_TARGET_MB,
    ),
    AttackSpec(
        "idle-connections",
        f"1,100 connections sending nothing, daemon at ulimit -n {DAEMON_NOFILE}; "
        "new-connection requests and an executor SIGKILL meanwhile",
        idle_connections_attack,
        budget_s=(90.0, 60.0),
        nofile=DAEMON_NOFILE,
    ),
    AttackSpec(
        "slowloris",
        "100 connections (quick: 20) sending header bytes one a second",
        slowloris_attack,
        budget_s=(120.0, 60.0),
    ),
    AttackSpec(
        "sigterm",
        "SIGTERM with a steady client and 2 long (6 s) requests in flight",
        sigterm_attack,
        budget_s=(120.0, 100.0),
        env={"EMULATED_DEVICES": "3"},
        normal_client=False,
    ),
    AttackSpec(
        "hung-executors",
        "SIGSTOP every executor while idle; time until readiness is not 200",
        hung_executors_attack,
        budget_s=(30.0, 20.0),
        normal_client=False,
    ),
)

BY_NAME = {spec.name: spec for spec in ATTACKS}


def select(names: str | None) -> list[AttackSpec]:
    """The attacks named in a comma-separated list (all for None), in run order."""
    if not names:
        return list(ATTACKS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown attack(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    return [spec for spec in ATTACKS if spec.name in wanted]
