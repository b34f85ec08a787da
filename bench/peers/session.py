"""A peer server's process session: what every launcher starts and stops the
same way.

Each launcher starts its server with `start_new_session=True` (the session
and process-group id are then the child's pid) and `preexec_fn=set_pdeathsig`
(the child gets SIGTERM if the launcher dies), and `end_session` ends it:
SIGTERM, a wait, SIGKILL of the group if it does not exit, and then SIGKILL
of whatever of the session outlives it — a peer's workers, stubs or Ray's
processes — so nothing of it outlives `stop()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

from bench.daemon_launcher import free_port

PR_SET_PDEATHSIG = 1

__all__ = ["end_session", "free_port", "session_processes", "set_pdeathsig"]


def set_pdeathsig() -> None:  # runs in the child before exec
    """SIGTERM this process when its parent dies (Linux prctl)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command) of live processes in session `sid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            state, session = fields[0], int(fields[3])
            if session != sid or state == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out.append((int(entry.name), cmd.strip()))
        except (OSError, ValueError, IndexError):
            continue
    return out


def end_session(
    proc: subprocess.Popen, timeout_s: float, *, whole_group: bool = False, poll_s: float = 0.1
) -> list[str]:
    """Stop the server `proc` (a session leader) and everything of its
    session; the commands that had to be killed after it exited. SIGTERM
    goes to `proc` alone, or to its process group with `whole_group`."""
    sid = proc.pid
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(sid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGKILL)
            proc.wait(10)
    killed: list[str] = []
    grace = time.monotonic() + 5.0
    while session_processes(sid) and time.monotonic() < grace:
        time.sleep(poll_s)
    for pid, cmd in session_processes(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(cmd)
    return killed
