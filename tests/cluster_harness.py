"""Two Ray nodes on this machine: head on 127.0.0.1, node B on 127.0.0.2 (1 CPU each).

As root the cluster and the test process's main thread live in a private network namespace
(only ``lo``), entered with ``unshare(CLONE_NEWNET)`` and left with ``setns`` at the end, so no
traffic can leave; otherwise every node binds its 127.0.0.x address (the head's address is
then the one Ray resolves for this machine). Every process is stopped by the pid we started
(never ``ray stop``, nor by name).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
CLONE_NEWNET = 0x40000000


@dataclass
class Node:
    address: str  # as Ray reports it (see LocalCluster.resolve_addresses)
    process: subprocess.Popen

    def tree(self) -> list[psutil.Process]:
        """The node's processes: ``ray start --block`` and everything under it."""
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
        with contextlib.suppress(ChildProcessError):
            self.process.wait(timeout=10)


@dataclass
class LocalCluster:
    address: str
    nodes: list[Node] = field(default_factory=list)
    netns: int | None = None  # the namespace to return to (fd), when we entered a private one

    def resolve_addresses(self) -> None:
        """Take the nodes' addresses from Ray: outside a private network namespace Ray replaces
        the head's 127.0.0.1 with this machine's address."""
        import ray

        nodes = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        head = nodes - {node.address for node in self.nodes[1:]}
        if len(head) == 1:
            self.nodes[0].address = head.pop()

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        if self.netns is not None:
            _libc().setns(self.netns, CLONE_NEWNET)
            os.close(self.netns)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _private_network() -> int | None:
    """Enter a network namespace holding only ``lo`` (root only); the fd of the old one."""
    if os.geteuid() != 0:
        return None
    old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    if _libc().unshare(CLONE_NEWNET) != 0:
        os.close(old)
        return None
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    return old


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", GLOO_SOCKET_IFNAME="lo")
    with open(log, "w") as out:
        return subprocess.Popen([RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats",
                                 *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def start_cluster(log_dir: Path, nodes: int = 2, timeout: float = 90.0) -> LocalCluster:
    """Start the head (127.0.0.1) and ``nodes - 1`` more (127.0.0.2, ...); wait until all joined."""
    netns = _private_network()
    port = _free_port("127.0.0.1")
    cluster = LocalCluster(f"127.0.0.1:{port}", netns=netns)
    try:
        head = _start(["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                       "--include-dashboard=false"], log_dir / "head.log")
        cluster.nodes.append(Node("127.0.0.1", head))
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not start: {(log_dir / 'head.log').read_text()}")
            time.sleep(0.2)
        for index in range(1, nodes):
            address = f"127.0.0.{index + 1}"
            cluster.nodes.append(Node(address, _start(
                [f"--address={cluster.address}", f"--node-ip-address={address}"],
                log_dir / f"node{index}.log")))
        wait_for_nodes(cluster, nodes, deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def wait_for_nodes(cluster: LocalCluster, count: int, deadline: float) -> None:
    """Wait until ``count`` raylets are up (each runs its node's processes)."""
    while sum(1 for node in cluster.nodes if any(p.name() == "raylet" for p in node.tree())) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the Ray nodes did not start in time")
        time.sleep(0.2)


def kill(proc: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(signal.SIGKILL)
