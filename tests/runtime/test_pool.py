"""WorkerPool: warm workers that keep their state and process group across runs (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from notebook_accel import WorkerPool, notebook_launcher

pytestmark = pytest.mark.slow


def notebook(source: str) -> dict:
    """Functions as a notebook defines them: in ``__main__``'s name, so they travel by value."""
    scope = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(source), "<notebook cell>", "exec"), scope)
    return scope


CELLS = notebook("""
    def load(n):
        global data
        import torch
        data = torch.arange(n)
        print("loaded", len(data))
        return "loaded"

    def total():
        import torch
        import torch.distributed as dist
        from notebook_accel import Accelerator
        accelerator = Accelerator()
        t = data.sum().float() + accelerator.process_index
        dist.all_reduce(t)
        return t.item(), id(dist.group.WORLD), os.getpid()

    def reduce_rank():
        import torch
        import torch.distributed as dist
        from notebook_accel import PartialState
        PartialState()  # the pool's group is up already; a one-off launch makes its own
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item()

    def read_data():
        return data

    import os
""")


SHARED_WORKERS = True  # the module's pool outlives each test: conftest checks for leaks per module


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(num_processes=2) as pool:
        yield pool


def test_state_and_process_group_stay_across_runs(pool, capfd):
    assert pool.run(CELLS["load"], 5) == "loaded"
    assert "[rank 0] loaded 5" in capfd.readouterr().out
    first = pool.run(CELLS["total"])
    second = pool.run(CELLS["total"])
    assert first[0] == second[0] == 21.0  # (10 + 0) + (10 + 1): each rank its own `data`
    assert first[1:] == second[1:]  # the same process group object, in the same process
    assert "data" in pool.names


def test_a_name_living_on_the_workers_wins_over_the_notebooks_copy(pool):
    pool.run(CELLS["load"], 3)
    shadowing = notebook("""
        import torch
        data = "the notebook's copy"
        def read_data():
            return data
    """)
    assert pool.run(shadowing["read_data"]).tolist() == [0, 1, 2]


def test_names_are_those_living_on_every_rank_after_a_run_on_some_ranks(pool):
    """A run on rank 1 only assigns a name there: ``pool.names`` (what a cell on every rank
    can read) does not list it, ``names_on(1)`` does, and what a replacement loses does."""
    cells = notebook("""
        def only_here():
            global only_on_one
            only_on_one = 1

        def everywhere():
            global on_both
            on_both = 2
    """)
    pool.run(cells["everywhere"])
    pool.run_on(1, cells["only_here"])
    assert "on_both" in pool.names and "only_on_one" not in pool.names
    assert "only_on_one" in pool.names_on(1) and "only_on_one" not in pool.names_on([0])
    assert "on_both" in pool.names_on(1)
    assert "only_on_one" in pool.lost and "on_both" in pool.lost


def test_return_all_and_status(pool):
    pids = [info.pid for info in pool.status()]
    assert len(pids) == 2 and all(info.alive and info.rss for info in pool.status())
    import fcntl  # a run's payload goes into every rank's commands pipe at once: 1 MiB each
    assert all(fcntl.fcntl(h.commands_fd, getattr(fcntl, "F_GETPIPE_SZ", 1032)) == 1 << 20
               for h in pool._current.workers.handles)
    assert pool.run(CELLS["reduce_rank"]) == 3.0
    assert {info.pid for info in pool.status()} == set(pids)


def test_notebook_launcher_works_while_a_pool_is_up(pool):
    from notebook_accel import last_launch

    assert notebook_launcher(CELLS["reduce_rank"], num_processes=2) == 3.0
    assert last_launch().warm_pool is False  # the live view's header: "fresh workers"
    assert pool.run(CELLS["reduce_rank"]) == 3.0
    assert last_launch().warm_pool is True  # "on the warm pool"


def test_restart_drops_the_state_and_close_leaves_nothing():
    pool = WorkerPool(num_processes=2)
    pool.run(CELLS["load"], 2)
    old = {info.pid for info in pool.status()}
    pool.restart()
    assert not {info.pid for info in pool.status()} & old
    with pytest.raises(Exception, match="data"):
        pool.run(CELLS["read_data"])
    pool.close()
    pool.close()  # idempotent
    assert not any(psutil.pid_exists(pid) for pid in old)
    with pytest.raises(RuntimeError, match="closed; create a new one"):
        pool.run(CELLS["reduce_rank"])


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"num_proceses": 2}, TypeError, "unknown option 'num_proceses'; did you mean 'num_processes'"),
    ({"num_processes": 0}, ValueError, "num_processes"),
    ({"num_nodes": 2}, ValueError, "several nodes only on a Ray cluster; give cluster="),
    ({"node_rank": 1}, TypeError, "one kernel drives every node"),
    ({"mixed_precision": "fp9"}, ValueError, "bf16"),
])
def test_bad_options_are_refused_before_anything_starts(options, error, match):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(error, match=match):
        WorkerPool(**options)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_pool_without_heal_whose_workers_died_while_idle_is_replaced_at_the_next_run(capfd):
    """heal=False keeps the one rule for workers that died, idle or mid-run: every worker
    replaced, and what was lost said (a heal: tests/runtime/test_pool_heal.py)."""
    with WorkerPool(num_processes=2, heal=False) as pool:
        pool.run(CELLS["load"], 2)
        victim = pool.status()[1].pid
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while pool.status()[1].alive and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.names == () and pool.lost == ("data",)  # nothing lives on dead workers
        with pytest.raises(TypeError, match="not callable"):
            pool.run(42)
        capfd.readouterr()
        assert pool.run(CELLS["reduce_rank"]) == 3.0
        err = capfd.readouterr().err
        assert ("the pool's workers were replaced (rank 1 was killed by SIGKILL while idle; "
                in err) and "their state was lost: data" in err
        assert victim not in {info.pid for info in pool.status()}
        with pytest.raises(Exception, match="data"):
            pool.run(CELLS["read_data"])


