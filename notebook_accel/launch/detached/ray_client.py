"""The kernel's side of detached pools on a Ray cluster: start one, list them, stop one, talk to one.

The keeper is a detached Ray actor (``ray_keeper.RayKeeper``) named after the pool in the
namespace ``ray_keeper.NAMESPACE``; a kernel connected to the cluster (``cluster=``: the
kernel's one Ray connection, ``cluster/placement.connect``) finds it with ``ray.get_actor``.
:class:`RayConnection` has :class:`~.client.Connection`'s surface, so a
:class:`~.attached.DetachedPool` talks to either keeper alike; its requests are actor calls.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

from notebook_accel.launch.cluster import placement
from notebook_accel.launch.detached.client import ANSWER_TIMEOUT, START_TIMEOUT, KeeperGone
from notebook_accel.launch.detached.ray_keeper import NAMESPACE, RayKeeper

_TOUCH_MOST = 60.0  # seconds between an attached kernel's touches, at most
_GONE_WAIT = 30.0  # seconds a stopped keeper's actor has to be gone


class RayConnection:
    """A kernel's way to one keeper actor, as :class:`~.client.Connection` is to a keeper's
    socket: ``request`` (one actor call), ``close``. While open, a thread touches the keeper
    (every third of its ``idle_timeout``, at most a minute apart), so an attached kernel keeps
    it from ending as idle, as an open socket does."""

    streams = False  # a run's output is read with ``since``, never pushed

    def __init__(self, actor: Any, name: str, idle_timeout: float) -> None:
        self.actor, self.name = actor, name
        self._every = min(_TOUCH_MOST, idle_timeout / 3)
        self._open = threading.Event()
        self._start_touching()

    def request(self, op: str, *, body: bytes = b"", timeout: float = ANSWER_TIMEOUT,
                **fields: Any) -> Any:
        """The keeper's answer to ``op`` (``info``: its info; a pool op: the service's bytes).

        Raises:
            KeeperGone: the actor is dead, or did not answer within ``timeout`` seconds.
        """
        ray = placement.ray_module()
        self._start_touching()
        if op == "info":
            call = self.actor.info.remote()
        elif op == "stop":
            call = self.actor.stop.remote()
        else:
            call = self.actor.answer.remote(op, fields, body)
        try:
            return ray.get(call, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
            raise KeeperGone(f"the keeper actor of detached pool {self.name!r} does not answer "
                             f"({type(error).__name__})") from None

    def _start_touching(self) -> None:
        if self._open.is_set():
            return
        self._open.set()
        threading.Thread(target=self._touch, daemon=True,
                         name=f"notebook_accel: attached to {self.name}").start()

    def _touch(self) -> None:
        ray = placement.ray_module()
        while self._open.is_set():
            time.sleep(self._every)
            if not self._open.is_set():
                return
            try:
                ray.get(self.actor.touch.remote(), timeout=ANSWER_TIMEOUT)
            except Exception:  # the keeper is gone (stopped, or its cluster): touch no more;
                self._open.clear()  # a later request says it is gone, or touches again
                return

    def receive(self) -> Any:
        raise KeeperGone("a keeper actor streams nothing: read the run's output with since")

    def close(self) -> None:
        self._open.clear()


def keeper_actor(name: str, cluster: str) -> Any:
    """The keeper actor of detached pool ``name`` on ``cluster``, or None."""
    ray = placement.connect(cluster)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def connection(name: str, cluster: str) -> RayConnection:
    """A connection to the detached pool ``name`` on ``cluster``.

    Raises:
        ValueError: no such pool is up there (naming those that are).
    """
    actor = keeper_actor(name, cluster)
    info = None
    if actor is not None:
        with contextlib.suppress(KeeperGone):
            info = RayConnection(actor, name, float("inf")).request("info")
    if info is None:
        up = ", ".join(repr(i["name"]) for i in cluster_pools(cluster)) or "none"
        raise ValueError(f"no detached pool named {name!r} is up on the Ray cluster "
                         f"{cluster!r} (up there: {up})")
    return RayConnection(actor, name, info["idle_timeout"])


def start_on_cluster(name: str, cluster: str, idle_timeout: float, **options: Any) -> dict[str, Any]:
    """Start the detached pool ``name`` on ``cluster``: a detached keeper actor owning a
    ``WorkerPool(cluster=..., **options)``; it outlives this kernel and ends after
    ``idle_timeout`` seconds without a request, or :func:`stop_on_cluster`.

    Returns:
        The pool's info (as :func:`cluster_pools` lists it).
    Raises:
        ValueError: a pool of that name is up on the cluster.
        RuntimeError: the keeper actor failed to start its pool (why).
    """
    ray = placement.connect(cluster)
    if keeper_actor(name, cluster) is not None:
        raise ValueError(f"a detached pool named {name!r} is up already on the Ray cluster "
                         f"{cluster!r}; stop it first (%accelerate stop {name}), or choose "
                         "another name")
    keeper = ray.remote(RayKeeper).options(
        name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_concurrency=16,
        max_restarts=0)
    actor = keeper.remote(name, json.dumps(options), float(idle_timeout))
    try:
        info = ray.get(actor.info.remote(), timeout=START_TIMEOUT)
    except Exception as error:  # noqa: BLE001 - any failure to start: said, the actor ended
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        cause = getattr(error, "cause", None) or error
        raise RuntimeError(f"the keeper actor of detached pool {name!r} did not start its pool "
                           f"on {cluster!r}: {type(cause).__name__}: {cause}") from None
    return {**info, "cluster": cluster}


def cluster_pools(cluster: str | None = None) -> list[dict[str, Any]]:
    """The detached pools on ``cluster`` (None: the one this kernel is connected to; none
    connected: none), each as its keeper tells it, with ``cluster``."""
    cluster = cluster or placement.connected()
    if cluster is None:
        return []
    ray = placement.connect(cluster)
    pools = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] != NAMESPACE:
            continue
        actor = keeper_actor(entry["name"], cluster)
        if actor is None:
            continue
        with contextlib.suppress(KeeperGone):
            info = RayConnection(actor, entry["name"], float("inf")).request("info")
            pools.append({**info, "cluster": cluster})
    return pools


def stop_on_cluster(name: str, cluster: str) -> None:
    """End the detached pool ``name`` on ``cluster`` (its pool, hubs and keeper actor);
    returns once the actor is gone.

    Raises:
        ValueError: no such pool is up there.
    """
    ray = placement.connect(cluster)
    actor = keeper_actor(name, cluster)
    if actor is None:
        up = ", ".join(repr(i["name"]) for i in cluster_pools(cluster)) or "none"
        raise ValueError(f"no detached pool named {name!r} is up on the Ray cluster "
                         f"{cluster!r} (up there: {up})")
    with contextlib.suppress(Exception):  # (a keeper that fails to close is killed all the same)
        ray.get(actor.stop.remote(), timeout=60)
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + _GONE_WAIT
    while keeper_actor(name, cluster) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
