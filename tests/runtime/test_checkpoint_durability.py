"""A worker killed in the middle of save_state leaves the previous checkpoint loadable."""

from __future__ import annotations

import pytest

from notebook_accel import WorkerError, notebook_launcher


def _setup(value: float):
    import torch

    from notebook_accel import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    return accelerator, model


def save(directory: str, value: float, kill_after_writes: int | None, kill_at_rename: int | None):
    import os
    import signal

    from notebook_accel.checkpoint import training_state as checkpoint

    accelerator, _ = _setup(value)
    calls = {"write": 0, "rename": 0}
    real_write, real_rename = checkpoint._write, os.rename

    def write(obj, path, *how):
        if accelerator.is_main_process and calls["write"] == kill_after_writes:
            os.kill(os.getpid(), signal.SIGKILL)
        calls["write"] += 1
        real_write(obj, path, *how)

    def rename(src, dst):
        real_rename(src, dst)
        calls["rename"] += 1
        if calls["rename"] == kill_at_rename:
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint._write = write
    os.rename = rename
    accelerator.save_state(directory)


def load(directory: str) -> list[float]:
    accelerator, model = _setup(0.0)
    accelerator.load_state(directory)
    return sorted({float(v) for p in accelerator.unwrap_model(model).parameters() for v in p.flatten()})


# (writes before the kill, renames before the kill, may the new state be what loads?)
KILL_POINTS = [(0, None, False), (1, None, False), (2, None, False), (None, 1, False), (None, 2, True)]


@pytest.mark.slow
def test_killed_save_state_leaves_a_loadable_checkpoint(tmp_path):
    directory = str(tmp_path / "checkpoint")
    notebook_launcher(save, (directory, 1.0, None, None), num_processes=2, output="none")
    assert notebook_launcher(load, (directory,), num_processes=2, output="none") == [1.0]
    for writes, renames, new_allowed in KILL_POINTS:
        with pytest.raises(WorkerError, match="SIGKILL"):
            notebook_launcher(save, (directory, 2.0, writes, renames), num_processes=2,
                              output="none")
        loaded = notebook_launcher(load, (directory,), num_processes=2, output="none")
        assert loaded == [1.0] or (new_allowed and loaded == [2.0]), (writes, renames, loaded)
        # put the known-good state back for the next kill point
        notebook_launcher(save, (directory, 1.0, None, None), num_processes=2, output="none")