def _script(body: str) -> subprocess.Popen:
    code = "from notebook_accel import WorkerPool, notebook_launcher\n" + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.getcwd()))


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_pool_left_open_is_closed_at_interpreter_exit():
    proc = _script("""
        pool = WorkerPool(num_processes=2)
        print(*[info.pid for info in pool.status()], flush=True)
    """)
    pids = [int(pid) for pid in proc.stdout.readline().split()]
    assert proc.wait(30) == 0 and len(pids) == 2
    assert _gone_within(pids, 5)


def test_workers_die_with_the_kernel_even_holding_the_gil():
    """SIGKILL the kernel: the pool's workers, and a one-off worker stuck holding the GIL
    (its watchdog thread cannot run), are gone within 15 s (PR_SET_PDEATHSIG)."""
    proc = _script("""
        import os, threading
        pool = WorkerPool(num_processes=2)
        print(*[info.pid for info in pool.status()], flush=True)
        def hold_the_gil():
            import ctypes
            print(os.getpid(), flush=True)
            ctypes.PyDLL(None).sleep(600)  # a C call that keeps the GIL
        notebook_launcher(hold_the_gil, num_processes=1, output="all")
    """)
    pids = [int(pid) for pid in proc.stdout.readline().split()]
    stuck = proc.stdout.readline()
    pids.append(int(stuck.split()[-1]))
    time.sleep(0.5)
    proc.kill()
    proc.wait(10)
    assert _gone_within(pids, 15)


LOAD = notebook("""
    import os, time

    def flood(megabytes):
        line = b"x" * 1023 + b"\\n"
        for _ in range(megabytes * 1024):
            os.write(1, line)  # C-level output, as a library's would be
        return megabytes

    def nap(seconds):
        time.sleep(seconds)

    def noop():
        return None
""")


def test_ten_megabytes_of_output_per_rank_stream_without_blocking_the_workers(pool, capfd):
    start = time.monotonic()
    assert pool.run(LOAD["flood"], 10) == 10
    assert time.monotonic() - start < 20
    assert "not shown: too much output" in capfd.readouterr().out
    assert pool.run(CELLS["reduce_rank"]) == 3.0


def test_a_run_past_its_timeout_is_stopped_and_the_pool_stays():
    with WorkerPool(num_processes=2, timeout=1.0) as pool:
        pids = [info.pid for info in pool.status()]
        start = time.monotonic()
        with pytest.raises(Exception, match="timed out after"):
            pool.run(LOAD["nap"], 30)
        assert time.monotonic() - start < 1.0 + 3.0
        assert [info.pid for info in pool.status()] == pids
        assert pool.run(CELLS["reduce_rank"]) == 3.0


def test_five_hundred_runs_leave_fds_threads_and_memory_flat(pool):
    def snapshot():
        me = psutil.Process()
        workers = [psutil.Process(info.pid) for info in pool.status()]
        return (me.num_fds(), me.num_threads(), [w.num_fds() for w in workers],
                [w.num_threads() for w in workers],
                [p.memory_info().rss for p in (me, *workers)])

    for _ in range(50):
        pool.run(LOAD["noop"])
    before = snapshot()
    for _ in range(500):
        pool.run(LOAD["noop"])
    after = snapshot()
    assert after[:4] == before[:4], (before, after)
    assert all(a - b < 8 << 20 for a, b in zip(after[4], before[4], strict=True)), (before, after)


SHARED = notebook("""
    def touch(t):
        import psutil
        import torch.distributed as dist
        from notebook_accel import PartialState
        PartialState()  # the pool's group is up already; a one-off launch makes its own
        before = psutil.Process().memory_full_info().uss
        total = float(t.sum())  # reads every page
        dist.barrier()  # both ranks mapped them all: a page only one rank maps counts as its own
        grown = psutil.Process().memory_full_info().uss - before
        dist.barrier()
        if dist.get_rank() == 1:
            t[0] = 5.0  # a write: this rank's own page from now on
        dist.barrier()
        return total, grown, float(t[0])
""")


@pytest.mark.parametrize("launch", ["pool", "notebook_launcher"])
def test_a_big_tensor_reaches_the_workers_as_one_shared_copy(launch):
    import torch

    size = 256 << 20
    big = torch.ones(size // 4)
    if launch == "pool":
        with WorkerPool(num_processes=2, return_all=True) as pool:
            fds = psutil.Process().num_fds()
            results = pool.run(SHARED["touch"], big)
            assert psutil.Process().num_fds() == fds  # the memory files are closed
    else:
        notebook_launcher(SHARED["touch"], (torch.ones(4),), num_processes=2)  # warm-up
        fds = psutil.Process().num_fds()
        results = notebook_launcher(SHARED["touch"], (big,), num_processes=2, return_all=True)
        assert psutil.Process().num_fds() == fds
    assert [total for total, _, _ in results] == [size / 4] * 2
    # the pages were mapped, not copied: reading them all made neither worker's own memory grow
    assert all(grown < size / 10 for _, grown, _ in results), results
    assert [first for _, _, first in results] == [1.0, 5.0]  # copy-on-write: each its own value
    assert big[0].item() == 1.0


def test_a_pool_started_from_a_thread_outlives_that_thread():
    import threading

    made = []
    thread = threading.Thread(target=lambda: made.append(WorkerPool(num_processes=2)))
    thread.start()
    thread.join()
    with made[0] as pool:
        time.sleep(0.5)
        assert pool.run(CELLS["reduce_rank"]) == 3.0
