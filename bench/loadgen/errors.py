"""The load generator's two failures, which the command line tells apart by
exit status."""

from __future__ import annotations


class LoadGenError(Exception):
    """A problem with the target or the inputs (exit status 2 from the CLI)."""


class RunFailed(Exception):
    """The run could not be carried out (exit status 1 from the CLI)."""
