"""The peers the daemon is compared with, behind one interface, and how each
peer's configuration grid is screened.

Every peer has a small grid of the settings a careful user of it would try
(`bench.peers.ray_grid`, `bench.peers.triton_launcher.triton_grid`,
`bench.peers.bentoml_launcher.bentoml_grid`). Each grid point is started and
screened at **its own capacity**: a short bisection (`--screen-probes`
probes) from the workload's nominal rate, so a point that would pass at a
lower load is not ranked by how badly it fails at the daemon's. The point
with the highest screened capacity (ties: the earlier point) then gets the
same full capacity search and CDF run as the daemon.

Where several models share the emulated devices, Triton's and Ray Serve's
grids are tried under two placements (`placements_for`): ``shared``, every
model on every device (Triton's own layout: an instance of each model on
each GPU), the instances of one device taking turns on it; and
``partition``, each model on devices of its own (model k on the devices d
with d mod n = k), which a user who sees the models queue behind each other
would try next.

A peer's extra is imported only when the peer is run; a missing extra is a
`PeerUnavailable` naming what to install.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.repository import BUNDLED_REPOSITORY
from app.repository.loader import load_repository
from app.runtime.realtime import fifo_while
from app.workloads.spec import Workload
from bench.compare.measure import (
    Options,
    SystemResult,
    capacity_search,
    free_port,
    measure,
)
from bench.compare.setups import Setup
from bench.loadgen import ModelTarget, build_targets
from bench.progress import say


class PeerUnavailable(RuntimeError):
    """A peer's optional extra is not installed (the message says which)."""


@dataclass(frozen=True)
class PeerPoint:
    """One configuration of a peer."""

    label: str
    settings: dict[str, Any]  # what the results JSON records
    config: Any  # the peer's own point object
    placement: str = "shared"  # the models' devices: "shared" or "partition"


PLACEMENTS = ("shared", "partition")


def placements_for(setup: Setup, workload: Workload) -> tuple[str, ...]:
    """Both placements where several emulated models could each have a
    device of their own; else only ``shared`` (partitioning one model, or
    more models than devices, is the same layout or none)."""
    models = len(workload.models)
    if models > 1 and setup.emulated_devices >= models:
        return PLACEMENTS
    return ("shared",)


def placed(points: Sequence[PeerPoint], placements: Sequence[str]) -> list[PeerPoint]:
    """Every point under each placement, shared first (ties go to it)."""
    out = []
    for placement in placements:
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        for point in points:
            if placement == "shared":
                out.append(point)
                continue
            out.append(
                PeerPoint(
                    f"{point.label} placement={placement}",
                    {**point.settings, "device_sharing": placement},
                    point.config,
                    placement,
                )
            )
    return out


def _placements(setup: Setup, workload: Workload, options: Options) -> Sequence[str]:
    return options.placements or placements_for(setup, workload)


@dataclass(frozen=True)
class Running:
    """A started peer: where it listens and how long it took to serve."""

    url: str
    startup_s: float
    handle: Any


RequestBuilder = Callable[[str, Sequence[dict[str, Any]], float, int], tuple[str, bytes]]


def input_metadata(setup: Setup) -> dict[str, list[dict[str, Any]]]:
    """Every model's v2 input metadata, from the repository the daemon serves."""
    if setup.repository == BUNDLED_REPOSITORY:
        from app.repository.bundled import ensure_bundled_models

        ensure_bundled_models(setup.repository)  # the ONNX files are built on first use
    index = load_repository(setup.repository)
    return {
        name: [
            {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}
            for spec in config.inputs
        ]
        for name, config in index.models.items()
    }


def targets_for(setup: Setup, workload: Workload, request: RequestBuilder) -> list[ModelTarget]:
    """One target per workload model, with the peer's own path and body."""
    inputs = input_metadata(setup)
    targets = []
    for k, model in enumerate(workload.models):
        path, body = request(model.name, inputs[model.name], float(model.slo_ms), k)
        targets.append(ModelTarget(model.name, float(model.slo_ms), body, path))
    return targets


