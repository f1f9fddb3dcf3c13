"""A background run's cell output, kept for whoever watches it, later or live.

A run in the background has no cell to print into: the relay writes what a cell would show
(``[rank N]`` lines within the cell's budget, notes, rich displays) here instead, numbered in
order. A watcher reads from a number on (:meth:`RunOutput.since`), so every piece is shown
once, in order, whether it came before the watch began or while it runs. Memory is bounded:
the newest ``KEEP_BYTES`` are kept, older pieces dropped and counted (every rank's whole
output is still in its launch record's logs).
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any

from notebook_accel.wire import Display, Kind

KEEP_BYTES = 2 << 20  # a watch replays at most this (paced below Jupyter's IOPub limits)
_DISPLAY_BYTES = 1000  # what a rich display counts for against KEEP_BYTES


class _Stream:
    """``stdout`` or ``stderr`` of a :class:`RunOutput`, as a stream to write to."""

    def __init__(self, output: RunOutput, name: str) -> None:
        self._output, self._name = output, name

    def write(self, text: str) -> int:
        if text:
            self._output.add(self._name, text)
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


class RunOutput:
    """Pieces of output (``("stdout" | "stderr", text)`` or ``(Kind.DISPLAY, message)``),
    numbered from 0, the newest ``keep`` bytes kept; thread-safe.

    Attributes:
        stdout, stderr: streams that add what is written to them.
        record: the run's launch record, once its workers were started (every rank's lines:
            ``record.logs(rank)``).
        ended: no more output will come.
        dropped_lines, dropped_bytes: what was dropped for memory.
    """

    def __init__(self, keep: int = KEEP_BYTES) -> None:
        self.keep = keep
        self._changed = threading.Condition()
        self._items: collections.deque[tuple[str, Any]] = collections.deque()
        self._first = 0  # the number of the oldest kept piece
        self._size = 0
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self.ended = False
        self.record: Any = None
        self.stdout = _Stream(self, "stdout")
        self.stderr = _Stream(self, "stderr")

    def add(self, stream: str, item: Any) -> None:
        """Keep one piece: text written to ``stream``, or a display (``Kind.DISPLAY``)."""
        size = len(item) if isinstance(item, str) else _DISPLAY_BYTES
        with self._changed:
            self._items.append((stream, item))
            self._size += size
            while self._size > self.keep and len(self._items) > 1:
                _, old = self._items.popleft()
                self._first += 1
                gone = len(old) if isinstance(old, str) else _DISPLAY_BYTES
                self._size -= gone
                self.dropped_bytes += gone
                self.dropped_lines += old.count("\n") if isinstance(old, str) else 1
            self._changed.notify_all()

    def display(self, message: Display) -> None:
        """Keep a rich display of the main worker, in order with the text around it."""
        self.add(Kind.DISPLAY, message)

    def end(self) -> None:
        """No more output will come: watchers return once they have shown the rest."""
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    @property
    def count(self) -> int:
        """The number the next piece will get."""
        with self._changed:
            return self._first + len(self._items)

    def since(self, number: int, timeout: float | None = None) -> tuple[list[tuple[str, Any]], int, int]:
        """The pieces numbered ``number`` or later, waiting up to ``timeout`` seconds for one
        (None: until one comes or the output ends).

        Returns:
            The pieces, the number to ask from next, and how many pieces from ``number`` on
            were dropped before they could be read.
        """
        with self._changed:
            self._changed.wait_for(lambda: self._first + len(self._items) > number or self.ended,
                                   timeout)
            start = max(number, self._first)
            items = list(itertools.islice(self._items, start - self._first, None))
            return items, self._first + len(self._items), start - number
