"""A detached pool seen from a kernel: ``WorkerPool(detach=True)`` / ``WorkerPool.attach(name)``.

:class:`DetachedPool` has the warm pool's surface (``run``, ``run_on``, ``submit``,
``start_background``, ``background``, ``names``, ``status``, ``revive``, ``stacks``...) but
holds no worker: each call is a request to the pool's keeper (``keeper.py``), which runs it on
its own :class:`~notebook_accel.WorkerPool`. A run's payload is serialised here as the pool
would (``serialise_payload``) and forwarded as it is. Every run on a detached pool runs in the
keeper's background: ``run`` shows its output live and returns its value, ``submit`` returns a
:class:`DetachedRun` at once. A run's output is read back from the keeper's rings
(``output_ring.py``) from a number on, so a kernel that attaches later sees it from its first
line, once, then live.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from notebook_accel.launch.control.interrupts import interrupts_raised
from notebook_accel.launch.detached.client import (
    Connection,
    KeeperGone,
    detached_pools,
    start_detached,
    stop_detached,
)
from notebook_accel.launch.detached.detached_run import DetachedRun
from notebook_accel.launch.detached.runtime_dir import check_name, pool_files
from notebook_accel.launch.handoff.cells import SentCells
from notebook_accel.launch.handoff.payload import serialise_payload
from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.launch.pools.pool import PoolUnavailable
from notebook_accel.launch.supervision.tracebacks import hide_our_frames
from notebook_accel.launch.views.rank_ranges import parse_ranks
from notebook_accel.launch.views.text import say

DEFAULT_NAME = "pool"  # a detached pool's name when none is given
_OWN_ROWS = ("detach", "name", "idle_timeout")  # the rows that say how to keep it, not the pool
_LONG = 3600.0  # seconds a call that runs on the pool (a heal, a submit) may take


class DetachedPool:
    """A detached pool, reached through its keeper (see the module's text).

    ``close()`` ends the pool (its keeper and workers), as a kernel's pool's does; ``leave()``
    lets it go on without this kernel. Nothing ends it when this kernel ends.

    Example:
        >>> pool = WorkerPool(num_processes=2, detach=True, name="exp1")  # doctest: +SKIP
        >>> run = pool.submit(train, epochs=3)      # the kernel may now die  # doctest: +SKIP
        >>> # later, in any kernel of the same user:
        >>> WorkerPool.attach("exp1").background.watch()  # doctest: +SKIP
    """

    detached = True

    def __init__(self, name: str, connection: Any, stop: Callable[[], None], log: str) -> None:
        self.name = name
        self._connection = connection  # kept: a request costs no connect, no thread
        self._stop, self._log = stop, log
        self._closed = False
        self._cells_sent = SentCells()  # what the keeper's workers have of the notebook's cells
        self.plan = self._ask("plan")

    @classmethod
    def _local(cls, name: str) -> DetachedPool:
        """The detached pool ``name`` of this machine (its keeper's socket)."""
        files = pool_files(name)
        return cls(name, Connection(files), lambda: stop_detached(name), str(files.log))

    @classmethod
    def _on_cluster(cls, name: str, cluster: str) -> DetachedPool:
        """The detached pool ``name`` on the Ray cluster ``cluster`` (its keeper actor)."""
        from notebook_accel.launch.detached import ray_client

        return cls(name, ray_client.connection(name, cluster),
                   lambda: ray_client.stop_on_cluster(name, cluster),
                   f"the keeper actor's log on the Ray cluster {cluster!r}")

    @classmethod
    def start(cls, options: Mapping[str, Any] | LaunchRequest) -> DetachedPool:
        """Start a detached pool for ``WorkerPool``'s ``options`` (``name``: default "pool";
        ``idle_timeout`` from the options, the environment or the config file).

        Raises:
            TypeError, ValueError: a bad option, or a pool of that name is up, before any
                process starts.
            RuntimeError: the keeper ended before its pool was ready (its log said).
        """
        request = (options.for_door("WorkerPool") if isinstance(options, LaunchRequest)
                   else LaunchRequest.from_keywords("WorkerPool", options))
        filled = fill_options(request, request.get("config_file"))
        name = request.get("name") or DEFAULT_NAME
        pool_options = {key: value for key, value in request.items() if key not in _OWN_ROWS}
        cluster = filled.get("cluster")
        if cluster:  # the keeper is a detached actor of that cluster
            from notebook_accel.launch.detached import ray_client

            check_name(name)
            ray_client.start_on_cluster(name, cluster, filled["idle_timeout"],
                                        **{key: value for key, value in pool_options.items()
                                           if key != "cluster"})
            return cls._on_cluster(name, cluster)
        start_detached(name, idle_timeout=filled["idle_timeout"], **pool_options)
        return cls._local(name)

    @classmethod
    def attach(cls, name: str | None = None, cluster: str | None = None) -> DetachedPool:
        """Reach the detached pool ``name`` (None: the only one up) from this kernel: this
        machine's, else the Ray cluster's (``cluster``; None: the one this kernel is connected
        to, else the ``cluster`` option's environment variable or config file).

        Raises:
            ValueError: no such pool is up, or none is, or several are and no name was given
                (naming those up).
        """
        if name is not None:
            check_name(name)
        if cluster is None and (name is None or pool_files(name).socket.exists()):
            up = [info["name"] for info in detached_pools()]
            if name is not None or len(up) == 1:
                try:
                    return cls._local(name or up[0])
                except (KeeperGone, PoolUnavailable):
                    pass
            elif up:
                raise ValueError(f"several detached pools are up ({', '.join(up)}); name the "
                                 "one to attach")
        cluster = cluster or known_cluster()
        if cluster is None:
            if name is None:
                raise ValueError("no detached pool is up (%accelerate start --detach starts one; "
                                 "one on a Ray cluster: attach with --cluster ADDRESS)")
            up = ", ".join(repr(info["name"]) for info in detached_pools()) or "none"
            raise ValueError(f"no detached pool named {name!r} is up on this machine (up: {up}); "
                             "one on a Ray cluster: attach with --cluster ADDRESS "
                             "(cluster=ADDRESS)")
        from notebook_accel.launch.detached import ray_client

        if name is None:
            up = [info["name"] for info in ray_client.cluster_pools(cluster)]
            if len(up) != 1:
                raise ValueError(f"no detached pool is up on the Ray cluster {cluster!r}" if not up
                                 else f"several detached pools are up on the Ray cluster "
                                 f"{cluster!r} ({', '.join(up)}); name the one to attach")
            name = up[0]
        return cls._on_cluster(name, cluster)

    # -- talking to the keeper ------------------------------------------------------------------

    def _ask(self, op: str, timeout: float = 10.0, body: bytes = b"", **fields: Any) -> Any:
        """The keeper's answer to ``op``; what it printed meanwhile is printed here."""
        if self._closed:
            raise hide_our_frames(PoolUnavailable(
                f"this kernel left detached pool {self.name!r}; WorkerPool.attach({self.name!r}) "
                "reaches it again", "the pool was left"))
        try:
            data = self._connection.request(op, body=body, timeout=timeout, **fields)
        except KeeperGone:
            raise hide_our_frames(PoolUnavailable(
                f"detached pool {self.name!r} is gone: its keeper ended (why: the end of "
                f"{self._log})", f"detached pool {self.name!r} is gone")) from None
        return self._unpack(data)

    def _receive(self) -> Any:
        """The next message of a streamed run (see ``_ask``)."""
        return self._unpack(self._connection.receive())

    @staticmethod
    def _unpack(data: bytes) -> Any:
        kind, value, printed = pickle.loads(data)
        if printed:
            sys.stdout.write(printed)
            sys.stdout.flush()
        if kind == "raise":
            raise value
        return value

    def _call(self, name: str, *args: Any, timeout: float = _LONG) -> Any:
        return self._ask("call", timeout=timeout, name=name, args=list(args))

    # -- the pool's surface ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once this kernel closed (ended) or left the pool."""
        return self._closed

    @property
    def names(self) -> tuple[str, ...]:
        """The names living on every rank (as ``WorkerPool.names``)."""
        return self._call("names_on")

    def names_on(self, ranks: int | str | Iterable[int] | None = None) -> tuple[str, ...]:
        """As ``WorkerPool.names_on``."""
        return self._call("names_on", _plain(ranks))

    @property
    def copies(self) -> tuple[str, ...]:
        """As ``WorkerPool.copies``."""
        return self._call("copies_on")

    def copies_on(self, ranks: int | str | Iterable[int] | None = None) -> tuple[str, ...]:
        """As ``WorkerPool.copies_on``."""
        return self._call("copies_on", _plain(ranks))

    @property
    def lost(self) -> tuple[str, ...]:
        """As ``WorkerPool.lost``."""
        return self._call("lost")

    @property
    def heals(self) -> bool:
        """As ``WorkerPool.heals``."""
        return self._call("heals")

    def status(self) -> list[Any]:
        """One ``RankInfo`` per rank (none once closed)."""
        return [] if self._closed else self._call("status")

    def revive(self) -> None:
        """As ``WorkerPool.revive``, in the keeper."""
        self._call("revive")

    def stacks(self, timeout: float = 1.0) -> str:
        """As ``WorkerPool.stacks``."""
        return self._call("stacks", timeout)

    def collectives(self, last: int = 8, timeout: float = 5.0) -> str:
        """As ``WorkerPool.collectives``."""
        return self._call("collectives", last, timeout)

    def debug(self, rank: int | None = None) -> None:
        """pdb needs the kernel that owns the workers: not on a detached pool."""
        raise hide_our_frames(RuntimeError(
            "pdb on a rank needs a pool this kernel owns; a detached pool's failure is in its "
            "WorkerError (.remote_traceback) and in its ranks' logs (.background.logs(rank))"))

    def restart(self) -> None:
        """Not on a detached pool (its keeper holds its options): close it and start another."""
        raise hide_our_frames(RuntimeError(
            f"a detached pool is not restarted: %accelerate stop {self.name} (pool.close()), "
            "then start it again"))

    @property
    def background(self) -> DetachedRun | None:
        """The pool's latest run (running or ended; a foreground one too), if any."""
        info = self._ask("run")
        return None if info is None else DetachedRun(self, info)

    def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """As ``WorkerPool.run``: the run's output live in this cell, rank 0's value. The stop
        button stops the run (every rank at the same point); this kernel's death does not."""
        return self._foreground(None, function, args, kwargs)

    def run_on(self, ranks: int | str | Iterable[int], function: Callable[..., Any],
               *args: Any, **kwargs: Any) -> Any:
        """As ``WorkerPool.run_on``."""
        try:
            chosen = parse_ranks(ranks, self.plan.world_size)
        except ValueError as error:
            hide_our_frames(error)
            raise
        return self._foreground(chosen, function, args, kwargs)

    def submit(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> DetachedRun:
        """As ``WorkerPool.submit``: the run goes on in the keeper, whatever becomes of this
        kernel; any kernel that attaches sees it (``pool.background``)."""
        return self.start_background(function, args, kwargs)

    def start_background(self, function: Callable[..., Any], args: tuple[Any, ...] = (),
                         kwargs: dict[str, Any] | None = None, *, ranks: tuple[int, ...] | None = None,
                         what: str | None = None, advice: str | None = None) -> DetachedRun:
        """As ``WorkerPool.start_background``."""
        name = getattr(function, "__name__", type(function).__name__)
        handle = self._submit(function, args, dict(kwargs or {}), ranks,
                              what or f"a background run of {name}",
                              advice or "its RunHandle's .watch(), or .cancel()")
        say(f"{handle.what} runs in the background on detached pool {self.name!r} (it goes on if "
            f"this kernel ends); {'%accelerate watch' if advice else '.watch()'} shows it live")
        return handle

    def _submit(self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                ranks: tuple[int, ...] | None, what: str, advice: str,
                stream: bool = False) -> DetachedRun:
        if not callable(function):
            raise hide_our_frames(TypeError(f"function={function!r} is not callable; pass the "
                                            "function to run"))
        try:
            payload = serialise_payload(function, args, kwargs, sent=self._cells_sent)
        except TypeError as error:
            hide_our_frames(error)
            raise
        stream = stream and self._connection.streams  # (a keeper actor's output is read)
        info = self._ask("submit", timeout=_LONG, body=payload, what=what, advice=advice,
                         ranks=None if ranks is None else list(ranks), stream=stream)
        return DetachedRun(self, info, streaming=stream)

    def _foreground(self, ranks: tuple[int, ...] | None, function: Callable[..., Any],
                    args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = getattr(function, "__name__", type(function).__name__)
        handle = self._submit(function, args, kwargs, ranks, f"a run of {name}",
                              "wait for it, or .background.cancel()", stream=True)
        try:
            with interrupts_raised():
                handle.show()
        except KeyboardInterrupt:  # the stop button: the run's stop, as on a kernel's pool
            handle.output.leave_stream()
            handle.cancel()
            handle.show()
        except BaseException:
            handle.output.leave_stream()
            raise
        return handle.result()

    def leave(self) -> None:
        """Let the pool go on without this kernel (``WorkerPool.attach`` reaches it again)."""
        self._closed = True
        self._connection.close()

    def close(self) -> None:
        """End the pool: its keeper and workers (a running run is cancelled first)."""
        if not self._closed:
            self._closed = True
            self._connection.close()
            try:
                self._stop()
            except ValueError:
                pass  # ended already

    def __enter__(self) -> DetachedPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "left" if self._closed else f"{self.plan.world_size} ranks"
        return f"<detached WorkerPool {self.name!r}: {state}, {self.plan.device_type}>"


def known_cluster() -> str | None:
    """The Ray cluster a detached pool is looked for on when none is named: the one this
    kernel is connected to, else the ``cluster`` option's (environment variable, config file)."""
    from notebook_accel.launch.cluster import placement

    return placement.connected() or fill_options({}, None).get("cluster") or None


def _plain(ranks: int | str | Iterable[int] | None) -> Any:
    """``ranks`` as JSON carries it."""
    return ranks if ranks is None or isinstance(ranks, (int, str)) else list(ranks)
