"""An optional compiled build of the scheduling core and the simulator's loop.

    python -m app.build_fast            # compile (needs the `fast` extra: mypy)
    python -m app.build_fast --status   # which modules load compiled
    python -m app.build_fast --clean    # back to pure Python

mypyc compiles the same typed sources (`MODULES`) into C extensions placed
next to them; Python prefers an extension to the .py file of the same
module, so once built they are used wherever the package is imported from
this checkout, and `--clean` (removing the extensions) is the way back. The
pure-Python modules stay the reference: the compiled ones make the same
decisions, only faster (`python -m bench.sim_speed`). Policies other than Symphony stay
interpreted and subclass the compiled `Scheduler` (app/scheduling/compiled.py).

The build writes its C sources under build/mypyc and one shared library,
`app/core__mypyc.*.so`, that the per-module extensions load; all are
ignored by git. Rebuild after changing a compiled module: an extension
older than its source is still the one imported (`--status` says so).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path

# The root the module paths are relative to: the directory holding `app/`.
ROOT = Path(__file__).resolve().parent.parent
# The hot path of the simulator with Symphony, and what it calls per request.
MODULES = (
    "app/scheduling/types.py",
    "app/scheduling/queue.py",
    "app/scheduling/timers.py",
    "app/scheduling/rate.py",
    "app/scheduling/model.py",
    "app/scheduling/profile.py",
    "app/scheduling/autoscale.py",
    "app/scheduling/base.py",
    "app/scheduling/symphony.py",
    "app/simulation/engine.py",
)
# The shared library's module: inside the package, so that it imports from
# wherever the package does.
GROUP = "app.core"
_SHARED_LIB = "app/core__mypyc"


class BuildError(RuntimeError):
    pass


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def extensions(root: Path = ROOT) -> list[Path]:
    """The compiled files of the build present under `root`."""
    found: list[Path] = []
    for stem in [p.removesuffix(".py") for p in MODULES] + [_SHARED_LIB]:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = root / f"{stem}{suffix}"
            if path.exists():
                found.append(path)
    return found


def compiled_modules() -> dict[str, bool]:
    """Each module of the build: whether this interpreter loads it compiled."""
    return {
        name: not str(importlib.import_module(name).__file__).endswith(".py")
        for name in map(module_name, MODULES)
    }


def stale_modules(root: Path = ROOT) -> list[str]:
    """Modules changed since the build: their source is newer than the shared
    library that holds the compiled code (the per-module extensions are stubs
    that a rebuild may leave as they were)."""
    libraries = [
        root / f"{_SHARED_LIB}{suffix}"
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if (root / f"{_SHARED_LIB}{suffix}").exists()
    ]
    if not libraries:
        return []
    built_at = max(p.stat().st_mtime for p in libraries)
    return [module_name(p) for p in MODULES if (root / p).stat().st_mtime > built_at]


def build(root: Path = ROOT, opt_level: str = "3") -> list[Path]:
    """Compile `MODULES` in place under `root` (a checkout, or a copy of its
    `app/`); return the extensions written. `opt_level` is the C compiler's
    -O: "0" builds in a third of the time and decides the same (the tests'
    build), "3" is the one to serve with."""
    try:
        import mypyc  # noqa: F401
    except ImportError:
        raise BuildError(
            "the compiled build needs mypy: pip install -e '.[fast]' (a C compiler and "
            "Python's headers too)"
        ) from None
    # setuptools' build_ext, in a child: it reads the paths relative to `root`
    # and leaves the interpreter that asked untouched.
    script = (
        "import sys\n"
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        "setup(name='app-core', script_args=['build_ext', '--inplace'],\n"
        f"      ext_modules=mypycify(sys.argv[2:], group_name={GROUP!r},\n"
        "                           target_dir='build/mypyc', opt_level=sys.argv[1]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", script, opt_level, *MODULES],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        raise BuildError(f"mypyc failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    built = extensions(root)
    if len(built) != len(MODULES) + 1:
        raise BuildError(f"mypyc wrote {len(built)} extensions, expected {len(MODULES) + 1}")
    for path in built:  # the build's time (an unchanged one is copied with its old time)
        os.utime(path)
    return built


def clean(root: Path = ROOT) -> list[Path]:
    """Remove the build's extensions under `root`: pure Python again."""
    removed = extensions(root)
    for path in removed:
        path.unlink()
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--clean", action="store_true", help="remove the compiled extensions")
    action.add_argument("--status", action="store_true", help="which modules load compiled")
    args = parser.parse_args(argv)
    if args.clean:
        removed = clean()
        print(f"removed {len(removed)} compiled files; the core runs as pure Python")
        return 0
    if args.status:
        stale = set(stale_modules())
        for name, compiled in compiled_modules().items():
            state = "compiled" if compiled else "pure Python"
            print(f"{name}: {state}{' (older than its source: rebuild)' if name in stale else ''}")
        return 0
    try:
        built = build()
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"compiled {len(MODULES)} modules ({len(built)} extensions under {ROOT / 'app'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
