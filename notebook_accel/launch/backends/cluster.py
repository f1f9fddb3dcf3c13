"""The cluster backend: ranks on the nodes of a Ray cluster, driven from this one kernel.

Ray places one hub per node (``launch/cluster/placement.py``: a placement group spread over the
nodes, ranks numbered node by node), starts and keeps it. Each launch is one Ray call per hub:
it forks its node's ranks as a local launch does (``launch/worker/hub/node_hub.py``) and links them
to the kernel over one ordered connection per node (``launch/cluster/channel_server.py``), or,
for a Ray Client address, to a relay on the head node that the kernel pumps through Ray
(``launch/cluster/channel_relay.py``). The kernel takes each link apart into its ranks' channels
(``launch/cluster/node_links.py``), so the supervisor, output relay, views and failure records
are the same as for local processes. Rank 0's node hosts the rendezvous store, on a port that
its hub found free there. A warm pool's dead rank is forked again by its node's hub
(:meth:`ClusterPoolWorkers.replace`, for a heal: ``launch/pools/heal.py``).
"""

from __future__ import annotations

import dataclasses
import socket
import time
from typing import Any

from notebook_accel import wire
from notebook_accel.contract import MASTER_ADDR, MASTER_PORT, NODE_RANK
from notebook_accel.launch.backends.base import (
    Backend,
    PoolWorkerSet,
    WorkerGroup,
    WorkerHandle,
    kill_all,
)
from notebook_accel.launch.cluster import placement
from notebook_accel.launch.cluster.channel_relay import RelayedChannels
from notebook_accel.launch.cluster.channel_server import ChannelServer
from notebook_accel.launch.cluster.node_links import KINDS, LinkFrames, NodeLinks
from notebook_accel.launch.handoff.cells import SentCells
from notebook_accel.launch.handoff.environment import worker_environment
from notebook_accel.launch.handoff.payload import Payload
from notebook_accel.launch.planning.fd_limit import ensure_fd_room
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.views import in_kernel
from notebook_accel.launch.worker.main import WorkerSpec

CONNECT_TIMEOUT = 60.0  # seconds for every node's freshly placed hub to link back
LINK_TIMEOUT = 6.0  # the same for hubs placed before: one that is silent (frozen) is replaced
CHECK_AFTER = 0.5  # seconds the links may take before the hubs are asked, through Ray, if alive


class HubHandle(WorkerHandle):
    """A rank forked by its node's hub; its channels are what the node's link brought
    (``NodeLinks``, the group's one inbox), its signals and commands frames on that link."""

    rss_told = True  # its hub sends its memory figure when it moved (looked at once a second)

    def __init__(self, rank: int, node: int, address: str, links: NodeLinks, pid: int,
                 persistent: bool, spec: WorkerSpec) -> None:
        self.rank, self.node, self.address = rank, node, address
        self.spec = spec  # what its hub forked it from (a replacement is forked from the same)
        self._links, self._pid = links, pid
        self._ends = links.ends[rank]
        self.inbox = self.together = links
        self.persistent = persistent  # a pool worker: its commands go on the link
        self._gave_up = False

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
        return self._links.fileno()  # the group's inbox: readable on news (an end among them)

    @property
    def exitcode(self) -> int | None:
        return self._ends.exitcode if self._ends.ended.is_set() else None

    @property
    def ended(self) -> bool:
        """Its end came (with its exit status, or its node's loss)."""
        return self._ends.ended.is_set()

    def read_output(self, name: str) -> bytes | None:
        return self._links.take_bytes(self.rank, KINDS[name])

    def frames(self, name: str) -> LinkFrames:
        return LinkFrames(self._links, self.rank, name)

    def rss(self) -> int | None:
        return self._ends.rss  # its hub's latest figure

    def describe_end(self) -> str | None:
        if self._ends.lost is None:
            return None
        how = "ended without an exit status" if self._ends.exitcode is None else "was killed by SIGKILL"
        return f"{how}: its node or its Ray worker was lost ({self._ends.lost})"

    def command(self, message: wire.Message) -> bool:
        return self.persistent and self._links.command(self.rank, wire.encode(message))

    def end_commands(self) -> None:
        """Close a pool worker's commands channel: it leaves its serve loop and exits."""
        self._links.command(self.rank, b"")

    def terminate(self) -> None:
        self._links.signal([self.rank], "terminate")  # SIGKILL 2 s later on the hub's clock

    def interrupt(self) -> None:
        self._links.signal([self.rank], "interrupt")

    def kill(self) -> None:
        self._links.signal([self.rank], "kill")

    def dump_stacks(self) -> None:
        self._links.signal([self.rank], "dump_stacks")

    def reap(self, timeout: float) -> None:
        if not self._gave_up and not self._ends.ended.wait(timeout):
            self._gave_up = True  # a hub that did not answer once is not waited for again


