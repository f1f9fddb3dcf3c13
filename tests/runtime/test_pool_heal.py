"""The warm pool's heal in place, case by case (real worker processes, real gloo collectives):
which rank dies, how many, when (mid-run, idle, during the heal, again), and what is said."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from notebook_accel import WorkerError, WorkerPool
from tests.runtime.test_pool import notebook

pytestmark = pytest.mark.slow

CELLS = notebook("""
    import os, time

    def setup():
        global acc, model, opt, step, mine
        import torch
        from notebook_accel import Accelerator
        acc = Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = acc.prepare(model, opt)
        step = 0
        mine = acc.process_index

    def train(until, pause=0.01):
        global step
        import torch
        while step < until:
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            acc.backward(model(x).pow(2).mean())
            opt.step()
            step += 1
            time.sleep(pause)
        return step

    def look():
        import torch
        import torch.distributed as dist
        t = torch.ones(1)
        dist.all_reduce(t)
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        every = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
        dist.all_gather(every, weights)
        return os.getpid(), t.item(), step, all(torch.equal(every[0], w) for w in every)

    def die_on(ranks):
        import torch.distributed as dist
        if dist.get_rank() in ranks:
            os._exit(3)
        time.sleep(30)

    def leave_a_trap():
        global trap
        class Trap:  # copying it to a new rank kills that rank: a death during the heal
            def __reduce__(self):
                return (os._exit, (4,))
        trap = Trap()

    def leave_a_slow_copy():
        global slow
        class Slow:  # copying it to a new rank takes 4 s
            def __reduce__(self):
                return (time.sleep, (4,))
        slow = Slow()

    def leave_a_generator():
        global numbers
        numbers = (n for n in range(3))

    def wait_in_a_collective():
        import torch
        import torch.distributed as dist
        if dist.get_rank() == 1:
            time.sleep(30)
        dist.all_reduce(torch.ones(1))

    def leave_a_plain_value():
        global plain
        plain = 42

    def read_plain():
        return plain

    def snapshot_every(directory, steps):
        acc.snapshot_every(steps=steps, dir=directory)

    def read_mine():
        return globals().get("mine")

    def diverge():
        import torch
        with torch.no_grad():
            model.module.weight.add_(float(acc.process_index))  # each rank its own model
