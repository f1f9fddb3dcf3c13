"""The cluster backend: ranks on the nodes of a Ray cluster, driven from this one kernel.

Ray places one agent per rank (``launch/cluster/placement.py``: a placement group spread over the
nodes, ranks numbered node by node), starts and keeps it, and reports its death. Each launch
forks a worker from every agent; the worker runs our own runtime and connects its channels
back to the kernel (``launch/cluster/channel_server.py``), or, for a Ray Client address, to a relay on
the head node that the kernel pumps through Ray (``launch/cluster/channel_relay.py``), so the
supervisor, output relay, views and failure records are the same as for local processes.
Rank 0's node hosts the rendezvous store, on a port that its agent found free there.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from typing import Any

from notebook_accel.contract import NODE_RANK
from notebook_accel.launch.backends.base import Backend, WorkerGroup, WorkerHandle, kill_all
from notebook_accel.launch.cluster import placement
from notebook_accel.launch.cluster.channel_relay import RelayedChannels
from notebook_accel.launch.cluster.channel_server import ChannelServer
from notebook_accel.launch.environment import worker_environment
from notebook_accel.launch.fd_limit import ensure_fd_room
from notebook_accel.launch.payload import Payload
from notebook_accel.launch.plan import LaunchPlan
from notebook_accel.launch.views import in_kernel
from notebook_accel.launch.worker.main import WorkerSpec

CONNECT_TIMEOUT = 60.0  # seconds for every forked worker to connect back


class ClusterHandle(WorkerHandle):
    """A rank forked by its node's agent; its channels are TCP connections to this kernel (or
    sockets pumped from the relay that holds them)."""

    end_grace = 2.0  # separate connections: its last bytes may arrive after its *alive* end

    def __init__(self, rank: int, node: int, address: str, agent: Any, pid: int,
                 channels: dict[str, socket.socket]) -> None:
        self.rank, self.node, self.address = rank, node, address
        self._agent, self._pid, self._channels = agent, pid, channels
        self.stdout_fd = channels["stdout"].fileno()
        self.stderr_fd = channels["stderr"].fileno()
        self.control_fd = channels["control"].fileno()
        self.events_fd = channels["events"].fileno()
        commands = channels.get("commands")
        self.commands_fd = commands.fileno() if commands is not None else None  # a pool worker's
        self.persistent = commands is not None
        self._exitcode: int | None = None
        self._ended = threading.Event()
        self._gave_up = False
        threading.Thread(target=self._wait, name=f"notebook-accel-rank{rank}-exit",
                         daemon=True).start()

    def _wait(self) -> None:
        ray = placement.ray_module()
        try:
            with contextlib.suppress(Exception):  # the agent (or its node) died: no exit status
                self._exitcode = ray.get(self._agent.wait.remote(self._pid))
        finally:
            self._ended.set()

    @property
    def label(self) -> str:
        return f"rank {self.rank} on node {self.node} ({self.address})"

    @property
    def prefix(self) -> str:
        return f"node {self.node} rank {self.rank}"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def sentinel(self) -> int:
        return self._channels["alive"].fileno()  # end of file when the worker is gone

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def describe_end(self) -> str | None:
        if self._exitcode is not None:
            return None
        return "ended without an exit status: its node or its Ray worker was lost"

    def _signal(self, sig: int, group: bool = True) -> None:
        with contextlib.suppress(Exception):
            self._agent.signal.remote(self._pid, int(sig), group)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def interrupt(self) -> None:
        self._signal(signal.SIGINT, group=False)  # a KeyboardInterrupt in the worker only

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self._channels["alive"].shutdown(socket.SHUT_WR)  # the worker's watchdog kills it
        self._signal(signal.SIGKILL)

    @property
    def ended(self) -> bool:
        """Its exit status came, or its agent is gone."""
        return self._ended.is_set()

    def end_commands(self) -> None:
        """Close a pool worker's commands channel: it leaves its serve loop and exits."""
        with contextlib.suppress(OSError, KeyError):
            self._channels["commands"].shutdown(socket.SHUT_WR)

    def dump_stacks(self) -> None:
        self._signal(signal.SIGUSR1, group=False)

    def reap(self, timeout: float) -> None:
        if not self._gave_up and not self._ended.wait(timeout):
            self._gave_up = True  # an agent that did not answer once is not waited for again

    def close(self) -> None:
        for conn in self._channels.values():
            conn.close()


