"""A hang said as a disagreement at a numbered collective, from every rank's flight recorder:
a one-off launch (faulthandler's signal) and a warm pool (the commands channel)."""

from __future__ import annotations

import re
import time

import pytest

from notebook_accel import WorkerError, WorkerPool, notebook_launcher


def different_collectives_at_the_same_number():
    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator

    Accelerator()
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1024))  # the line the hang names for rank 0
    else:
        dist.broadcast(torch.ones(10), 0)  # the line the hang names for rank 1
    return "never"


def _line_of(text: str) -> int:
    import inspect

    source, first = inspect.getsourcelines(different_collectives_at_the_same_number)
    return first + next(i for i, line in enumerate(source) if text in line)


def said(err: str) -> str:
    """The hang's block of last collectives in ``err`` (said once)."""
    assert err.count("last collectives: ") == 1, err
    return err.split("last collectives: ")[1].split("every rank's stack now:")[0]


def assert_names_both(block: str) -> None:
    """``block`` (the hang's) names rank 0's all_reduce and rank 1's broadcast at one number,
    each on its own line of :func:`different_collectives_at_the_same_number`."""
    number = re.search(r"the ranks called different collectives at #(\d+) \(group default\)", block)
    assert number, block
    assert f"rank 0 waits in all_reduce #{number[1]} (float32[1024]" in block, block
    assert f"rank 1 waits in broadcast #{number[1]} (float32[10]" in block, block
    assert f"line {_line_of('torch.ones(1024)')}, in different" in block, block
    assert f"line {_line_of('torch.ones(10), 0')}, in different" in block, block


def test_a_one_off_launch_names_the_collectives_the_ranks_disagree_on(capsys):
    started = time.monotonic()
    with pytest.raises(WorkerError, match="timed out"):
        notebook_launcher(different_collectives_at_the_same_number, num_processes=2,
                          hang_after=1, timeout=6, output="all")
    assert time.monotonic() - started < 30
    assert_names_both(said(capsys.readouterr().err))


@pytest.mark.slow
def test_a_pools_hang_names_the_collectives_the_ranks_disagree_on(capsys):
    with (WorkerPool(num_processes=2, hang_after=1, timeout=8, stop_wait=1) as pool,
          pytest.raises(WorkerError, match="timed out")):
        pool.run(different_collectives_at_the_same_number)
    assert_names_both(said(capsys.readouterr().err))


def test_check_collectives_raises_on_each_ranks_line_instead_of_hanging():
    started = time.monotonic()
    with pytest.raises(WorkerError) as failed:
        notebook_launcher(different_collectives_at_the_same_number, num_processes=2,
                          check_collectives=True, hang_after=30, timeout=30, output="none")
    assert time.monotonic() - started < 20  # raised, not timed out
    error = failed.value
    assert "DistributedOperationException" in str(error), error
    assert "check_collectives: the ranks of the default group called different collectives" in str(error)
    assert "rank 0: all_reduce(float32[1024])" in error.remote_traceback
    assert "rank 1: broadcast(float32[10], src=0)" in error.remote_traceback
    line = _line_of("torch.ones(1024)" if error.rank == 0 else "torch.ones(10), 0")
    last_frame = re.findall(r'File "[^"]+", line (\d+)', error.remote_traceback)[-1]
    assert int(last_frame) == line, error.remote_traceback  # the rank's own line, last


def collectives_then_a_sub_group():
    import torch
    import torch.distributed as dist

    for _ in range(3):
        dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.ones(2, 2, dtype=torch.int64), 0)  # the last on the default group


@pytest.mark.slow
def test_an_idle_pools_last_collectives_side_by_side():
    with WorkerPool(num_processes=2) as pool:
        pool.run(collectives_then_a_sub_group)
        text = pool.collectives(last=2)
        with pytest.raises(ValueError, match="last must be an integer >= 1"):
            pool.collectives(last=0)
    lines = text.splitlines()
    assert lines[:2] == ["group default (the last 2):", lines[1]] and lines[1].split() == ["#", "ranks", "0,", "1"], text
    assert "all_reduce float32[3] test_collective_hangs.py:" in lines[2], text
    assert "broadcast int64[2,2] test_collective_hangs.py:" in lines[3], text
    assert int(lines[3].split()[0]) == int(lines[2].split()[0]) + 1


def _rank_0_waits_for_rank_1(marker):
    import os
    import time

    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(3))
    if dist.get_rank() == 1:
        while not os.path.exists(marker):  # rank 1 elsewhere until the test lets it go
            time.sleep(0.05)
    dist.all_reduce(torch.ones(5))  # rank 0 waits here meanwhile
    return dist.get_rank()


@pytest.mark.slow
def test_a_busy_pools_collectives_show_the_one_a_rank_waits_in(tmp_path):
    """A background run is in flight and its supervisor reads the channels: the ranks' answers
    reach pool.collectives() through it, rank 0's all_reduce said as waiting."""
    marker = tmp_path / "go"
    with WorkerPool(num_processes=2) as pool:
        run = pool.submit(_rank_0_waits_for_rank_1, str(marker))
        deadline = time.monotonic() + 15
        while ("float32[5]" not in (text := pool.collectives(last=2))  # (rank 0 there yet)
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert not run.done()
        lines = text.splitlines()
        assert lines[1].split() == ["#", "rank", "0", "rank", "1"], text
        number = int(lines[-1].split()[0])
        assert re.search(rf"^{number}  all_reduce float32\[5\] test_collective_hangs.py:\d+ waiting\s+-$",
                         lines[-1]), text
        assert "all_reduce float32[3]" in lines[-2] and lines[-2].count("all_reduce float32[3]") == 2, text
        marker.touch()
        assert run.result(timeout=15) == 0
        assert pool.run(collectives_then_a_sub_group) is None  # the pool goes on


def _a_quiet_group_pushed_out_of_the_ring():
    import time

    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator
    from notebook_accel.launch.worker.flight_recorder import RING

    Accelerator()
    quiet = dist.new_group([0, 1], group_desc="quiet")
    dist.all_reduce(torch.ones(2), group=quiet)  # used once (an evaluation's group)
    for _ in range(RING + 100):  # a busy default group (DDP's gradients) fills the ring
        dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2), group=quiet)  # rank 0 waits here
    else:
        time.sleep(30)  # rank 1 never comes


def test_a_rank_whose_ring_lost_a_quiet_group_is_still_said_to_be_short_of_it(capsys):
    """The ring is the process's: a busy group pushes a quiet group's entries out. The rank
    that never reached the quiet group's collective is still named, with how far short."""
    with pytest.raises(WorkerError, match="timed out"):
        notebook_launcher(_a_quiet_group_pushed_out_of_the_ring, num_processes=2, hang_after=1,
                          timeout=10, output="all")
    block = said(capsys.readouterr().err)
    assert block.startswith("not every rank reached all_reduce #2 (group quiet):"), block
    assert "rank 0 waits in all_reduce #2 (float32[2]" in block, block
    assert re.search(r"rank 1 never reached it: it is at .*line \d+, in _a_quiet_group_pushed_out_of_"
                     r"the_ring \(time.sleep\(30\)  # rank 1 never comes\), 1 collective short", block), block
