"""``WorkerPool``: warm workers that keep their Python state and process group across calls.

A pool starts one worker per rank once; ``pool.run(fn, ...)`` runs ``fn`` on every rank
with the same contract as ``notebook_launcher`` (live output, rank 0's value, one
``WorkerError`` naming the root-cause rank), through the same supervisor, relay and
views. What a run assigns stays on the workers for the next run
(``launch/worker/namespace.py``).

Never a silently wrong result: a run that ends inside a collective (interrupted, or a
broken peer), a rank killed, or ranks whose process groups disagree on how many
collectives they issued, leave a group that could pair later collectives wrongly; it is
never reused. When ranks died and others live, the pool heals in place (``heal.py``:
the dead ranks alone started again, given what the living hold alike); otherwise it
replaces every worker. Either way it says what was kept and lost (``recovery.py``).

Here: making the pool and its run path (``run``, ``run_on``, ``debug``, ``restart``,
``close``); its questions about itself are ``questions.py``'s, its recovery after a run
``recovery.py``'s, its background runs ``background.py``'s: parts of one ``WorkerPool``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from notebook_accel.launch.backends.base import PoolWorkerSet
from notebook_accel.launch.backends.pool import PoolBackend, pool_workers
from notebook_accel.launch.control.interrupts import StopPresses, deferred_interrupts, stopped_by
from notebook_accel.launch.handoff.payload import serialise_payload
from notebook_accel.launch.handoff.shared_tensors import SharedTensors
from notebook_accel.launch.launcher import launch_once, plan_launch, print_notes
from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.launch.pools.background import BackgroundRuns, PoolBusy
from notebook_accel.launch.pools.heal import Healed
from notebook_accel.launch.pools.questions import PoolQuestions, RankInfo
from notebook_accel.launch.pools.recovery import PoolRecovery, say_recovery
from notebook_accel.launch.pools.run_handle import RunHandle
from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.tracebacks import hide_our_frames
from notebook_accel.launch.supervision.verdicts.root_cause import ENDED_BY_US
from notebook_accel.launch.tuning import CANCEL_WAIT
from notebook_accel.launch.views.rank_ranges import parse_ranks
from notebook_accel.launch.worker.debugger import post_mortem
from notebook_accel.launch.worker.serve import join_process_group
from notebook_accel.machine.launch_kinds import device_launch
from notebook_accel.wire import RunDone

__all__ = ["PoolUnavailable", "RankInfo", "WorkerPool"]  # RankInfo: questions.py's


class PoolUnavailable(RuntimeError):
    """The pool cannot run anything: it is closed, or its workers are gone.

    Attributes:
        reason: what happened, without the advice (``"the pool is closed"``), for a
            front end to add its own (``%accelerate restart``).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Current:
    """The pool's current workers, apart from the pool so that its finaliser can close them."""

    def __init__(self) -> None:
        self.workers: PoolWorkerSet | None = None

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None


