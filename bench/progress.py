"""Progress where a person waits: a rich live display on a terminal, and
plain lines elsewhere (a log file, a pipe, CI), where rich draws nothing
until the end. Either way something is said at least every `EVERY_S`
seconds, with the elapsed time and, where the work is counted, an estimate
of the time left.

    progress = Progress(..., console=err)
    with progress, plain_lines(progress):
        ...

`Status` is the same for work that is not counted in steps (the comparison's
systems and probes): `status.say("symphony: capacity probe 3 at ×1.2")`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

EVERY_S = 4.0  # a line at least this often (the promise is every 5 s)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def about(seconds: float) -> str:
    """An estimate as a person reads it: "about 40 s", "about 26 min"."""
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"


def task_line(task: Any) -> str:
    """One task as a plain line: what, how far, how long, how long left."""
    parts = [task.description or "working"]
    if task.total:
        parts.append(f"{task.completed:g}/{task.total:g}")
    elapsed = task.elapsed or 0.0
    parts.append(f"elapsed {_clock(elapsed)}")
    remaining = task.time_remaining
    if task.total and remaining is not None:
        parts.append(f"about {_clock(remaining)} left")
    return " · ".join(parts)


@contextmanager
def plain_lines(progress: Progress, every_s: float = EVERY_S) -> Iterator[None]:
    """While inside: when `progress` is enabled and its console is not a
    terminal, print each running task as a line every `every_s` seconds,
    and sooner (at most once a second) when a task starts or changes."""
    console = progress.console
    if progress.disable or console.is_terminal:
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        said: dict[Any, str] = {}  # each task's description when last said
        last = 0.0
        while not stop.wait(0.2):
            running = [t for t in list(progress.tasks) if not t.finished and t.visible]
            since = time.monotonic() - last
            changed = any(said.get(t.id) != t.description for t in running)
            # Every `every_s`; sooner (not more than once a second) on a change.
            if running and (since >= every_s or (changed and since >= min(1.0, every_s))):
                for task in running:
                    console.print(task_line(task), highlight=False, markup=False, soft_wrap=True)
                    said[task.id] = task.description
                last = time.monotonic()

    thread = threading.Thread(target=tick, name="progress-lines", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def make_progress(console: Console, *, quiet: bool = False) -> Progress:
    """The project's progress display: spinner, what, bar, count, elapsed,
    time left."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=quiet,
    )


class Status:
    """What an uncounted piece of work is doing now: a live line on a
    terminal, a plain line every few seconds elsewhere. While one is open,
    `say(text)` anywhere sets its line and `about_subject(name)` what the line is
    about (its prefix: the system being measured)."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=quiet,
        )
        self._task: Any = None
        self._lines: Any = None
        self.subject = ""

    def __enter__(self) -> Status:
        global _open
        self.progress.__enter__()
        self._task = self.progress.add_task("starting", total=None)
        self._lines = plain_lines(self.progress)
        self._lines.__enter__()
        _open = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _open
        _open = None
        self._lines.__exit__(*exc)
        self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        if self._task is not None:
            line = f"{self.subject}: {text}" if self.subject else text
            self.progress.reset(self._task, description=line)  # elapsed: of this step


_open: Status | None = None


def say(text: str) -> None:
    """Set the open Status's line (nothing when none is open)."""
    if _open is not None:
        _open.say(text)


def about_subject(subject: str) -> None:
    """What the open Status's lines are about from now on."""
    if _open is not None:
        _open.subject = subject
