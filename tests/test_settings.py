"""Settings from one source: every setting by its variable and by its flag,
errors that name the setting, the CLI leaving the environment alone, and the
the settings page's table (docs/settings.md) generated from the same metadata."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import app.__main__ as cli
from app.repository.device_class import DeviceClass
from app.runtime import realtime
from app.runtime.realtime import RealtimeUnavailable
from app.server.setting_parsers import FALSE, TRUE
from app.server.settings import (
    NORMAL_SLACK_MS,
    REALTIME_SLACK_MS,
    SETTINGS,
    Settings,
    read_settings,
)
from app.server.settings_cli import TABLE_END, TABLE_START, markdown_table, table_in, with_table

SETTINGS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
# A plan file PLAN reads the kind of (a partition plan: the policy stays the default).
PLAN_FILE = Path(__file__).resolve().parent / "data" / "partition-plan.json"

# For every setting: a text other than its default, and the value it gives.
SAMPLES: dict[str, tuple[str, object]] = {
    "MODEL_REPOSITORY": ("/srv/models", Path("/srv/models")),
    "POLICY": ("flex", "flex"),
    "POLICY_OPTIONS": ('{"rate_window_s": 2}', {"rate_window_s": 2}),
    "HOST": ("0.0.0.0", "0.0.0.0"),
    "PORT": ("9000", 9000),
    "GRPC_PORT": ("9001", 9001),
    "CPU_SLICES": ("3", 3),
    "THREADS_PER_SLICE": ("2", 2),
    "EMULATED_DEVICES": ("0", 0),
    "DEVICE_SHARES": (" cpu=0.5,0.5 ; cuda:1=0.3, 0.7", {"cpu": (0.5, 0.5), "cuda:1": (0.3, 0.7)}),
    "COLOCATION_PROFILE": ("0", False),
    "PLAN": (str(PLAN_FILE), PLAN_FILE),
    "CORE_GROUPS": ("/srv/groups.json", Path("/srv/groups.json")),
    "REPLAN_S": ("30", 30.0),
    "REPLAN_GAIN": ("0.1", 0.1),
    "AUTOSCALE": (" 2:6 ", (2, 6)),
    "AUTOSCALE_WINDOW_S": ("2.5", 2.5),
    "AUTOSCALE_COOLDOWN_S": ("0", 0.0),
    "RAY_ADDRESS": ("10.0.0.5:6379", "10.0.0.5:6379"),
    "RAY_NODES": ("0=10.0.0.2,1=10.0.0.3", {0: "10.0.0.2", 1: "10.0.0.3"}),
    "ARENA_SLOTS": ("64", 64),
    "METRICS_PORT": ("9102", 9102),
    "API_WORKERS": ("4", 4),
    "MAX_QUEUE": ("5", 5),
    "STUCK_FACTOR": ("2.5", 2.5),
    "STUCK_MARGIN_S": ("0.25", 0.25),
    "HEARTBEAT_TIMEOUT_S": ("0.5", 0.5),
    "RESPAWN": ("off", False),
    "SHUTDOWN_GRACE_S": ("0.5", 0.5),
    "EXIT_ON_ERROR": ("0", False),
    "STRICT_READINESS": ("no", False),
    "HEADER_TIMEOUT_S": ("2.5", 2.5),
    "BODY_TIMEOUT_S": ("0", 0.0),
    "KEEP_ALIVE_TIMEOUT_S": ("1", 1.0),
    "MAX_HEADER_BYTES": ("8192", 8192),
    "MAX_BUFFERED_BYTES": ("1048576", 1 << 20),
    "MAX_CONNECTIONS": ("100", 100),
    "DEADLINE_MARGIN_MS": ("4", 4.0),
    "TIMER_LEAD_MS": ("1.25", 1.25),
    "REALTIME_PRIORITY": ("7", 7),
    "MAX_BODY_BYTES": ("1024", 1024),
    "MAX_JSON_BYTES": ("65536", 65536),
    "METRICS_PREFIX": ("dserve:", "dserve:"),
    "ACCESS_LOG": ("yes", True),
    "ADMIN_TOKEN": ("s3cret", "s3cret"),
    "SERVER_NAME": ("triton", "triton"),
    "PROFILE_BATCH_SIZES": ("1, 3,9", (1, 3, 9)),
    "PROFILE_CACHE_DIR": ("/var/cache/ds", Path("/var/cache/ds")),
    "PROFILE_MIN_R2": ("0.5", 0.5),
    "PROFILE_SAMPLE_RATE": ("0.25", 0.25),
    "PPIPE_PLAN": ("/srv/plan.json", Path("/srv/plan.json")),
    "PPIPE_TIMINGS": ("/srv/profiles", Path("/srv/profiles")),
    "PPIPE_CLASSES": (
        "fast:2,slow:1:3.5",
        (DeviceClass("fast", 2), DeviceClass("slow", 1, 3.5)),
    ),
}

# (variable, bad text, the error after the variable's or flag's name)
BAD: list[tuple[str, str, str]] = [
    ("MAX_QUEUE", "-1", " must be ≥ 0, got -1"),
    ("RAY_ADDRESS", "head", "='head' is not a Ray address: use auto, HOST:PORT or ray://HOS"),
    ("RAY_ADDRESS", "ray://h:x", "='ray://h:x' is not a Ray address: use auto, HOST:PORT or"),
    ("RAY_NODES", "10.0.0.2", "='10.0.0.2': '10.0.0.2' is not DEVICE=NODE"),
    ("MAX_QUEUE", "many", "='many' is not an integer"),
    ("PORT", "70000", " must be 0 to 65535, got 70000"),
    ("GRPC_PORT", "-1", " must be 0 to 65535, got -1"),
    ("ARENA_SLOTS", "0", " must be ≥ 1, got 0"),
    ("THREADS_PER_SLICE", "0", " must be ≥ 1, got 0"),
    ("CPU_SLICES", "-1", " must be ≥ 0, got -1"),
    ("MAX_BODY_BYTES", "0", " must be ≥ 1, got 0"),
    ("MAX_JSON_BYTES", "100", " must be ≥ 1024, got 100"),
    ("MAX_HEADER_BYTES", "100", " must be ≥ 256, got 100"),
    ("HEADER_TIMEOUT_S", "-1", " must be ≥ 0, got -1"),
    ("MAX_CONNECTIONS", "0", " must be ≥ 1, got 0"),
    ("EMULATED_DEVICES", "1.5", "='1.5' is not an integer"),
    ("DEVICE_SHARES", "cpu", "='cpu': 'cpu': expected DEVICE=SHARE,SHARE…"),
    ("DEVICE_SHARES", "cpu=0.5;", "='cpu=0.5;': '': expected DEVICE=SHARE,SHARE…"),
    ("DEVICE_SHARES", "tpu=0.5", "='tpu=0.5': 'tpu' is not a device: use a kind (cpu, cuda,"),
    ("DEVICE_SHARES", "cpu=0.5,x", "='cpu=0.5,x': device 'cpu': '0.5,x' are not numbers"),
    ("DEVICE_SHARES", "cpu=0.5,,0.5", "='cpu=0.5,,0.5': device 'cpu': '0.5,,0.5' are not num"),
    ("DEVICE_SHARES", "cpu=0.6,0.5", "='cpu=0.6,0.5': device 'cpu': shares sum to 1.1, more "),
    ("DEVICE_SHARES", "cpu=0", "='cpu=0': device 'cpu': a share must be in (0, 1], got 0.0"),
    ("DEVICE_SHARES", "cpu=nan", "='cpu=nan': device 'cpu': a share must be in (0, 1], got nan"),
    ("DEVICE_SHARES", "cpu=1;cpu=1", "='cpu=1;cpu=1': device 'cpu' is given twice"),
    ("STUCK_FACTOR", "-0.5", " must be ≥ 0, got -0.5"),
    ("STUCK_MARGIN_S", "nan", "='nan' is not a finite number"),
    ("HEARTBEAT_TIMEOUT_S", "-0.5", " must be ≥ 0, got -0.5"),
    ("SHUTDOWN_GRACE_S", "-1", " must be ≥ 0, got -1"),
    ("SHUTDOWN_GRACE_S", "inf", "='inf' is not a finite number"),
    ("SHUTDOWN_GRACE_S", "soon", "='soon' is not a number"),
    ("DEADLINE_MARGIN_MS", "-1", " must be ≥ 0, got -1"),
    ("TIMER_LEAD_MS", "", "='' is not a number"),
    ("METRICS_PREFIX", "9_", "='9_' cannot start a metric name"),
    ("METRICS_PREFIX", "deadline-serve_", "='deadline-serve_' cannot start a metric name"),
    ("RESPAWN", "maybe", "='maybe' is not a boolean"),
    ("RESPAWN", "2", "='2' is not a boolean"),
    ("RESPAWN", "", "='' is not a boolean"),
    ("COLOCATION_PROFILE", "sometimes", "='sometimes' is not a boolean"),
    ("AUTOSCALE", "6:2", "='6:2' is not MIN:MAX devices with 1 ≤ MIN ≤ MAX"),
    ("AUTOSCALE", "4", "='4' is not MIN:MAX devices with 1 ≤ MIN ≤ MAX"),
    ("AUTOSCALE_WINDOW_S", "0", " must be ≥ 0.1, got 0"),
    ("REALTIME_PRIORITY", "100", " must be 0 (off) to 99, got 100"),
    ("REALTIME_PRIORITY", "-1", " must be 0 (off) to 99, got -1"),
    ("POLICY", "fifo", "='fifo' is not a policy; choose one of symphony"),
    ("POLICY_OPTIONS", "{nope", "='{nope' is not JSON"),
    ("POLICY_OPTIONS", "[1, 2]", " must be a JSON object, got '[1, 2]'"),
    ("PROFILE_BATCH_SIZES", "1,,4", "='1,,4' is not a comma-separated list of integers"),
    ("PROFILE_BATCH_SIZES", "1,0", " items must be ≥ 1, got 0"),
    ("PROFILE_BATCH_SIZES", "1,x", "='1,x' is not a comma-separated list of integers"),
    ("MODEL_REPOSITORY", "", "='' is not a path"),
    ("PROFILE_SAMPLE_RATE", "1.5", " must be 0 to 1, got 1.5"),
    ("PROFILE_SAMPLE_RATE", "-0.1", " must be 0 to 1, got -0.1"),
    ("PROFILE_SAMPLE_RATE", "nan", "='nan' is not a finite number"),
    ("PROFILE_SAMPLE_RATE", "often", "='often' is not a number"),
    ("PPIPE_CLASSES", "fast", "='fast': device class 'fast': expected NAME:THREADS[:SLOWDOWN]"),
    ("PPIPE_CLASSES", "a:1,a:2", "='a:1,a:2': class names repeat"),
    ("PPIPE_CLASSES", "slow:1:0.5", "='slow:1:0.5': device class 'slow': slowdown must be ≥ 1"),
    ("PPIPE_CLASSES", "x-y:1", "='x-y:1': device class name 'x-y': use letters, digits and '_'"),
]

FLAG = {setting.env: setting.flag for setting in SETTINGS}
# Every setting but PLAN, which goes without its older names (CORE_GROUPS, PPIPE_PLAN).
ALL_AT_ONCE = {name: sample for name, sample in SAMPLES.items() if name != "PLAN"}


def serve(*argv: str, env: dict[str, str] | None = None) -> Settings:
    return cli.parse_command(["serve", *argv], env or {}).settings


def test_flag_names_come_from_the_variables():
    assert FLAG["MAX_QUEUE"] == "--max-queue"
    assert FLAG["MODEL_REPOSITORY"] == "--model-repository"
    assert FLAG["SHUTDOWN_GRACE_S"] == "--shutdown-grace-s"
    assert [setting.name for setting in SETTINGS] == [
        "repository", "policy", "policy_options", "host", "port", "api_workers", "grpc_port",
        "metrics_port",
        "cpu_slices",
        "threads_per_slice", "emulated_devices", "device_shares", "colocation_profile",
        "plan", "core_groups", "replan_s", "replan_gain", "autoscale", "autoscale_window_s",
        "autoscale_cooldown_s",
        "ray_address",
        "ray_nodes", "arena_slots",
        "max_queue",
        "stuck_factor", "stuck_margin_s", "heartbeat_timeout_s", "respawn", "shutdown_grace_s",
        "exit_on_error", "strict_readiness", "header_timeout_s", "body_timeout_s",
        "keep_alive_timeout_s", "max_header_bytes",
        "max_buffered_bytes", "max_connections", "deadline_margin_ms", "timer_lead_ms",
        "realtime_priority", "max_body_bytes", "max_json_bytes", "metrics_prefix", "access_log",
        "server_name", "admin_token",
        "profile_batch_sizes", "profile_cache_dir", "profile_min_r2", "profile_sample_rate",
        "ppipe_plan", "ppipe_timings", "ppipe_classes",
    ]  # fmt: skip


def test_defaults_are_the_dataclass_defaults():
    assert read_settings({}) == Settings() == serve()
    assert Settings.from_env({}) == Settings()
    for setting in SETTINGS:
        assert getattr(Settings(), setting.name) == setting.default


def test_every_setting_by_its_variable_and_by_its_flag():
    assert set(SAMPLES) == {setting.env for setting in SETTINGS}
    for setting in SETTINGS:
        text, value = SAMPLES[setting.env]
        assert value != setting.default, setting.env
        by_env = Settings.from_env({setting.env: text})
        by_flag = serve(setting.flag, text)
        assert getattr(by_env, setting.name) == value, setting.env
        assert by_flag == by_env, setting.flag
        changed = {
            other.name
            for other in SETTINGS
            if getattr(by_env, other.name) != getattr(Settings(), other.name)
        }
        # REALTIME_PRIORITY also brings its own slack defaults (below).
        slack = {"deadline_margin_ms", "timer_lead_ms"}
        assert changed == {setting.name} | (slack if setting.name == "realtime_priority" else set())
    assert serve("--repository", "/srv/models").repository == Path("/srv/models")


def test_all_flags_at_once_match_all_variables_at_once():
    env = {name: text for name, (text, _value) in ALL_AT_ONCE.items()}
    argv = [arg for name, (text, _value) in ALL_AT_ONCE.items() for arg in (FLAG[name], text)]
    assert serve(*argv) == Settings.from_env(env)
    assert Settings.from_env(env).max_queue == 5


def test_plan_is_refused_beside_its_older_names():
    for older in ("CORE_GROUPS", "PPIPE_PLAN"):
        with pytest.raises(ValueError) as error:
            Settings.from_env({"PLAN": str(PLAN_FILE), older: "/srv/groups.json"})
        assert str(error.value) == (
            f"PLAN and {older} are both set: {older} is the older name of PLAN; set PLAN only"
        )


def test_a_flag_wins_over_its_variable():
    env = {"MAX_QUEUE": "3", "POLICY": "flex", "RESPAWN": "0"}
    settings = serve("--max-queue", "5", "--respawn", "yes", env=env)
    assert (settings.max_queue, settings.policy, settings.respawn) == (5, "flex", True)


@pytest.mark.parametrize("variable,text,error", BAD)
def test_bad_values_name_the_setting_and_the_value(variable, text, error):
    with pytest.raises(ValueError) as by_env:
        Settings.from_env({variable: text})
    assert str(by_env.value).startswith(variable + error)
    with pytest.raises(ValueError) as by_flag:
        serve(FLAG[variable], text)
    assert str(by_flag.value).startswith(FLAG[variable] + error)


def test_a_bad_value_exits_2_naming_the_setting(monkeypatch, capsys):
    assert cli.main(["serve", "--max-queue", "-1"]) == 2
    assert "error: --max-queue must be ≥ 0, got -1" in capsys.readouterr().err
    monkeypatch.setenv("MAX_QUEUE", "-1")
    assert cli.main(["serve"]) == 2
    assert "error: MAX_QUEUE must be ≥ 0, got -1" in capsys.readouterr().err


def test_booleans_are_a_few_spellings_only():
    for word in TRUE:
        assert Settings.from_env({"RESPAWN": word.upper()}).respawn is True
        assert serve("--respawn", word).respawn is True
    for word in FALSE:
        assert Settings.from_env({"RESPAWN": f" {word.title()} "}).respawn is False
        assert serve("--respawn", word).respawn is False


def test_unset_by_default_means_empty_is_unset():
    empty = {"CPU_SLICES": "", "THREADS_PER_SLICE": " ", "ADMIN_TOKEN": "", "DEVICE_SHARES": ""}
    settings = Settings.from_env(empty)
    assert (settings.cpu_slices, settings.threads_per_slice, settings.admin_token) == (
        None,
        None,
        None,
    )
    assert settings.device_shares is None
    assert Settings.from_env({"CPU_SLICES": "0"}).cpu_slices == 0
    assert serve("--cpu-slices", "", env={"CPU_SLICES": "2"}).cpu_slices is None


def test_realtime_priority_brings_smaller_slack_unless_it_is_set():
    def slack(*argv: str, env: dict[str, str] | None = None) -> tuple[float, float]:
        settings = serve(*argv, env=env)
        return settings.deadline_margin_ms, settings.timer_lead_ms

    assert slack() == NORMAL_SLACK_MS == (2.0, 1.0)
    assert slack("--realtime-priority", "10") == REALTIME_SLACK_MS == (1.5, 0.5)
    assert slack(env={"REALTIME_PRIORITY": "10"}) == (1.5, 0.5)
    assert slack("--realtime-priority", "0", env={"REALTIME_PRIORITY": "10"}) == (2.0, 1.0)
    assert slack("--realtime-priority", "10", "--timer-lead-ms", "1") == (1.5, 1.0)
    assert slack("--deadline-margin-ms", "2", env={"REALTIME_PRIORITY": "10"}) == (2.0, 0.5)
    assert slack(env={"REALTIME_PRIORITY": "10", "DEADLINE_MARGIN_MS": "0"}) == (0.0, 0.5)


def test_read_settings_refuses_what_is_not_a_setting():
    with pytest.raises(ValueError, match="not settings: log_level"):
        read_settings({}, {"log_level": "info"})


# ------------------------------------------------------------------ the CLI


def test_parsing_reads_the_environment_and_never_writes_it(monkeypatch):
    monkeypatch.setenv("MAX_QUEUE", "3")
    monkeypatch.delenv("REALTIME_PRIORITY", raising=False)
    before = dict(os.environ)
    argv = [arg for name, (text, _value) in ALL_AT_ONCE.items() for arg in (FLAG[name], text)]
    command = cli.parse_command(["serve", "--log-level", "warning", *argv], os.environ)
    assert command.settings.max_queue == 5 and command.log_level == "warning"
    assert command.label("max_queue") == "--max-queue"
    assert dict(os.environ) == before
    assert cli.parse_command(["serve"], os.environ).settings.max_queue == 3
    assert cli.parse_command(["serve"], os.environ).label("max_queue") == "MAX_QUEUE"
    assert "REALTIME_PRIORITY" not in os.environ


def test_serve_passes_its_settings_to_create_app(monkeypatch):
    import uvicorn

    import app.main

    monkeypatch.delenv("REALTIME_PRIORITY", raising=False)
    monkeypatch.setenv("HOST", "127.0.0.2")
    before = dict(os.environ)
    made: list[Settings] = []
    runs: list[dict[str, object]] = []
    monkeypatch.setattr(app.main, "create_app", lambda settings: made.append(settings) or "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: runs.append({"app": app, **kw}))
    argv = ["serve", "--max-queue", "5", "--port", "9001", "--shutdown-grace-s", "2.5"]
    assert cli.main([*argv, "--log-level", "warning"]) == 0
    assert dict(os.environ) == before
    [settings] = made
    assert (settings.max_queue, settings.port, settings.host) == (5, 9001, "127.0.0.2")
    [run] = runs
    assert (run["app"], run["host"], run["port"], run["log_level"]) == (
        "app",
        "127.0.0.2",
        9001,
        "warning",
    )
    assert run["timeout_graceful_shutdown"] == 3.5  # the grace, then 1 s of safety net


def test_a_refused_priority_names_how_it_was_given(monkeypatch, capsys):
    def refuse(priority: int, setting: str = "REALTIME_PRIORITY") -> None:
        raise RealtimeUnavailable(f"{setting}={priority}: the kernel refused SCHED_FIFO")

    monkeypatch.setattr(realtime, "check_permitted", refuse)
    monkeypatch.delenv("REALTIME_PRIORITY", raising=False)
    assert cli.main(["serve", "--realtime-priority", "3"]) == 2
    assert "--realtime-priority=3: the kernel refused" in capsys.readouterr().err
    monkeypatch.setenv("REALTIME_PRIORITY", "4")
    assert cli.main(["serve"]) == 2
    assert "REALTIME_PRIORITY=4: the kernel refused" in capsys.readouterr().err


def test_serve_help_lists_every_setting(monkeypatch, capsys):
    monkeypatch.setenv("ADMIN_TOKEN", "do-not-print-me")
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for setting in SETTINGS:
        assert f"{setting.flag} {setting.parser.metavar}" in text, setting.flag
        assert f"env {setting.env}]" in " ".join(text.split()), setting.env
    assert "--log-level" in text and "--repository PATH" in text
    assert "default 1,2,4,8,16,32" in text
    assert "do-not-print-me" not in text


def test_the_admin_token_is_not_in_the_settings_repr():
    assert "s3cret" not in repr(Settings.from_env({"ADMIN_TOKEN": "s3cret"}))


# ------------------------------------------------------------------ docs/settings.md


def test_the_settings_page_table_is_the_generated_one():
    page = SETTINGS_PAGE.read_text(encoding="utf-8")
    assert table_in(page) == markdown_table(), (
        "docs/settings.md's settings table is stale: run "
        "`python -m app.server.settings_cli --write docs/settings.md`"
    )
    assert with_table(page) == page
    assert page.count(TABLE_START) == page.count(TABLE_END) == 1


def test_table_has_a_row_per_setting_with_its_default():
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(SETTINGS)
    for row, setting in zip(rows, SETTINGS, strict=True):
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert cells[:3] == [
            f"`{setting.env}`",
            ", ".join(f"`{flag}`" for flag in (setting.flag, *setting.aliases)),
            setting.shown(),
        ]
    assert "| `MAX_QUEUE` | `--max-queue` | 0 |" in markdown_table()
    assert "| `DEADLINE_MARGIN_MS` | `--deadline-margin-ms` | 2 (1.5 with" in markdown_table()


def test_with_table_rewrites_only_between_the_markers():
    document = f"intro\n{TABLE_START}\nold\n{TABLE_END}\nafter\n"
    rewritten = with_table(document)
    assert rewritten.startswith(f"intro\n{TABLE_START}\n\n| variable |")
    assert rewritten.endswith(f"|\n\n{TABLE_END}\nafter\n")
    assert table_in(rewritten) == markdown_table()
    with pytest.raises(ValueError, match="markers"):
        table_in("no table here")


def test_policy_options_are_checked_against_the_policy():
    with pytest.raises(ValueError, match=r"policy 'symphony' has no option 'bogus'.*pruning"):
        Settings.from_env({"POLICY_OPTIONS": '{"bogus": 1}'})
    # The core's slack is two settings of its own, in milliseconds.
    with pytest.raises(ValueError, match=r"TIMER_LEAD_MS \(--timer-lead-ms\)"):
        Settings.from_env({"POLICY_OPTIONS": '{"timer_lead": 0.001}'})
    flex = Settings.from_env({"POLICY": "flex", "POLICY_OPTIONS": '{"threshold": 4}'})
    assert flex.policy_options == {"threshold": 4}