class Peer:
    """A peer system: its grid, how to start and stop one point, its requests."""

    name = ""
    title = ""
    install = "pip install -e '.[peers]'"

    def check(self) -> None:
        """Raise PeerUnavailable when the peer cannot run here."""

    def grid(self, setup: Setup, workload: Workload, options: Options) -> list[PeerPoint]:
        raise NotImplementedError

    def start(self, setup: Setup, workload: Workload, point: PeerPoint) -> Running:
        raise NotImplementedError

    def stop(self, running: Running) -> None:
        raise NotImplementedError

    def targets(self, setup: Setup, workload: Workload) -> list[ModelTarget]:
        raise NotImplementedError


def _require(module: str, peer: str, install: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise PeerUnavailable(f"peer {peer!r} needs the {module!r} package: {install}")


class RayServe(Peer):
    """Ray Serve, `@serve.batch`, one replica per device (bench/peers/ray_serve_app.py)."""

    name, title = "ray", "Ray Serve"

    def check(self) -> None:
        _require("ray", self.name, self.install)

    def grid(self, setup: Setup, workload: Workload, options: Options) -> list[PeerPoint]:
        from bench.peers.ray_grid import candidate_grid

        points = candidate_grid(
            _grid_targets(setup, workload),
            **({"waits_s": options.ray_waits_s} if options.ray_waits_s is not None else {}),
        )
        return placed(
            [PeerPoint(p.label, p.to_dict(), p) for p in points],
            _placements(setup, workload, options),
        )

    def start(self, setup: Setup, workload: Workload, point: PeerPoint) -> Running:
        from bench.peers.ray_serve_launcher import start_ray_serve

        sizes = dict(point.config.max_batch_size)
        handle = start_ray_serve(
            setup.repository,
            free_port(),
            devices=setup.devices,
            max_batch_size=sizes if len(sizes) > 1 else point.config.single_batch_size(),
            batch_wait_timeout_s=point.config.batch_wait_timeout_s,
            cpu_threads=setup.cpu_threads,
            models=[m.name for m in workload.models],
            device_sharing=point.placement,
        )
        return Running(handle.url, handle.startup_s, handle)

    def stop(self, running: Running) -> None:
        from bench.peers.ray_serve_launcher import stop

        stop(running.handle)

    def targets(self, setup: Setup, workload: Workload) -> list[ModelTarget]:
        # Ray Serve speaks the daemon's native /infer API.
        return build_targets(workload, input_metadata(setup))


def _grid_targets(setup: Setup, workload: Workload) -> list[Any]:
    """Each workload model's profile, SLO and max batch, as the grids take them."""
    from bench.peers.ray_grid import target_from_config

    index = load_repository(setup.repository)
    return [
        target_from_config(index.models[m.name], cpu_threads=setup.cpu_threads, slo_ms=m.slo_ms)
        for m in workload.models
    ]


class TritonServer(Peer):
    """The Triton Inference Server: the `tritonserver` binary of the
    nvidia-pytriton wheel, dynamic batcher, Python backend, one instance per
    device (bench/peers/triton_launcher.py)."""

    name, title = "tritonserver", "Triton"
    install = "pip install --no-deps nvidia-pytriton==0.7.0"

    def check(self) -> None:
        from bench.peers.triton_launcher import TritonUnavailable, find_triton

        try:
            find_triton()
        except TritonUnavailable as exc:
            # The launcher's message names the install command once already.
            hint = "" if self.install in str(exc) else f" ({self.install})"
            raise PeerUnavailable(f"peer {self.name!r}: {exc}{hint}") from None

    def grid(self, setup: Setup, workload: Workload, options: Options) -> list[PeerPoint]:
        from bench.peers.triton_grid import triton_grid

        delays = options.triton_delays_us
        points = triton_grid(
            _grid_targets(setup, workload), **({"delays_us": delays} if delays is not None else {})
        )
        return placed(
            [PeerPoint(p.label, p.to_dict(), p) for p in points],
            _placements(setup, workload, options),
        )

    def start(self, setup: Setup, workload: Workload, point: PeerPoint) -> Running:
        from bench.peers.triton_launcher import start_triton

        handle = start_triton(
            setup.repository,
            free_port(),
            devices=setup.devices,
            models=[m.name for m in workload.models],
            cpu_threads=setup.cpu_threads,
            cpu_slices=max(setup.cpu_slices, 1),
            device_sharing=point.placement,
            **point.config.launch_options(),
        )
        return Running(handle.url, handle.startup_s, handle)

    def stop(self, running: Running) -> None:
        from bench.peers.triton_launcher import stop

        stop(running.handle)

    def targets(self, setup: Setup, workload: Workload) -> list[ModelTarget]:
        from bench.peers.triton_launcher import kserve_request

        return targets_for(setup, workload, kserve_request)


class BentoML(Peer):
    """BentoML's adaptive batching, one worker per device, in its own venv
    (bench/peers/bentoml_launcher.py)."""

    name, title = "bentoml", "BentoML"
    install = "python -m bench.peers.bentoml_launcher --setup"

    def check(self) -> None:
        from bench.peers.bentoml_launcher import PEER_VENV, peer_python_path

        if not peer_python_path(PEER_VENV).exists():
            raise PeerUnavailable(
                f"peer {self.name!r} needs its venv at {PEER_VENV}: {self.install}"
            )

    def grid(self, setup: Setup, workload: Workload, options: Options) -> list[PeerPoint]:
        from bench.peers.bentoml_grid import bentoml_grid

        points = bentoml_grid(_grid_targets(setup, workload))
        return [PeerPoint(p.label, p.to_dict(), p) for p in points]

    def start(self, setup: Setup, workload: Workload, point: PeerPoint) -> Running:
        from bench.peers.bentoml_launcher import start_bentoml

        handle = start_bentoml(
            setup.repository,
            free_port(),
            devices=setup.devices,
            models=[m.name for m in workload.models],
            cpu_threads=setup.cpu_threads,
            cpu_slices=max(setup.cpu_slices, 1),
            **point.config.start_kwargs(),
        )
        return Running(handle.url, handle.startup_s, handle)

    def stop(self, running: Running) -> None:
        from bench.peers.bentoml_launcher import stop

        stop(running.handle)

    def targets(self, setup: Setup, workload: Workload) -> list[ModelTarget]:
        from bench.peers.bentoml_grid import bentoml_request

        return targets_for(setup, workload, bentoml_request)


PEERS: dict[str, Peer] = {peer.name: peer for peer in (RayServe(), TritonServer(), BentoML())}


def screen(
    peer: Peer, setup: Setup, workload: Workload, options: Options
) -> tuple[PeerPoint, list[dict[str, Any]]]:
    """Each grid point's own capacity; the best point and every row."""
    targets = peer.targets(setup, workload)
    rows: list[dict[str, Any]] = []
    best: tuple[float, PeerPoint] | None = None
    grid = list(peer.grid(setup, workload, options))
    for i, point in enumerate(grid, 1):
        say(f"grid point {i}/{len(grid)} ({point.label}): starting")
        running = peer.start(setup, workload, point)
        try:
            with fifo_while(options.realtime_priority, "--realtime-priority"):
                capacity, probes = capacity_search(
                    running.url, workload, targets, options, options.screen_probes
                )
        finally:
            peer.stop(running)
        row = {
            **point.settings,
            "label": point.label,
            "startup_s": running.startup_s,
            "capacity_rps": capacity.capacity_rps,
            "capacity_status": capacity.status,
            "probes": probes,
        }
        rows.append(row)
        print(
            f"  {peer.name} grid {point.label}: capacity {capacity.capacity_rps:,.0f} r/s "
            f"({capacity.status}, start-up {running.startup_s:.1f} s)",
            file=sys.stderr,
        )
        if best is None or capacity.capacity_rps > best[0]:
            best = (capacity.capacity_rps, point)
    if best is None:
        raise ValueError(f"peer {peer.name}: empty grid")
    return best[1], rows


def run_peer(peer: Peer, setup: Setup, workload: Workload, options: Options) -> SystemResult:
    """Screen the grid, then measure the best point as the daemon is measured."""
    best, rows = screen(peer, setup, workload, options)
    targets = peer.targets(setup, workload)
    say(f"best point ({best.label}): starting")
    running = peer.start(setup, workload, best)
    try:
        measured = measure(
            running.url,
            workload,
            targets,
            options,
            system=peer.name,
            label=f"{peer.title}, {best.label}",
            startup_s=running.startup_s,
            pid=getattr(getattr(running.handle, "process", None), "pid", None),
        )
    finally:
        peer.stop(running)
    measured.grid = rows
    return measured


__all__ = [
    "PEERS",
    "PLACEMENTS",
    "BentoML",
    "Peer",
    "PeerPoint",
    "PeerUnavailable",
    "RayServe",
    "Running",
    "TritonServer",
    "placed",
    "placements_for",
    "run_peer",
    "screen",
]