""")


def _pool(**options) -> WorkerPool:
    pool = WorkerPool(num_processes=3, output="none", **options)
    pool.run(CELLS["setup"])
    return pool


def _kill(pool: WorkerPool, ranks: list[int], after: float) -> threading.Timer:
    pids = [pool.status()[rank].pid for rank in ranks]
    timer = threading.Timer(after, lambda: [os.kill(pid, signal.SIGKILL) for pid in pids])
    timer.start()
    return timer


def _recovery_after(pool: WorkerPool, dying: tuple[int, ...]) -> str:
    """What the pool said it did after ``dying`` ranks exited in a run (the run's error's)."""
    with pytest.raises(WorkerError) as info:
        pool.run(CELLS["die_on"], dying)
    return info.value.recovery


def _trains_on(pool: WorkerPool, pids_kept: dict[int, int]) -> None:
    """The healed pool trains on: same processes where kept, one group, replicas equal."""
    pool.run(CELLS["train"], 40, 0.0)
    _, reduced, step, equal = pool.run(CELLS["look"])
    assert (reduced, step, equal) == (3.0, 40, True)
    for rank, pid_before in pids_kept.items():
        assert pool.status()[rank].pid == pid_before


def test_rank_0_dying_is_healed_from_rank_1():
    with _pool() as pool:
        kept = {rank: pool.status()[rank].pid for rank in (1, 2)}
        timer = _kill(pool, [0], 0.3)
        with pytest.raises(WorkerError, match="rank 0 was killed by SIGKILL") as info:
            pool.run(CELLS["train"], 10**6)
        timer.join()
        said = info.value.recovery
        # rank 1 may wait in the all_reduce for rank 0 (blocked in C++): then it is ended too and
        # healed with rank 0, from rank 2
        healed = re.search(r"The pool healed: (rank 0 was|ranks 0, 1 were) replaced in ", said)
        assert healed, said
        source = 1 if healed.group(1) == "rank 0 was" else 2
        assert f"restored from rank {source}" in said and "step" in said, said
        assert "rebuilt for the new group: acc, model, opt" in said
        _trains_on(pool, {rank: pid for rank, pid in kept.items() if rank >= source})
        if source == 1:  # two ranks left: rank 0's own value (unlike theirs) went with it
            assert pool.run_on(0, CELLS["read_mine"]) is None
        else:  # one rank left: each of its names counts as the same on every rank, as said
            assert "the only rank left" in said and pool.run_on(0, CELLS["read_mine"]) == 2


def test_two_ranks_dying_at_once_are_healed_from_the_last():
    with _pool() as pool:
        kept = {0: pool.status()[0].pid}
        said = _recovery_after(pool, (1, 2))
        # both died on their own: said, before what the pool did (the error names one of them)
        assert said.startswith("rank 1 exited with code 3, rank 2 exited with code 3. The pool "
                               "healed: ranks 1, 2 were replaced in "), said
        assert "restored from rank 0 (the only rank left" in said
        _trains_on(pool, kept)


def test_every_rank_dying_replaces_every_rank_and_says_what_was_lost():
    with _pool() as pool:
        said = _recovery_after(pool, (0, 1, 2))
        assert said.startswith("the pool's workers were replaced (rank 0 exited with code 3, rank 1 "
                               "exited with code 3, rank 2 exited with code 3; "), said
        assert "their state was lost: acc, mine, model, opt, step" in said, said
        assert pool.names == ()


def test_a_rank_dying_during_the_heal_replaces_every_rank_and_says_so():
    with _pool() as pool:
        pool.run(CELLS["leave_a_trap"])
        said = _recovery_after(pool, (1,))
        assert said.startswith("the pool's workers were replaced (rank 1 exited with code 3; the heal "
                               "failed: rank 1 exited with code 4"), said
        pool.run(CELLS["setup"])
        _trains_on(pool, {})


def test_the_same_rank_dying_again_right_after_its_heal_is_said_as_such():
    with _pool() as pool:
        for attempt in range(2):
            said = _recovery_after(pool, (2,))
            assert said.startswith("The pool healed: rank 2 was replaced"), said
            assert ("rank 2 died again in the run right after a heal" in said) == (attempt == 1)
        _trains_on(pool, {0: pool.status()[0].pid})


def test_a_rank_dying_while_idle_is_healed_at_the_next_run(capfd):
    with _pool() as pool:
        pool.run(CELLS["train"], 5)
        kept = {rank: pool.status()[rank].pid for rank in (0, 2)}
        os.kill(pool.status()[1].pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pool.status()[1].alive and time.monotonic() < deadline:
            time.sleep(0.02)
        capfd.readouterr()
        assert pool.run(CELLS["look"])[1:] == (3.0, 5, True)
        said = capfd.readouterr().err  # a script's information: stderr
        assert "rank 1 was killed by SIGKILL while idle. The pool healed: rank 1 was replaced" in said
        assert "the pool's workers were replaced" not in said
        _trains_on(pool, kept)


def test_the_stop_button_during_a_heal_replaces_every_rank_and_stops():
    with _pool() as pool:
        pool.run(CELLS["leave_a_slow_copy"])
        timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))  # the heal's copy takes 4 s
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            pool.run(CELLS["die_on"], (1,))
        timer.join()
        assert time.monotonic() - start < 1.5 + 4.0  # stopped, not waited out
        assert pool.names == ()  # replaced: a group half healed is never reused
        pool.run(CELLS["setup"])
        _trains_on(pool, {})


def test_what_cannot_be_copied_or_differs_is_named_and_the_rest_restored():
    with _pool() as pool:
        pool.run(CELLS["leave_a_generator"])
        said = _recovery_after(pool, (1,))
        assert "  lost with rank 1 (each rank held its own value): mine\n" in said, said
        assert "  not copied to rank 1 (cannot be copied): numbers (TypeError: cannot pickle " in said
        names = set(pool.names_on(1))
        assert {"acc", "model", "opt", "step"} <= names and not names & {"mine", "numbers"}


def test_prepared_objects_that_differ_between_survivors_refuse_the_heal():
    """Survivors whose models differ stopped at different steps: no copy can be trusted, so
    every rank is replaced (never a mixed state)."""
    with _pool() as pool:
        pool.run(CELLS["diverge"])
        said = _recovery_after(pool, (1,))
        assert said.startswith("the pool's workers were replaced (rank 1 exited with code 3; the heal "
                               "failed: "), said
        assert "the surviving ranks hold different acc, model, opt" in said, said


def test_a_rank_the_stop_button_had_to_end_is_healed(capfd):
    """The stop button, rank 0 inside an all_reduce its peer never joins: no common point, so
    every rank is stopped at once and rank 0 (blocked in C++) is ended: then healed, not every
    worker replaced."""
    with WorkerPool(num_processes=2, output="none", stop_wait=0.5) as pool:
        pool.run(CELLS["setup"])
        kept = pool.status()[1].pid
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt, match="rank 0 was ended; what the pool did then is said above"):
            pool.run(CELLS["wait_in_a_collective"])
        timer.join()
        said = capfd.readouterr().err
        assert "rank 0 did not stop within 1.5 s of the interrupt" in said
        assert "The pool healed: rank 0 was replaced" in said and "were replaced (" not in said
        assert pool.status()[1].pid == kept and pool.run(CELLS["look"])[1:] == (2.0, 0, True)


def test_sharded_state_is_named_as_lost_and_why():
    """FSDP2: each rank holds its own shard; with no snapshot to restore it from, the heal names
    the prepared objects as not copied, says why, and keeps the rest."""
    with WorkerPool(num_processes=2, output="none", fsdp=True) as pool:
        pool.run(CELLS["setup"])
        pool.run(CELLS["leave_a_plain_value"])
        said = _recovery_after(pool, (1,))
        assert said.startswith("The pool healed: rank 1 was replaced"), said
        assert "restored from rank 0 (the only rank left" in said and "plain" in said
        assert ("acc, model (ShardsNotCarried: an FSDP-sharded model: each rank held its own part of it; "
                "no snapshot holds them: prepare it again on every rank)") in said, said
        assert pool.run(CELLS["read_plain"]) == 42


def test_a_heal_keeps_the_snapshot_schedule_on_every_rank(tmp_path):
    """With snapshot_every on, the Accelerator is still copied (its schedule carries no process's
    writer or ids) and the new rank counts steps as the others: the next snapshot is complete."""
    from notebook_accel.checkpoint.snapshot_dir import newest

    with _pool() as pool:
        pool.run(CELLS["snapshot_every"], str(tmp_path), 5)
        pool.run(CELLS["train"], 6, 0.0)
        said = _recovery_after(pool, (1,))
        assert "rebuilt for the new group: acc, model, opt" in said, said
        pool.run(CELLS["train"], 16, 0.0)
        deadline = time.monotonic() + 30
        while (newest(tmp_path) is None or newest(tmp_path).step < 15) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert newest(tmp_path).step == 15  # every rank, the new one too, wrote its part
        _trains_on(pool, {0: pool.status()[0].pid})
