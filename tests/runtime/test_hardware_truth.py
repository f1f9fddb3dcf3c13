"""What the hardware cannot do, with real child processes: the arch list asked in a forked child, and
/dev/shm as a 64 MB tmpfs in a private mount namespace (tests/unit/test_hardware_truth.py has the rest)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from notebook_accel.machine import gpu_support
from tests.unit.test_hardware_truth import _PLAN_TWO, REPO


def test_the_arch_list_is_asked_in_a_forked_child_so_this_process_stays_fork_safe():
    """``torch.cuda.get_arch_list()`` registers torch's fork handler in the process that calls
    it (later forked workers could not use CUDA): the kernel asks a child instead."""
    marker = []
    assert gpu_support.in_forked_child(lambda: str(os.getpid())) not in ("", str(os.getpid()))
    assert gpu_support.in_forked_child(lambda: marker.append(1) or "done") == "done"
    assert marker == []  # what the call did stayed in the child
    assert gpu_support.in_forked_child(lambda: 1 / 0) is None  # a failing child: unknown
    gpu_support.torch_arch_list.cache_clear()
    try:
        assert gpu_support.torch_arch_list() == tuple(torch.cuda.get_arch_list())  # () on CPU
    finally:
        gpu_support.torch_arch_list.cache_clear()


def test_a_child_that_does_not_answer_is_killed():
    import time

    started = time.monotonic()
    assert gpu_support.in_forked_child(lambda: time.sleep(30) or "late", timeout=0.5) is None
    assert time.monotonic() - started < 10  # and reaped: the suite's leak check sees no process


def test_a_64_mb_dev_shm_in_a_private_mount_namespace_is_said_at_planning(tmp_path):
    """The real probe: a 64 MB tmpfs mounted on /dev/shm for one process only (as Docker
    without --shm-size), which plans a 2-process launch and prints its notes."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    script = tmp_path / "plan_two.py"
    script.write_text(_PLAN_TWO)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")]))}
    command = (f"mount -t tmpfs -o size=64m tmpfs /dev/shm && "
               f"exec {sys.executable} {script}")
    done = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c", command],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    if done.returncode != 0 and ("mount" in done.stderr or "unshare" in done.stderr):
        pytest.skip(f"no private mount namespace with a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    shm = [line for line in done.stdout.splitlines() if "/dev/shm" in line]
    assert len(shm) == 1, done.stdout
    assert shm[0].startswith("[notebook_accel] /dev/shm is only 64 MB, less than 2 workers need")
    assert "DataLoader workers" in shm[0] and "--shm-size=1g" in shm[0] and "NCCL" not in shm[0]
