"""A rank SIGKILLed while a snapshot is being written (issue 45): the previous snapshot stays the
newest complete one, and the job resumed from it ends with an uninterrupted run's weights, bit for
bit (2 ranks, gloo)."""

from __future__ import annotations

import pytest

from notebook_accel import WorkerError, notebook_launcher
from notebook_accel.checkpoint import snapshot_dir

TOTAL, EVERY, KILLED_STEP = 20, 5, 15


def train(directory: str, kill: tuple[str, int] | None, auto: bool = False, stop_at: int = TOTAL):
    """Train TOTAL steps (over an epoch's end) with snapshots every EVERY steps, resuming from the
    newest; ``kill``: SIGKILL this process in the write of step KILLED_STEP's snapshot, at its
    ``("write", rank)`` first file or at rank 0's ``("rename", 0)`` commit. ``auto``: the snapshots
    and the resume come from the launch options and ``Accelerator(resume="auto")`` instead (the
    loop reads ``resumed_step``); ``stop_at``: the session ends after that step."""
    import os
    import signal
    import threading
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from notebook_accel import Accelerator, set_seed
    from notebook_accel.checkpoint import atomic_dir, training_state

    set_seed(0)
    acc = Accelerator(cpu=True, resume="auto" if auto else None)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 4, 0.9)
    g = torch.Generator().manual_seed(1)
    loader = DataLoader(TensorDataset(torch.randn(96, 8, generator=g), torch.randn(96, 1, generator=g)),
                        batch_size=4, shuffle=True)
    if auto:  # the loader in a call of its own: the snapshot waits for it
        model, opt, sched = acc.prepare(model, opt, sched)
        assert acc.resumed_step == 0
        loader = acc.prepare(loader)
        assert acc._snapshots.directory == Path(directory)
        step = start = acc.resumed_step
    else:
        model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
        acc.snapshot_every(steps=EVERY, dir=directory, keep=2)
    mine = threading.current_thread
    if kill is not None and kill[1] == acc.process_index:
        point = kill[0]
        real_write, real_rename = training_state._write, atomic_dir.os.rename

        def write(obj, path, *how):
            if point == "write" and mine().name == f"snapshot-{KILLED_STEP}":
                os.kill(os.getpid(), signal.SIGKILL)
            real_write(obj, path, *how)

        def rename(src, dst):
            if point == "rename" and mine().name == f"snapshot-{KILLED_STEP}":
                os.kill(os.getpid(), signal.SIGKILL)
            real_rename(src, dst)

        training_state._write, atomic_dir.os.rename = write, rename
    if not auto:
        step = start = acc.resume()
    while step < stop_at:
        for x, y in loader:
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            if step == stop_at:
                break
    acc.wait_for_snapshots()
    return start, [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    start, weights = notebook_launcher(train, (str(tmp_path_factory.mktemp("ref")), None), num_processes=2,
                                       output="none")
    assert start == 0
    return weights


@pytest.mark.slow
@pytest.mark.parametrize("kill", [("write", 1), ("write", 0), ("rename", 0)])
def test_a_rank_killed_mid_write_leaves_the_previous_snapshot_and_the_resume_is_bit_exact(tmp_path, reference,
                                                                                          kill):
    directory = str(tmp_path / "snaps")
    with pytest.raises(WorkerError, match="SIGKILL"):
        notebook_launcher(train, (directory, kill), num_processes=2, output="none")
    newest = snapshot_dir.newest(tmp_path / "snaps")
    assert newest.step == KILLED_STEP - EVERY, kill
    assert (tmp_path / "snaps" / f"{snapshot_dir.snapshot_name(KILLED_STEP)}.tmp").is_dir()  # left half written
    start, weights = notebook_launcher(train, (directory, None), num_processes=2, output="none")
    assert start == KILLED_STEP - EVERY
    assert all(a.equal(b) for a, b in zip(weights, reference, strict=True))
    assert [s.step for s in snapshot_dir.listing(tmp_path / "snaps")] == [TOTAL - EVERY, TOTAL]


def _train_from_the_launch_option(directory: str) -> tuple[int, int]:
    """Seven steps with no snapshot_every call of its own: the launch option schedules them."""
    import torch

    from notebook_accel import Accelerator

    acc = Accelerator(cpu=True, project_dir=directory)
    model = torch.nn.Linear(4, 1)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(7):
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        opt.zero_grad()
    acc.wait_for_snapshots()
    return acc._snapshots.steps, acc.process_index


def test_the_launch_option_schedules_snapshots_in_every_worker(tmp_path):
    results = notebook_launcher(_train_from_the_launch_option, args=(str(tmp_path),),
                                num_processes=2, snapshot_every=3, return_all=True, output="none")
    assert results == [(3, 0), (3, 1)]
    assert snapshot_dir.newest(tmp_path / "snapshots").step == 6


def test_a_bad_snapshot_every_is_refused_naming_its_source(monkeypatch):
    with pytest.raises(ValueError, match="snapshot_every=0 must be an int >= 1"):
        notebook_launcher(_train_from_the_launch_option, args=("x",), num_processes=2, snapshot_every=0)
    monkeypatch.setenv("NOTEBOOK_ACCEL_SNAPSHOT_EVERY", "often")
    with pytest.raises(ValueError, match="environment variable NOTEBOOK_ACCEL_SNAPSHOT_EVERY"):
        notebook_launcher(_train_from_the_launch_option, args=("x",), num_processes=2)


def test_a_second_launch_with_resume_auto_goes_on_bit_exactly(tmp_path, reference):
    """The session ends after step 13 (snapshots at 5 and 10, from the launch options); a second
    launch of the same function with Accelerator(resume="auto") loads step 10 by prepare() itself and
    ends with the uninterrupted run's weights."""
    directory = str(tmp_path / "drive" / "run7")
    options = {"num_processes": 2, "output": "none", "snapshot_every": EVERY, "snapshot_dir": directory}
    start, _ = notebook_launcher(train, (directory, None, True, 13), **options)
    assert start == 0 and snapshot_dir.newest(tmp_path / "drive" / "run7").step == 10
    start, weights = notebook_launcher(train, (directory, None, True), **options)
    assert start == 10
    assert all(a.equal(b) for a, b in zip(weights, reference, strict=True))


def _train_to_a_url(url: str, stop: int) -> tuple[int, list]:
    import torch

    from notebook_accel import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.snapshot_every(steps=3, dir=url, keep=1)
    step = start = acc.resume()
    while step < stop:
        acc.backward(model(torch.full((2, 4), float(step))).sum())
        opt.step()
        opt.zero_grad()
        step += 1
    acc.wait_for_snapshots()
    return start, [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


def test_a_url_snapshot_dir_is_uploaded_by_rank_0_and_resumed_on_a_machine_without_the_mirror(tmp_path,
                                                                                             monkeypatch):
    import shutil

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = f"local://{tmp_path / 'bucket' / 'run'}"  # fsspec's local file system, behind a URL
    assert notebook_launcher(_train_to_a_url, (url, 7), num_processes=2, output="none")[0] == 0
    assert sorted(p.name for p in (tmp_path / "bucket" / "run").iterdir()) == ["snapshot_000000006"]
    assert (tmp_path / "bucket" / "run" / "snapshot_000000006" / "random_states_1.pkl").is_file()  # rank 1's too
    _, reference = notebook_launcher(_train_to_a_url, (str(tmp_path / "ref"), 9), num_processes=2, output="none")
    shutil.rmtree(tmp_path / "cache")  # a new machine
    start, weights = notebook_launcher(_train_to_a_url, (url, 9), num_processes=2, output="none")
    assert start == 6 and all(a.equal(b) for a, b in zip(weights, reference, strict=True))
