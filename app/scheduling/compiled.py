"""`mypyc_attr` for the modules the optional compiled build covers
(app/build_fast.py), and a no-op stand-in where mypy is not installed: the
pure-Python modules never need it.

`allow_interpreted_subclasses=True` lets policies in pure-Python modules
subclass a class that is compiled to a native one (`Scheduler`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # mypy (and with it mypy_extensions) is not installed

        def mypyc_attr(*attrs, **kwattrs):
            return lambda cls: cls


__all__ = ["mypyc_attr"]
