"""The static multi-node path (one kernel per node, no cluster): two launches meet and run one
job; a node that never comes fails the launch within the join bound, naming it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from notebook_accel import notebook_launcher
from notebook_accel.launch.handoff.ports import free_port

# 127.0.0.2: a loopback address the plan accepts as "reachable by every node" (not 127.0.0.1).
NODE_ADDR = "127.0.0.2"


def _noop() -> int:
    return 0


def test_main_node_names_the_node_that_never_joins():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"node 1 of 2 did not join within 2 s; start the same "
                                           r"launch there with node_rank=1"):
        notebook_launcher(_noop, num_processes=1, num_nodes=2, node_rank=0, master_addr=NODE_ADDR,
                          use_port=free_port(), timeout=2)
    assert time.monotonic() - start < 10


def test_other_node_names_the_main_node_it_cannot_reach():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"node 0 of 2 .* could not be reached within 2 s; start "
                                           r"the same launch there with node_rank=0"):
        notebook_launcher(_noop, num_processes=1, num_nodes=2, node_rank=1, master_addr=NODE_ADDR,
                          use_port=free_port(), timeout=2)
    assert time.monotonic() - start < 10


NODE_1 = """
import sys
from notebook_accel import notebook_launcher
from tests.runtime.test_static_join import _rank_sum
print("NODE1", notebook_launcher(_rank_sum, num_processes=1, num_nodes=2, node_rank=1,
                                 master_addr=sys.argv[1], use_port=int(sys.argv[2]), timeout=60))
"""


def _rank_sum() -> float:
    """Each node's one rank: the all-reduced sum of the ranks (1.0 when both nodes ran)."""
    import torch

    from notebook_accel import Accelerator

    acc = Accelerator()
    return acc.reduce(torch.tensor([float(acc.process_index)]), "sum").item()


@pytest.mark.slow  # two launches' torch start-ups
def test_two_kernels_join_and_run_one_job(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    port = free_port()
    node_1 = subprocess.Popen([sys.executable, "-c", NODE_1, NODE_ADDR, str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        result = notebook_launcher(_rank_sum, num_processes=1, num_nodes=2, node_rank=0,
                                   master_addr=NODE_ADDR, use_port=port, timeout=60)
    except Exception as exc:  # the other node's side of the story belongs in the failure
        node_1.kill()
        raise AssertionError(f"node 0 failed; node 1 printed:\n{node_1.communicate()[0][-4000:]}") from exc
    try:
        output, _ = node_1.communicate(timeout=60)
    finally:
        node_1.kill()
        node_1.wait()
    assert result == 1.0
    assert node_1.returncode == 0, output[-4000:]
    assert "NODE1 1.0" in output
