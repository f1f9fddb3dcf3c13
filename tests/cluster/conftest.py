"""The cluster tests share one 2-node loopback cluster per module (see tests/cluster_harness.py)."""

from __future__ import annotations

import pytest

from tests.cluster_harness import private_network

pytest.importorskip("ray", reason="the cluster tests need the ray extra")


def _local_cluster(tmp_path_factory, client: bool):
    from notebook_accel.launch import start_local_cluster

    with private_network():
        local = start_local_cluster(nodes=2, logs=tmp_path_factory.mktemp("ray"), client=client)
        try:
            yield local
        finally:
            local.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two raylets (127.0.0.1, 127.0.0.2; 1 CPU each); this process is connected as the driver."""
    yield from _local_cluster(tmp_path_factory, client=False)


@pytest.fixture(scope="module")
def client_cluster(tmp_path_factory):
    """The same, with this process connected through the head's Ray Client server: its
    ``address`` is ``ray://127.0.0.1:<port>``."""
    yield from _local_cluster(tmp_path_factory, client=True)
