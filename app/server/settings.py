"""The daemon's settings, and how each is set.

Each field of `Settings` carries its own description (`Setting`, in its
metadata): variable, parser (`app.server.setting_parsers`), default, meaning.
From that come the environment reader (`Settings.from_env`), a flag per
setting (`app.server.settings_cli`; MAX_QUEUE → `--max-queue`; a flag wins)
and the table in docs/settings.md (`python -m app.server.settings_cli --write
docs/settings.md`; a test checks it). Slack defaults follow REALTIME_PRIORITY.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from app.repository import BUNDLED_REPOSITORY
from app.repository.device_class import DEFAULT_CLASSES, DeviceClass
from app.scheduling.policy_spec import merge_options, parse_policy
from app.scheduling.registry import policy_options
from app.server.setting_parsers import (
    Boolean,
    DeviceClasses,
    DeviceRange,
    DeviceShares,
    FilePath,
    Integer,
    IntegerList,
    JsonObject,
    MetricPrefix,
    Number,
    Parser,
    PolicyName,
    RayAddress,
    RayNodes,
    RealtimePriority,
    Text,
)

# Default (DEADLINE_MARGIN_MS, TIMER_LEAD_MS) at normal and at real-time
# priority: the slack the answer path needs. Under SCHED_FIFO its p99 over
# HTTP is ~1.2–1.5 ms; at normal priority 2 / 1 ms gave the highest
# capacity on (a) of 3 / 2, 2 / 1 and 1 / 0.5 (BENCHMARKS.md, "Serving
# slack at normal priority").
NORMAL_SLACK_MS = (2.0, 1.0)
REALTIME_SLACK_MS = (1.5, 0.5)
# Metric names start with it, so ours do not collide with other exporters'.
DEFAULT_METRICS_PREFIX = "deadline_serve_"


@dataclass(frozen=True)
class Setting:
    """How one field of `Settings` is set and documented."""

    env: str  # the environment variable; the flag is derived from it
    parser: Parser
    meaning: str  # one line, as the settings table (docs/settings.md) and `--help` show it
    shown_default: str | None = None  # where the default value does not say it
    aliases: tuple[str, ...] = ()  # further flags, kept for existing command lines
    name: str = ""  # the `Settings` attribute (filled in from the field)
    default: object = None  # (filled in from the field)

    @property
    def flag(self) -> str:
        return "--" + self.env.lower().replace("_", "-")

    @property
    def optional(self) -> bool:
        """Unset (None) by default; an empty value also means unset."""
        return self.default is None

    def parse(self, text: str, label: str) -> object:
        if self.optional and not text.strip():
            return None
        return self.parser.parse(text, label)

    def shown(self) -> str:
        """The default as a user reads it."""
        if self.shown_default is not None:
            return self.shown_default
        assert self.default is not None, f"{self.env}: an unset default needs shown_default"
        return self.parser.show(self.default)


_KEY = "setting"


def _setting(
    env: str,
    parser: Parser,
    meaning: str,
    *,
    shown: str | None = None,
    aliases: tuple[str, ...] = (),
) -> dict[str, Setting]:
    """A field's metadata: how the setting is set and documented."""
    return {_KEY: Setting(env, parser, meaning, shown, aliases)}


def _slack_shown(index: int) -> str:
    return f"{NORMAL_SLACK_MS[index]:g} ({REALTIME_SLACK_MS[index]:g} with `REALTIME_PRIORITY` > 0)"


