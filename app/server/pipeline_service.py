"""Models served as PPipe pipelines by the daemon (`PPIPE_PLAN`): start-up
from a plan file, and the serving path of their requests.

Start-up (`start_pipelines`). The plan (app/planning/ppipe/plan.py, written
by `python -m app plan ppipe … --out FILE`) names its models, device classes
and pipelines. Each of its models must be an ONNX model of the repository;
its partitioning (the boundary tensors, `partitions/MODEL.json`) and block
profiles are read from the timings directory (`PPIPE_TIMINGS`; by default
the one the planner read, as the plan records it: what
`python -m app.repository.block_profile … --out DIR` wrote). Every class the
plan uses must be a live class (`PPIPE_CLASSES`: threads and an emulated
slowdown). The plan's models leave the repository's ordinary serving (no
executor of the other devices loads them); their partitions are written to
a temporary directory and loaded by one executor per device instance of the
plan's layout (app/server/pipeline_setup.py's `LivePipelines`), and the
`ppipe` core (app/scheduling/ppipe/) serves them. Anything missing stops
start-up with `StartupFailed` naming it.

One machine: stages hand over through shared memory, so the plan's links
are not used: the layout is built with a bandwidth at which a transfer
takes ~0 s, as app/server/pipeline_driver.py expects.

Serving: LiveService's one admission-and-answer path (`_serve`: the
request's SLO — the model config's, or a tighter per-request one; a plan
made for another SLO is warned about at start-up —, MAX_QUEUE, metrics,
statistics, the answer) sends these models' requests to `route`
(app/server/serving_routes.py's `PipelineRoute`, the pipeline driver in
place of the dispatcher). An answer's `device` names the instance of each
stage in order (`cpu2t:0>cpu1t:2`); its `exec_ms` runs from the first
stage's start to the last one's end. Executors that die are respawned (RESPAWN): the driver
takes the instance out of the core's tables at `DeviceDown` and back at
`DeviceUp`, as for ordinary executors.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

from app.repository.config import ModelConfig
from app.repository.loader import RepositoryIndex
from app.runtime.events import DeviceDown, DeviceUp, ExecutorEvent
from app.scheduling.ppipe import Layout, PPipeScheduler
from app.scheduling.ppipe.batches import PipelineBatch
from app.scheduling.ppipe.sequencer import LIVE_HOLD, LIVE_OVERDUE, live_lead
from app.server.metrics import Metrics
from app.server.pipeline_setup import LivePipelines
from app.server.serving_routes import PipelineRoute
from app.server.settings import Settings
from app.server.startup import StartupFailed
from app.server.statistics import Statistics

log = logging.getLogger("app.server")

# Shared memory: a bandwidth at which the largest cut moves in nanoseconds.
SHARED_MEMORY_GBPS = 1e9


class PipelineService:
    """The plan's models, served (see the module docstring)."""

    def __init__(
        self,
        live: LivePipelines,
        configs: dict[str, ModelConfig],
        workdir: Path,
        settings: Settings,
        metrics: Metrics,
        statistics: Statistics,
    ) -> None:
        self.live = live
        self.configs = configs
        self._workdir = workdir
        self._settings = settings
        self._metrics = metrics
        self._statistics = statistics
        self._names = {d.id: d.name for d in live.devices}
        live.driver.on_batch = self._on_batch
        # The largest batch a pipeline of the model can run: its profile's.
        layout = live.driver.core.layout
        max_items = {
            m: min(c.max_batch_size, max(len(p.stages[0].latency) for p in layout.pipelines_of(m)))
            for m, c in configs.items()
        }
        # Where LiveService's one serving path sends these models' requests.
        self.route = PipelineRoute(live.driver, max_items, self._names)

    @property
    def layout(self) -> Layout:
        """The plan's pipelines over their device instances."""
        return self.live.driver.core.layout

    def device_name(self, device_id: int) -> str:
        """An instance's executor name (`CLASS:i`)."""
        return self._names[device_id]

    @property
    def pending(self) -> int:
        """Requests accepted and not answered yet."""
        return len(self.live.driver.pending)

    def ready(self, model: str) -> bool:
        """Some pipeline of `model` has a live instance in every stage."""
        core = self.live.driver.core
        return any(
            all(any(core.alive[d] for d in stage.devices) for stage in pipeline.stages)
            for pipeline in core.layout.pipelines_of(model)
        )

    def device_counts(self) -> tuple[int, int]:
        """Instances alive, and in all."""
        alive = self.live.driver.core.alive
        return sum(alive), len(alive)

    def device_index(self) -> list[dict[str, object]]:
        """The pipelines' executor devices, as `GET /v2/devices` lists them:
        each with its PPipe device `class` (what `plan ppipe --from` reads)
        and the models whose pipelines run on it."""
        core = self.live.driver.core
        layout = core.layout
        by_id = {d.id: d for d in self.live.devices}
        out: list[dict[str, object]] = []
        for instance in layout.devices:
            device = by_id[instance.id]
            models = sorted(
                {
                    p.model
                    for p in layout.pipelines
                    if any(instance.id in stage.devices for stage in p.stages)
                }
            )
            alive = bool(core.alive[instance.id])
            out.append(
                {
                    "name": device.name,
                    "kind": device.kind,
                    "share": 1.0 / instance.share,
                    "cpus": None,
                    "threads": device.threads,
                    "alive": alive,
                    "state": "serving" if alive else "down",
                    "class": instance.device_class,
                    "models": models,
                }
            )
        return out

    def on_event(self, event: ExecutorEvent) -> None:
        """The pipelines' executor events, logged and counted as LiveService
        does its own (the driver carries them out)."""
        if isinstance(event, DeviceDown):
            name = self._names.get(event.device, str(event.device))
            log.error("pipeline device %s out of service: %s", name, event.reason)
            self._metrics.executor_failed(name)
        elif isinstance(event, DeviceUp):
            name = self._names.get(event.device, str(event.device))
            log.warning("pipeline device %s back in service after %.3f s", name, event.seconds_down)
            self._metrics.executor_restarted(name, event.seconds_down)

    def _on_batch(self, batch: PipelineBatch) -> None:
        """A batch ran through every stage: Triton's per-batch statistics,
        its compute from the first stage's start to the last one's end."""
        self._statistics.batch_executed(
            batch.model,
            batch=("pipeline", batch.id),
            batch_size=batch.size,
            requests=len(batch.requests),
            infer_s=batch.stages[-1].finish - batch.stages[0].start,
        )

    def fail_all(self, error: Exception) -> int:
        """Answer every request still waiting with `error`; return how many."""
        return self.live.driver.fail_all(error)

    async def stop(self) -> None:
        """Stop the executors, free the arenas and the partition files."""
        await self.live.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)


