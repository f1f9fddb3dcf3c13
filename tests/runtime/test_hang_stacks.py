"""A one-off launch (notebook_launcher) whose rank makes no progress: marked, and every
running rank's stack shown once, grouped, from faulthandler's dumps; the job runs on."""

from __future__ import annotations

import re

from notebook_accel import notebook_launcher


def _rank_1_sleeps_while_rank_0_waits():
    import time

    import torch
    import torch.distributed as dist

    from notebook_accel import Accelerator

    Accelerator()
    if dist.get_rank() == 1:
        time.sleep(4)
    dist.all_reduce(torch.ones(1))
    return "done"


def test_a_one_off_launch_shows_every_ranks_stack_once_when_one_makes_no_progress(capsys):
    assert notebook_launcher(_rank_1_sleeps_while_rank_0_waits, num_processes=2,
                             hang_after=1, output="all") == "done"
    err = capsys.readouterr().err
    assert err.count("every rank's stack now:") == 1, err
    said = err.split("every rank's stack now:")[1]
    assert "no progress (no output, event or collective) for 1 s on rank" in err
    assert "rank 0: all_reduce <- _rank_1_sleeps_while_rank_0_waits\n" in said, said
    assert "rank 1: _rank_1_sleeps_while_rank_0_waits\n" in said and "time.sleep(4)" in said
    assert "Current thread" not in err and not re.search(r"line \d+ in ", err)  # no raw dump