@dataclass(frozen=True)
class Settings:
    """What the daemon runs with. Each field's metadata (`Setting`) says how
    it is set; the field's default is the setting's default."""

    repository: Path = field(
        default=BUNDLED_REPOSITORY,
        metadata=_setting(
            "MODEL_REPOSITORY",
            FilePath(),
            "model repository root",
            shown="the bundled `app/models/`",
            aliases=("--repository",),
        ),
    )
    policy: str = field(
        default="symphony",
        metadata=_setting(
            "POLICY",
            PolicyName(),
            "scheduling policy, one of `app.scheduling.policy_names()`, optionally with its "
            "options: `NAME:key=value,…` or `NAME:{JSON}` (the simulator's `--policy` syntax)",
        ),
    )
    policy_options: dict[str, object] = field(
        default_factory=dict,
        metadata=_setting(
            "POLICY_OPTIONS",
            JsonObject(metavar="OPTIONS", options=True),
            'policy options, a JSON object or `key=value,…`: `{"stagger_slack": 2}` or '
            "`stagger_slack=2` (the same as `POLICY=NAME:OPTIONS`; a key given in both is refused)",
        ),
    )
    host: str = field(
        default="127.0.0.1",
        metadata=_setting(
            "HOST",
            Text(metavar="ADDRESS"),
            "address uvicorn binds (loopback unless told otherwise)",
        ),
    )
    port: int = field(
        default=8000, metadata=_setting("PORT", Integer(0, 65535), "port uvicorn binds")
    )
    api_workers: int = field(
        default=0,
        metadata=_setting(
            "API_WORKERS",
            Integer(0, 256),
            "API worker processes that serve HTTP and gRPC and hand the scheduler process "
            "small descriptors over ZeroMQ, tensors in shared memory (0: one process does "
            "both; `python -m app serve` only; docs/architecture.md, API worker processes)",
        ),
    )
    grpc_port: int = field(
        default=8001,
        metadata=_setting(
            "GRPC_PORT",
            Integer(0, 65535),
            "port of the KServe v2 gRPC endpoint, on `HOST` (0: off; needs the `triton` extra)",
        ),
    )
    metrics_port: int = field(
        default=8002,
        metadata=_setting("METRICS_PORT", Integer(0, 65535), "port of Triton's metrics (0: off)"),
    )
    cpu_slices: int | None = field(
        default=None,
        metadata=_setting(
            "CPU_SLICES",
            Integer(0),
            "CPU executor processes for ONNX models (auto: 1 without a GPU, 0 with one)",
            shown="auto",
        ),
    )
    threads_per_slice: int | None = field(
        default=None,
        metadata=_setting(
            "THREADS_PER_SLICE",
            Integer(1),
            "ONNX Runtime intra-op threads per CPU slice",
            shown="cores / slices",
        ),
    )
    emulated_devices: int = field(
        default=2,
        metadata=_setting(
            "EMULATED_DEVICES", Integer(0), "emulated devices for emulated models (0: none)"
        ),
    )
    device_shares: dict[str, tuple[float, ...]] | None = field(
        default=None,
        metadata=_setting(
            "DEVICE_SHARES",
            DeviceShares(),
            "devices split into shares, one executor each, `DEVICE=SHARE,…` items separated "
            "by `;`: `cpu=0.5,0.5` runs `cpu:0/0` and `cpu:0/1` on half the cores each, "
            "`cuda:0=0.3,0.7` two MPS clients of GPU 0 (a kind names each device of it; "
            "a device's shares sum to ≤ 1)",
            shown="none",
        ),
    )
    colocation_profile: bool = field(
        default=True,
        metadata=_setting(
            "COLOCATION_PROFILE",
            Boolean(),
            "with `DEVICE_SHARES`, measure at start-up what each model's co-runners on the "
            "other shares of its device cost it and plan with its profile × that slowdown "
            "(app/server/colocation.py; 0: plan with the profiles measured alone)",
        ),
    )
    plan: Path | None = field(
        default=None,
        metadata=_setting(
            "PLAN",
            FilePath(),
            "a plan file of any planner (`python -m app plan partition|herd|inss|ppipe … --out "
            "FILE`), checked against the repository's models and this server's devices at "
            "start-up: a partition's or HERD's groups, one scheduling core each; an InSS plan's "
            "shares, placement and batch sizes; a PPipe plan's pipelines (app/server/plans.py). "
            "`POLICY` defaults to `flex` for a HERD plan, `inss` for an InSS plan",
            shown="unset (no plan)",
        ),
    )
    core_groups: Path | None = field(
        default=None,
        metadata=_setting(
            "CORE_GROUPS",
            FilePath(),
            "the older name of `PLAN` for a partition or HERD plan (not with `PLAN`)",
            shown="unset (one core per set of devices hosting the same models)",
        ),
    )
    replan_s: float = field(
        default=0.0,
        metadata=_setting(
            "REPLAN_S",
            Number(metavar="S"),
            "with a plan in force, every S seconds plan the sub-clusters (HERD: the serving "
            "groups; InSS: the placement, shares and batches; PPipe: the pipelines) again from "
            "the rates measured over the last S seconds and take the new plan up while serving "
            "when it is `REPLAN_GAIN` better (app/server/replanning.py); 0: the plan stays",
            shown="0 (off)",
        ),
    )
    replan_gain: float = field(
        default=0.2,
        metadata=_setting(
            "REPLAN_GAIN",
            Number(metavar="F", maximum=1.0),
            "how much lower a re-plan's objective must be than the plan in force's, under the "
            "rates just measured, to be taken up; the objective is the largest sub-cluster's "
            "deviation from the average rate as a fraction of it (plus w × the same for "
            "memory): 0.2 is 20 points; for HERD, how much higher its least burst tolerance "
            "must be; for InSS, by what fraction its Σ throughput must be higher when it "
            "serves as many models at their rates (one serving more is always taken up); for "
            "PPipe, by what fraction its load factor (the least over the models of planned "
            "throughput ÷ measured rate) (hysteresis: the plan does not flap)",
        ),
    )
    autoscale: tuple[int, int] | None = field(
        default=None,
        metadata=_setting(
            "AUTOSCALE",
            DeviceRange(),
            "act on Symphony's advised device change (symphony.txt §4.4): each core's devices "
            "in service between MIN and MAX, the rest parked (their executors stopped) and "
            "started when the bad rate calls for them (app/server/autoscaling.py); unset: all "
            "devices serve",
            shown="off",
        ),
    )
    autoscale_window_s: float = field(
        default=5.0,
        metadata=_setting(
            "AUTOSCALE_WINDOW_S",
            Number(metavar="S", minimum=0.1),
            "how often the autoscaler reads the bad rate and idle time",
        ),
    )
    autoscale_cooldown_s: float = field(
        default=10.0,
        metadata=_setting(
            "AUTOSCALE_COOLDOWN_S",
            Number(metavar="S", minimum=0.0),
            "after a device change, none for this long",
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=_setting(
            "RAY_ADDRESS",
            RayAddress(),
            "run the executors as actors on this Ray cluster, one per device "
            "(app/runtime/ray_pool.py; the `ray` extra); the daemon's dispatch delays to them "
            "are measured at start-up and budgeted in every plan",
            shown="unset (executor processes on this machine)",
            aliases=("--ray",),
        ),
    )
    ray_nodes: dict[int, str] | None = field(
        default=None,
        metadata=_setting(
            "RAY_NODES",
            RayNodes(),
            "with RAY_ADDRESS: each named executor's Ray node (node ID, IP address, or `local`: "
            "the daemon's), e.g. `0=10.0.0.2,1=local`; the others go where Ray places them",
            shown="unset (Ray places every executor)",
        ),
    )
    arena_slots: int = field(
        default=1024,
        metadata=_setting(
            "ARENA_SLOTS",
            Integer(1),
            "shared-memory slots per model, one per item: a hard cap on items in flight "
            "(429 `overloaded` above; at least the model's max_batch_size)",
        ),
    )
    max_queue: int = field(
        default=0,
        metadata=_setting(
            "MAX_QUEUE",
            Integer(0),
            "per model, requests accepted and not yet answered; above it 429 `queue_full` (0: off)",
        ),
    )
    stuck_factor: float = field(
        default=10.0,
        metadata=_setting(
            "STUCK_FACTOR",
            Number(),
            "a batch running past `STUCK_FACTOR`·ℓ(b) + `STUCK_MARGIN_S` means a hung "
            "executor: it is killed and handled as a crash (0: no watchdog)",
        ),
    )
    stuck_margin_s: float = field(
        default=1.0,
        metadata=_setting("STUCK_MARGIN_S", Number(metavar="S"), "see `STUCK_FACTOR`"),
    )
    heartbeat_timeout_s: float = field(
        default=0.8,
        metadata=_setting(
            "HEARTBEAT_TIMEOUT_S",
            Number(metavar="S"),
            "an executor whose heartbeat (a thread of its own, 5 beats per timeout) stops "
            "this long is hung, idle or busy: it is killed and handled as a crash (0: off)",
        ),
    )
    respawn: bool = field(
        default=True,
        metadata=_setting(
            "RESPAWN", Boolean(), "restart an executor that died or hung (0: leave its device down)"
        ),
    )
    shutdown_grace_s: float = field(
        default=5.0,
        metadata=_setting(
            "SHUTDOWN_GRACE_S",
            Number(metavar="S"),
            "on SIGTERM, how long in-flight requests may take to finish",
        ),
    )
    exit_on_error: bool = field(
        default=True,
        metadata=_setting(
            "EXIT_ON_ERROR",
            Boolean(),
            "stop at start-up (non-zero exit) when a model fails to load, naming the model "
            "and the reason (0: serve the others)",
        ),
    )
    strict_readiness: bool = field(
        default=True,
        metadata=_setting(
            "STRICT_READINESS",
            Boolean(),
            "`/v2/health/ready` is not ready while a model of the repository failed to load "
            "(0: ready once the loaded models are)",
        ),
    )
    # Connections (app/api/connection.py; enforced under `python -m app serve`).
    header_timeout_s: float = field(
        default=10.0,
        metadata=_setting(
            "HEADER_TIMEOUT_S",
            Number(metavar="S"),
            "a connection must send a complete request head this soon after it opens, after "
            "its previous answer or after the head's first byte; else it is closed (0: off)",
        ),
    )
    body_timeout_s: float = field(
        default=30.0,
        metadata=_setting(
            "BODY_TIMEOUT_S",
            Number(metavar="S"),
            "a request body must have arrived this soon after its head; else 408 "
            "`request_timeout` and the connection is closed (0: off)",
        ),
    )
    keep_alive_timeout_s: float = field(
        default=5.0,
        metadata=_setting(
            "KEEP_ALIVE_TIMEOUT_S",
            Number(metavar="S"),
            "an idle keep-alive connection is closed after this long",
        ),
    )
    max_header_bytes: int = field(
        default=64 << 10,
        metadata=_setting(
            "MAX_HEADER_BYTES",
            Integer(256),
            "largest request head (request line and headers); 431 `headers_too_large` above "
            "and the connection is closed",
        ),
    )
    max_buffered_bytes: int = field(
        default=256 << 20,
        metadata=_setting(
            "MAX_BUFFERED_BYTES",
            Integer(1),
            "request bodies received and not yet answered, over all connections; a body "
            "that does not fit gets 503 `server_busy` (one body alone always fits)",
        ),
    )
    max_connections: int | None = field(
        default=None,
        metadata=_setting(
            "MAX_CONNECTIONS",
            Integer(1),
            "open client connections; a new one above it gets 503 `too_many_connections` and "
            "is closed. Capped below the open-file limit less a reserve for the executors",
            shown="auto (≤ 4096)",
        ),
    )
    deadline_margin_ms: float = field(
        default=NORMAL_SLACK_MS[0],
        metadata=_setting(
            "DEADLINE_MARGIN_MS",
            Number(metavar="MS"),
            "plan batches to end this long before each deadline (IPC, the answer); "
            "raise it on a busy small machine",
            shown=_slack_shown(0),
        ),
    )
    timer_lead_ms: float = field(
        default=NORMAL_SLACK_MS[1],
        metadata=_setting(
            "TIMER_LEAD_MS",
            Number(metavar="MS"),
            "run the scheduling core this long before each of its timers, "
            "which fire late on a busy event loop",
            shown=_slack_shown(1),
        ),
    )
    realtime_priority: int = field(
        default=0,
        metadata=_setting(
            "REALTIME_PRIORITY",
            RealtimePriority(),
            "`SCHED_FIFO` priority of the event loop, emulated and GPU executors one below "
            "(0: off; Linux, root or `CAP_SYS_NICE`)",
        ),
    )
    max_body_bytes: int = field(
        default=64 << 20,
        metadata=_setting(
            "MAX_BODY_BYTES",
            Integer(1),
            "largest request body accepted (413 above): the ceiling of each model's own "
            "limit, derived from its input shapes",
        ),
    )
    max_json_bytes: int = field(
        default=2 << 20,
        metadata=_setting(
            "MAX_JSON_BYTES",
            Integer(1024),
            "largest JSON text of one request (the whole body, or the JSON header of a "
            "binary-tensor request; 413 above): parsing holds the event loop ~2-3 ms per MB, "
            "so larger tensors go as binary tensor data",
        ),
    )
    metrics_prefix: str = field(
        default=DEFAULT_METRICS_PREFIX,
        metadata=_setting(
            "METRICS_PREFIX",
            MetricPrefix(),
            "prefix of every metric name on `/metrics` (empty: none)",
        ),
    )
    access_log: bool = field(
        default=False,
        metadata=_setting(
            "ACCESS_LOG",
            Boolean(),
            "a log line per HTTP request (uvicorn's; ~9 % of the CPU it uses)",
        ),
    )
    server_name: str = field(
        default="deadline-serve",
        metadata=_setting(
            "SERVER_NAME",
            Text(metavar="NAME"),
            "the `name` server metadata reports (HTTP `GET /v2`, gRPC ServerMetadata); "
            "`triton` for clients that check it is Triton (its health/metadata examples)",
        ),
    )
    admin_token: str | None = field(
        default=None,
        repr=False,  # a credential: kept out of logs
        metadata=_setting(
            "ADMIN_TOKEN",
            Text(metavar="TOKEN"),
            "bearer token that management routes (model load/unload) require; see Exposure",
            shown="none",
        ),
    )
    profile_batch_sizes: tuple[int, ...] = field(
        default=(1, 2, 4, 8, 16, 32),
        metadata=_setting(
            "PROFILE_BATCH_SIZES",
            IntegerList(),
            "batch sizes the profiler measures at load (those ≤ the model's max batch, "
            "with 1 and the max)",
        ),
    )

    profile_cache_dir: Path | None = field(
        default=None,
        metadata=_setting(
            "PROFILE_CACHE_DIR",
            FilePath(),
            "where measured latency profiles are cached, per model name, model-file hash and "
            "device (never in the model repository)",
            shown="`$XDG_CACHE_HOME/deadline-serve/profiles` (`~/.cache/…`)",
        ),
    )
    profile_min_r2: float = field(
        default=0.9,
        metadata=_setting(
            "PROFILE_MIN_R2",
            Number(),
            "a measured profile whose linear fit has a lower r², or whose latency falls "
            "with batch size, is measured again at start-up, then reported as a warning",
        ),
    )
    # 5 %: a dynamic model at 100 requests/s yields ~300 alone-times a minute,
    # enough to refill a per-application histogram window, while re-runs stay
    # a small share of the device's work; they only use idle device time and
    # a planned batch stops them (app/runtime/alone_profiler.py).
    profile_sample_rate: float = field(
        default=0.05,
        metadata=_setting(
            "PROFILE_SAMPLE_RATE",
            Number(maximum=1.0),
            "fraction of the requests of models with input-dependent latency (`dynamic`) "
            "that their executor re-runs alone while idle, feeding the scheduler's "
            "alone-time histograms (0: off; static models are never re-run)",
        ),
    )

    # PPipe (app/server/pipeline_setup.py): models served as pipelines.
    ppipe_plan: Path | None = field(
        default=None,
        metadata=_setting(
            "PPIPE_PLAN",
            FilePath(),
            "the older name of `PLAN` for a PPipe plan (not with `PLAN`): its models are served "
            "as pipelines of partitions over executors of its device classes (`PPIPE_CLASSES`)",
            shown="unset (no pipelines)",
        ),
    )
    ppipe_timings: Path | None = field(
        default=None,
        metadata=_setting(
            "PPIPE_TIMINGS",
            FilePath(),
            "the plan's block profiles and partitions "
            "(`python -m app.repository.block_profile … --out DIR`)",
            shown="the directory the plan was made from",
        ),
    )
    ppipe_classes: tuple[DeviceClass, ...] = field(
        default=DEFAULT_CLASSES,
        metadata=_setting(
            "PPIPE_CLASSES",
            DeviceClasses(),
            "the live CPU device classes the plan's classes name: intra-op threads and an "
            "emulated slowdown",
        ),
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from environment variables (`os.environ` by default)."""
        return read_settings(os.environ if env is None else env)


def _described(spec: Field[Any]) -> Setting:
    setting = spec.metadata.get(_KEY)
    assert isinstance(setting, Setting), f"Settings.{spec.name} has no Setting metadata"
    default = spec.default_factory() if spec.default is MISSING else spec.default  # type: ignore[misc]
    return replace(setting, name=spec.name, default=default)


# Every setting, in the order of the settings table (docs/settings.md).
SETTINGS: tuple[Setting, ...] = tuple(_described(spec) for spec in fields(Settings))
SETTING_BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


def read_settings(env: Mapping[str, str], flags: Mapping[str, str] | None = None) -> Settings:
    """Settings from environment variables and flag values (keyed by
    attribute name, e.g. `{"max_queue": "5"}`); a flag wins over its
    variable, and a setting given by neither takes its default. A bad value
    raises ValueError naming the variable or flag it came from."""
    flags = flags or {}
    unknown = set(flags) - set(SETTING_BY_NAME)
    if unknown:
        raise ValueError(f"not settings: {', '.join(sorted(unknown))}")
    given: dict[str, object] = {}
    for setting in SETTINGS:
        if setting.name in flags:
            given[setting.name] = setting.parse(flags[setting.name], setting.flag)
        elif setting.env in env:
            given[setting.name] = setting.parse(env[setting.env], setting.env)
    _split_policy(given, flags)
    _plan_settings(given)
    _check_policy_options(
        str(given.get("policy", SETTING_BY_NAME["policy"].default)),
        given.get("policy_options") or {},  # type: ignore[arg-type]
    )
    return Settings(**{**_dependent_defaults(given), **given})  # type: ignore[arg-type]


def _split_policy(given: dict[str, object], flags: Mapping[str, str]) -> None:
    """`POLICY=NAME:OPTIONS`: the name stays `policy`, the options join
    `policy_options` (a key given in both is a ValueError)."""
    text = given.get("policy")
    if not isinstance(text, str) or ":" not in text:
        return
    spec = parse_policy(text)
    label = SETTING_BY_NAME["policy"].flag if "policy" in flags else "POLICY"
    separate = given.get("policy_options") or {}
    given["policy"] = spec.name
    given["policy_options"] = merge_options(spec.options, separate, f"{label} and POLICY_OPTIONS")  # type: ignore[arg-type]


# The core's options that are settings of their own (app/server/startup.py
# passes them to every core).
CORE_SLACK_OPTIONS = {"deadline_margin": "deadline_margin_ms", "timer_lead": "timer_lead_ms"}


def _check_policy_options(policy: str, options: Mapping[str, object]) -> None:
    known = policy_options(policy)
    unknown = sorted(set(options) - set(known) - set(CORE_SLACK_OPTIONS))
    if unknown:
        raise ValueError(
            f"POLICY_OPTIONS: policy {policy!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options: {', '.join(o for o in known if o not in CORE_SLACK_OPTIONS)}"
        )
    for option, name in CORE_SLACK_OPTIONS.items():
        if option in options:
            setting = SETTING_BY_NAME[name]
            raise ValueError(
                f"POLICY_OPTIONS may not set {option!r}: it is the setting "
                f"{setting.env} ({setting.flag}), in milliseconds"
            )


# The policy a plan of each kind is served with unless POLICY says otherwise.
# An InSS plan's shares are served by `symphony`: on the same shares it
# serves more than InSS's own FIFO batching (`inss`, which takes the plan's
# batch sizes) on every setting bench/inss_sim.py measures (BENCHMARKS.md).
PLAN_POLICIES = {"herd-plan": "flex", "inss-plan": "symphony"}


def _plan_settings(given: dict[str, object]) -> None:
    """PLAN alone (not with its older names); the policy its kind is served
    with unless POLICY is given. Reads the plan file's kind."""
    if given.get("plan") is None:
        return
    older = [SETTING_BY_NAME[n].env for n in ("core_groups", "ppipe_plan") if given.get(n)]
    if older:
        names = " and ".join(older)
        what = "is the older name" if len(older) == 1 else "are older names"
        raise ValueError(f"PLAN and {names} are both set: {names} {what} of PLAN; set PLAN only")
    from app.planning.plan_files import read_plan_file

    try:
        kind = read_plan_file(Path(str(given["plan"]))).kind
    except ValueError as exc:
        raise ValueError(f"PLAN: {exc}") from None
    if "policy" not in given and kind in PLAN_POLICIES:
        given["policy"] = PLAN_POLICIES[kind]


def _dependent_defaults(given: Mapping[str, object]) -> dict[str, object]:
    """Defaults that follow from other settings: the slack of the answer
    path is smaller at real-time priority."""
    margin_ms, lead_ms = REALTIME_SLACK_MS if given.get("realtime_priority") else NORMAL_SLACK_MS
    return {"deadline_margin_ms": margin_ms, "timer_lead_ms": lead_ms}
