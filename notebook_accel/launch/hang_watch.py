"""Spot a rank that makes no progress, mark it, and show every rank's stack once.

Progress is anything a rank does that the kernel sees: a line of output, an event, a
control message, or (a pool's ranks, asked for their stacks while silent) a collective
issued. A rank silent for ``after`` seconds is marked ``no progress`` in the record (the
live view and the text view show it, with the time); on a pool every rank's stack is
then shown once, grouped (:mod:`.stack_groups`). A rank that moves again loses the mark.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from notebook_accel.launch.rank_ranges import ranks_text
from notebook_accel.launch.record import LaunchRecord
from notebook_accel.launch.stack_groups import stacks_text

NO_PROGRESS = "no progress"  # the rank's state (a phase) while it makes none
HANG_AFTER = 60.0  # default seconds without progress before a rank is marked
_LOOK_EVERY = 0.5


class HangWatch:
    """The ranks' latest progress, for one launch's supervisor."""

    def __init__(self, ranks: Sequence[int], after: float | None, record: LaunchRecord,
                 report: Callable[[str], None]) -> None:
        now = time.monotonic()
        self.after = after
        self.record = record
        self.report = report  # shows a text in the cell (the grouped stacks)
        self.progress = dict.fromkeys(ranks, now)
        self.counts: dict[int, int | None] = {}  # collectives at the last stack seen
        self.said = False
        self._looked = now

    def moved(self, rank: int) -> None:
        """``rank`` showed progress now."""
        self.progress[rank] = time.monotonic()
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
        if self.after is None or now - self._looked < _LOOK_EVERY:
            return
        self._looked = now
        running = [w for w in workers if not w.finished]
        silent = [w for w in running if now - self.progress[w.rank] >= self.after]
        if not silent:
            return
        for w in silent:
            if w.stack is not None and self.counts.setdefault(w.rank, w.stack.collectives) \
                    != w.stack.collectives:  # a collective issued: progress
                self.counts[w.rank] = w.stack.collectives
                self.moved(w.rank)
                continue
            status = self.record.ranks[w.rank]
            if status.state != NO_PROGRESS:
                status.enter_phase(NO_PROGRESS, time.time() - (now - self.progress[w.rank]))
        asked = [w for w in running if w.ask_stack()]  # a pool's ranks answer
        answered = {w.rank: w.stack.frames for w in asked if w.stack is not None}
        marked = [w.rank for w in silent if self.record.ranks[w.rank].state == NO_PROGRESS]
        if marked and not self.said and asked and len(answered) == len(asked):
            self.said = True
            self.report(f"no progress (no output, event or collective) for {self.after:g} s on "
                        f"{ranks_text(marked)}; every rank's stack now:\n{stacks_text(answered)}")
