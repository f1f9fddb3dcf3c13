"""A config saved by the panel runs as many processes under the peer's own CLI,
``accelerate launch --config_file FILE script.py``, as under notebook_accel (issue 36)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from notebook_accel.launch.handoff.ports import free_port
from notebook_accel.machine.hardware import Hardware

ACCELERATE = Path(sys.executable).parent / "accelerate"
# One write per rank (shorter than PIPE_BUF, so atomic): the ranks share torchrun's stdout.
SCRIPT = ("import os\n"
          "os.write(1, f\"WORLD_SIZE {os.environ['WORLD_SIZE']} RANK {os.environ['RANK']}\\n\".encode())\n")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ACCELERATE.exists(), reason=f"the peer's CLI is not installed ({ACCELERATE})"),
]


def _world_and_device() -> tuple[str, str]:
    from notebook_accel import PartialState

    return os.environ["WORLD_SIZE"], PartialState().device.type


def _peer_launch(config: Path, script: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``accelerate launch --config_file config script``; its process group is killed on timeout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(ACCELERATE), "launch", "--config_file", str(config), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"accelerate launch did not end in {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_the_peers_launch_starts_the_saved_number_of_processes(tmp_path, device):
    pytest.importorskip("ipywidgets")
    from magics.panel.form import config_panel

    config = tmp_path / "config.yaml"
    panel = config_panel(config, hardware=Hardware(cpu_count=4))  # a machine without a GPU
    panel.device.value = device
    panel.num_processes.value = 3
    panel.main_process_port.value = free_port()  # the peer's torchrun would take 29500
    assert panel.save() == config, panel.messages.value + panel.saved.value
    data = yaml.safe_load(config.read_text())
    assert (data["num_processes"], data["distributed_type"], data["use_cpu"]) == (3, "MULTI_GPU", True)

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = _peer_launch(config, script)
    assert result.returncode == 0, result.stdout[-4000:]
    seen = sorted(re.findall(r"WORLD_SIZE (\d+) RANK (\d+)", result.stdout))
    assert seen == [("3", "0"), ("3", "1"), ("3", "2")], result.stdout[-4000:]

    from notebook_accel import notebook_launcher  # ours reads the same file as 3 CPU workers

    assert notebook_launcher(_world_and_device, config_file=config, return_all=True) == [("3", "cpu")] * 3
