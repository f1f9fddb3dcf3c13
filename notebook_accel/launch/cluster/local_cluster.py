"""A throwaway Ray cluster on this machine, to try ``cluster=`` without one (demos, tests,
benchmarks): a head on 127.0.0.1 and more nodes on 127.0.0.2, 127.0.0.3..., each its own raylet.

Every process is stopped by the pid this kernel started (never ``ray stop``, which stops every
Ray process of the machine by name). Ray replaces the head's 127.0.0.1 with this machine's
address when it has another interface; :attr:`Node.address` is the one Ray uses.

Example:
    >>> with start_local_cluster(nodes=2) as cluster:  # doctest: +SKIP
    ...     notebook_launcher(train, num_nodes=2, cluster=cluster.address)
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from notebook_accel.launch.handoff.ports import free_port


@dataclass
class Node:
    """One raylet of the cluster: ``ray start --block`` and everything under it."""

    address: str
    process: subprocess.Popen

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def raylet(self) -> psutil.Process:
        return next(p for p in self.tree() if p.name() == "raylet")

    def stop(self) -> None:
        for proc in reversed(self.tree()):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@dataclass
class LocalCluster:
    """The cluster's address (for ``cluster=``) and its nodes; :meth:`stop` ends it."""

    address: str
    nodes: list[Node] = field(default_factory=list)
    logs: Path | None = None

    def memory(self) -> int:
        """Bytes of memory every process of every node holds (their PSS: shared pages counted
        once, split between their sharers)."""
        total = 0
        for node in self.nodes:
            for proc in node.tree():
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_full_info().pss
        return total

    def stop(self) -> None:
        """Leave the cluster (this kernel's placements included), then stop every node."""
        from notebook_accel.launch.cluster import placement

        if placement.connected() == self.address:
            placement.disconnect()
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _start(args: list[str], cpus: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the nodes' collectives stay on loopback
    # The head's Ray Client server forks one server per client while gRPC threads run; gRPC's
    # fork handlers then can crash the child as it starts (docs/cluster.md, Ray Client)
    env.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
    ray = str(Path(sys.executable).with_name("ray"))
    with open(log, "w") as out:
        return subprocess.Popen([ray, "start", "--block", f"--num-cpus={cpus}",
                                 "--disable-usage-stats", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def start_local_cluster(nodes: int = 2, cpus_per_node: int = 1, timeout: float = 120.0,
                        logs: Path | None = None, client: bool = False) -> LocalCluster:
    """Start a head and ``nodes - 1`` more nodes on loopback addresses; returns once every node
    has joined and this kernel is connected (as ``cluster=`` would connect it).

    With ``client`` the kernel connects through the head's Ray Client server, and
    :attr:`LocalCluster.address` is its ``ray://`` address (as for a cluster outside the
    kernel's network).

    Raises:
        RuntimeError: a node did not start within ``timeout`` seconds (its log is named).
    """
    from notebook_accel.launch.cluster import placement

    logs = Path(logs or tempfile.mkdtemp(prefix="notebook_accel_ray_"))
    port, client_port = free_port(), free_port()
    gcs = f"127.0.0.1:{port}"
    cluster = LocalCluster(f"ray://127.0.0.1:{client_port}" if client else gcs, logs=logs)
    deadline = time.monotonic() + timeout
    try:
        serve_clients = [f"--ray-client-server-port={client_port}"] if client else []
        head = _start(["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                       "--include-dashboard=false", *serve_clients], cpus_per_node,
                      logs / "head.log")
        cluster.nodes.append(Node("127.0.0.1", head))
        for head_port in (port, client_port) if client else (port,):
            while True:
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", head_port), timeout=0.5).close()
                    break
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray head did not start; see {logs / 'head.log'}")
                time.sleep(0.2)
        for index in range(1, nodes):
            address = f"127.0.0.{index + 1}"
            cluster.nodes.append(Node(address, _start(
                [f"--address={gcs}", f"--node-ip-address={address}"], cpus_per_node,
                logs / f"node{index}.log")))
        ray = placement.connect(cluster.address)
        while len(alive := [n for n in ray.nodes() if n["Alive"]]) < nodes:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{nodes - len(alive)} node(s) did not join; see {logs}")
            time.sleep(0.2)
    except BaseException:
        cluster.stop()
        raise
    others = {node.address for node in cluster.nodes[1:]}
    head_address = {n["NodeManagerAddress"] for n in alive} - others
    if len(head_address) == 1:
        cluster.nodes[0].address = head_address.pop()
    return cluster