class ClusterGroup(WorkerGroup):
    """The ranks of one launch; closing it stops them and ends the links (the hubs stay placed
    for the next launch)."""

    def __init__(self, plan: LaunchPlan, handles: list[HubHandle], links: NodeLinks) -> None:
        super().__init__(plan, handles)
        self.links = links

    def close(self) -> None:
        kill_all(self.handles, reap_timeout=2.0)
        self.links.close()
        if any(handle.describe_end() is not None for handle in self.handles):
            placement.discard(self.plan)  # a node was lost: place afresh next time


class ClusterBackend(Backend):
    """Ranks on a Ray cluster's nodes (``plan.cluster``)."""

    name = "cluster"
    local = False

    @classmethod
    def where(cls, plan: LaunchPlan) -> str:
        return f"{plan.num_nodes} nodes of the Ray cluster {plan.cluster}"

    def check(self, plan: LaunchPlan) -> None:
        if not placement.is_placed(plan):  # placed hubs hold their resources already
            placement.check_capacity(plan)

    def start(self, plan: LaunchPlan, payload: Payload) -> ClusterGroup:
        links, handles = start_ranks(plan, payload)
        return ClusterGroup(plan, handles, links)


def start_ranks(plan: LaunchPlan, payload: Payload | None) -> tuple[NodeLinks, list[HubHandle]]:
    """Have every node's hub fork its ranks (``payload`` None: warm pool workers, serving runs
    from their commands channel); returns the links and the ranks' handles once all linked.
    Hubs placed before and lost since, or silent for ``LINK_TIMEOUT`` seconds (a frozen
    process, a node gone without a word), are placed afresh, once."""
    ensure_fd_room(plan.num_nodes)
    ray = placement.ray_module()
    for attempt in range(2):
        kept = placement.is_placed(plan)
        placed = placement.placement_for(plan)
        try:
            return _start(ray, plan, payload, placed, LINK_TIMEOUT if kept else CONNECT_TIMEOUT)
        except (ray.exceptions.RayActorError, TimeoutError) as exc:
            placement.discard(plan)
            if attempt or (isinstance(exc, TimeoutError) and not kept):
                raise
    raise AssertionError("unreachable")


