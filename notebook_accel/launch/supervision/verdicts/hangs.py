"""The hang verdict: spot a rank that makes no progress, mark it, show every rank's stack once.

Progress is anything a rank does that the kernel sees: a line of output, an event, a
control message, or (a pool's ranks, asked for their stacks while silent) a collective
issued. A rank silent for ``after`` seconds is marked ``no progress`` in the record (the
live view and the text view show it, with the time), and every running rank's stack is
then shown once, grouped (``supervision/stack_groups.py``): a pool's ranks answer a ``StackAsk``, a
one-off launch's dump theirs through faulthandler (``supervision/stack_dumps.py``). Above the stacks,
the ranks' last collectives (their flight recorders) are said as a disagreement at a
numbered collective (``supervision/collective_disagreement.py``): different operations or shapes at
the same number, ranks that never reached it. A rank that moves again loses the mark.

The stacks shown also tell the stop button when its cut cannot be reached
(:meth:`HangWatch.cut_unreachable`): every rank marked, and some wait inside a collective
that the others, further back, have not joined. Waiting for a common point would only
wait ``stop_wait``; the ranks are stopped at once, saying why in words.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from notebook_accel.contract import OPTIONS
from notebook_accel.launch.supervision.collective_disagreement import disagreement
from notebook_accel.launch.supervision.stack_dumps import StackDumps
from notebook_accel.launch.supervision.stack_groups import innermost, stacks_text
from notebook_accel.launch.tuning import HANG_LOOK_EVERY, HANG_RECORDED
from notebook_accel.launch.views.output import OutputRelay
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.launch.views.record import LaunchRecord, RankState

NO_PROGRESS = RankState.NO_PROGRESS  # the rank's state (a phase) while it makes none
HANG_AFTER: float = OPTIONS["hang_after"].default  # seconds without progress before a mark


class HangWatch:
    """The ranks' latest progress, for one launch's supervisor."""

    def __init__(self, ranks: Sequence[int], after: float | None, record: LaunchRecord,
                 report: Callable[[str], None], dumps: StackDumps | None = None) -> None:
        """``dumps``: the stacks of ranks that cannot answer a ``StackAsk`` (None: not shown)."""
        now = time.monotonic()
        self.after = after
        self.record = record
        self.report = report  # shows a text in the cell (the grouped stacks)
        self.dumps = dumps
        self.progress = dict.fromkeys(ranks, now)  # the least recent first
        self.counts: dict[int, int | None] = {}  # collectives at the last stack seen
        self.said = False
        self._looked = now
        self._index: dict[int, Any] | None = None  # rank -> the supervisor's worker

    def moved(self, rank: int) -> None:
        """``rank`` showed progress now (its own stack dump is none)."""
        if self.dumps is not None and rank in self.dumps.ranks():
            return
        self.progress.pop(rank, None)
        self.progress[rank] = time.monotonic()  # to the end: a look reads the front only
        status = self.record.ranks[rank]
        if status.state == NO_PROGRESS:
            status.enter_phase(None, time.time())

    def waited(self) -> None:
        """The kernel waited on the user (a debugger's prompt): no rank's silence counts."""
        now = time.monotonic()
        self.progress = dict.fromkeys(self.progress, now)

    def look(self, workers: Sequence[Any]) -> None:
        """Mark the ranks silent for ``after`` seconds (cheap; looks twice a second)."""
        now = time.monotonic()
        if self.after is None or now - self._looked < HANG_LOOK_EVERY:
            return
        self._looked = now
        if self.dumps is not None and self.dumps.taking:
            if self.dumps.ready():
                self._show(*self.dumps.take())
            return
        silent = self._silent(workers, now)
        if not silent:
            return
        running = [w for w in workers if not w.finished]
        for w in silent:
            if w.stack is not None and self.counts.setdefault(w.rank, w.stack.collectives) \
                    != w.stack.collectives:  # a collective issued: progress
                self.counts[w.rank] = w.stack.collectives
                self.moved(w.rank)
                continue
            status = self.record.ranks[w.rank]
            if status.state != NO_PROGRESS:
                status.enter_phase(NO_PROGRESS, time.time() - (now - self.progress[w.rank]))
        recorded = 0 if self.said else HANG_RECORDED  # (once said, the count is all that is read)
        asked = [w for w in running if w.ask_stack(recorded)]  # a pool's ranks answer
        answered = {w.rank: w.stack for w in asked
                    if w.stack is not None and w.stack.recorder is not None}
        if self.said or not any(self.record.ranks[w.rank].state == NO_PROGRESS for w in silent):
            return
        if asked:
            if len(answered) == len(asked):
                self._show({rank: stack.frames for rank, stack in answered.items()},
                           {rank: stack.recorder for rank, stack in answered.items()})
        elif self.dumps is not None:
            self.dumps.ask(running)  # taken at a later look, once they had time to arrive

    def _silent(self, workers: Sequence[Any], now: float) -> list[Any]:
        """The running workers silent for ``after`` seconds: the front of ``progress``, so a
        look costs what is silent, not the number of ranks (finished ones are dropped)."""
        if self._index is None or len(self._index) != len(workers):
            self._index = {w.rank: w for w in workers}
        by_rank, silent = self._index, []
        for rank, at in list(self.progress.items()):
            if now - at < self.after:
                break
            worker = by_rank.get(rank)
            if worker is None or worker.finished:
                del self.progress[rank]
            else:
                silent.append(worker)
        return silent

    def _show(self, stacks: dict[int, Any], recorders: dict[int, Any]) -> None:
        """Say which ranks are marked, with what their collectives disagree on and every
        running rank's stack, once (none marked any more: nothing, and a later silence is
        said)."""
        marked = [rank for rank, status in self.record.ranks.items() if status.state == NO_PROGRESS]
        if marked:
            self.said = True
            ended = [rank for rank in self.record.ranks if rank not in stacks]  # (not asked)
            said = disagreement(recorders, stacks, ended)
            collectives = f"\nlast collectives: {said}\n" if said else "; "
            self.report(f"no progress (no output, event or collective) for {self.after:g} s on "
                        f"{ranks_text(marked)}{collectives}every rank's stack now:\n"
                        f"{stacks_text(stacks)}")

    def cut_unreachable(self, workers: Sequence[Any]) -> str | None:
        """Why the stop button's cut cannot be reached, as the stacks shown already tell
        (``rank 1 is blocked in all_reduce, which rank 0 has not joined``); None: it may be.

        Every running rank is marked, and the ranks furthest on (most collectives issued)
        wait inside their last one while the others, further back, have not joined it.
        """
        running = [w for w in workers if not w.finished]
        if not self.said or not running:
            return None
        if any(self.record.ranks[w.rank].state != NO_PROGRESS or w.stack is None
               or w.stack.collectives is None for w in running):
            return None
        furthest = max(w.stack.collectives for w in running)
        ahead = [w for w in running if w.stack.collectives == furthest]
        behind = [w.rank for w in running if w.stack.collectives < furthest]
        if not behind:
            return None
        blocked = innermost(ahead[0].stack.frames)
        return (f"{ranks_text(w.rank for w in ahead)} {'is' if len(ahead) == 1 else 'are'} "
                f"blocked in {blocked}, which {ranks_text(behind)} "
                f"{'has' if len(behind) == 1 else 'have'} not joined")


def cell_note(relay: OutputRelay, text: str) -> None:
    """A note of ours in the cell, below the output gathered so far (what ``report`` says,
    given ``functools.partial(cell_note, relay)``: a function of the relay, not a method, so
    no cycle keeps the workers' pipes open after)."""
    relay.flush()
    print(f"[notebook_accel] {text}", file=sys.stderr, flush=True)
