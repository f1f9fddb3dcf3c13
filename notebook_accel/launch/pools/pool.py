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
replaces every worker. Either way it says what was kept and lost.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from notebook_accel.launch.backends.base import WorkerHandle
from notebook_accel.launch.backends.pool import PoolBackend, PoolWorkers, pool_workers
from notebook_accel.launch.control.interrupts import StopPresses, deferred_interrupts, stopped_by
from notebook_accel.launch.handoff.payload import serialise_payload
from notebook_accel.launch.handoff.shared_tensors import SharedTensors
from notebook_accel.launch.launcher import launch_once, plan_launch, print_notes
from notebook_accel.launch.planning.options import fill_options
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.planning.request import LaunchRequest
from notebook_accel.launch.pools.background import BackgroundRuns, PoolBusy
from notebook_accel.launch.pools.heal import Healed, can_heal, heal_in_place
from notebook_accel.launch.pools.run_handle import RunHandle
from notebook_accel.launch.supervision.collective_table import collectives_text
from notebook_accel.launch.supervision.errors import WorkerError
from notebook_accel.launch.supervision.stack_groups import stacks_text
from notebook_accel.launch.supervision.supervisor import ENDED_BY_US, INTERRUPT_GRACE
from notebook_accel.launch.supervision.tracebacks import hide_our_frames
from notebook_accel.launch.supervision.worker_stacks import ask_recorders, ask_stacks
from notebook_accel.launch.views.rank_ranges import parse_ranks
from notebook_accel.launch.views.text import ranks_text, say
from notebook_accel.launch.worker.debugger import post_mortem
from notebook_accel.launch.worker.serve import join_process_group
from notebook_accel.machine.launch_kinds import device_launch
from notebook_accel.wire import RunDone

_REPLACED = "the pool's workers were replaced"
_CANCEL_WAIT = 60.0  # seconds close() waits for a background run to stop before ending it


class PoolUnavailable(RuntimeError):
    """The pool cannot run anything: it is closed, or its workers are gone.

    Attributes:
        reason: what happened, without the advice (``"the pool is closed"``), for a
            front end to add its own (``%accelerate restart``).
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RankInfo:
    """One worker of a pool, for ``%accelerate status``."""

    rank: int
    pid: int | None
    alive: bool
    exitcode: int | None
    rss: int | None  # bytes


class _Current:
    """The pool's current workers, apart from the pool so that its finaliser can close them."""

    def __init__(self) -> None:
        self.workers: PoolWorkers | None = None

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.workers = None


