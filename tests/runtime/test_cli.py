"""The notebook-accel command, run as `python -m notebook_accel` in a subprocess."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import notebook_accel


@pytest.fixture
def home(tmp_path):
    return tmp_path


def run(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the command with a home of its own (and the test's config dirs: tests/conftest.py)."""
    base = {k: v for k, v in os.environ.items() if k != "HF_HOME"}
    base.update(HOME=str(home / "home"), **env)
    return subprocess.run([sys.executable, "-m", "notebook_accel", *args], env=base,
                          capture_output=True, text=True, timeout=60, check=False)


def ours(home: Path) -> Path:
    return home / "cache" / "notebook_accel" / "default_config.yaml"


def test_no_command_prints_usage(home):
    proc = run(home)
    assert proc.returncode == 2 and "usage: notebook-accel" in proc.stdout
    assert "env" in proc.stdout and "config" in proc.stdout


def test_env_reports_versions_hardware_and_config(home):
    path = ours(home)
    path.parent.mkdir(parents=True)
    path.write_text("num_processes: 3\nmixed_precision: bf16\ndistributed_type: MULTI_CPU\n")
    proc = run(home, "env", NOTEBOOK_ACCEL_START_METHOD="spawn")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"notebook_accel: {notebook_accel.__version__}" in out
    assert f"Python: {sys.version.split()[0]}" in out
    import torch

    assert f"PyTorch: {torch.__version__}" in out
    assert f"{len(os.sched_getaffinity(0))} CPU cores" in out
    assert f"Config file: {path}" in out
    assert "num_processes: 3" in out and "mixed_precision: bf16" in out and "device: cpu" in out
    assert "num_machines: 1\n" in out and "use_cpu: false\n" in out
    assert "NOTEBOOK_ACCEL_START_METHOD=spawn" in out


def test_config_without_flags_shows_defaults_and_where_to_write(home):
    proc = run(home, "config")
    assert proc.returncode == 0, proc.stderr
    assert "Config file: none" in proc.stdout and str(ours(home)) in proc.stdout
    assert "num_processes: auto" in proc.stdout
    assert not ours(home).exists()


def test_config_default_writes_once_and_force_overwrites(home):
    proc = run(home, "config", "--default")
    assert proc.returncode == 0, proc.stderr
    path = ours(home)
    assert str(path) in proc.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = yaml.safe_load(path.read_text())
    assert data["compute_environment"] == "LOCAL_MACHINE" and "distributed_type" in data

    path.write_text("num_processes: 7\n")
    proc = run(home, "config", "--default", "--mixed-precision", "bf16")
    assert proc.returncode == 1 and "--force" in proc.stderr and str(path) in proc.stderr
    assert path.read_text() == "num_processes: 7\n"

    proc = run(home, "config", "--default", "--force", "--mixed-precision", "bf16")
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(path.read_text())
    assert data["mixed_precision"] == "bf16" and data.get("num_processes") != 7


def test_config_flags_update_the_file_keeping_other_keys(home):
    path = home / "my.yaml"
    path.write_text("mixed_precision: fp16\nrdzv_backend: c10d\nsomething_new: 1\n")
    proc = run(home, "config", "--config-file", str(path), "--num-processes", "4",
               "--device", "cpu", "--start-method", "forkserver", "--main-process-port", "29600")
    assert proc.returncode == 0, proc.stderr
    assert str(path) in proc.stdout
    data = yaml.safe_load(path.read_text())
    assert data["num_processes"] == 4 and data["mixed_precision"] == "fp16"
    assert data["use_cpu"] is True and data["distributed_type"] == "MULTI_GPU"  # the peer starts 4
    assert data["start_method"] == "forkserver" and data["main_process_port"] == 29600
    assert data["rdzv_backend"] == "c10d" and data["something_new"] == 1


def test_config_with_device_auto_and_several_processes_names_this_machines_device(home):
    """The peer's format has no auto for several processes: it would run one (issue 36)."""
    path = home / "auto.yaml"
    proc = run(home, "config", "--config-file", str(path), "--num-processes", "3")
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(path.read_text())
    assert data["num_processes"] == 3 and data["distributed_type"] == "MULTI_GPU"
    assert data["use_cpu"] is True  # this machine has no GPU: auto is cpu here


def test_config_imports_the_peer_file_into_ours(home):
    peer = home / "hf" / "accelerate" / "default_config.yaml"
    peer.parent.mkdir(parents=True)
    peer.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                    "num_processes: 2\nmixed_precision: bf16\nuse_cpu: false\n")
    proc = run(home, "config", "--start-method", "spawn", HF_HOME=str(home / "hf"))
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(ours(home).read_text())
    assert (data["num_processes"], data["mixed_precision"], data["start_method"]) == (
        2, "bf16", "spawn")
    assert data["distributed_type"] == "MULTI_GPU"
    assert "start_method" not in yaml.safe_load(peer.read_text())


def test_config_file_env_variable_is_honoured(home):
    chosen = home / "chosen" / "c.yaml"
    proc = run(home, "config", "--num-processes", "2", NOTEBOOK_ACCEL_CONFIG_FILE=str(chosen))
    assert proc.returncode == 0, proc.stderr
    assert str(chosen) in proc.stdout and yaml.safe_load(chosen.read_text())["num_processes"] == 2
    assert not ours(home).exists()


def test_bad_values_name_the_flag_and_valid_values(home):
    proc = run(home, "config", "--mixed-precision", "fp32")
    assert proc.returncode == 1
    assert "--mixed-precision" in proc.stderr and "'bf16'" in proc.stderr
    assert not ours(home).exists()
    proc = run(home, "config", "--device", "gpu")
    assert proc.returncode == 2 and "'cuda'" in proc.stderr


def test_malformed_file_is_reported_with_its_path(home):
    path = ours(home)
    path.parent.mkdir(parents=True)
    path.write_text("num_processes: [2\n")
    proc = run(home, "config")
    assert proc.returncode == 1 and str(path) in proc.stderr and "line" in proc.stderr
