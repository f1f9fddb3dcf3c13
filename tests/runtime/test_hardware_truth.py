"""What the hardware cannot do, with real child processes: a fake nvidia-smi on PATH, the arch list
asked in a forked child, and /dev/shm as a 64 MB tmpfs in a private mount namespace
(tests/unit/test_hardware_truth.py has the rest)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from notebook_accel.machine import gpu_support, hardware
from notebook_accel.machine.hardware import Hardware
from tests.unit.test_hardware_truth import _PLAN_TWO, REPO

# -- the probes: nvidia-smi and the driver's /proc entries ------------------------------------

def fake_smi(tmp_path: Path, monkeypatch, rows: list[str], knows_compute_cap: bool = True) -> None:
    """An ``nvidia-smi`` on PATH answering ``--query-gpu`` with ``rows`` ("name, 7.5"); an old
    driver's refuses the ``compute_cap`` field, as the real one does (exit code 2)."""
    names = "\n".join(row.rsplit(",", 1)[0] for row in rows)
    full = "\n".join(rows)
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir(exist_ok=True)
    refuse = ('echo \'Field "compute_cap" is not a valid field to query.\'; exit 2'
              if not knows_compute_cap else f"printf '%s\\n' '{full}'")
    script.write_text("#!/bin/sh\n"
                      'case "$1" in\n'
                      f"  --query-gpu=name) printf '%s\\n' '{names}' ;;\n"
                      f"  --query-gpu=name,compute_cap) {refuse} ;;\n"
                      "  *) exit 3 ;;\n"
                      "esac\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")


def fake_proc(tmp_path: Path, monkeypatch, names: list[str]) -> None:
    root = tmp_path / "proc_gpus"
    for i, name in enumerate(names):
        entry = root / f"0000:00:0{i + 4}.0"
        entry.mkdir(parents=True)
        (entry / "information").write_text(f"Model: \t\t {name}\nIRQ:   36\n")
    monkeypatch.setattr(hardware, "_NVIDIA_PROC", root)



def test_capabilities_come_from_nvidia_smi_and_follow_cuda_visible_devices(tmp_path, monkeypatch):
    fake_proc(tmp_path, monkeypatch, ["NVIDIA A100-SXM4-40GB", "Tesla T4"])
    fake_smi(tmp_path, monkeypatch, ["NVIDIA A100-SXM4-40GB, 8.0", "Tesla T4, 7.5"])
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # gpu_names wants a CUDA build of torch
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    hardware._detect.cache_clear()
    try:
        hw = hardware.detect()
    finally:
        hardware._detect.cache_clear()
    assert hw.gpus() == [("Tesla T4", (7, 5))]
    assert gpu_support.bf16_verdicts(hw) == {"Tesla T4 (compute capability 7.5)": False}


def test_an_old_driver_without_compute_cap_leaves_the_name_to_judge(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, ["Tesla V100-SXM2-16GB, 7.0"], knows_compute_cap=False)
    assert hardware._gpu_names_from_smi() == ["Tesla V100-SXM2-16GB"]
    assert hardware.gpu_capabilities(["Tesla V100-SXM2-16GB"]) == (None,)
    hw = Hardware(cpu_count=2, gpu_names=("Tesla V100-SXM2-16GB",), gpu_capabilities=(None,))
    assert gpu_support.bf16_verdicts(hw) == {"Tesla V100-SXM2-16GB": False}  # by its name
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi at all
    assert hardware.gpu_capabilities(["Tesla T4"]) == (None,)
    assert hardware.gpu_capabilities([]) == ()  # no GPU: nothing is asked



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
