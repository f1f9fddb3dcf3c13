"""What a warm pool answers about itself: the names its ranks hold, whether it would heal,
what replacing it would lose, where its ranks are (``stacks``, ``collectives``), ``status``.

:class:`PoolQuestions` is a part of :class:`~notebook_accel.WorkerPool` (as ``BackgroundRuns``
is); it asks nothing of a run and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from notebook_accel.launch.planning.plan import LaunchPlan
from notebook_accel.launch.pools.heal import can_heal
from notebook_accel.launch.pools.recovery import lost_names
from notebook_accel.launch.supervision.collective_table import collectives_text
from notebook_accel.launch.supervision.stack_groups import stacks_text
from notebook_accel.launch.supervision.worker_stacks import ask_recorders, ask_stacks
from notebook_accel.launch.tuning import RECORDERS_WAIT, STACKS_WAIT
from notebook_accel.launch.views.rank_ranges import parse_ranks
from notebook_accel.wire import RunDone


@dataclass(frozen=True)
class RankInfo:
    """One worker of a pool, for ``%accelerate status``."""

    rank: int
    pid: int | None
    alive: bool
    exitcode: int | None
    rss: int | None  # bytes


class PoolQuestions:
    """The pool's questions about itself, for :class:`~notebook_accel.WorkerPool`."""

    plan: LaunchPlan
    _current: Any  # the pool's current workers (pool.py's ``_Current``)
    _reports: tuple[RunDone, ...]  # each rank's latest report

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
        rest = [names for names in rest if names != first]  # (ranks mostly hold the same)
        if not rest:
            return first
        common = set(first).intersection(*rest)
        return tuple(name for name in first if name in common)

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
        return lost_names(self._reports)

    def stacks(self, timeout: float = STACKS_WAIT) -> str:
        """Every rank's current Python stack, ranks at the same place grouped
        (``ranks 0, 2-7: all_reduce <- step <- train``); idle ranks say so.

        Raises:
            PoolUnavailable: the pool is closed.
        """
        self._refuse_if_busy()
        workers = self._usable()
        stacks, silent = ask_stacks(workers.handles, timeout)
        return stacks_text(stacks, silent)

    def collectives(self, last: int = 8, timeout: float = RECORDERS_WAIT) -> str:
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

    def status(self) -> list[RankInfo]:
        """One :class:`RankInfo` per rank (none once closed)."""
        workers = self._current.workers
        if workers is None:
            return []
        dead = {h.rank for h in workers.dead()}  # (a cluster rank whose node was lost: no exit code)
        return [RankInfo(rank=h.rank, pid=h.pid, alive=h.rank not in dead, exitcode=h.exitcode,
                         rss=None if h.rank in dead else h.rss()) for h in workers.handles]