async def start_pipelines(
    settings: Settings, index: RepositoryIndex, metrics: Metrics, statistics: Statistics
) -> PipelineService | None:
    """Serve PPIPE_PLAN's models (None when it is unset); they are taken out
    of `index.models`. Raises StartupFailed naming what is missing."""
    if settings.ppipe_plan is None:
        return None
    try:
        configs, live, workdir = _build(settings, index)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise StartupFailed(f"PPIPE_PLAN {settings.ppipe_plan}: {message}") from exc
    service = PipelineService(live, configs, workdir, settings, metrics, statistics)
    live.on_event = service.on_event
    try:
        await live.start()
    except BaseException as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        if isinstance(exc, RuntimeError):
            raise StartupFailed(f"PPIPE_PLAN {settings.ppipe_plan}: {exc}") from exc
        raise
    for name in configs:
        index.models.pop(name, None)
    for device in live.devices:
        log.info("pipeline device %d: %s (%d threads)", device.id, device.name, device.threads)
    log.info(
        "serving %s as pipelines: %s",
        ", ".join(configs),
        "; ".join(
            f"{p.model} batch {p.batch}: "
            + " > ".join(f"[{s.start},{s.end}) on {list(s.devices)}" for s in p.stages)
            for p in live.driver.core.layout.pipelines
        ),
    )
    return service


