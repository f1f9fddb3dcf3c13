"""A node's hub on a Ray cluster: the one actor per node that forks, watches and speaks for the
node's ranks.

The kernel places one hub per node (a Ray actor holding its node's bundle: the CPUs and GPUs of
its ranks, see ``launch/cluster/placement.py``). The hub imports torch once; each launch forks
the node's ranks from it exactly as a local launch forks its workers (``rank_fork.py``: pipes,
the alive watchdog, the parent-death signal), and one thread (``hub_pump.py``) multiplexes them
onto one ordered connection to the kernel, or to its relay for a ``ray://`` address
(``hub_link.py``). A launch costs one Ray call per node. What every rank imports (torch, its
distributed package, ``torch._dynamo``, our runtime) is imported once, in the hub.

This module imports nothing of Ray at import time: the kernel wraps :class:`NodeHub` in
``ray.remote``.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading

from notebook_accel.contract import MASTER_ADDR, MASTER_PORT
from notebook_accel.launch.handoff.payload import Payload
from notebook_accel.launch.handoff.ports import free_port
from notebook_accel.launch.worker.hub.hub_link import hello
from notebook_accel.launch.worker.hub.hub_pump import HubPump
from notebook_accel.launch.worker.hub.rank_fork import fork_ranks
from notebook_accel.launch.worker.main import WorkerSpec


class NodeHub:
    """Starts the node's ranks of each launch and links them to the kernel."""

    def __init__(self) -> None:
        # paid once per node, and shared by its ranks' memory (copy on write), not per rank:
        # torch, torch.distributed, torch._dynamo (a first optimizer's import), our runtime
        importlib.import_module("notebook_accel.launch.worker.warm")
        importlib.import_module("notebook_accel.runtime.state")

    def where(self) -> tuple[str, int, list[str]]:
        """This node's address (as Ray knows it), the hub's pid and the GPUs Ray gave it."""
        import ray

        return ray.util.get_node_ip_address(), os.getpid(), [str(g) for g in ray.get_gpu_ids()]

    def start(self, specs: list[WorkerSpec], payload: Payload | None, kernel: tuple[str, int],
              token: bytes, node: int) -> tuple[list[int], int]:
        """Link to the kernel at ``kernel`` as node ``node``, fork a worker per spec (without a
        payload: a warm pool's workers, serving the runs the kernel sends) and multiplex them;
        returns their pids and the rendezvous port (specs with ``MASTER_PORT`` 0, rank 0's
        node's: one free here now, which rank 0's store binds next)."""
        link = socket.create_connection(kernel, timeout=30)
        try:
            link.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link.sendall(hello(token, node))
            port = _rendezvous_port(specs)
            ranks, alive_w = fork_ranks(specs, payload, serve=payload is None)
        except BaseException:
            link.close()
            raise
        pump = HubPump(link, ranks, alive_w)
        threading.Thread(target=pump.run, name=f"notebook-accel-hub-node{node}", daemon=True).start()
        return [rank.pid for rank in ranks], port


def _rendezvous_port(specs: list[WorkerSpec]) -> int:
    port = int(specs[0].env[MASTER_PORT])
    if port == 0:
        port = free_port(specs[0].env[MASTER_ADDR])
        for spec in specs:
            spec.env[MASTER_PORT] = str(port)
    return port
