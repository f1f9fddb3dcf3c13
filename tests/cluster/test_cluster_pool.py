"""A warm pool across the two nodes of a real Ray cluster: state and process group kept."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from notebook_accel import WorkerError
from notebook_accel.launch.pools.pool import WorkerPool
from tests.cluster import checks
from tests.runtime import test_collective_hangs as collective_hangs

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the cluster's raylets and placed agents live for the whole module


def _fail_on_rank_1():
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("bad on rank 1")


def test_a_pool_across_two_nodes_keeps_state_and_its_group(cluster):
    with WorkerPool(num_processes=1, num_nodes=2, cluster=cluster.address) as pool:
        checks.check_a_pool_keeps_state_across_the_nodes(pool, "plain address")
        with pytest.raises(WorkerError, match=r"^rank 1 on node 1 .* failed: ValueError: bad"):
            pool.run(_fail_on_rank_1)
        assert pool.run(checks.sum_remembered) == 3.0  # the failed run broke no collective


def test_the_stop_button_keeps_a_pool_across_two_nodes(cluster):
    """Issue 30 across nodes: pressed at random moments of a loop of collectives, every rank stops
    at the same point: the same processes, the same round on both, the next all_reduce right."""
    rng = random.Random(30)
    with WorkerPool(num_processes=1, num_nodes=2, cluster=cluster.address, return_all=True) as pool:
        first = None
        for _ in range(5):
            timer = threading.Timer(rng.uniform(0.3, 0.8), os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            started = time.monotonic()
            with pytest.raises(KeyboardInterrupt, match="at the same point; the pool keeps its state"):
                pool.run(checks.reduce_in_a_loop)
            timer.join()
            assert time.monotonic() - started < 0.8 + 2.0
            looks = pool.run(checks.look_rounds)
            assert looks[0][1] == looks[1][1] > 0 and [look[2] for look in looks] == [3.0, 3.0], looks
            if first is None:
                first = [look[0] for look in looks]
            assert [look[0] for look in looks] == first  # the same processes on both nodes


def _rank_1_speaks_later():
    import os
    import threading
    import time

    if os.environ["RANK"] == "1":  # its line comes while the next run holds rank 0 alone
        threading.Thread(target=lambda: (time.sleep(0.5), print("rank 1, between runs", flush=True)),
                         daemon=True).start()


def _a_while_on_this_rank():
    import os
    import time

    time.sleep(1.5)
    return int(os.environ["RANK"])


def test_a_run_on_one_rank_while_another_node_speaks_keeps_that_news_for_later(cluster, capfd):
    """Both nodes share one inbox in the kernel: a run on rank 0 alone must leave rank 1's line
    (news of a rank outside the run) for the next run, not fail on it."""
    with WorkerPool(num_processes=1, num_nodes=2, cluster=cluster.address, return_all=True) as pool:
        pool.run(_rank_1_speaks_later)
        assert pool.run_on([0], _a_while_on_this_rank) == [0]
        assert pool.run(_a_while_on_this_rank) == [0, 1]
    assert "rank 1, between runs" in capfd.readouterr().out


def test_a_pools_collectives_and_its_hang_are_read_through_the_nodes_hubs(cluster, capsys):
    """Issue 47 on a cluster pool: ``pool.collectives()`` asks each rank through its node's hub
    (ranks alike share a column), and a hang names the collectives the ranks disagree on."""
    with WorkerPool(num_processes=1, num_nodes=2, cluster=cluster.address, hang_after=1,
                    timeout=8, stop_wait=1) as pool:
        pool.run(collective_hangs.collectives_then_a_sub_group)
        table = pool.collectives(last=2).splitlines()
        assert table[0] == "group default (the last 2):" and table[1].split() == ["#", "ranks", "0,", "1"]
        assert "all_reduce float32[3]" in table[2] and "broadcast int64[2,2]" in table[3], table
        capsys.readouterr()
        started = time.monotonic()
        with pytest.raises(WorkerError, match="timed out"):
            pool.run(collective_hangs.different_collectives_at_the_same_number)
        assert time.monotonic() - started < 20
    collective_hangs.assert_names_both(collective_hangs.said(capsys.readouterr().err))


def test_a_dead_rank_is_forked_again_by_its_nodes_hub_and_the_pool_heals(cluster, capfd):
    """Issue 44 on a cluster: rank 1 (node 1) SIGKILLed, then rank 0 (node 0, the store's host):
    each time the next run heals in place, its node's hub forking the rank again; the name held
    alike is restored on it, the other rank is the same process, all_reduce gives the world."""
    with WorkerPool(num_processes=1, num_nodes=2, cluster=cluster.address, return_all=True) as pool:
        pool.run(checks.CELLS["remember_alike"])
        for victim in (1, 0):
            pids = [info.pid for info in pool.status()]
            os.kill(pids[victim], signal.SIGKILL)
            checks.wait_until_seen_dead(pool, victim)
            capfd.readouterr()
            looks = pool.run(checks.CELLS["look_alike"])
            said = capfd.readouterr().err  # a script's information: stderr
            assert (f"rank {victim} was killed by SIGKILL while idle. The pool healed: rank "
                    f"{victim} was replaced") in said, said
            assert "restored from rank" in said and "kept" in said, said
            assert [look[1:] for look in looks] == [({"lr": 0.1}, 2.0)] * 2
            assert looks[1 - victim][0] == pids[1 - victim]  # the other rank: the same process
            assert looks[victim][0] != pids[victim] and pool.status()[victim].pid == looks[victim][0]
