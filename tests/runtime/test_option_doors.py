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


def test_a_value_refused_after_its_door_names_that_door(monkeypatch, capsys, tmp_path):
    """bf16 on a T4 is refused by the plan, after the request: the error still names where the
    value came from (a keyword: nothing; the magic's or the CLI's flag: the flag), before any
    worker starts, whichever door it came through."""
    import torch
    from IPython.core.error import UsageError

    from magics import pool as magic_pool
    from magics.accelerate_magic import AccelerateMagics
    from notebook_accel.launch.pools import pool
    from notebook_accel.machine import gpu_support, hardware
    from notebook_accel.machine.hardware import Hardware

    t4 = Hardware(cpu_count=8, gpu_names=("Tesla T4",) * 2, gpu_capabilities=((7, 5),) * 2)
    monkeypatch.setattr(hardware, "detect", lambda: t4)
    monkeypatch.setattr(gpu_support, "torch_arch_list", lambda: ("sm_75", "sm_80"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    started = []
    monkeypatch.setattr(launcher, "backend_for", lambda plan: started.append(plan))
    monkeypatch.setattr(pool, "pool_workers", lambda plan: started.append(plan))
    refused = "mixed_precision='bf16' on Tesla T4"
    with pytest.raises(ValueError, match=f"^{refused}"):  # an argument: no prefix
        notebook_launcher(_colour, mixed_precision="bf16")
    with pytest.raises(ValueError, match=f"^{refused}"):
        WorkerPool(mixed_precision="bf16")
    args = AccelerateMagics.accelerate.parser.parse_args(["--mixed-precision", "bf16"])
    with pytest.raises(UsageError, match=f"^flag --mixed-precision: {refused}"):
        AccelerateMagics._run(_colour, None, args, None)  # a %%accelerate cell
    start = AccelerateMagics.accelerate.parser.parse_args(["start", "--mixed-precision", "bf16"])
    with pytest.raises(UsageError, match=f"^flag --mixed-precision: {refused}"):
        magic_pool.start(start)  # %accelerate start
    nodes = AccelerateMagics.accelerate.parser.parse_args(["start", "--nodes", "2"])
    with pytest.raises(UsageError, match="^flag --nodes: num_nodes=2: a pool spans several nodes"):
        magic_pool.start(nodes)
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('a worker ran')\n")
    assert cli.main(["launch", "--mixed-precision", "bf16", str(script)]) == 1
    assert f"error: flag --mixed-precision: {refused}" in capsys.readouterr().err
    assert started == []
