"""A Ray Client address (ray://): the workers reach the kernel through the relay on the head
node (launch/cluster/channel_relay.py). The magic's pool from a kernel (and that kernel's death),
results, output, a crash on node B, the stop button, a warm pool and a lost node, on 2 raylets
(127.0.0.1, 127.0.0.2), with nothing left behind."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from notebook_accel import notebook_launcher
from notebook_accel.launch.cluster import placement
from notebook_accel.launch.pools.pool import WorkerPool
from tests.cluster import checks
from tests.kernel_harness import Kernel

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the cluster's raylets and placed agents live for the whole module


def _launch(cluster, function, **options):
    return notebook_launcher(function, num_processes=1, num_nodes=2, cluster=cluster.address,
                             **options)


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (one that ends while it is asked about is not running)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_notebooks_pool_through_the_magic_from_a_kernel_then_the_kernel_dies(client_cluster):
    """First in the module: the kernel is a second Ray Client of the cluster, and its pool
    needs the nodes' CPUs, which this process's placements take later. Its ranks end within
    15 s of the kernel's death (the relay stops hearing its beats); its agents when Ray ends the
    dead client's job, which frees the nodes' CPUs for the next tests."""
    import ray

    kernel = Kernel()
    try:
        kernel.ok("%load_ext notebook_accel")
        started = kernel.ok(f"%accelerate start -n 1 --nodes 2 --cluster {client_cluster.address}",
                            timeout=180)
        assert "pool up: 2 ranks" in started.stdout, started.stdout + started.stderr
        lines = kernel.ok("%%accelerate\nimport os\n"
                          "print('hello from', os.environ['RANK'], os.getpid())").stdout
        assert "[node 0 rank 0] hello from 0" in lines and "[node 1 rank 1] hello from 1" in lines
        ranks = [psutil.Process(int(pid)) for pid in re.findall(r"hello from \d (\d+)", lines)]
        assert len(ranks) == 2, lines
        os.kill(kernel.pid, signal.SIGKILL)
        killed = time.monotonic()
        while alive := [p for p in ranks if _running(p)]:
            assert time.monotonic() - killed < 15, f"ranks {[p.pid for p in alive]} outlived the kernel"
            time.sleep(0.2)
        print(f"the dead kernel's ranks ended after {time.monotonic() - killed:.1f} s")
        while ray.available_resources().get("CPU", 0) < 2:  # the dead client's agents
            assert time.monotonic() - killed < 90, "the dead kernel's agents still hold the CPUs"
            time.sleep(0.5)
    finally:
        kernel.shutdown()


def _relay_and_agents():
    (placed,) = placement._placements.values()
    return placed.relay, placed.pids


def _sum_and_print_lines():
    import sys

    import torch
    import torch.distributed as dist

    rank = os.environ["RANK"]
    for i in range(300):
        print(f"line {rank}:{i}", file=sys.stdout if i % 2 else sys.stderr)
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return value.item(), os.environ["NODE_RANK"]


def test_ranks_on_both_nodes_return_and_print_through_the_relay(client_cluster, capsys):
    assert client_cluster.address.startswith("ray://")
    assert _launch(client_cluster, _sum_and_print_lines, return_all=True) == [(3.0, "0"),
                                                                              (3.0, "1")]
    out, err = capsys.readouterr()
    for rank in (0, 1):
        seen = [int(i) for i in re.findall(rf"^\[node {rank} rank {rank}\] line {rank}:(\d+)$",
                                            out + err, re.MULTILINE)]
        assert sorted(seen) == list(range(300)), f"rank {rank}: {len(seen)} lines"
        odd = [int(i) for i in re.findall(rf"\] line {rank}:(\d+)$", out, re.MULTILINE)]
        assert odd == list(range(1, 300, 2))  # in order per rank and stream
    relay, _ = _relay_and_agents()
    assert relay is not None  # the workers connected to the relay, not to this process


def test_a_pool_across_two_nodes_then_nothing_is_left(client_cluster):
    with WorkerPool(num_processes=1, num_nodes=2, cluster=client_cluster.address) as pool:
        checks.check_a_pool_keeps_state_across_the_nodes(pool, "ray://")
    relay, agents = _relay_and_agents()
    import ray

    deadline = time.monotonic() + 5
    while (ray.get(relay.sessions.remote()) or any(psutil.Process(p).children() for p in agents)):
        assert time.monotonic() < deadline, "a relay session or a worker was left"
        time.sleep(0.1)


def test_a_crash_on_node_b_names_node_rank_and_traceback_within_2s(client_cluster):
    checks.check_a_crash_on_node_b_is_named_within_2s(lambda job: _launch(client_cluster, job))


def test_the_stop_button_stops_every_rank_within_2s(client_cluster, capsys):
    checks.check_the_stop_button(lambda job: _launch(client_cluster, job), capsys)


def test_losing_node_b_fails_the_job_within_10s_naming_it(client_cluster, capfd):
    """Last in the module: node B (127.0.0.2) does not come back."""
    checks.check_losing_node_b(client_cluster, lambda job: _launch(client_cluster, job), capfd, after=5)