class WorkerPool(BackgroundRuns):
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

    @property
    def names(self) -> tuple[str, ...]:
        """The names living on every rank (a name that a run on some ranks assigned, or that
        only some ranks assigned, is not one: :meth:`names_on`); none while a worker is gone
        (:meth:`revive` heals or replaces the workers; ``names_on`` the living ranks still
        answers)."""
        return self.names_on()

    def names_on(self, ranks: int | str | Iterable[int] | None = None) -> tuple[str, ...]:
        """The names living on every one of ``ranks`` (``1``, ``"0,2-3"``, ``[0, 2]``; default:
        every rank), in the order the first of them reports them."""
        return self._on_all(ranks, "names")

    @property
    def copies(self) -> tuple[str, ...]:
        """Those of :attr:`names` that still hold the copy the notebook sent, on every rank."""
        return self.copies_on()

    def copies_on(self, ranks: int | str | Iterable[int] | None = None) -> tuple[str, ...]:
        """Those of :meth:`names_on` ``ranks`` that still hold the notebook's copy on each."""
        return self._on_all(ranks, "copies")

    def _on_all(self, ranks: int | str | Iterable[int] | None, field: str) -> tuple[str, ...]:
        """The names in ``field`` (``names``, ``copies``) of the chosen ranks' reports, all."""
        workers = self._current.workers
        if workers is None or not self._reports:
            return ()
        chosen = range(len(self._reports)) if ranks is None else parse_ranks(
            ranks, self.plan.world_size)
        if {h.rank for h in workers.dead()} & set(chosen):  # a gone rank holds nothing
            return ()
        first, *rest = (getattr(self._reports[rank], field) for rank in chosen)
        others = [set(names) for names in rest]
        return tuple(name for name in first if all(name in names for names in others))

    @property
    def heals(self) -> bool:
        """Whether ranks that died now would be healed in place (some live, ``heal=True``, and
        no node of theirs was lost), not every worker replaced."""
        workers = self._current.workers
        if workers is None:
            return False
        dead = [h.rank for h in workers.dead()]
        return can_heal(self.plan, workers, dead) is None

    @property
    def lost(self) -> tuple[str, ...]:
        """What replacing the workers now would lose: the names on any rank that hold state
        (not modules, nor functions and classes imported from one), even when a worker is
        gone."""
        return _lost(self._reports)

    def revive(self) -> None:
        """Recover if a worker is gone (died while idle): heal in place (the dead ranks
        replaced alone, given what the others hold alike), or, with ``heal=False`` or no rank
        left, replace every worker; either way say what was kept and lost.

        Raises:
            PoolUnavailable: the pool is closed.
            PoolBusy: a background run runs on the pool (:meth:`submit`).
            WorkerError: the latest background run failed and nobody was told yet.
        """
        self._check_background()
        workers = self._usable()
        dead = workers.dead()
        if dead:
            reason = ", ".join(f"rank {h.rank} {_ended(h)}" for h in dead) + " while idle"
            _say(self._recover(workers, reason, self._reports))

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

    def stacks(self, timeout: float = 1.0) -> str:
        """Every rank's current Python stack, ranks at the same place grouped
        (``ranks 0, 2-7: all_reduce <- step <- train``); idle ranks say so.

        Raises:
            PoolUnavailable: the pool is closed.
        """
        self._refuse_if_busy()
        workers = self._usable()
        stacks, silent = ask_stacks(workers.handles, timeout)
        return stacks_text(stacks, silent)

    def collectives(self, last: int = 8, timeout: float = 5.0) -> str:
        """Every rank's last ``last`` collectives per process group, side by side, aligned by
        their number (ranks that read alike share a column): what each rank issued, with
        dtypes, shapes and the user's line, and which one it still waits in; while a
        background run runs too (its ranks answer even inside a collective).

        Example: ``print(pool.collectives(last=4))``.

        Raises:
            ValueError: ``last`` is not an integer >= 1.
            PoolUnavailable: the pool is closed.
        """
        if isinstance(last, bool) or not isinstance(last, int) or last < 1:
            raise ValueError(f"collectives(last={last!r}): last must be an integer >= 1")
        running = self._background is not None and not self._background.done()
        recorders, silent = ask_recorders(self._usable().handles, last, timeout, running)
        return collectives_text(recorders, last, silent)

    def _run(self, ranks: tuple[int, ...] | None, function: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with deferred_interrupts():
            workers = self._ready(function)
            with SharedTensors() as shared:  # big tensors: one shared copy, not one per rank
                payload = self._payload(workers, function, args, kwargs, shared)
                return self._launch(workers, ranks, payload)

    def _ready(self, function: Callable[..., Any]) -> PoolWorkers:
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

    def _payload(self, workers: PoolWorkers, function: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], shared: SharedTensors) -> Any:
        try:
            return serialise_payload(
                function, args, kwargs, shared=shared if self.plan.cluster is None else None,
                sources_sent=workers.sources_sent)
        except TypeError as error:
            hide_our_frames(error)
            raise

    def _launch(self, workers: PoolWorkers, ranks: tuple[int, ...] | None, payload: Any,
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
                _say(self._after_run(workers, ended))

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
            self._background.cancel(timeout=_CANCEL_WAIT)
        self._finalizer()

    def status(self) -> list[RankInfo]:
        """One :class:`RankInfo` per rank (none once closed)."""
        workers = self._current.workers
        if workers is None:
            return []
        dead = {h.rank for h in workers.dead()}  # (a cluster rank whose node was lost: no exit code)
        return [RankInfo(rank=h.rank, pid=h.pid, alive=h.rank not in dead, exitcode=h.exitcode,
                         rss=None if h.rank in dead else h.rss()) for h in workers.handles]

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

    def _usable(self) -> PoolWorkers:
        workers = self._current.workers
        if self.closed or workers is None:
            raise PoolUnavailable("this WorkerPool is closed; create a new one, e.g. "
                                  f"WorkerPool(num_processes={self.plan.num_processes})",
                                  "the pool is closed")
        return workers

    def _after_run(self, workers: PoolWorkers, ended: str, ours: set[int] = frozenset(),
                   root: int | None = None) -> str | None:
        """Keep the workers when every rank is idle with a group it can trust; else heal or
        replace them. Returns what was done, in words (None: the workers were kept); why, too,
        unless the failed run's error says it (only its root-cause rank died: ``root``)."""
        reason = _distrust(workers, ended, ours)
        reports = tuple(h.last_report for h in workers.handles)
        if reason is None:
            self._reports = reports  # (ranks a run on some ranks left idle: their last ones)
            self._healed = ()
            return None
        # a rank without a report of this run keeps its last one (what it held before)
        merged = tuple(r if r is not None else (self._reports[i] if i < len(self._reports) else None)
                       for i, r in enumerate(reports))
        said = ended == "failed" and {h.rank for h in workers.dead()} == {root}
        return self._recover(workers, reason, merged, cause_said=said)

    def _recover(self, workers: PoolWorkers, reason: str,
                 reports: tuple[RunDone | None, ...], cause_said: bool = False) -> str:
        """Heal the dead ranks in place when the pool can, else replace every worker; returns
        what was done, starting with why (unless ``cause_said``: the run's error says it)."""
        dead = tuple(h.rank for h in workers.dead())
        known = tuple(r for r in reports if r is not None)
        every_name = _lost(known) if known else self.lost
        if not dead or can_heal(self.plan, workers, list(dead)) is not None:
            return self._replace(reason, every_name)
        living = [r for rank, r in enumerate(reports) if rank not in dead and r is not None]
        theirs = _lost(tuple(r for rank, r in enumerate(reports) if rank in dead and r is not None))
        again = sorted(set(dead) & set(self._healed))
        try:
            self.last_heal = heal_in_place(workers, self.plan, dead, theirs,
                                           same_cut=len({r.collectives for r in living}) <= 1)
        except Exception as error:  # noqa: BLE001 - whatever broke the heal, the pool recovers
            return self._replace(f"{reason}; the heal failed: {str(error).splitlines()[0]}",
                                 every_name)
        except KeyboardInterrupt:
            _say(self._replace(f"{reason}; the heal was interrupted", every_name))
            raise
        self._healed = dead
        self._reports = tuple(h.last_report for h in workers.handles)
        if self._failed_rank in dead:
            self._failed_rank = None  # its frames went with it
        text = self.last_heal.text
        if again:
            text += (f"\n{ranks_text(again)} died again in the run right after a heal: if this "
                     "cell makes it run out of memory (or crash) every time, change the cell "
                     "before running it again")
        return text if cause_said else f"{reason}. {text}"

    def _replace(self, reason: str, lost: tuple[str, ...]) -> str:
        """Replace every worker; returns what was done and lost, in words."""
        self._failed_rank = None  # its frames are gone with the workers
        self._healed = ()
        self._current.close()
        self._start()
        return (f"{_REPLACED} ({reason}; a process group that may pair "
                f"later collectives wrongly is never reused): their state was "
                f"lost{': ' + _listed(lost) if lost else ''}")


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


def _say(recovery: str | None) -> None:
    """What a recovery did, in the cell: a heal as information, a replacement (state lost) as
    a warning."""
    if recovery and recovery.startswith(_REPLACED):
        print(f"[notebook_accel] {recovery}", file=sys.stderr, flush=True)
    elif recovery:
        say(recovery)


def _lost(reports: tuple[RunDone, ...]) -> tuple[str, ...]:
    """The names holding state on any rank (modules and imported code do not), once each."""
    lost: dict[str, None] = {}
    for report in reports:
        imported = set(report.imported)
        lost.update((name, None) for name in report.names if name not in imported)
    return tuple(lost)


def _distrust(workers: PoolWorkers, ended: str, ours: set[int] = frozenset()) -> str | None:
    """Why the workers' process group cannot be trusted after a run that ``ended``
    (``finished``, ``failed``, ``interrupted``); None: it can. ``ours``: the ranks the stop
    that followed a failure had to end (said as such, not as an outside kill)."""
    dead = workers.dead()
    if dead and ended == "interrupted":  # the supervisor killed the ranks stuck in C++ code
        return (f"{ranks_text(h.rank for h in dead)} did not stop within {INTERRUPT_GRACE:g} s of "
                f"the interrupt (blocked in C++ code, e.g. a collective), so we ended "
                f"{'it' if len(dead) == 1 else 'them'}")
    if dead:
        return ", ".join(f"rank {h.rank} was ended by us (blocked in C++ code after the failure, "
                         f"e.g. in a collective, it did not stop within {INTERRUPT_GRACE:g} s)"
                         if h.rank in ours else f"rank {h.rank} {_ended(h)}" for h in dead)
    reports = [h.last_report for h in workers.handles]
    if any(r is None for r in reports):
        return "a rank did not end its run"
    broke = [h.rank for h, r in zip(workers.handles, reports, strict=True) if r.broke_group]
    if broke:
        return f"the run ended inside a collective on {ranks_text(broke)}"
    counts = {r.collectives for r in reports}
    if len(counts) > 1:
        return ("the ranks' process groups disagree (collectives issued: "
                f"{', '.join(str(r.collectives) for r in reports)})")
    if ended != "finished" and -1 in counts:
        return "the run failed and the process group cannot be checked"
    return None


def _ended(handle: WorkerHandle) -> str:
    """How a dead rank ended, in words (a cluster rank whose node was lost has no exit code)."""
    exitcode = handle.exitcode
    if exitcode is None:  # its handle says why (a lost node)
        return handle.describe_end() or "ended without an exit status"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _listed(names: tuple[str, ...], most: int = 20) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more

