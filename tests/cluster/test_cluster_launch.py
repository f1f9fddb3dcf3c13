"""notebook_launcher on a real 2-node Ray cluster (127.0.0.1 and 127.0.0.2, 1 CPU each):
results, environment, output, collectives across nodes, failures, the stop button."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from notebook_accel import WorkerError, notebook_launcher
from tests.cluster import checks
from tests.runtime import test_collective_hangs as collective_hangs

pytestmark = pytest.mark.slow
SHARED_WORKERS = True  # the cluster's raylets and placed agents live for the whole module


def _launch(cluster, function, **options):
    return notebook_launcher(function, num_processes=1, num_nodes=2, cluster=cluster.address,
                             **options)


def _environment_and_sum():

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    names = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
             "MASTER_ADDR", "ACCELERATE_TORCH_DEVICE", "NOTEBOOK_ACCEL_DEVICE")
    env = {name: os.environ.get(name) for name in names}
    dist.destroy_process_group()
    return value.item(), env


def test_ranks_on_both_nodes_all_reduce_and_return(cluster):
    first, second = _launch(cluster, _environment_and_sum, return_all=True)
    assert first[0] == second[0] == 3.0  # 1 + 2, summed across the two nodes
    for rank, (_, env) in enumerate((first, second)):
        assert env["RANK"] == env["NODE_RANK"] == env["GROUP_RANK"] == str(rank)
        assert (env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("0", "2", "1")
        assert env["NOTEBOOK_ACCEL_DEVICE"] == env["ACCELERATE_TORCH_DEVICE"] == "cpu"
    assert first[1]["MASTER_ADDR"] == second[1]["MASTER_ADDR"]
    assert first[1]["MASTER_ADDR"] in [node.address for node in cluster.nodes]  # rank 0's node
    value, _ = _launch(cluster, _environment_and_sum)  # warm: rank 0's value only
    assert value == 3.0


def _numbered_lines():
    import sys

    rank = os.environ["RANK"]
    for i in range(1000):
        print(f"line {rank}:{i}", file=sys.stdout if i % 2 else sys.stderr)


def test_every_line_of_every_rank_arrives_once_in_order(cluster, capsys):
    _launch(cluster, _numbered_lines)
    out, err = capsys.readouterr()
    for rank in (0, 1):
        seen = [int(i) for i in re.findall(rf"^\[node {rank} rank {rank}\] line {rank}:(\d+)$",
                                            out + err, re.MULTILINE)]
        assert sorted(seen) == list(range(1000)), f"rank {rank}: {len(seen)} lines"
        odd = [int(i) for i in re.findall(rf"\] line {rank}:(\d+)$", out, re.MULTILINE)]
        assert odd == list(range(1, 1000, 2))  # in order per rank and stream


def test_a_crash_on_node_b_names_node_rank_and_traceback_within_2s(cluster):
    checks.check_a_crash_on_node_b_is_named_within_2s(lambda job: _launch(cluster, job))


def _killed_by_signal():
    import time

    if os.environ["RANK"] == "1":
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def test_a_rank_killed_on_node_b_is_named_with_its_signal(cluster):
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"^rank 1 on node 1 \(.*\) was killed by SIGKILL"):
        _launch(cluster, _killed_by_signal)
    assert time.monotonic() - started < 5.0


def test_a_job_the_cluster_cannot_place_is_refused_naming_what_is_missing(cluster):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"num_nodes=3 .*needs 3 nodes with 1 CPU each, and 2 "
                                           r"of its 2 alive nodes"):
        notebook_launcher(print, num_processes=1, num_nodes=3, cluster=cluster.address)
    with pytest.raises(RuntimeError, match=r"needs 2 nodes with 2 CPU each, and 0 of its"):
        notebook_launcher(print, num_processes=2, num_nodes=2, cluster=cluster.address)
    assert time.monotonic() - started < 30


def _crash_once(marker):
    from pathlib import Path

    if os.environ["RANK"] == "1" and not Path(marker).exists():
        Path(marker).touch()
        raise RuntimeError("first attempt")
    return "second attempt"


def test_max_restarts_recovers_from_a_crashed_rank_within_5s(cluster, tmp_path, capsys):
    started = time.monotonic()
    assert _launch(cluster, _crash_once, args=(str(tmp_path / "crashed"),),
                   max_restarts=1) == "second attempt"
    took = time.monotonic() - started
    assert "rank 1 on node 1" in capsys.readouterr().err
    assert took < 5.0, f"{took:.2f} s for the failed attempt and the restart"


def test_the_stop_button_stops_every_rank_within_2s_and_keeps_the_kernels_handler(cluster, capsys):
    checks.check_the_stop_button(lambda job: _launch(cluster, job), capsys)


def test_a_hang_across_the_nodes_names_the_collectives_the_ranks_disagree_on(cluster, capsys):
    """Issue 47 through the per-node hubs: each hub signals its ranks, whose recorders' lines
    come back over the node links; the block names both operations at the same number."""
    started = time.monotonic()
    with pytest.raises(WorkerError, match="timed out"):
        _launch(cluster, collective_hangs.different_collectives_at_the_same_number, hang_after=1,
                timeout=6, output="all")
    assert time.monotonic() - started < 20
    collective_hangs.assert_names_both(collective_hangs.said(capsys.readouterr().err))


def test_losing_node_b_fails_the_job_within_10s_naming_it_and_leaves_nothing(cluster, capfd):
    """Last in the module: node B does not come back."""
    checks.check_losing_node_b(cluster, lambda job: _launch(cluster, job), capfd, after=8)
