"""Snapshots (issue 45): the host copy, the directory's commit protocol, pruning, the background
writer, and resume's refusals, in one process."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import pytest
import safetensors.torch
import torch

from notebook_accel import Accelerator
from notebook_accel.checkpoint import snapshot_dir, state_parts
from notebook_accel.checkpoint.host_copy import blank, host_copy
from notebook_accel.checkpoint.snapshot_writer import SnapshotWriter


def _commit(directory, step, saved_at, token="t"):
    tmp = directory / (snapshot_dir.snapshot_name(step) + ".tmp")
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"x")
    snapshot_dir.mark_done(tmp, 0, token)
    assert snapshot_dir.wait_for_ranks(tmp, 1, token, timeout=1) == []
    snapshot_dir.commit(tmp, directory / snapshot_dir.snapshot_name(step), {"step": step, "saved_at": saved_at})


def test_the_host_copy_is_training_proof_and_keeps_tied_weights_one():
    weight = torch.ones(3, 2)
    state = OrderedDict(a=weight, b=weight.detach(), c={"lr": [0.1]}, n=3)
    state._metadata = {"": {"version": 1}}
    copied = host_copy(state)
    weight.add_(1)
    state["c"]["lr"].append(0.2)
    assert torch.equal(copied["a"], torch.ones(3, 2)) and copied["c"] == {"lr": [0.1]}
    assert copied["a"] is copied["b"]  # tied: one tensor, stored once
    assert type(copied) is OrderedDict and copied._metadata == {"": {"version": 1}}


def test_a_host_copy_into_an_earlier_one_overwrites_its_matching_tensors_only():
    weight, bias = torch.ones(3, 2), torch.zeros(2)
    first = host_copy({"w": weight, "tied": weight, "b": bias, "steps": [torch.tensor(1.0)]})
    weight.add_(1)
    second = host_copy({"w": weight, "tied": weight.clone(), "b": torch.zeros(5), "steps": [torch.tensor(2.0)]},
                       into=first)
    assert second["w"] is first["w"] and torch.equal(second["w"], torch.full((3, 2), 2.0))  # its pages, new values
    assert second["tied"] is not second["w"] and torch.equal(second["tied"], second["w"])  # tied once, not now
    assert second["b"].shape == (5,) and second["b"] is not first["b"]  # another shape: a fresh copy
    assert second["steps"][0] is first["steps"][0] and second["steps"][0].item() == 2.0
    assert host_copy({"w": weight.t()}, into=first)["w"] is not first["w"]  # other strides: fresh


def test_a_snapshot_copies_into_the_last_written_ones_host_copy(tmp_path):
    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=1, dir=tmp_path, keep=3)
    _train(accelerator, model, optimizer, 1)
    accelerator.wait_for_snapshots()
    first = list(accelerator._snapshots._spare["model.safetensors"].values())
    _train(accelerator, model, optimizer, 1)
    accelerator.wait_for_snapshots()
    second = list(accelerator._snapshots._spare["model.safetensors"].values())
    assert len(second) == len(first) and all(a is b for a, b in zip(first, second, strict=True))
    snapshot = safetensors.torch.load_file(tmp_path / "snapshot_000000002" / "model.safetensors")
    assert all(torch.equal(snapshot[k], v) for k, v in model.state_dict().items())  # the step-2 weights


def test_a_blank_is_the_host_copy_without_its_values_and_a_copy_goes_into_it():
    weight = torch.randn(300, 70)
    state = OrderedDict(a=weight, b=weight.detach(), t=weight.t(), c={"lr": [0.1]}, n=3,
                        e=torch.zeros(0), h=torch.ones(5, dtype=torch.bfloat16))
    made = blank(state)
    assert made["a"] is made["b"] and made["c"] == {"lr": [0.1]} and made["n"] == 3  # tied: one
    for key in ("a", "t", "e", "h"):
        assert made[key].device.type == "cpu" and made[key].dtype == state[key].dtype
        assert made[key].shape == state[key].shape and made[key].stride() == state[key].stride()
    copied = host_copy(state, into=made)
    assert copied["a"] is made["a"] and copied["t"] is made["t"] and copied["h"] is made["h"]  # its memory
    assert torch.equal(copied["a"], weight) and torch.equal(copied["t"], weight.t())  # the values


def test_the_first_snapshot_copies_into_memory_made_ahead_after_the_first_step(tmp_path):
    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=3, dir=tmp_path, keep=3)
    _train(accelerator, model, optimizer, 1)
    ahead = accelerator._snapshots._first_copy
    deadline = time.monotonic() + 10
    while ahead.ready() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    made = list(ahead.ready()["model.safetensors"].values())
    _train(accelerator, model, optimizer, 2)  # the snapshot of step 3
    accelerator.wait_for_snapshots()
    copied = list(accelerator._snapshots._spare["model.safetensors"].values())
    assert len(copied) == len(made) and all(a is b for a, b in zip(made, copied, strict=True))
    snapshot = safetensors.torch.load_file(tmp_path / "snapshot_000000003" / "model.safetensors")
    assert all(torch.equal(snapshot[k], v) for k, v in model.state_dict().items())


def test_memory_made_ahead_that_is_not_ready_is_not_waited_for(tmp_path, monkeypatch):
    from notebook_accel.checkpoint import copy_memory

    release = threading.Event()
    monkeypatch.setattr(copy_memory, "blank", lambda state: release.wait(10) and None)
    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=2, dir=tmp_path, keep=3)
    _train(accelerator, model, optimizer, 2)  # due while the memory is still being made: a fresh copy
    release.set()
    accelerator.wait_for_snapshots()
    assert [s.step for s in snapshot_dir.listing(tmp_path)] == [2]
    assert accelerator._snapshots._first_copy is copy_memory.MadeAhead.NONE


def test_no_memory_is_made_ahead_where_it_would_not_fit(tmp_path, monkeypatch):
    from notebook_accel.checkpoint import copy_memory

    monkeypatch.setattr(copy_memory, "SPARE_SHARE", 0.0)
    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=3, dir=tmp_path, keep=3)
    _train(accelerator, model, optimizer, 1)
    assert accelerator._snapshots._first_copy is copy_memory.MadeAhead.NONE


def test_a_snapshot_is_complete_only_once_every_rank_is_in_and_it_is_renamed(tmp_path):
    tmp = tmp_path / "snapshot_000000010.tmp"
    tmp.mkdir()
    snapshot_dir.mark_done(tmp, 0, "run2")
    (tmp / ".done-1-run1").touch()  # left by a killed run: not this run's
    assert snapshot_dir.wait_for_ranks(tmp, 2, "run2", timeout=0.1) == [1]
    assert snapshot_dir.newest(tmp_path) is None  # a .tmp folder is never loaded
    snapshot_dir.mark_done(tmp, 1, "run2")
    assert snapshot_dir.wait_for_ranks(tmp, 2, "run2", timeout=1) == []
    snapshot_dir.commit(tmp, tmp_path / "snapshot_000000010", {"step": 10, "saved_at": time.time()})
    newest = snapshot_dir.newest(tmp_path)
    assert newest.step == 10 and newest.complete and not list(newest.path.glob(".done-*"))


def test_the_newest_is_the_last_saved_and_keep_prunes_the_oldest(tmp_path):
    _commit(tmp_path, 900, saved_at=100.0)  # an earlier run that got further
    _commit(tmp_path, 10, saved_at=200.0)   # this run, started over
    _commit(tmp_path, 20, saved_at=300.0)
    assert snapshot_dir.newest(tmp_path).step == 20
    assert [p.name for p in snapshot_dir.prune(tmp_path, keep=2)] == ["snapshot_000000900"]
    assert [s.step for s in snapshot_dir.listing(tmp_path)] == [10, 20]
    (tmp_path / "snapshot_000000030.tmp").mkdir()
    (tmp_path / "snapshot_000000005.pruned").mkdir()
    snapshot_dir.clear_unfinished(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot_000000010", "snapshot_000000020"]


def test_the_writer_waits_for_a_write_still_going_and_says_so_once():
    said, release = [], threading.Event()
    writer = SnapshotWriter(said.append)
    writer.submit(1, release.wait)
    timer = threading.Timer(0.2, release.set)
    timer.start()
    assert writer.submit(2, lambda: None) >= 0.1  # waited for step 1's write
    writer.submit(3, lambda: time.sleep(0.2))
    writer.submit(4, lambda: None)
    writer.wait()
    assert len(said) == 1 and said[0].startswith("snapshot step 2 waits for the write of step 1")


def test_a_failed_write_is_said_and_training_goes_on(capsys):
    writer = SnapshotWriter(print)
    writer.submit(5, lambda: 1 / 0)
    writer.wait()
    assert writer.failed and writer.failed[0][0] == 5
    assert "snapshot step 5 was not written (ZeroDivisionError" in capsys.readouterr().err


def _train(accelerator, model, optimizer, steps):
    for _ in range(steps):
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        optimizer.zero_grad()


def _prepared(width=4):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(width, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def test_keep_n_prunes_older_snapshots_as_training_goes(tmp_path):
    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=1, dir=tmp_path, keep=2)
    _train(accelerator, model, optimizer, 5)
    accelerator.wait_for_snapshots()
    assert [s.step for s in snapshot_dir.listing(tmp_path)] == [4, 5]
    assert (tmp_path / "snapshot_000000005" / "model.safetensors").is_file()  # save_state's layout
    assert (tmp_path / "snapshot_000000005" / "optimizer.bin").is_file()


def test_a_write_that_dies_midway_leaves_the_previous_snapshot_the_newest(tmp_path, monkeypatch):
    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=2, dir=tmp_path)
    _train(accelerator, model, optimizer, 2)
    accelerator.wait_for_snapshots()
    weights = [p.detach().clone() for p in model.parameters()]
    real = state_parts.write_files

    def dies_after_one_file(directory, files, *how):
        real(directory, files[:1], *how)
        raise OSError("disk gone")

    monkeypatch.setattr(state_parts, "write_files", dies_after_one_file)
    _train(accelerator, model, optimizer, 2)
    accelerator.wait_for_snapshots()
    assert (tmp_path / "snapshot_000000004.tmp" / "model.safetensors").is_file()  # half written
    assert snapshot_dir.newest(tmp_path).step == 2
    monkeypatch.undo()
    again, model2, optimizer2 = _prepared()
    assert again.resume(tmp_path) == 2
    assert all(torch.equal(a, b) for a, b in zip(weights, model2.parameters(), strict=True))


def test_resume_with_nothing_says_so_and_starts_at_0(tmp_path, capsys):
    accelerator, _, _ = _prepared()
    assert accelerator.resume(tmp_path / "none") == 0
    assert f"nothing to resume in {tmp_path / 'none'}: starting at step 0" in capsys.readouterr().out


def test_resume_refuses_another_model_shape_naming_it(tmp_path):
    accelerator, model, optimizer = _prepared(width=4)
    accelerator.snapshot_every(steps=1, dir=tmp_path)
    _train(accelerator, model, optimizer, 1)
    accelerator.wait_for_snapshots()
    other, _, _ = _prepared(width=6)
    with pytest.raises(ValueError, match=r"model 0's weight is \[2, 4\] in it, \[2, 6\] here"):
        other.resume(tmp_path)


def test_resume_refuses_another_world_size_and_strategy(tmp_path):
    from notebook_accel.checkpoint.snapshot_identity import differences

    saved = {"world_size": 2, "strategy": "FsdpStrategy", "models": [], "optimizers": 1, "schedulers": 0,
             "dataloaders": 0, "custom_objects": 0}
    here = {**saved, "world_size": 1, "strategy": "DdpStrategy"}
    assert differences(saved, here) == [
        "it was taken with 2 processes, this run has 1",
        "it was taken with the FsdpStrategy strategy, this run uses DdpStrategy",
    ]


def test_snapshot_every_checks_its_arguments(tmp_path):
    accelerator, _, _ = _prepared()
    with pytest.raises(ValueError, match="needs steps=N"):
        accelerator.snapshot_every(dir=tmp_path)
    with pytest.raises(ValueError, match=r"keep=0\): must be an integer >= 1"):
        accelerator.snapshot_every(steps=5, dir=tmp_path, keep=0)


def _auto(width=4, loader=True, register=None):
    """An Accelerator(resume="auto") preparing a model and optimizer in one call, then (``loader``) a
    loader in a second."""
    accelerator = Accelerator(cpu=True, resume="auto")
    model = torch.nn.Linear(width, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    after_first = accelerator.resumed_step
    if loader:
        accelerator.prepare(torch.utils.data.DataLoader(torch.ones(8, width), batch_size=2))
    return accelerator, model, optimizer, after_first


def test_resume_auto_loads_once_everything_the_snapshot_holds_is_prepared(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NOTEBOOK_ACCEL_SNAPSHOT_DIR", str(tmp_path))  # the launch option's variable
    with pytest.raises(ValueError, match=r"resume='yes'\) is not one of None, 'auto'"):
        Accelerator(cpu=True, resume="yes")
    first, model, optimizer, after_first = _auto()
    assert f"resume='auto': once prepare() has the model and optimizer, this run goes on from the newest " \
           f"complete snapshot in {tmp_path}" in capsys.readouterr().out
    assert after_first == 0 and first.resumed_step == 0  # nothing to resume: said once
    first.snapshot_every(steps=3)  # into the launch option's directory
    _train(first, model, optimizer, 6)
    first.wait_for_snapshots()
    weights = [p.detach().clone() for p in model.parameters()]
    assert snapshot_dir.newest(tmp_path).step == 6
    capsys.readouterr()

    second, model2, _, after_first = _auto()
    assert after_first == 0  # the snapshot holds a loader: the model and optimizer alone do not load it
    assert second.resumed_step == 6 and "resumed from snapshot step 6" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(weights, model2.parameters(), strict=True))

    third, model3, optimizer3, _ = _auto(loader=False)  # never prepares the loader the snapshot holds
    assert third.resumed_step == 0
    with pytest.raises(RuntimeError, match=r"resume='auto': the newest snapshot \(.*snapshot_000000006, "
                                           r"step 6\) holds 1 dataloaders \(prepared: 0\), not all prepared"):
        _train(third, model3, optimizer3, 1)
    assert snapshot_dir.newest(tmp_path).step == 6


def test_a_heal_leaves_a_write_waiting_for_a_dead_ranks_part_and_the_next_snapshot_goes_on(tmp_path, monkeypatch):
    """A write waits for every rank's part; a rank killed before writing its own never sends it.
    After a heal (``leave_old_group``) that write stops waiting, stays incomplete, and the next
    snapshot neither waits for it nor is held back (the hang of test_pool_heal's schedule test)."""
    from notebook_accel.checkpoint import snapshots

    accelerator, model, optimizer = _prepared()
    accelerator.snapshot_every(steps=2, dir=tmp_path)
    monkeypatch.setattr(snapshot_dir, "mark_done", lambda *args: None)  # a part that never comes
    _train(accelerator, model, optimizer, 2)
    old = accelerator._snapshots.writer
    time.sleep(0.2)
    assert old.busy  # waiting for the missing part (RANK_WAIT_S)
    snapshots.leave_old_group()
    monkeypatch.undo()
    deadline = time.monotonic() + 5
    while old.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not old.busy and accelerator._snapshots.writer is not old
    accelerator._snapshots.rejoin()
    _train(accelerator, model, optimizer, 2)
    accelerator.wait_for_snapshots()
    assert snapshot_dir.newest(tmp_path).step == 4
    assert (tmp_path / "snapshot_000000002.tmp").is_dir()  # left incomplete, never the newest


def test_a_plain_snapshot_and_save_import_nothing_of_torchs_distributed_checkpoint(tmp_path):
    """Its import (80 modules, 60 ms with the interpreter held) was the first background write's
    stall on training: only a sharded state's write may import it."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys, torch
        from notebook_accel import Accelerator
        acc = Accelerator(cpu=True)
        net = torch.nn.Linear(4, 4)
        model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
        acc.snapshot_every(steps=1, dir={str(tmp_path / "snaps")!r})
        for _ in range(2):
            acc.backward(model(torch.ones(2, 4)).sum()); opt.step(); opt.zero_grad()
        acc.wait_for_snapshots()
        acc.save_state({str(tmp_path / "saved")!r})
        print("dcp" if "torch.distributed.checkpoint" in sys.modules else "none")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "none"
    assert (tmp_path / "saved").is_dir() and any((tmp_path / "snaps").iterdir())
