"""`deadline-serve`, the console script: the server's commands as
`python -m app` runs them, and the benchmarks from the checkout."""

from __future__ import annotations

import sys

import pytest

from app import command
from tests.conftest import ROOT


def test_the_console_script_is_declared_and_bench_is_not_in_the_wheel() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert "\n[project.scripts]\n" in text
    assert '\ndeadline-serve = "app.command:main"\n' in text
    assert '\ninclude = ["app*"]\n' in text  # packages.find: no top-level `bench`
    assert '"bench" =' not in text  # nor its package data
    # gRPC (and config.pbtxt) in the default install.
    dependencies = text.split("dependencies = [", 1)[1].split("]\n", 1)[0]
    assert '"tritonclient[grpc]>=2.40"' in dependencies


def test_usage_and_unknown_commands(capsys) -> None:
    assert command.main([]) == 2
    assert "serve" in capsys.readouterr().err
    assert command.main(["--help"]) == 0
    assert "simulate" in capsys.readouterr().out
    assert command.main(["serv"]) == 2
    assert "unknown command 'serv'" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # imported here
def test_bench_runs_a_benchmark_module_by_name_with_its_exit_status(capsys) -> None:
    assert command.main(["bench", "compare", "--systems", "nope"]) == 2
    assert "unknown systems ['nope']" in capsys.readouterr().err
    assert command.main(["bench", "nothere"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark 'nothere'" in err and "compare" in err and "simulate" in err
    assert command.main(["bench", "../etc"]) == 2
    argv = list(sys.argv)
    assert command.run_bench("simulate", ["--help"]) == 0  # argparse's exit, returned
    assert "--capacity" in capsys.readouterr().out
    assert sys.argv == argv


def test_serve_is_python_m_app_serve(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        command.main(["serve", "--help"])
    assert done.value.code == 0
    assert "--access-log" in capsys.readouterr().out


def test_without_a_checkout_bench_says_where_to_run_it(monkeypatch, capsys) -> None:
    monkeypatch.setattr(command, "checkout", lambda: None)
    assert command.main(["simulate"]) == 2
    assert "not installed with the wheel" in capsys.readouterr().err
