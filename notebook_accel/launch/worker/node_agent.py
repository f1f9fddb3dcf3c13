"""A node's agent on a Ray cluster: the actor that forks the ranks placed on its node.

The kernel places one agent per rank (a Ray actor in the job's placement group, see
``launch/backends/cluster.py``); Ray starts it, keeps it, and tells the kernel when it or its
node dies. The agent imports torch once; each launch forks a fresh worker from it, which
runs our own worker runtime (:func:`.main.worker_main`) with its four channels (and a fifth,
*alive*) as TCP connections back to the kernel, each opened with the launch's secret token.
The worker dies with its agent (``PR_SET_PDEATHSIG``) and when the kernel closes *alive*.

This module imports nothing of Ray: the kernel wraps :class:`NodeAgent` in ``ray.remote``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from multiprocessing.connection import Connection

from notebook_accel.launch.payload import Payload
from notebook_accel.launch.ports import free_port
from notebook_accel.launch.worker.main import WorkerPipes, WorkerSpec, worker_main
from notebook_accel.launch.worker.serve import serve_main

CHANNELS = ("alive", "stdout", "stderr", "control", "events", "commands")  # the order opened
RUN_CHANNELS = CHANNELS[:-1]  # a one-off run's worker: all but a pool worker's commands
HELLO = struct.Struct("!32sIB")  # token, global rank, channel index


def hello(token: bytes, rank: int, channel: str) -> bytes:
    """The first bytes a worker sends on each of its connections to the kernel."""
    return HELLO.pack(token, rank, CHANNELS.index(channel))


class NodeAgent:
    """Forks, signals and waits for the workers of one rank slot on this node."""

    def __init__(self) -> None:
        import torch  # noqa: F401 - paid once per agent, not per launch

    def where(self) -> tuple[str, int, list[str]]:
        """This node's address (as Ray knows it), the agent's pid and the GPUs Ray gave it."""
        import ray

        return ray.util.get_node_ip_address(), os.getpid(), [str(g) for g in ray.get_gpu_ids()]

    def free_port(self, host: str) -> int:
        """A port free on ``host`` now (rank 0's rendezvous store binds it next)."""
        return free_port(host)

    def start(self, spec: WorkerSpec, payload: Payload | None, kernel: tuple[str, int],
              token: bytes) -> int:
        """Fork the worker of ``spec``; returns its pid. Without a payload it is a warm pool's
        worker: it serves the runs the kernel sends on its commands channel."""
        spec.parent_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            try:
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the agent's (Ray's) connections
                pipes = _connect(kernel, token, spec.rank, serve=payload is None)
            except BaseException:  # noqa: BLE001 - no kernel to tell: the agent reports the exit
                os._exit(1)
            if payload is None:
                serve_main(spec, None, pipes)
            worker_main(spec, payload, pipes)
        return pid

    def wait(self, pid: int) -> int:
        """Block until worker ``pid`` ends; its exit code (negative: the signal that ended it)."""
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def signal(self, pid: int, sig: int, group: bool = True) -> None:
        """Send ``sig`` to the worker (``group``: and to everything it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                try:
                    os.killpg(pid, sig)  # the worker leads its own session
                    return
                except ProcessLookupError:
                    pass
            os.kill(pid, sig)


def _connect(kernel: tuple[str, int], token: bytes, rank: int, serve: bool) -> WorkerPipes:
    """Open the worker's connections to the kernel, one per channel."""
    ends = {}
    for channel in CHANNELS if serve else RUN_CHANNELS:
        sock = socket.create_connection(kernel, timeout=30)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(hello(token, rank, channel))
        if channel not in ("alive", "commands"):
            sock.shutdown(socket.SHUT_RD)  # output only: the kernel never writes there
        ends[channel] = Connection(sock.detach())
    return WorkerPipes(stdout=ends["stdout"], stderr=ends["stderr"], control=ends["control"],
                       events=ends["events"], alive=ends["alive"], commands=ends.get("commands"))