def _build(
    settings: Settings, index: RepositoryIndex
) -> tuple[dict[str, ModelConfig], LivePipelines, Path]:
    """Read the plan, the models' partitionings and profiles; lay the plan
    out and create its executors' pool (not started)."""
    from app.planning.ppipe.layout import build_layout
    from app.planning.ppipe.plan import read_plan
    from app.planning.ppipe.profiles import load_profile
    from app.planning.ppipe.reference import timings_root
    from app.repository.partition import load_partitioning

    assert settings.ppipe_plan is not None
    plan = read_plan(settings.ppipe_plan)
    timings = settings.ppipe_timings or plan.details.get("timings")
    if timings is None:
        raise ValueError("the plan does not say where its block profiles are: set PPIPE_TIMINGS")
    root = timings_root(Path(timings))
    classes = {c.name: c for c in settings.ppipe_classes}
    used = {s.device_class for p in plan.pipelines for s in p.stages}
    missing = sorted(used - set(classes))
    if missing:
        raise ValueError(
            f"its classes {missing} are not live classes (PPIPE_CLASSES has {sorted(classes)})"
        )
    configs: dict[str, ModelConfig] = {}
    partitionings = {}
    profiles = {}
    for target in plan.models:
        name = target.name
        if not plan.pipelines_of(name):
            raise ValueError(f"model {name!r}: the plan gives it no pipeline (none met its SLO)")
        config = index.models.get(name)
        if config is None:
            why = index.errors.get(name, "no such model in the repository")
            raise ValueError(f"model {name!r}: {why}")
        if config.backend != "onnx" or config.model_file is None:
            raise ValueError(
                f"model {name!r}: a pipeline cuts an ONNX model, this one's backend is "
                f"{config.backend}"
            )
        partitions = root / "partitions" / f"{name}.json"
        if not partitions.is_file():
            raise ValueError(
                f"model {name!r}: no {partitions} "
                "(written by python -m app.repository.block_profile --name MODEL)"
            )
        partitionings[name] = load_partitioning(partitions, config.model_file)
        if partitionings[name].name != name:
            raise ValueError(
                f"model {name!r}: {partitions} partitions model "
                f"{partitionings[name].name!r} (block_profile --name {name})"
            )
        profiles[name] = load_profile(name, root, used)
        if abs(config.slo_ms - target.slo_s * 1000.0) > 1e-6:
            log.warning(
                "model %s: its SLO is %g ms; the plan was made for %g ms",
                name,
                config.slo_ms,
                target.slo_s * 1000.0,
            )
        batch = max(p.batch for p in plan.pipelines_of(name))
        if batch > config.max_batch_size:
            raise ValueError(
                f"model {name!r}: the plan batches {batch}, above its max_batch_size "
                f"{config.max_batch_size}"
            )
        configs[name] = config
    local = dataclasses.replace(
        plan, cluster=dataclasses.replace(plan.cluster, bandwidth_gbps=SHARED_MEMORY_GBPS)
    )
    core = _live_core(build_layout(local, profiles), settings)
    workdir = Path(tempfile.mkdtemp(prefix="deadline-serve-ppipe-"))
    try:
        live = LivePipelines(
            core,
            partitionings,
            {c: classes[c] for c in used},
            workdir,
            capacity=max(settings.arena_slots, *(c.max_batch_size for c in configs.values())),
            respawn=settings.respawn,
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return configs, live, workdir


def _live_core(layout: Layout, settings: Settings) -> PPipeScheduler:
    """The `ppipe` core as the daemon's executors need it: stages handed over
    a lead before their start, two held at a time, overdue instances routed
    around (app/scheduling/ppipe/sequencer.py)."""
    return PPipeScheduler(
        layout,
        deadline_margin=settings.deadline_margin_ms / 1000.0,
        lead=live_lead(layout),
        hold=LIVE_HOLD,
        overdue=LIVE_OVERDUE,
    )
