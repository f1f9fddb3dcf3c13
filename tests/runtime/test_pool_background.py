"""Background runs on the warm pool (real worker processes, real gloo collectives): submit
returns at once, watch shows every line once, cancel stops at the consistent cut, the pool
refuses other runs meanwhile, and a failure or a rank's death is said in the next call."""

from __future__ import annotations

import time

import pytest

from notebook_accel import WorkerError, WorkerPool
from notebook_accel.launch import LaunchInterrupted, PoolBusy
from tests.runtime.test_pool import notebook

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the module's pool outlives each test: conftest checks for leaks per module

CELLS = notebook("""
    import os, time

    def numbered(steps, pause=0.02):
        global done_steps
        import torch
        import torch.distributed as dist
        from notebook_accel import Accelerator
        acc = Accelerator()
        done_steps = 0
        for step in range(steps):
            t = torch.ones(1)
            dist.all_reduce(t)  # a collective per step: a cut is a step boundary
            acc.log({"loss": 1.0 / (step + 1)}, step=step)
            print(f"line {step}", flush=True)
            done_steps += 1
            time.sleep(pause)
        return "trained"

    def steps_done():
        return done_steps

    def reduce_rank():
        import torch
        import torch.distributed as dist
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    def fails_on_one():
        import torch.distributed as dist
        print("before the failure", flush=True)
        if dist.get_rank() == 1:
            raise ValueError("rank one is unhappy")
        return 0

    def pauses():
        breakpoint()
        return "after the breakpoint"

    def dies_on_one():
        import torch.distributed as dist
        if dist.get_rank() == 1:
            os._exit(3)
        time.sleep(30)
""")


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(num_processes=2) as pool:
        yield pool


def _shown(text: str, rank: int, steps: int) -> list[int]:
    """How many times each numbered line of ``rank`` appears in ``text``."""
    return [text.count(f"[rank {rank}] line {i}\n") for i in range(steps)]


def test_submit_returns_at_once_and_watch_shows_every_line_once(pool, capfd):
    started = time.monotonic()
    run = pool.submit(CELLS["numbered"], 40)
    assert time.monotonic() - started < 1.0 and not run.done()
    assert ".watch() shows it live" in capfd.readouterr().err  # (stdout in a kernel)
    time.sleep(0.5)  # the kernel is free meanwhile: nothing of the run reaches its streams
    with pytest.raises(PoolBusy, match=r"the pool is running a background run of numbered "
                                       r"\(\d+\.\d s, step \d+\); its RunHandle's \.watch\(\), or \.cancel\(\)"):
        pool.run(CELLS["reduce_rank"])
    assert "line" not in str(capfd.readouterr())
    assert run.watch() == "trained"
    out = capfd.readouterr().out
    assert _shown(out, 0, 40) == [1] * 40 and _shown(out, 1, 40) == [1] * 40
    assert run.done() and run.result() == "trained" and run.state() == "finished"
    assert "line 39" in run.logs(1) and run.step == 39
    assert run.watch() == "trained"  # a second watch shows the whole run again, then its value
    assert _shown(capfd.readouterr().out, 1, 40) == [1] * 40
    assert pool.run(CELLS["reduce_rank"]) == 3.0  # free again


def test_cancel_stops_every_rank_at_the_same_point_and_keeps_the_state(pool):
    pids = [info.pid for info in pool.status()]
    run = pool.submit(CELLS["numbered"], 100_000, 0.01)
    time.sleep(1.5)
    assert run.cancel(timeout=30) is True and run.done() and run.state() == "cancelled"
    with pytest.raises(LaunchInterrupted, match="at the same point; the pool keeps its state"):
        run.result()
    assert run.cancel() is False  # ended already
    counts = [pool.run_on(rank, CELLS["steps_done"]) for rank in (0, 1)]
    assert counts[0] == counts[1] > 0  # the consistent cut: every rank stopped after one step
    assert pool.run(CELLS["reduce_rank"]) == 3.0 and [i.pid for i in pool.status()] == pids


def test_a_failure_is_raised_by_result_watch_or_the_next_call(pool):
    run = pool.submit(CELLS["fails_on_one"])
    with pytest.raises(WorkerError, match="rank 1 failed: ValueError: rank one is unhappy") as seen:
        run.result(timeout=60)
    assert pool.run(CELLS["reduce_rank"]) == 3.0  # told by result(): not raised again

    run = pool.submit(CELLS["fails_on_one"])
    while not run.done():
        time.sleep(0.05)
    with pytest.raises(WorkerError, match="rank one is unhappy") as next_call:
        pool.run(CELLS["reduce_rank"])
    assert next_call.value.rank == 1 and "which ran in the background, failed" in str(
        next_call.value.__notes__)
    assert next_call.value is not seen.value
    with pytest.raises(WorkerError) as watched:
        run.watch()  # the outcome, always
    assert watched.value is next_call.value
    assert pool.run(CELLS["reduce_rank"]) == 3.0


def test_a_rank_dying_in_the_background_is_said_next_and_healed(pool):
    run = pool.submit(CELLS["dies_on_one"])
    assert run.result.__self__ is run  # (a handle, at once)
    deadline = time.monotonic() + 60
    while not run.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(WorkerError, match="rank 1 exited with code 3") as error:
        pool.run(CELLS["reduce_rank"])
    assert "The pool healed: rank 1 was replaced" in error.value.recovery
    assert pool.run(CELLS["reduce_rank"]) == 3.0
    assert all(info.alive for info in pool.status())


def test_close_cancels_a_background_run_and_leaves_nothing():
    with WorkerPool(num_processes=2) as own:
        run = own.submit(CELLS["numbered"], 100_000, 0.01)
        time.sleep(1.0)
    assert run.done() and run.state() == "cancelled"


def test_a_breakpoint_in_a_background_run_never_waits_for_input(pool):
    """A background run has no input box: its rank's debugger gets no line and quits, said in
    the run's output (``input()`` would ask whichever cell runs now)."""
    run = pool.submit(CELLS["pauses"])
    try:
        outcome = run.result(timeout=60)
    except WorkerError as error:
        outcome = error
    kept = "".join(text for _, text in run.output.since(0, 0)[0] if isinstance(text, str))
    assert "debugger here (a background run has no input box): it quits" in kept, (outcome, kept)
    assert pool.run(CELLS["reduce_rank"]) == 3.0
