"""A launch option added as one row of the options table reaches a worker's environment through
every front door: ``notebook_launcher``, ``WorkerPool``, the ``%%accelerate`` magic's flags and
the ``notebook-accel`` command's flags; its bad values are refused before any worker starts, in
the one message style, naming where they came from (docs/architecture.md, "Adding a launch
option", is the list this test follows: the row is all it adds)."""

from __future__ import annotations

import os

import pytest

from notebook_accel import WorkerPool, contract, notebook_launcher
from notebook_accel.cli import command as cli
from notebook_accel.contract import LaunchOption
from notebook_accel.launch import launcher

VAR = "NOTEBOOK_ACCEL_TEST_COLOUR"


@pytest.fixture
def colour(monkeypatch):
    """The new option: one row, nothing else."""
    row = LaunchOption("colour", str, "a colour the workers see", choices=("red", "blue"),
                       env=VAR, to_workers=str, magic_flag="--colour", cli_flag="--colour")
    monkeypatch.setitem(contract.OPTIONS, "colour", row)
    monkeypatch.delenv(VAR, raising=False)
    return row


def _colour():
    return os.environ.get(VAR)


def _planned(monkeypatch) -> list:
    """Record each launch's plan instead of starting its workers."""
    plans = []
    monkeypatch.setattr(launcher, "launch_once", lambda backend, plan, payload: plans.append(plan))
    return plans


def test_notebook_launcher_and_a_pool_pass_it_to_the_workers(colour):
    assert notebook_launcher(_colour, num_processes=1, device="cpu", colour="BLUE") == "blue"
    with WorkerPool(num_processes=1, device="cpu", colour="red") as pool:
        assert pool.run(_colour) == "red"


def test_the_magics_flag_passes_it_to_the_workers(colour, monkeypatch):
    from IPython.core.magic_arguments import parse_argstring

    from magics.cell.arguments import launch_options, magic_flags

    @magic_flags
    def accelerate(line):
        """The magic's parser, made from the table as it is now."""

    plans = _planned(monkeypatch)
    notebook_launcher(_colour, **launch_options(parse_argstring(accelerate, "--colour blue -n 1")))
    assert plans[-1].worker_env[VAR] == "blue"


def test_the_commands_flag_passes_it_to_the_workers(colour, monkeypatch, tmp_path):
    script = tmp_path / "colour.py"
    seen = tmp_path / "seen"
    script.write_text(f"import os\nopen({str(seen)!r}, 'w').write(os.environ[{VAR!r}])\n")
    assert cli.main(["launch", "--colour", "red", "-n", "1", "--device", "cpu", str(script)]) == 0
    assert seen.read_text() == "red"


def test_its_bad_values_name_their_source_and_the_valid_ones(colour, monkeypatch, capsys, tmp_path):
    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import parse_argstring

    from magics.cell.arguments import magic_flags

    @magic_flags
    def accelerate(line):
        """The magic's parser, made from the table as it is now."""

    plans = _planned(monkeypatch)
    valid = "is not one of 'red', 'blue'"
    with pytest.raises(ValueError, match=f"^colour='green' {valid}$"):
        notebook_launcher(_colour, colour="green")
    with pytest.raises(ValueError, match=f"^colour='green' {valid}$"):
        WorkerPool(colour="green")
    with pytest.raises(UsageError, match="--colour: invalid choice: 'green'"):  # argparse's words
        parse_argstring(accelerate, "--colour green")
    monkeypatch.setenv(VAR, "green")
    with pytest.raises(ValueError, match=f"^environment variable {VAR}: colour='green' {valid}$"):
        notebook_launcher(_colour, num_processes=1)
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('a worker ran')\n")
    assert cli.main(["launch", "-n", "1", str(script)]) == 1
    assert f"environment variable {VAR}: colour='green' {valid}" in capsys.readouterr().err
    assert plans == []  # nothing started
