"""The cluster tests share one 2-node loopback cluster per module (see tests/cluster_harness.py)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.cluster_harness import private_network

pytest.importorskip("ray", reason="the cluster tests need the ray extra")


def _local_cluster(tmp_path_factory, client: bool, cpus_per_node: int = 1):
    from notebook_accel.launch import start_local_cluster

    with private_network():
        with _repository_on_the_nodes_path(client):
            local = start_local_cluster(nodes=2, cpus_per_node=cpus_per_node,
                                        logs=tmp_path_factory.mktemp("ray"), client=client)
        try:
            yield local
        finally:
            local.stop()


@contextlib.contextmanager
def _repository_on_the_nodes_path(client: bool):
    """The tests' jobs live in importable modules (``tests.cluster.checks``...), so they travel by
    reference. A local driver gives Ray's workers its ``sys.path``; a Ray Client driver does not
    (a user's modules must be installed on the cluster): the raylets, started here, inherit the
    repository on their ``PYTHONPATH``."""
    saved = os.environ.get("PYTHONPATH")
    if client:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parents[2]), saved]))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two raylets (127.0.0.1, 127.0.0.2; 1 CPU each); this process is connected as the driver."""
    yield from _local_cluster(tmp_path_factory, client=False)


@pytest.fixture(scope="module")
def client_cluster(tmp_path_factory):
    """The same, with this process connected through the head's Ray Client server: its
    ``address`` is ``ray://127.0.0.1:<port>``."""
    yield from _local_cluster(tmp_path_factory, client=True)


@pytest.fixture(scope="module")
def wide_cluster(tmp_path_factory):
    """The same two raylets with 16 CPUs each: room for 16 ranks per node (on 2 real cores)."""
    yield from _local_cluster(tmp_path_factory, client=False, cpus_per_node=16)
