"""Ranks placed on a Ray cluster: the connection, the capacity check and the nodes' hubs.

One placement group per job shape (STRICT_SPREAD: one bundle per node, ``num_processes`` CPUs,
and as many GPUs on ``cuda``), one :class:`~.worker.node_hub.NodeHub` actor per node holding
its whole bundle. Placements are kept across launches (a warm launch forks from hubs that
are already placed) until one of their hubs is lost or the kernel ends. For a Ray Client
address (``ray://``) a placement also holds a :class:`~.channel_relay.ChannelRelay` on the head
node, which the workers connect to instead of the kernel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notebook_accel.launch.planning.plan import LaunchPlan

PLACE_TIMEOUT = 20.0  # seconds a placement group may stay pending before the launch is refused
HUB_TIMEOUT = 120.0  # seconds for the hubs to start (each imports torch)
CLIENT_ATTEMPTS = 3  # Ray Client connections tried: the head's per-client server can die as it
# starts (github.com/ray-project/ray/issues/63202); the kernel then asks for another. The head
# reports that death one of two ways: as a failed start, or (when the server died while the head
# read its command line) as psutil's ZombieProcess.
_CLIENT_SERVER_DIED = ("Starting Ray client server failed", "psutil.ZombieProcess")
_connected: list[str] = []  # the address this kernel's Ray connection was made with
_placements: dict[tuple, Placement] = {}


def ray_module() -> Any:
    """``ray``, or an ImportError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ImportError("cluster=... runs on Ray, which is not installed here; "
                          "pip install 'notebook_accel[ray]'") from None
    return ray


def connect(address: str) -> Any:
    """Connect this kernel to the cluster at ``address`` (once); returns ``ray``.

    Ray's own SIGINT/SIGTERM handlers are undone: the kernel's stay in force.

    Raises:
        ValueError: the kernel is connected to another cluster already.
        ConnectionError: no cluster answers at ``address``.
    """
    ray = ray_module()
    if ray.is_initialized():
        if _connected and _connected[0] != address:
            raise ValueError(f"cluster={address!r}: this kernel is connected to the Ray cluster "
                             f"{_connected[0]!r}; use that address, or restart the kernel")
        return ray
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")  # a dead hub's unread replies
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for attempt in range(CLIENT_ATTEMPTS if is_client_address(address) else 1):
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
                break
            except ConnectionError as exc:
                if attempt + 1 < CLIENT_ATTEMPTS and any(sign in str(exc)
                                                         for sign in _CLIENT_SERVER_DIED):
                    continue  # the head's per-client server died as it started: ask for another
                raise ConnectionError(f"cluster={address!r}: no Ray cluster answers there "
                                      f"({exc})") from None
    finally:
        for sig, handler in saved.items():
            with contextlib.suppress(ValueError, TypeError):  # not the main thread / a C handler
                signal.signal(sig, handler)
    _connected[:] = [address]
    return ray


def is_client_address(address: str) -> bool:
    """Whether ``address`` is a Ray Client one (``ray://host:port``): the kernel is outside the
    cluster's network, so its workers' channels go through a relay."""
    return address.startswith("ray://")


def connected() -> str | None:
    """The address of the cluster this kernel is connected to, if any."""
    return _connected[0] if _connected else None


def _needs(plan: LaunchPlan) -> dict[str, float]:
    need = {"CPU": float(plan.num_processes)}
    if plan.device_type == "cuda":
        need["GPU"] = float(plan.num_processes)
    return need


def check_capacity(plan: LaunchPlan) -> None:
    """Refuse a job the cluster's nodes cannot hold, naming what is missing.

    Raises:
        RuntimeError: fewer than ``num_nodes`` alive nodes have the resources of one node's ranks.
    """
    ray = connect(plan.cluster)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    need = _needs(plan)
    fit = [n for n in nodes if all(n["Resources"].get(k, 0) >= v for k, v in need.items())]
    if len(fit) >= plan.num_nodes:
        return
    each = ", ".join(f"{v:g} {k}" for k, v in need.items())
    have = "; ".join(
        f"{n['NodeManagerAddress']}: " + ", ".join(f"{n['Resources'].get(k, 0):g} {k}" for k in need)
        for n in nodes) or "none"
    raise RuntimeError(
        f"cluster={plan.cluster!r} cannot place num_nodes={plan.num_nodes} x "
        f"num_processes={plan.num_processes}: that needs {plan.num_nodes} nodes with {each} each, "
        f"and {len(fit)} of its {len(nodes)} alive nodes have it ({have}); add nodes, or ask for "
        f"num_nodes <= {len(fit)}")


