"""The keeper of a detached pool on a Ray cluster: a detached Ray actor that owns the pool.

:class:`RayKeeper` is plain Python; ``ray_client.start_on_cluster`` wraps it in ``ray.remote``
and starts it with ``lifetime="detached"`` under the pool's name in the namespace
:data:`NAMESPACE`, so it outlives the driver (the kernel) that started it and any driver of
the cluster finds it by name (``ray.get_actor``). It owns a cluster
:class:`~notebook_accel.WorkerPool` (its placement group and node hubs are this actor's, so
they end with it) and serves it with the Unix keeper's :class:`PoolService`: a request is one
actor call (:meth:`RayKeeper.answer`) instead of a message on a socket. Who may call it is
the cluster's business (its network, its auth, the namespace): there is no token.

It ends on :meth:`RayKeeper.stop`, or after ``idle_timeout`` seconds with no run and no
request (an attached kernel touches it meanwhile), killing itself; why is printed to the
actor's log (Ray's worker log on its node).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from notebook_accel.launch.detached.pool_service import OPS, PoolService

NAMESPACE = "notebook_accel"  # the Ray namespace of every detached pool's keeper actor
_TICK = 0.5  # seconds between two looks at the idle time


class RayKeeper:
    """Owns one detached pool on the cluster it runs in (see the module's text)."""

    def __init__(self, name: str, options: str, idle_timeout: float) -> None:
        import ray

        from notebook_accel.launch.pools.pool import WorkerPool

        self.name, self.idle_timeout = name, float(idle_timeout)
        self.since = time.time()
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._ended: str | None = None
        settings = json.loads(options)
        # The pool is placed from inside the cluster: its own address, never the kernel's
        # (a ray:// one would start a relay the actor does not need).
        settings["cluster"] = ray.get_runtime_context().gcs_address
        self.folder = Path(tempfile.mkdtemp(prefix=f"notebook_accel-{name}-"))
        _log(f"keeper actor of detached pool {name!r}, pid {os.getpid()}: starting the pool")
        try:
            self.pool = WorkerPool(**settings)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.service = PoolService(self.pool, self.folder / "output")
        _log(f"ready: {self.pool.plan.world_size} ranks on {self.pool.plan.device_type} "
             f"across {self.pool.plan.num_nodes} nodes")
        threading.Thread(target=self._watch_idle, name="notebook_accel: idle keeper",
                         daemon=True).start()

    def info(self) -> dict[str, Any]:
        """As the Unix keeper's ``info``, plus the node the actor runs on."""
        import ray

        self.touch()
        return {**self.service.describe(self.name, self.since, self.idle_timeout),
                "node": ray.util.get_node_ip_address()}

    def answer(self, op: str, head: dict[str, Any], body: bytes) -> bytes:
        """The pool service's answer to ``op`` (never streamed: a kernel reads a run's output
        with ``since``)."""
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; valid: {', '.join(repr(o) for o in OPS)}")
        self.touch()
        if op == "submit":
            head = {**head, "stream": False}
        return self.service.answer(op, head, body)

    def touch(self) -> None:
        """A kernel is here: the idle time starts again."""
        with self._lock:
            self._last = time.monotonic()

    def stop(self, why: str = "stopped on request") -> str:
        """End the pool (a running run cancelled at its cut), its hubs and placement group;
        the caller then kills the actor."""
        with self._lock:
            if self._ended is not None:
                return self._ended
            self._ended = why
        from notebook_accel.launch.cluster import placement

        try:
            self.pool.close()
            placement.disconnect()  # this actor's hubs and placement groups
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            _log(f"detached pool {self.name!r} ended: {why}")
        return why

    def _watch_idle(self) -> None:
        while self._ended is None:
            time.sleep(_TICK)
            with self._lock:
                if self.service.running():
                    self._last = time.monotonic()
                idle = time.monotonic() - self._last
            if idle >= self.idle_timeout:
                self.stop(f"no run and no request for {self.idle_timeout:g} s (idle_timeout)")
                _end_this_actor()


def _end_this_actor() -> None:
    """Kill this actor from one of its own threads (its name is then free)."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
    time.sleep(5.0)
    os._exit(0)  # (the kill did not take)


def _log(text: str) -> None:
    print(f"[notebook_accel] {time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)