class ClusterGroup(WorkerGroup):
    """The ranks of one launch; closing it stops them (the agents stay placed for the next)."""

    def close(self) -> None:
        kill_all(self.handles, reap_timeout=2.0)
        for handle in self.handles:
            handle.close()
        if any(handle.exitcode is None for handle in self.handles):
            placement.discard(self.plan)  # an agent is lost: place afresh next time


class ClusterBackend(Backend):
    """Ranks on a Ray cluster's nodes (``plan.cluster``)."""

    name = "cluster"

    def check(self, plan: LaunchPlan) -> None:
        placement.check_capacity(plan)

    def start(self, plan: LaunchPlan, payload: Payload) -> ClusterGroup:
        return ClusterGroup(plan, start_ranks(plan, payload))


def start_ranks(plan: LaunchPlan, payload: Payload | None) -> list[ClusterHandle]:
    """Fork one worker per rank from the placed agents (``payload`` None: warm pool workers,
    serving runs from their commands channel); returns their handles once all connected."""
    ensure_fd_room(plan.world_size)
    placed = placement.placement_for(plan)
    ray = placement.ray_module()
    port_ref = placed.agents[0].free_port.remote(placed.addresses[0])
    server = (ChannelServer(ray.util.get_node_ip_address(), plan.world_size, serve=payload is None)
              if placed.relay is None else  # its session opens while the port is found
              RelayedChannels(ray, placed.relay, plan.world_size, serve=payload is None))
    port = ray.get(port_ref)
    payload_ref = ray.put(payload)
    pids: dict[int, int] = {}
    try:
        starts = {
            agent.start.remote(_spec(plan, placed, rank, port), payload_ref, server.address,
                               server.token): rank
            for rank, agent in enumerate(placed.agents)
        }
        channels = server.accept(time.monotonic() + CONNECT_TIMEOUT,
                                 lambda: _collect(ray, starts, pids))
        _collect(ray, starts, pids, wait=True)
    except BaseException:
        for rank, pid in pids.items():
            placed.agents[rank].signal.remote(pid, int(signal.SIGKILL), True)
        placement.discard(plan)
        raise
    finally:
        server.close()
    return [
        ClusterHandle(rank, rank // plan.num_processes, placed.addresses[rank],
                      placed.agents[rank], pids[rank], channels[rank])
        for rank in range(plan.world_size)
    ]


def _spec(plan: LaunchPlan, placed: placement.Placement, rank: int, port: int) -> WorkerSpec:
    node = rank // plan.num_processes
    env = worker_environment(
        rank=rank, local_rank=rank % plan.num_processes, world_size=plan.world_size,
        local_world_size=plan.num_processes, group_rank=node, master_addr=placed.addresses[0],
        master_port=port, mixed_precision=plan.mixed_precision, device_type=plan.device_type,
    )
    env[NODE_RANK] = str(node)
    if plan.device_type == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = placed.visible_gpus(rank, plan.num_processes)
    env.update(plan.worker_env)
    return WorkerSpec(rank=rank, env=env, num_threads=None,
                      send_result=plan.return_all or rank == 0,
                      rich_output=plan.output != "none" and in_kernel())


def _collect(ray: Any, starts: dict, pids: dict[int, int], wait: bool = False) -> None:
    """Record the pids of the workers the agents forked (``starts``: each agent's start
    reference -> its rank; those collected are taken out, so a call costs what is still
    pending); raise if an agent failed to."""
    pending = list(starts)
    if not pending:
        return
    done, _ = ray.wait(pending, num_returns=len(pending), timeout=None if wait else 0)
    for ref in done:
        pids[starts.pop(ref)] = ray.get(ref)


class ClusterPoolWorkers:
    """A warm pool's workers on a cluster: one serving worker per rank, forked by the agents
    (the surface of :class:`~.pool.PoolWorkers`: ``handles``, ``dead``, ``close``)."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.handles = start_ranks(plan, None)
        self.sources_sent: set[str] = set()  # notebook cells whose sources the workers have
        self.closed = False

    def dead(self) -> list[ClusterHandle]:
        """The workers that have ended."""
        return [handle for handle in self.handles if handle.ended]

    def close(self, grace: float = 2.0) -> None:
        """End every worker (they leave when their commands channel closes; killed after
        ``grace`` seconds) and release everything of the set. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for handle in self.handles:
            handle.end_commands()
        deadline = time.monotonic() + grace
        for handle in self.handles:
            handle.reap(max(0.0, deadline - time.monotonic()))
        ClusterGroup(self.plan, self.handles).close()
