"""WorkerPool failures: the root cause is named, the pool stays up or is replaced (said),
and never a silently wrong result (real worker processes, real gloo collectives)."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from notebook_accel import WorkerError, WorkerPool
from tests.runtime.test_pool import notebook

pytestmark = pytest.mark.slow

SOURCE = """
    import os, time

    def keep(value):
        global kept
        kept = value

    def read_kept():
        return kept

    def reduce_rank():
        import torch
        import torch.distributed as dist
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    def raise_on(rank_to_fail):
        import torch.distributed as dist
        if dist.get_rank() == rank_to_fail:
            raise ValueError(f"rank {rank_to_fail} gave up")
        return "fine"

    def raise_while_peer_waits():
        import torch
        import torch.distributed as dist
        if dist.get_rank() == 1:
            time.sleep(0.3)
            raise ValueError("rank 1 gave up before the all_reduce")
        dist.all_reduce(torch.ones(1))

    def peer_late(delay):
        import torch
        import torch.distributed as dist
        if dist.get_rank() == 1:
            time.sleep(delay)
        t = torch.ones(1) * 100
        dist.all_reduce(t)
        return t.item()

    def sleep_and_note(seconds):
        global interrupted_after
        start = time.monotonic()
        try:
            time.sleep(seconds)
        except KeyboardInterrupt:
            interrupted_after = time.monotonic() - start
            raise

    def read_interrupted():
        return interrupted_after

    def pid():
        return os.getpid()
"""
CELLS = notebook(SOURCE)


def _line_of(text: str) -> int:
    """The line number of ``text`` in the cells' source, as a traceback names it."""
    [number] = [n for n, line in enumerate(textwrap.dedent(SOURCE).splitlines(), 1) if text in line]
    return number


@pytest.fixture
def pool():
    with WorkerPool(num_processes=2, return_all=True) as pool:
        pool.run(CELLS["keep"], "precious")
        yield pool


def _interrupt_after(seconds: float) -> threading.Timer:
    """The notebook's stop button: SIGINT to this process (the kernel) after ``seconds``."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_a_run_raising_on_some_ranks_names_the_root_cause_and_keeps_the_pool(pool, capfd):
    pids = pool.run(CELLS["pid"])
    with pytest.raises(WorkerError, match="rank 1 failed: ValueError: rank 1 gave up") as info:
        pool.run(CELLS["raise_on"], 1)
    assert info.value.rank == 1 and f'line {_line_of("{rank_to_fail} gave up")}, in raise_on' in info.value.remote_traceback
    assert isinstance(info.value, ChildFailedError) and "rank 1 gave up" in info.value.failures[1].message
    assert pool.run(CELLS["pid"]) == pids
    assert pool.run(CELLS["read_kept"]) == ["precious", "precious"]
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]
    assert "replaced" not in capfd.readouterr().err


def test_a_rank_raising_while_its_peer_waits_in_a_collective_does_not_hang(pool, capfd):
    start = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 failed: ValueError: rank 1 gave up") as info:
        pool.run(CELLS["raise_while_peer_waits"])
    assert time.monotonic() - start < 10
    assert "Connection closed" not in info.value.args[0]
    # rank 0 waited in the all_reduce, in C++: ended within the interrupt's grace, then healed
    said = info.value.recovery  # on the error, in the cell: what the pool did, and why
    assert said.startswith("rank 0 was ended by us (blocked in C++ code after the failure"), said
    assert "The pool healed: rank 0 was replaced" in said and "restored from rank 1 (the only rank left" in said
    assert said.splitlines()[1].endswith("s): kept")
    assert said in str(info.value)
    assert pool.run(CELLS["read_kept"]) == ["precious", "precious"]
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]


def test_an_interrupted_collective_never_pairs_with_the_next_one(pool):
    """Rank 0 waits in all_reduce for a peer that comes 3 s later; the stop button at 1 s.
    Plain torch then pairs the interrupted all_reduce with the next one (1 + 2 gave 102)."""
    timer = _interrupt_after(1.0)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pool.run(CELLS["peer_late"], 3.0)
    timer.join()
    assert time.monotonic() - start < 1.0 + 2.0 + 1.0  # the stuck rank: within 2 s (+ margin)
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]
    time.sleep(3)  # when the old peer would have arrived
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]


def test_the_stop_button_interrupts_every_rank_and_keeps_the_pool(pool):
    pids = pool.run(CELLS["pid"])
    timer = _interrupt_after(0.5)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="the pool keeps its state"):
        pool.run(CELLS["sleep_and_note"], 30)
    timer.join()
    assert time.monotonic() - start < 0.5 + 1.0
    assert all(after < 0.5 + 0.5 for after in pool.run(CELLS["read_interrupted"]))
    assert pool.run(CELLS["pid"]) == pids
    assert pool.run(CELLS["read_kept"]) == ["precious", "precious"]


def test_a_worker_killed_mid_run_is_named_and_the_pool_healed(pool):
    """Only the killed rank is replaced; it gets what the other rank holds (tests/runtime/
    test_pool_heal.py has the rest of the rule)."""
    pids = pool.run(CELLS["pid"])
    threading.Timer(0.5, os.kill, (pids[1], signal.SIGKILL)).start()
    with pytest.raises(WorkerError, match="rank 1 was killed by SIGKILL") as info:
        pool.run(CELLS["peer_late"], 5.0)
    assert "The pool healed: rank 1 was replaced" in info.value.recovery
    assert "restored from rank 0 (the only rank left" in info.value.recovery
    now = pool.run(CELLS["pid"])
    assert now[0] == pids[0] and now[1] != pids[1]
    assert pool.run(CELLS["read_kept"]) == ["precious", "precious"]
    assert pool.run(CELLS["reduce_rank"]) == [3.0, 3.0]
