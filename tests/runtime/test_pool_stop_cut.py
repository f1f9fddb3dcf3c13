"""The stop button on a warm pool stops every rank at a point they agree on (issue 30): the
process group and every rank's state are kept, whatever moment the press lands on; what cannot
reach that point (uneven work, a dead peer, a second press) is stopped at once within a bound,
saying which rank held it up; never a hang, never a wrong result. Real workers, real gloo."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from notebook_accel import WorkerPool
from tests.runtime.stop_chaos import run_chaos, summary
from tests.runtime.test_pool import notebook
from tests.runtime.test_pool_failures import _interrupt_after

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the module's pool outlives each test (and is replaced by some): checked per module

CELLS = notebook("""
    import os, time

    def reduce_rank():
        import torch
        import torch.distributed as dist
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    def uneven(extra_rank, rounds):
        global done
        import torch
        import torch.distributed as dist
        done = 0
        for _ in range(rounds + (1 if dist.get_rank() == extra_rank else 0)):
            dist.all_reduce(torch.ones(1))
            done += 1
            time.sleep(0.01)
        time.sleep(60)  # the others wait here; the extra rank waits in its last all_reduce

    def late_sleeper(seconds):
        global rounds_done
        import torch
        import torch.distributed as dist
        rounds_done = 0
        while True:
            if dist.get_rank() == 1:
                time.sleep(seconds)
            dist.all_reduce(torch.ones(1))
            rounds_done += 1

    def pid():
        return os.getpid()
""")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_fifty_presses_at_random_moments_keep_every_ranks_state(strategy, capsys):
    # DDP: one event in five SIGKILLs a random rank instead, and the pool must heal
    kills = 0.2 if strategy == "ddp" else 0.0
    result = run_chaos(50, {"fsdp": True} if strategy == "fsdp2" else {}, seed=30, kills=kills)
    with capsys.disabled():
        print(f"\n{strategy}: {summary(result)}")
    assert not result.problems, result.problems  # never silently inconsistent ranks
    assert result.presses + result.kills == 50 and result.healed == result.kills
    assert result.kills >= (5 if kills else 0), summary(result)
    assert not result.replaced, result.fallbacks  # every press kept the workers and their state
    assert result.final_diff == 0.0  # the same training as an uninterrupted run of as many steps
    stops = sorted(result.stop_seconds)
    assert stops[len(stops) // 2] < 0.5 and stops[-1] < 2.0, stops  # a step (ms here) + 0.5 s


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(num_processes=2, return_all=True, stop_wait=2.0) as pool:
        yield pool


def test_a_rank_sleeping_in_python_before_a_collective_is_waited_for(pool, capfd):
    """Rank 1 sleeps 1 s before each all_reduce, rank 0 waits inside it: the press makes rank 1
    run on to the next collective, then both stop; the pool keeps its processes and state."""
    pids = pool.run(CELLS["pid"])
    timer = _interrupt_after(1.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="at the same point; the pool keeps its state"):
        pool.run(CELLS["late_sleeper"], 1.0)
    timer.join()
    assert time.monotonic() - start < 1.5 + 2 * 1.0 + 0.5  # its sleep, one more round, a margin
    said = capfd.readouterr().err  # a script's information: stderr (a kernel's: stdout)
    assert "stopping after the current step (every rank runs on to the same point of your code)" in said
    assert not re.search(r"collective \d", said)  # no internal counters
    assert pool.run(CELLS["pid"]) == pids
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]


def test_uneven_work_falls_back_within_the_bound_naming_the_rank(pool, capfd):
    """Rank 1 has one more all_reduce than rank 0: no common point exists. After stop_wait
    (2 s here) every rank is stopped at once; rank 1, stuck in its collective, is ended and
    healed (said)."""
    timer = _interrupt_after(1.0)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        pool.run(CELLS["uneven"], 1, 5)
    timer.join()
    assert time.monotonic() - start < 1.0 + 1.0 + 2.0 + 1.5 + 1.5  # ask, wait, grace, margin
    message = str(info.value)
    assert "did not reach the common stopping point within 2 s (stop_wait)" in message, message
    assert message.endswith("; rank 1 was ended; what the pool did then is said above"), message
    said = capfd.readouterr().err  # why, once: where the pool says what it did
    assert ("rank 1 did not stop within 1.5 s of the interrupt (blocked in C++ code, e.g. a "
            "collective), so we ended it. The pool healed: rank 1 was replaced") in said, said
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]  # never a wrong result afterwards


def test_a_second_press_during_the_wait_stops_at_once(pool):
    timer = _interrupt_after(1.0)
    again = _interrupt_after(1.6)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        pool.run(CELLS["late_sleeper"], 30.0)
    timer.join()
    again.join()
    assert time.monotonic() - start < 1.6 + 1.5 + 1.0  # the second press, the kill grace, margin
    assert "stop was pressed again" in str(info.value)
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]


def test_a_rank_killed_during_the_wait_never_hangs_the_stop(pool, capfd):
    pids = pool.run(CELLS["pid"])
    timer = _interrupt_after(1.0)
    killer = threading.Timer(1.4, os.kill, (pids[1], signal.SIGKILL))
    killer.start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        pool.run(CELLS["late_sleeper"], 30.0)
    timer.join()
    killer.join()
    assert time.monotonic() - start < 1.4 + 1.5 + 2.0
    assert "rank 1 ended meanwhile" in str(info.value), str(info.value)
    assert "The pool healed: rank 1 was replaced" in capfd.readouterr().err
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]
