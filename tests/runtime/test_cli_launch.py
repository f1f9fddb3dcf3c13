"""``notebook-accel launch SCRIPT [ARGS]`` and ``notebook-accel test``: real workers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from notebook_accel.cli import command as cli

SCRIPT = """\
import sys
import torch
from notebook_accel import Accelerator

def main():
    accelerator = Accelerator()
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), "sum")
    print(f"rank {accelerator.process_index} of {accelerator.num_processes}: "
          f"sum {total.item():.0f}, argv {sys.argv[1:]}, name {__name__}")
    if "--fail-on-1" in sys.argv and accelerator.process_index == 1:
        raise ValueError("rank 1 was told to fail")
    if "--exit-3" in sys.argv and accelerator.process_index == 1:
        sys.exit(3)

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    (tmp_path / "cache").mkdir()
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in a subprocess (it sees the test's config dirs: tests/conftest.py)."""
    return subprocess.run([sys.executable, "-m", "notebook_accel", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_launch_runs_script_on_two_workers_with_prefixed_output(script):
    proc = run("launch", "-n", "2", str(script), "--lr", "0.1", "-n", "5")
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert (f"[rank {rank}] rank {rank} of 2: sum 3, argv ['--lr', '0.1', '-n', '5'], "
                f"name __main__") in proc.stdout


@pytest.mark.slow
def test_launch_reads_num_processes_from_the_config_file(tmp_path, script):
    (tmp_path / "cache" / "notebook_accel").mkdir()
    (tmp_path / "cache" / "notebook_accel" / "default_config.yaml").write_text(
        "num_processes: 3\ndistributed_type: MULTI_CPU\n")
    proc = run("launch", "--start-method", "fork", str(script))
    assert proc.returncode == 0, proc.stderr
    assert "[rank 2] rank 2 of 3: sum 6" in proc.stdout


@pytest.mark.slow
def test_launch_failing_script_exits_non_zero_with_the_error(script):
    proc = run("launch", "-n", "2", str(script), "--fail-on-1")
    assert proc.returncode == 1
    assert "notebook-accel launch: rank 1 failed: ValueError: rank 1 was told to fail" in proc.stderr
    assert f'File "{script}", line' in proc.stderr  # the script's own frame

    proc = run("launch", "-n", "2", str(script), "--exit-3")
    assert proc.returncode == 3, proc.stderr
    assert "rank 1 failed: called sys.exit(3)" in proc.stderr


def test_launch_missing_script_is_an_error(tmp_path, capsys):
    assert cli.main(["launch", "-n", "2", str(tmp_path / "nope.py")]) == 1
    assert f"no such script: {tmp_path / 'nope.py'}" in capsys.readouterr().err


def test_launch_bad_option_is_an_error_before_any_worker(tmp_path, script, capsys):
    assert cli.main(["launch", "-n", "0", str(script)]) == 1
    assert "num_processes=0" in capsys.readouterr().err


def test_launch_help_lists_script_and_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["launch", "--help"])
    out = capsys.readouterr().out
    assert "SCRIPT [ARGS ...]" in out and "--num-processes" in out and "--mixed-precision" in out


@pytest.mark.slow
def test_test_command_runs_the_sanity_check():
    proc = run("test", "-n", "2", "--start-method", "fork")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "FAIL" not in proc.stdout
    assert "2 workers" in proc.stdout


def test_test_command_passes_options_and_fails_on_a_failed_check(monkeypatch, tmp_path):
    import notebook_accel.cli.sanity as sanity

    calls = []
    monkeypatch.setenv("NOTEBOOK_ACCEL_CONFIG_FILE", str(tmp_path / "c.yaml"))
    (tmp_path / "c.yaml").write_text("num_processes: 3\n")
    monkeypatch.setattr(sanity, "run_sanity_check", lambda **kw: calls.append(kw) or False)
    assert cli.main(["test", "--mixed-precision", "bf16"]) == 1
    assert calls[0]["num_processes"] == 3 and calls[0]["request"]["mixed_precision"] == "bf16"
    assert calls[0]["request"].source("mixed_precision") == "flag --mixed-precision"
    monkeypatch.setattr(sanity, "run_sanity_check", lambda **kw: calls.append(kw) or True)
    assert cli.main(["test", "-n", "2"]) == 0
    assert calls[1]["num_processes"] == 2


def test_test_command_without_the_sanity_module(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "notebook_accel.cli.sanity", None)
    assert cli.main(["test"]) == 1
    assert "notebook_accel.cli.sanity is missing" in capsys.readouterr().err


def test_run_script_sets_argv_path_and_main(tmp_path, monkeypatch):
    from notebook_accel.cli.launch import run_script

    (tmp_path / "helper_mod_for_run_script.py").write_text("VALUE = 7\n")
    path = tmp_path / "s.py"
    path.write_text(textwrap.dedent("""\
        import sys, helper_mod_for_run_script
        assert __name__ == "__main__"
        assert helper_mod_for_run_script.VALUE == 7 and sys.argv[1:] == ["a", "--b"]
        raise SystemExit(0)
    """))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as exc:
        run_script(str(path), ["a", "--b"])
    assert exc.value.code == 0
    assert sys.argv == [str(path), "a", "--b"] and sys.path[0] == str(tmp_path)


def test_launch_accepts_the_peers_spellings():
    args = cli._build_parser().parse_args(
        ["launch", "--num_processes", "3", "--mixed_precision", "bf16", "--main_process_port",
         "29600", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
         "train.py", "--num_processes", "9"])
    assert (args.num_processes, args.mixed_precision, args.use_port, args.num_nodes,
            args.node_rank, args.master_addr) == (3, "bf16", 29600, 2, 1, "10.0.0.1")
    assert args.script == "train.py" and args.script_args == ["--num_processes", "9"]