def _start(ray: Any, plan: LaunchPlan, payload: Payload | None, placed: placement.Placement,
           link_timeout: float = CONNECT_TIMEOUT) -> tuple[NodeLinks, list[HubHandle]]:
    """Ray calls: one start per hub, one get for rank 0's node (its pids and the rendezvous
    port), one for the others' pids, a put of the payload above 2 nodes, and a check of the
    hubs every ``CHECK_EVERY`` seconds only while links are later than ``CHECK_AFTER``."""
    server = (ChannelServer(ray.util.get_node_ip_address(), plan.num_nodes)
              if placed.relay is None else
              RelayedChannels(ray, placed.relay, plan.num_nodes))
    pids: dict[int, list[int]] = {}
    specs: dict[int, WorkerSpec] = {}
    links: dict[int, socket.socket] = {}
    try:
        per_node = plan.num_processes

        def start(node: int, port: int, payload_arg: Any) -> Any:
            ranks = range(node * per_node, (node + 1) * per_node)
            specs.update((rank, _spec(plan, placed, rank, port)) for rank in ranks)
            return placed.hubs[node].start.remote(
                [specs[rank] for rank in ranks], payload_arg, server.address, server.token, node)

        # rank 0's node first: its hub finds the rendezvous port (port 0) and forks rank 0, which
        # hosts the store, so no peer asks before it listens (torch's connect backoff: 0.6 s)
        pids[0], port = ray.get(start(0, 0, payload), timeout=link_timeout)
        rest = ray.put(payload) if payload is not None and plan.num_nodes > 2 else payload
        starts = {start(node, port, rest): node for node in range(1, plan.num_nodes)}
        quiet_until = time.monotonic() + CHECK_AFTER
        accepted = server.accept(time.monotonic() + link_timeout, lambda: (
            time.monotonic() < quiet_until or _collect(ray, starts, pids)))
        links = {node: channels["link"] for node, channels in accepted.items()}
        _collect(ray, starts, pids, wait=True)
    except BaseException:
        for link in links.values():
            link.close()  # its hub kills what it forked
        raise
    finally:
        server.close()
    node_links = NodeLinks(links, {node: list(range(node * per_node, (node + 1) * per_node))
                                   for node in range(plan.num_nodes)})
    return node_links, [
        HubHandle(rank, rank // per_node, placed.addresses[rank // per_node], node_links,
                  pids[rank // per_node][rank % per_node], persistent=payload is None,
                  spec=specs[rank])
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
        env["CUDA_VISIBLE_DEVICES"] = placed.visible_gpus(node)
    env.update(plan.worker_env)
    return WorkerSpec(rank=rank, env=env, num_threads=None,
                      send_result=plan.return_all or rank == 0,
                      rich_output=plan.output != "none" and in_kernel())


def _collect(ray: Any, starts: dict, pids: dict[int, list[int]], wait: bool = False) -> None:
    """Record the pids of the ranks the hubs forked (``starts``: each hub's start reference ->
    its node; those collected are taken out, so a call costs what is still pending; ``wait``:
    all of them, in one call); raise if a hub failed to."""
    pending = list(starts)
    if not pending:
        return
    done = pending if wait else ray.wait(pending, num_returns=len(pending), timeout=0)[0]
    if done:  # one call for them all
        for ref, (forked, _) in zip(done, ray.get(done), strict=True):
            pids[starts.pop(ref)] = forked


class ClusterPoolWorkers(PoolWorkerSet):
    """A warm pool's workers on a cluster: one serving worker per rank, forked by the hubs."""

    local = False

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.links, self.handles = start_ranks(plan, None)
        self.cells_sent = SentCells()  # what the workers have of the notebook's cells
        self.keeper = None  # the ranks' one inbox per node is registered per run, then drained
        self.closed = False

    def send_runs(self, payload: bytes, with_result: set[int], ranks: set[int]) -> None:
        """Start a run on the ranks of ``ranks``: the payload once per node that has some."""
        for handle in self.handles:
            if handle.rank in ranks:
                handle.last_report = None
        self.links.run(payload, with_result, ranks)

    def dead(self) -> list[HubHandle]:
        """The workers that have ended."""
        return [handle for handle in self.handles if handle.ended]

    def replace(self, ranks: tuple[int, ...]) -> int:
        """Have the hub of each dead rank of ``ranks`` fork it again, from the spec it was forked
        from (same rank number, device and environment), around a fresh rendezvous store that
        every rank meets at next (a heal: ``launch/pools/heal.py``); returns the store's port.

        As at the launch, rank 0 hosts the store at ``MASTER_ADDR`` (its node's address), on a
        port node 0's hub finds free there; a survivor rank 0 hosts it when it rejoins.

        Raises:
            ConnectionError: a hub's node was lost, or its hub did not answer in time.
            RuntimeError: a hub could not fork its ranks.
        """
        old = {handle.rank: handle for handle in self.handles if handle.rank in ranks}
        port = self.links.free_port(0, self.handles[0].spec.env[MASTER_ADDR])
        by_node: dict[int, list[HubHandle]] = {}
        for rank in sorted(ranks):
            by_node.setdefault(old[rank].node, []).append(old[rank])
        fresh: dict[int, HubHandle] = {}
        for node, dead in by_node.items():
            specs = [dataclasses.replace(h.spec, env={**h.spec.env, MASTER_PORT: str(port)})
                     for h in dead]
            for handle, spec, pid in zip(dead, specs, self.links.fork(node, specs), strict=True):
                fresh[handle.rank] = HubHandle(handle.rank, node, handle.address, self.links,
                                               pid, persistent=True, spec=spec)
        self.handles = [fresh.get(handle.rank, handle) for handle in self.handles]
        return port

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
        ClusterGroup(self.plan, self.handles, self.links).close()
