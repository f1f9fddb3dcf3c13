"""Every rank's whole output, kept in the kernel whatever the cell showed.

The cell shows what its budget allows (``output.py``); this keeps each rank's lines (stdout and
stderr, in order) for ``last_launch().logs(rank)``. Memory is bounded: ``LOG_BYTES`` for the
launch, shared by its ranks (at least ``RANK_MIN`` and at most ``RANK_MAX`` each); past a
rank's share its oldest lines go, counted, and the log says how many.
"""

from __future__ import annotations

import collections

LOG_BYTES = 256 << 20  # bytes of every rank's lines kept for one launch, together
RANK_MIN = 256 << 10  # bytes kept per rank at least, however many ranks
RANK_MAX = 16 << 20  # bytes kept per rank at most, however few ranks


class _Log:
    def __init__(self) -> None:
        # a line's text and its stream side by side, not as a pair: a million kept lines are
        # then no million objects for the garbage collector to count and walk
        self.texts: collections.deque[str] = collections.deque()
        self.streams: collections.deque[str] = collections.deque()
        self.size = 0
        self.dropped_lines = 0
        self.dropped_bytes = 0


class RankLogs:
    """Lines per rank, oldest dropped (and counted) past each rank's share of ``LOG_BYTES``."""

    def __init__(self, ranks: int = 1) -> None:
        self._logs: dict[int, _Log] = {}
        self.share = RANK_MAX
        self.expect(ranks)

    def expect(self, ranks: int) -> None:
        """Size each rank's share for a launch of ``ranks`` ranks."""
        self.share = max(RANK_MIN, min(RANK_MAX, LOG_BYTES // max(1, ranks)))

    def add(self, rank: int, stream: str, text: str) -> None:
        """Keep one line (without its newline) of ``rank``'s ``stream``."""
        log = self._logs.get(rank)
        if log is None:
            log = self._logs[rank] = _Log()
        log.texts.append(text)
        log.streams.append(stream)
        log.size += len(text) + 1
        while log.size > self.share and len(log.texts) > 1:
            old = log.texts.popleft()
            log.streams.popleft()
            log.size -= len(old) + 1
            log.dropped_lines += 1
            log.dropped_bytes += len(old) + 1

    def ranks(self) -> list[int]:
        """The ranks that wrote anything."""
        return sorted(self._logs)

    def text(self, rank: int, stream: str | None = None) -> str:
        """``rank``'s lines (only ``stream``'s, "stdout" or "stderr", if given), one per line;
        a first line says how many were dropped for memory, if any were."""
        log = self._logs.get(rank)
        if log is None:
            return ""
        lines = list(log.texts) if stream is None else [
            text for name, text in zip(log.streams, log.texts, strict=True) if name == stream]
        if log.dropped_lines:
            lines.insert(0, f"[notebook_accel] {log.dropped_lines} earlier lines "
                            f"({log.dropped_bytes / 1e6:.1f} MB) not kept: over this rank's "
                            f"{self.share / 1e6:.1f} MB of the launch's log memory")
        return "\n".join(lines)
