"""Identical lines of many ranks, shown once with their ranks: ``[ranks 0-1023] epoch 1 done``.

With many ranks, most lines are the same on every rank. A line waits ``window`` seconds for the
same text from other ranks; then it is shown once, prefixed with the ranks that wrote it (lines
that differ stay per rank, with their own prefix). Each rank's lines keep their order: a line
joins a waiting group only if that group began after the rank's previous line's group.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW = 0.15  # seconds a line waits for the same line of other ranks


@dataclass
class _Group:
    seq: int
    since: float
    name: str  # "stdout" or "stderr"
    text: str
    ranks: list[int] = field(default_factory=list)


class LineGroups:
    """Gathers lines into groups of identical text and releases them in order of arrival."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._waiting: collections.deque[_Group] = collections.deque()
        self._open: dict[tuple[str, str], _Group] = {}  # (stream, text) -> its newest group
        self._rank_seq: dict[int, int] = {}  # rank -> the group of its latest line
        self._seq = 0

    def add(self, rank: int, name: str, text: str, now: float) -> None:
        """Take one line of ``rank``'s ``name`` stream."""
        group = self._open.get((name, text))
        if group is None or group.seq <= self._rank_seq.get(rank, -1):
            group = _Group(self._seq, now, name, text)
            self._seq += 1
            self._waiting.append(group)
            self._open[(name, text)] = group
        group.ranks.append(rank)
        self._rank_seq[rank] = group.seq

    def release(self, now: float | None, emit: Callable[[str, list[int], str], None],
                until: float | None = None) -> bool:
        """Pass every group older than the window (all, when ``now`` is None) to
        ``emit(stream, ranks, text)``, oldest first; with ``until`` (a ``time.perf_counter()``),
        stop there (after one group at least). Returns whether every such group was passed."""
        waiting = self._waiting

        def due() -> bool:
            return bool(waiting) and (now is None or now - waiting[0].since >= self.window)

        while due():
            group = waiting.popleft()
            if self._open.get((group.name, group.text)) is group:
                del self._open[(group.name, group.text)]
            emit(group.name, group.ranks, group.text)
            if until is not None and time.perf_counter() > until:  # (one group at least)
                return not due()
        return True

    def due_in(self, now: float) -> float:
        """Seconds until the oldest group's window has passed (inf: none waits)."""
        return self._waiting[0].since + self.window - now if self._waiting else float("inf")

    def __len__(self) -> int:
        return len(self._waiting)
