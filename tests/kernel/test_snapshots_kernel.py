"""The same cell goes on after the kernel and every worker are gone (issue 45; a real kernel).

A 2-rank DDP job (CPU, gloo) trains in a notebook cell with ``snapshot_every``; at a random step
the kernel and every worker are SIGKILLed (a Colab session ended). A new kernel runs the same
cell: it resumes from the newest complete snapshot, redoes at most the snapshot interval, and its
final weights equal an uninterrupted run's bit for bit. The same with the kill in the middle of a
snapshot's write (rank 0 has written one file of step 30's): the previous snapshot is the newest
complete one, and the resume goes on from it.
"""

from __future__ import annotations

import os
import random
import re
import signal
from pathlib import Path

import psutil
import pytest
import torch

from tests.kernel_harness import Kernel, wait_no_workers

pytestmark = pytest.mark.slow
TOTAL, EVERY = 80, 10

CELL = f"""
import time, torch
from torch.utils.data import DataLoader, TensorDataset
from notebook_accel import Accelerator, notebook_launcher, set_seed

def train(snap_dir, out, progress, pause):
    set_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 7, 0.9)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(200, 8, generator=g), torch.randn(200, 1, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=True)  # 25 steps an epoch on 2 ranks
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    acc.snapshot_every(steps={EVERY}, dir=snap_dir)
    step = acc.resume()
    while step < {TOTAL}:
        for x, y in loader:
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            if acc.is_main_process:
                with open(progress, "w") as f:
                    f.write(str(step))
                print(f"step {{step}}", flush=True)
            time.sleep(pause)
            if step == {TOTAL}:
                break
    acc.wait_for_snapshots()
    if acc.is_main_process:
        torch.save(acc.unwrap_model(model).state_dict(), out)

notebook_launcher(train, args=(SNAP, OUT, PROGRESS, PAUSE), num_processes=2)
"""


class _Killed(Exception):
    pass


def _kill_kernel_and_workers(k: Kernel) -> None:
    """SIGKILL the kernel and every process under it (its workers, a forkserver), as a session's end does."""
    kernel = psutil.Process(k.pid)
    below = kernel.children(recursive=True)
    assert len(below) >= 2, below  # the two workers at least
    os.kill(k.pid, signal.SIGKILL)
    for proc in below:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _settings(tmp: Path, name: str, pause: float) -> str:
    return (f"SNAP, OUT, PROGRESS, PAUSE = {str(tmp / name)!r}, {str(tmp / (name + '.pt'))!r}, "
            f"{str(tmp / (name + '.step'))!r}, {pause}")


WRITE_KILLED = 30
# Kernel A only (its forked workers inherit it): rank 0's write of step 30's snapshot stops after
# its first file, says so in a marker file and waits, to be killed there.
STALL_IN_WRITE = f"""
import pathlib, threading, time
from notebook_accel.checkpoint import state_parts
_real_write = state_parts.write_files
def _stalling(directory, files, *how):
    _real_write(directory, files[:1], *how)
    if threading.current_thread().name == "snapshot-{WRITE_KILLED}" and files:
        pathlib.Path(MARK).write_text("writing")
        time.sleep(600)
    _real_write(directory, files[1:], *how)
state_parts.write_files = _stalling
"""


@pytest.mark.parametrize("during", ["a step", "a write"])
def test_a_killed_session_resumes_from_the_newest_snapshot_and_ends_bit_for_bit(tmp_path, during):
    kill_at = random.Random(os.getpid()).randint(EVERY + 5, TOTAL - EVERY)
    mark = tmp_path / "writing"
    first = Kernel()
    try:
        first.ok(_settings(tmp_path, "run", 0.1))
        if during == "a write":
            first.ok(f"MARK = {str(mark)!r}\n" + STALL_IN_WRITE)

        def watch(result):
            seen = [int(n) for n in re.findall(r"step (\d+)", result.stdout)]
            if during == "a write" and mark.exists() or during == "a step" and seen and max(seen) >= kill_at:
                _kill_kernel_and_workers(first)
                raise _Killed

        with pytest.raises(_Killed):
            first.collect(first.execute(CELL), timeout=180, on_output=watch)
        assert not wait_no_workers(timeout=15)
    finally:
        first.shutdown()
    done = int((tmp_path / "run.step").read_text())  # the last step rank 0 finished before the kill
    snapshots = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("snapshot_"))
    assert done >= (kill_at if during == "a step" else WRITE_KILLED) and snapshots, snapshots

    second = Kernel()
    try:
        second.ok(_settings(tmp_path, "run", 0.0))
        second.ok("%load_ext notebook_accel")
        listed = second.ok(f"%accelerate snapshots {tmp_path / 'run'}").stdout
        resumed = second.ok(CELL, timeout=180).stdout  # the same cell, unchanged
        second.ok(_settings(tmp_path, "reference", 0.0))
        reference = second.ok(CELL, timeout=180).stdout
    finally:
        second.shutdown()
    said = re.search(r"resumed from snapshot step (\d+) \(saved \d+ s ago, (.+)\); (\d+) steps not redone", resumed)
    assert said, resumed
    step = int(said.group(1))
    assert said.group(2) == str(tmp_path / "run") and int(said.group(3)) == step
    redone = EVERY if during == "a step" else 2 * EVERY  # the interval (and the one being written)
    assert step % EVERY == 0 and 0 <= done - step <= redone, (done, step)
    if during == "a write":  # the half-written one was never the newest: the one before it is
        assert step == WRITE_KILLED - EVERY and f"snapshot_{WRITE_KILLED:09d}.tmp" in snapshots, snapshots
    marked = [line for line in listed.splitlines() if line.endswith("<- resume() loads this one")]
    assert len(marked) == 1 and marked[0].split()[0] == f"{step:,}", listed  # the listing named it
    assert f"step {step + 1}\n" in resumed and f"step {step}\n" not in resumed
    assert "nothing to resume in" in reference and "starting at step 0" in reference
    got = torch.load(tmp_path / "run.pt", weights_only=True)
    want = torch.load(tmp_path / "reference.pt", weights_only=True)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
