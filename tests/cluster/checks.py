"""What the cluster tests check with a plain address and with a Ray Client address alike: the
ranks' jobs (shipped to the workers by reference, so importable here) and the timed checks."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable

import psutil
import pytest

from notebook_accel import WorkerError
from tests.runtime.test_pool import notebook


def crash_on_node_b():
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise RuntimeError("boom on node B")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1
    time.sleep(60)


def print_pid_and_wait():
    import os
    import time

    print(f"pid={os.getpid()}", flush=True)
    time.sleep(60)


def wait_in_a_collective():
    import os
    import time

    import torch
    import torch.distributed as dist

    print(f"pid={os.getpid()}", flush=True)
    dist.init_process_group("gloo")
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)


def remember():
    global value  # noqa: PLW0603 - stays on the worker for the next run
    import os

    value = int(os.environ["RANK"]) + 1


def sum_remembered():
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(value)])  # noqa: F821 - defined by remember on the worker
    dist.all_reduce(total)
    return total.item()


def reduce_in_a_loop():
    """Counts all_reduce rounds in this rank's globals, until stopped (the stop button's cut)."""
    import torch
    import torch.distributed as dist

    global rounds
    rounds = globals().get("rounds", 0)
    while True:
        dist.all_reduce(torch.ones(1))
        rounds += 1
        time.sleep(0.002)


def look_rounds():
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    return os.getpid(), rounds, t.item()


def nothing():
    return None


def pids(text: str) -> list[int]:
    """The pids the ranks printed (``pid=N``)."""
    return [int(p) for p in re.findall(r"pid=(\d+)", text)]


def _gone(found: list[int]) -> None:
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) for pid in found) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in found if psutil.pid_exists(pid)]


def check_a_crash_on_node_b_is_named_within_2s(launch: Callable[[Callable], object]) -> None:
    """``launch(crash_on_node_b)``: rank 1 (node B) is named with its traceback within 2 s."""
    with pytest.raises(WorkerError) as caught:
        launch(crash_on_node_b)
    took = time.time() - caught.value.failure.timestamp
    assert caught.value.rank == 1
    message = str(caught.value)
    assert message.startswith("rank 1 on node 1 (127.0.0."), message
    assert "failed: RuntimeError: boom on node B" in message
    assert "raise RuntimeError" in caught.value.remote_traceback
    assert took < 2.0, f"{took:.2f} s from the crash to the error"


def check_the_stop_button(launch: Callable[[Callable], object], capsys) -> None:
    """``launch(print_pid_and_wait)`` interrupted once both ranks run: every rank stopped within
    2 s, none left, and the kernel's own SIGINT handler in force afterwards."""
    handler = signal.getsignal(signal.SIGINT)
    pressed: list[float] = []
    found: list[int] = []

    def press() -> None:
        deadline = time.monotonic() + 60
        while len(found) < 2 and time.monotonic() < deadline:
            found.extend(pids(capsys.readouterr().out))
            time.sleep(0.1)
        time.sleep(0.5)
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    capsys.readouterr()
    presser = threading.Thread(target=press)
    presser.start()
    with pytest.raises(KeyboardInterrupt):
        launch(print_pid_and_wait)
    took = time.monotonic() - pressed[0]
    presser.join()
    assert took < 2.0, f"{took:.2f} s from the interrupt to the stop"
    assert signal.getsignal(signal.SIGINT) is handler
    assert len(found) == 2
    _gone(found)


def check_losing_node_b(cluster, launch: Callable[[Callable], object], capfd, after: float) -> None:
    """Node B's raylet killed ``after`` s into ``launch(wait_in_a_collective)``: the job fails within
    10 s naming node B (which holds rank 0 or 1, as the placement put it), and no rank is left."""
    lost: list[float] = []

    def kill_raylet() -> None:
        time.sleep(after)  # the ranks are in their collectives by then (agents are warm)
        lost.append(time.monotonic())
        cluster.nodes[1].raylet().kill()

    killer = threading.Thread(target=kill_raylet)
    killer.start()
    with pytest.raises(WorkerError) as caught:
        launch(wait_in_a_collective)
    took = time.monotonic() - lost[0]
    killer.join()
    # (its hub may report the rank's SIGKILL, the node's end, just before its link ends)
    assert re.match(r"rank (\d) on node \1 \(127\.0\.0\.2\) (ended without an exit status|was killed "
                    "by SIGKILL): its node or its Ray worker was lost", str(caught.value)), str(caught.value)
    assert took < 10.0, f"{took:.2f} s from losing node B to the error"
    found = pids(capfd.readouterr().out)
    assert len(found) == 2
    _gone(found)


def check_a_pool_keeps_state_across_the_nodes(pool, label: str) -> None:
    """A name a run assigns stays on each rank for the next run, whose all_reduce crosses the
    nodes; prints the median of 20 empty cells (``label`` says which address)."""
    import statistics

    pool.run(remember)
    assert pool.run(sum_remembered) == 3.0  # 1 + 2, across the nodes, from kept state
    times = []
    for _ in range(20):
        started = time.perf_counter()
        pool.run(nothing)
        times.append(time.perf_counter() - started)
    print(f"pool cell across 2 nodes ({label}): median {statistics.median(times) * 1e3:.1f} ms")


CELLS = notebook("""
    import os

    def remember_alike():
        global kept
        kept = {"lr": 0.1}

    def look_alike():
        import torch
        import torch.distributed as dist
        total = torch.ones(1)
        dist.all_reduce(total)
        return os.getpid(), kept, total.item()
""")  # in the notebook's own name (``__main__``): names the pool's namespace holds and a heal copies


def wait_until_seen_dead(pool, rank: int, within: float = 10.0) -> None:
    """Until the kernel knows ``rank`` ended (a cluster rank's end comes over its node's link)."""
    deadline = time.monotonic() + within
    while pool.status()[rank].alive:
        assert time.monotonic() < deadline, f"rank {rank}'s end never reached the kernel"
        time.sleep(0.05)
