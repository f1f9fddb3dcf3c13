"""The cluster tests share one 2-node loopback cluster per module (see tests/cluster_harness.py)."""

from __future__ import annotations

import time

import pytest

from tests.cluster_harness import start_cluster

ray = pytest.importorskip("ray", reason="the cluster tests need the ray extra")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two raylets (127.0.0.1, 127.0.0.2; 1 CPU each); this process connects as the driver."""
    from notebook_accel.launch import placement

    local = start_cluster(tmp_path_factory.mktemp("ray"))
    try:
        placement.connect(local.address)
        deadline = time.monotonic() + 60
        while sum(1 for node in ray.nodes() if node["Alive"]) < len(local.nodes):
            assert time.monotonic() < deadline, "node B did not join the cluster"
            time.sleep(0.2)
        local.resolve_addresses()
        yield local
    finally:
        placement.disconnect()
        local.stop()