@dataclass
class Placement:
    """A job shape's placement group and one hub per node (in node order)."""

    group: Any  # ray.util.placement_group.PlacementGroup
    hubs: list[Any]  # ActorHandle of NodeHub
    addresses: list[str]  # each node's address
    pids: list[int]  # each hub's pid on its node
    gpus: list[list[str]]  # the GPUs Ray assigned each node's hub (its ranks', in order)
    relay: Any = None  # ActorHandle of ChannelRelay, for a Ray Client address

    def visible_gpus(self, node: int) -> str:
        """``CUDA_VISIBLE_DEVICES`` for ``node``'s ranks: its GPUs in local-rank order, so
        ``cuda:LOCAL_RANK`` is the rank's own."""
        return ",".join(self.gpus[node])

    def close(self) -> None:
        """Stop the hubs (and the relay) and free the placement group."""
        ray = ray_module()
        for actor in (*self.hubs, self.relay):
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(self.group)


def _key(plan: LaunchPlan) -> tuple:
    return plan.cluster, plan.num_nodes, plan.num_processes, plan.device_type


def placement_for(plan: LaunchPlan) -> Placement:
    """The hubs of ``plan``'s shape: those already placed, else placed now (a placed hub that
    was lost meanwhile shows in the launch's own call to it: see :func:`discard`).

    Raises:
        RuntimeError: the placement group stays pending for ``PLACE_TIMEOUT`` seconds (resources
            taken by other jobs), or the hubs do not start.
    """
    ray = ray_module()
    placed = _placements.get(_key(plan))
    if placed is not None:
        return placed
    check_capacity(plan)
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from notebook_accel.launch.worker.hub.node_hub import NodeHub

    need = _needs(plan)
    group = placement_group([dict(need) for _ in range(plan.num_nodes)], strategy="STRICT_SPREAD")
    if not group.wait(PLACE_TIMEOUT):  # a call to the GCS: no task (and no worker) to start
        ray.util.remove_placement_group(group)
        each = ", ".join(f"{v:g} {k}" for k, v in need.items())
        raise RuntimeError(
            f"cluster={plan.cluster!r}: {plan.num_nodes} distinct nodes with {each} free each were "
            f"not available within {PLACE_TIMEOUT:g} s (taken by other jobs?); free them, or ask "
            "for fewer nodes or processes")
    hub_class = ray.remote(NodeHub)
    hubs = [  # each holds its node's whole bundle: its ranks' CPUs and GPUs
        hub_class.options(
            num_cpus=need["CPU"], num_gpus=need.get("GPU", 0), max_concurrency=16,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=node),
        ).remote()
        for node in range(plan.num_nodes)
    ]
    placed = Placement(group, hubs, [], [], [],
                       _start_relay(ray) if is_client_address(plan.cluster) else None)
    try:
        where = ray.get([hub.where.remote() for hub in hubs], timeout=HUB_TIMEOUT)
    except BaseException as exc:
        placed.close()
        if isinstance(exc, Exception):
            raise RuntimeError(f"cluster={plan.cluster!r}: the nodes' hubs did not start: "
                               f"{type(exc).__name__}: {exc}") from None
        raise
    placed.addresses = [address for address, _, _ in where]
    placed.pids = [pid for _, pid, _ in where]
    placed.gpus = [gpus for _, _, gpus in where]
    _placements[_key(plan)] = placed
    return placed


def _start_relay(ray: Any) -> Any:
    """A :class:`~.channel_relay.ChannelRelay` on the head node (no CPU of the job's)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from notebook_accel.launch.cluster.channel_relay import ChannelRelay

    head = next(n["NodeID"] for n in ray.nodes()
                if n.get("Alive") and "node:__internal_head__" in n["Resources"])
    return ray.remote(ChannelRelay).options(
        num_cpus=0, max_concurrency=64,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()


def is_placed(plan: LaunchPlan) -> bool:
    """Whether hubs of ``plan``'s shape were placed by an earlier launch (and kept)."""
    return _key(plan) in _placements


def discard(plan: LaunchPlan) -> None:
    """Stop ``plan``'s hubs (one was lost, or the group must not be reused)."""
    placed = _placements.pop(_key(plan), None)
    if placed is not None:
        placed.close()


def disconnect() -> None:
    """Stop every placement of this kernel and leave the cluster (tests, the end of a notebook)."""
    for key in list(_placements):
        _placements.pop(key).close()
    if _connected:
        ray_module().shutdown()
        _connected.clear()
