"""A warm pool across the two nodes of a real Ray cluster: state and process group kept."""

from __future__ import annotations

import pytest

from notebook_accel import WorkerError
from notebook_accel.launch.pool import WorkerPool
from tests.cluster import checks

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
