"""GPU shares through CUDA MPS: the control daemon while the pool runs, and
each share's executor as an MPS client limited to its share of the SMs.

When a GPU is split into shares (`app.runtime.shares`), the pool starts the
MPS control daemon (`nvidia-cuda-mps-control -d`) with its pipe and log
directories in a private temporary directory, so that it neither needs nor
disturbs a system-wide daemon, and starts each share's executor with those
directories and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = round(100 × share):
the share's executors then run their kernels at once, each on at most that
part of the SMs. At pool stop the daemon is told `quit`.

Without the control program on PATH, or when the daemon does not start, the
shares' executors still run, one process each, and the GPU time-shares them
(kernels of different processes take turns); one warning says why.

The decisions (`plan_mps`, `executor_env`) are plain functions; `GpuSharing`
is the thin part that runs the daemon.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from app.runtime.devices import ExecutorDevice

log = logging.getLogger("app.runtime.mps")

MPS_CONTROL = "nvidia-cuda-mps-control"
PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# How long the control program may take to start or stop the daemon.
CONTROL_TIMEOUT_S = 30.0

Which = Callable[[str], "str | None"]


def shared_gpus(devices: Iterable[ExecutorDevice]) -> list[str]:
    """The GPUs split into shares, by name, in order."""
    return list(dict.fromkeys(d.whole for d in devices if d.kind == "cuda" and d.whole != d.name))


@dataclass(frozen=True)
class MpsPlan:
    """Whether to start the MPS control daemon, and with which program;
    `warning` says why GPU shares time-share instead."""

    control: str | None = None  # the program's path: start the daemon
    warning: str | None = None


def plan_mps(devices: Iterable[ExecutorDevice], which: Which = shutil.which) -> MpsPlan:
    """Start MPS when a GPU is split into shares and the control program is
    on PATH (`which` finds it); else nothing, with a warning when there are
    shares."""
    gpus = shared_gpus(devices)
    if not gpus:
        return MpsPlan()
    control = which(MPS_CONTROL)
    if control is None:
        return MpsPlan(
            warning=f"{MPS_CONTROL} is not on PATH: the shares of {', '.join(gpus)} "
            "time-share their GPU instead of running at once under MPS"
        )
    return MpsPlan(control=control)


def daemon_env(directory: str) -> dict[str, str]:
    """Where the daemon and its clients meet (pipes) and where it logs."""
    return {
        PIPE_DIRECTORY: os.path.join(directory, "pipe"),
        LOG_DIRECTORY: os.path.join(directory, "log"),
    }


def thread_percentage(share: float) -> int:
    """A share as MPS's active thread percentage: 1 to 100."""
    return min(100, max(1, round(100 * share)))


def executor_env(device: ExecutorDevice, directory: str | None) -> dict[str, str]:
    """The environment an executor adds to its own before its backend loads:
    for a share of a GPU while the daemon runs in `directory`, its MPS
    client settings; nothing otherwise."""
    if directory is None or device.kind != "cuda" or device.whole == device.name:
        return {}
    return {**daemon_env(directory), THREAD_PERCENTAGE: str(thread_percentage(device.share))}


Run = Callable[..., "subprocess.CompletedProcess[str]"]


class GpuSharing:
    """The MPS daemon of a pool (none when no GPU has shares)."""

    def __init__(self, directory: str | None = None, control: str | None = None) -> None:
        self.directory = directory  # set: the daemon runs, its directories under it
        self.control = control
        self._run: Run = subprocess.run

    @classmethod
    def start(
        cls,
        devices: Iterable[ExecutorDevice],
        which: Which = shutil.which,
        run: Run = subprocess.run,
    ) -> GpuSharing:
        """Start the daemon if `plan_mps` says so; a daemon that fails to
        start leaves the shares time-sharing, with a warning."""
        plan = plan_mps(devices, which)
        if plan.warning is not None:
            log.warning("%s", plan.warning)
        if plan.control is None:
            return cls()
        directory = tempfile.mkdtemp(prefix="dsrv-mps-")
        env = daemon_env(directory)
        for path in env.values():
            os.makedirs(path, exist_ok=True)
        failure = _control(run, [plan.control, "-d"], None, env)
        if failure is not None:
            log.warning(
                "the MPS control daemon did not start (%s): GPU shares time-share their GPU",
                failure,
            )
            shutil.rmtree(directory, ignore_errors=True)
            return cls()
        log.info("MPS control daemon started (pipes in %s)", env[PIPE_DIRECTORY])
        sharing = cls(directory, plan.control)
        sharing._run = run
        return sharing

    def env_for(self, device: ExecutorDevice) -> dict[str, str]:
        return executor_env(device, self.directory)

    def stop(self) -> None:
        """Tell the daemon to quit (its clients have exited by now)."""
        if self.directory is None or self.control is None:
            return
        directory, self.directory = self.directory, None
        failure = _control(self._run, [self.control], "quit\n", daemon_env(directory))
        if failure is not None:
            log.warning("stopping the MPS control daemon failed: %s", failure)
        shutil.rmtree(directory, ignore_errors=True)


def _control(run: Run, argv: list[str], text: str | None, env: Mapping[str, str]) -> str | None:
    """Run the control program; None when it succeeded, else why not."""
    try:
        done = run(
            argv,
            input=text,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=CONTROL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0:
        return f"exit code {done.returncode}: {(done.stderr or done.stdout or '').strip()}"
    return None