class WorkerPool(PoolQuestions, PoolRecovery, BackgroundRuns):
    """Warm workers (on this machine, or a Ray cluster's nodes with ``num_nodes`` and
    ``cluster``), which keep their state and process group across runs.

    Takes the options of :func:`~notebook_accel.notebook_launcher` but those whose row says
    ``not_for_pool`` (``node_rank``, ``max_restarts``, the rendezvous ones), resolved and
    checked the same way (``launch/planning/request.py``: :func:`~notebook_accel.launch.planning.request.door_options`),
    and ``stop_wait``: the seconds every rank has, after the stop button, to reach the point where
    they all stop together (default 5; then they are stopped at once, as a rank stuck in
    compute or diverging ranks would never get there), and ``heal`` (default True: a rank that
    dies is replaced alone and given what the living ranks hold alike; False: every worker is
    replaced). The workers start at once. Closed by :meth:`close`, at the end of a
    ``with`` block, when garbage-collected, or when the interpreter exits; workers also end
    when the kernel dies.

    Raises:
        TypeError, ValueError: a bad or unknown option, before any worker starts.

    Example:
        >>> with WorkerPool(num_processes=2) as pool:  # doctest: +SKIP
        ...     pool.run(load, "data/")      # `global data` in load: stays on the workers
        ...     pool.run(train, epochs=1)    # train sees `data`; the process group is still up
    """

    def __new__(cls, **options: Any) -> Any:
        if _detached(options):  # a keeper's pool, reached through it
            from notebook_accel.launch import DetachedPool  # (public name: detached/ uses us)

            return DetachedPool.start(options)
        return super().__new__(cls)

    def __init__(self, **options: Any) -> None:
        self._open(options)

    @classmethod
    def from_request(cls, request: LaunchRequest) -> Any:
        """A pool for a front door that built its own ``request`` (the ``%accelerate start``
        magic's flags): its values are not checked again, and an error about one of them
        names where it came from (``flag --mixed-precision: ...``), before any worker starts.

        Raises:
            TypeError, ValueError: as ``WorkerPool(...)``.
        """
        if _detached(request):
            from notebook_accel.launch import DetachedPool

            return DetachedPool.start(request)
        pool = object.__new__(cls)
        pool._open(request)
        return pool

    @staticmethod
    def attach(name: str | None = None, cluster: str | None = None) -> Any:
        """The detached pool ``name`` (None: the only one up), started by any kernel of this
        user on this machine (``WorkerPool(detach=True, name=...)``), or on the Ray cluster
        ``cluster`` (None: the one this kernel is connected to, or the ``cluster`` option's
        environment variable or config file): runs on it go through its keeper; its latest
        run is ``.background`` (``.watch()``: from its first line, once).

        Raises:
            ValueError: no such pool is up (naming those that are).
        """
        from notebook_accel.launch import DetachedPool

        return DetachedPool.attach(name, cluster)

    def _open(self, options: dict[str, Any] | LaunchRequest) -> None:
        with deferred_interrupts():
            try:
                self.plan = self._plan(options)
            except (TypeError, ValueError) as error:
                hide_our_frames(error)
                raise
            self._current = _Current()
            self._finalizer = weakref.finalize(self, self._current.close)
            self._reports: tuple[RunDone, ...] = ()  # each rank's latest report
            self._healed: tuple[int, ...] = ()  # the ranks the last run's heal replaced
            self.last_heal: Healed | None = None  # the latest heal in place (what it did, its times)
            self._failed_rank: int | None = None  # the root cause of the latest failed run
            self._background: RunHandle | None = None  # the latest background run
            self._start()

    @staticmethod
    def _plan(options: dict[str, Any] | LaunchRequest) -> LaunchPlan:
        request = (options.for_door("WorkerPool") if isinstance(options, LaunchRequest)
                   else LaunchRequest.from_keywords("WorkerPool", options))
        notes: list[str] = []
        filled = fill_options(request, request.get("config_file"), notes)  # once
        nodes = filled["num_nodes"]
        if nodes != 1 and filled["cluster"] is None:
            if "num_nodes" in request:
                source = request.source("num_nodes")
                raise ValueError(f"{source + ': ' if source else ''}num_nodes={nodes!r}: a pool "
                                 "spans several nodes only on a Ray cluster; give cluster= (e.g. "
                                 "'head:6379'), or num_nodes=1")
            raise ValueError(f"num_nodes={nodes} (from the config file): a pool spans "
                             "several nodes only on a Ray cluster; give cluster=, or num_nodes=1")
        plan = plan_launch(request, notes, filled)
        refusal = device_launch(plan.device_type).pool_refusal
        if refusal is not None:
            raise ValueError(refusal)
        print_notes(plan, notes)
        return plan

    def _start(self) -> None:
        self._current.workers = workers = pool_workers(self.plan)
        self._reports = ()
        try:  # the process group is ready before the first run
            launch_once(PoolBackend(workers), self.plan,
                        serialise_payload(join_process_group, (), {}))
        except BaseException:
            self._current.close()
            raise

    # -- the public surface ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return not self._finalizer.alive

    def run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on every rank of the pool.

        Same contract as ``notebook_launcher``: output live in the cell, rank 0's value
        (every rank's with ``return_all=True``). A function defined in the notebook runs
        in the worker's namespace: names that live there win over the notebook's copies,
        and what it assigns (``global x; x = ...``) stays there for later runs.

        Workers that died since the last run (killed while idle) are healed (or every
        worker replaced) first, as after a run that broke them, saying so (:meth:`revive`).

        Raises:
            TypeError: ``function`` is not callable, or a value cannot be pickled.
            PoolUnavailable: the pool is closed (a RuntimeError).
            PoolBusy: a background run runs on the pool (a RuntimeError naming it).
            WorkerError: the run failed on a rank (root cause named); the pool stays up, or
                heals or replaces its workers when its process group cannot be trusted (what
                it did: the error's ``recovery``).
            KeyboardInterrupt: interrupted; every rank stopped its run.
        """
        return self._run(None, function, args, kwargs)

    def run_on(self, ranks: int | str | Iterable[int], function: Callable[..., Any],
               *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` on some ranks of the pool only (the others stay
        idle, their state untouched), as :meth:`run` does on every rank.

        Args:
            ranks: ``1``, ``"0,2-3"`` or ``[0, 2]``.
        Returns:
            The first chosen rank's value (every chosen rank's with ``return_all=True``).
        Raises:
            ValueError: a rank outside the pool.
            WorkerError: as :meth:`run`; also when a rank enters a collective of the whole
                process group, which the other ranks never join: the run is stopped within
                a second or two (the cause named) and, as its group is left inside a
                collective, the workers are replaced (said).

        Example:
            >>> pool.run_on(1, inspect_batch)  # doctest: +SKIP
        """
        try:
            chosen = parse_ranks(ranks, self.plan.world_size)
        except ValueError as error:
            hide_our_frames(error)
            raise
        return self._run(chosen, function, args, kwargs)

    def debug(self, rank: int | None = None) -> None:
        """Open pdb at the frame that raised in the latest failed run, on its root-cause rank
        (or ``rank``), driven from the notebook's input box (``p``, ``up``, ``l``, ``q``...).
        The other ranks are not disturbed; the rank's state stays.

        Raises:
            RuntimeError: no failed run to debug (none yet, or the workers were replaced).
        """
        rank = self._failed_rank if rank is None else rank
        if rank is None:
            raise hide_our_frames(RuntimeError(
                "no failed run to debug: no run on the pool's current workers has failed (a "
                "failure's frames go with the workers that held them)"))
        self.run_on(rank, post_mortem)

    def _run(self, ranks: tuple[int, ...] | None, function: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with deferred_interrupts():
            workers = self._ready(function)
            with SharedTensors() as shared:  # big tensors: one shared copy, not one per rank
                payload = self._payload(workers, function, args, kwargs, shared)
                return self._launch(workers, ranks, payload)

    def _ready(self, function: Callable[..., Any]) -> PoolWorkerSet:
        """The workers, ready for a run of ``function`` (dead ones healed or replaced first).

        Raises:
            TypeError: ``function`` is not callable.
            PoolUnavailable, PoolBusy, WorkerError: see :meth:`run` and :meth:`submit`.
        """
        try:
            if not callable(function):
                raise TypeError(f"function={function!r} is not callable; pass the function "
                                "to run")
            self.revive()
            return self._usable()
        except (TypeError, PoolUnavailable, PoolBusy) as error:
            hide_our_frames(error)
            raise

    def _payload(self, workers: PoolWorkerSet, function: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], shared: SharedTensors) -> Any:
        try:
            return serialise_payload(
                function, args, kwargs, shared=shared if workers.local else None,
                sent=workers.cells_sent)
        except TypeError as error:
            hide_our_frames(error)
            raise

    def _launch(self, workers: PoolWorkerSet, ranks: tuple[int, ...] | None, payload: Any,
                presses: StopPresses | None = None, handle: RunHandle | None = None) -> Any:
        """One run on ``workers``, then the pool's recovery if its group cannot be trusted
        (in a background run's thread: stopped by ``presses``, its output kept in ``handle``)."""
        ended = "failed"
        try:
            with stopped_by(presses) if presses is not None else contextlib.nullcontext():
                value = launch_once(PoolBackend(workers, ranks), self.plan, payload,
                                    into=handle.output if handle is not None else None)
            ended = "finished"
            return value
        except WorkerError as error:
            self._failed_rank = error.rank
            ours = {f.rank for f in error.other_failures if f.headline.startswith(ENDED_BY_US)}
            error.recovery = self._after_run(workers, "failed", ours, error.rank) or ""
            ended = "said"
            raise
        except KeyboardInterrupt:
            ended = "interrupted"
            raise
        finally:
            if ended != "said":
                say_recovery(self._after_run(workers, ended))

    def restart(self) -> None:
        """Replace the workers with fresh ones (their state is dropped)."""
        if self.closed:
            raise PoolUnavailable("this WorkerPool is closed; create a new one instead of "
                                  "restarting it", "the pool is closed")
        self._refuse_if_busy()
        with deferred_interrupts():
            self._current.close()
            self._start()

    def close(self) -> None:
        """Stop the workers and release everything of the pool (a background run is cancelled
        first, at its consistent cut). Idempotent."""
        if self._background is not None and not self._background.done():
            self._background.cancel(timeout=CANCEL_WAIT)
        self._finalizer()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.plan.world_size} ranks"
        return f"<WorkerPool {state}, {self.plan.device_type}, start {self.plan.start.method}>"

    # -- health ------------------------------------------------------------------------------

    def _gone(self) -> bool:
        workers = self._current.workers
        return workers is None or bool(workers.dead())

    def _usable(self) -> PoolWorkerSet:
        workers = self._current.workers
        if self.closed or workers is None:
            raise PoolUnavailable("this WorkerPool is closed; create a new one, e.g. "
                                  f"WorkerPool(num_processes={self.plan.num_processes})",
                                  "the pool is closed")
        return workers


def _detached(options: Any) -> bool:
    """Whether ``options`` ask for a detached pool (``detach=True``).

    Raises:
        ValueError: a detached pool's option (``name``, ``idle_timeout``) without ``detach``.
    """
    if options.get("detach"):
        return True
    given = [row for row in ("name", "idle_timeout") if options.get(row) is not None]
    if given:
        raise hide_our_frames(ValueError(
            f"{', '.join(f'{row}={options[row]!r}' for row in given)}: only a detached pool "
            "takes it; add detach=True (%accelerate start --detach)"))
    return False



