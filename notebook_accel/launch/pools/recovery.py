"""A warm pool's recovery: after a run (or while idle) its workers are kept when their process
group can be trusted, else the dead ranks are healed in place (``heal.py``) or every worker is
replaced; either way what was kept and lost is said.

:class:`PoolRecovery` is a part of :class:`~notebook_accel.WorkerPool` (as ``BackgroundRuns``
is): ``revive`` and what a run's end calls (``_after_run``).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from notebook_accel.launch.backends.base import PoolWorkerSet, WorkerHandle
from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.pools.heal import Healed, can_heal, heal_in_place
from notebook_accel.launch.tuning import INTERRUPT_GRACE
from notebook_accel.launch.views.text import ranks_text, say
from notebook_accel.wire import RunDone

_REPLACED = "the pool's workers were replaced"


class PoolRecovery:
    """``revive`` and the pool's recovery after a run, for :class:`~notebook_accel.WorkerPool`."""

    plan: LaunchPlan
    _current: Any  # the pool's current workers (pool.py's ``_Current``)
    _reports: tuple[RunDone, ...]  # each rank's latest report
    _healed: tuple[int, ...]  # the ranks the last run's heal replaced
    last_heal: Healed | None
    _failed_rank: int | None

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
            say_recovery(self._recover(workers, reason, self._reports))

    def _after_run(self, workers: PoolWorkerSet, ended: str, ours: set[int] = frozenset(),
                   root: int | None = None) -> str | None:
        """Keep the workers when every rank is idle with a group it can trust; else heal or
        replace them. Returns what was done, in words (None: the workers were kept); why, too,
        unless the failed run's error says it (only its root-cause rank died: ``root``)."""
        reason = distrust(workers, ended, ours)
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

    def _recover(self, workers: PoolWorkerSet, reason: str,
                 reports: tuple[RunDone | None, ...], cause_said: bool = False) -> str:
        """Heal the dead ranks in place when the pool can, else replace every worker; returns
        what was done, starting with why (unless ``cause_said``: the run's error says it)."""
        dead = tuple(h.rank for h in workers.dead())
        known = tuple(r for r in reports if r is not None)
        every_name = lost_names(known) if known else self.lost
        if not dead or can_heal(self.plan, workers, list(dead)) is not None:
            return self._replace(reason, every_name)
        living = [r for rank, r in enumerate(reports) if rank not in dead and r is not None]
        theirs = lost_names(tuple(r for rank, r in enumerate(reports) if rank in dead and r is not None))
        again = sorted(set(dead) & set(self._healed))
        try:
            self.last_heal = heal_in_place(workers, self.plan, dead, theirs,
                                           same_cut=len({r.collectives for r in living}) <= 1)
        except Exception as error:  # noqa: BLE001 - whatever broke the heal, the pool recovers
            return self._replace(f"{reason}; the heal failed: {str(error).splitlines()[0]}",
                                 every_name)
        except KeyboardInterrupt:
            say_recovery(self._replace(f"{reason}; the heal was interrupted", every_name))
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


def say_recovery(recovery: str | None) -> None:
    """What a recovery did, in the cell: a heal as information, a replacement (state lost) as
    a warning."""
    if recovery and recovery.startswith(_REPLACED):
        print(f"[notebook_accel] {recovery}", file=sys.stderr, flush=True)
    elif recovery:
        say(recovery)


def lost_names(reports: tuple[RunDone, ...]) -> tuple[str, ...]:
    """The names holding state on any rank (modules and imported code do not), once each."""
    lost: dict[str, None] = {}
    for report in reports:
        imported = set(report.imported)
        lost.update((name, None) for name in report.names if name not in imported)
    return tuple(lost)


def distrust(workers: PoolWorkerSet, ended: str, ours: set[int] = frozenset()) -> str | None:
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

