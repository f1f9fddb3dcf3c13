"""Relay worker output into the launching cell, one ``[rank N] `` prefixed line at a time.

Lines of one rank stay in order. Carriage-return progress lines (tqdm) collapse to
their latest state: the final state is printed when the line ends, and a snapshot
at most every ``snapshot_every`` seconds while it is still moving. A rank that
floods (more than a burst of ``BURST_BYTES`` then ``RATE_BYTES`` per second) has
the excess counted, not relayed, so the kernel and the browser stay responsive;
its last lines are still kept for error reports.
"""

from __future__ import annotations

import codecs
import collections
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from notebook_accel.launch.views.rich_output import show_display
from notebook_accel.wire import Display, Kind

OUTPUT_CHOICES = ("all", "main", "none")
_TAIL_LINES = 200
BURST_BYTES = 4 << 20
RATE_BYTES = 256 << 10


class _Stream:
    """One rank's stdout or stderr: an incremental decoder and the unfinished line."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.partial = ""
        self.snapshot_at = time.monotonic()
        self.snapshot_text = ""
        self.tail: collections.deque[tuple[int, str]] = collections.deque(maxlen=_TAIL_LINES)
        self.count = 0

    def add_line(self, text: str) -> None:
        self.tail.append((self.count, text))
        self.count += 1


class _Budget:
    """A token bucket of relayed bytes per rank; what does not fit is counted."""

    def __init__(self) -> None:
        self.tokens = float(BURST_BYTES)
        self.updated = time.monotonic()
        self.skipped_lines = 0
        self.skipped_bytes = 0

    def allow(self, size: int) -> bool:
        now = time.monotonic()
        self.tokens = min(BURST_BYTES, self.tokens + (now - self.updated) * RATE_BYTES)
        self.updated = now
        if self.tokens >= size:
            self.tokens -= size
            return True
        self.skipped_lines += 1
        self.skipped_bytes += size
        return False

    def notice(self) -> str | None:
        """A line saying what was skipped since the last notice, if anything."""
        if not self.skipped_lines:
            return None
        text = (f"... {self.skipped_lines} lines ({self.skipped_bytes / 1e6:.1f} MB) not shown: "
                "too much output")
        self.skipped_lines = self.skipped_bytes = 0
        return text


def _latest(segment: str) -> str:
    """The visible text of a line that may contain carriage returns."""
    pieces = [piece for piece in segment.split("\r") if piece]
    return pieces[-1] if pieces else ""


class OutputRelay:
    """Prefixes, orders and forwards worker output; remembers each rank's last lines.

    Args:
        show: "all" relays every rank, "main" only rank 0, "none" nothing (the
            tails are still kept, so failures can show what a rank printed).
        stdout, stderr: where relayed lines go (the cell's streams by default).
        snapshot_every: seconds between snapshots of a moving progress line.
        publish: shows a rich display message of the main worker (in the cell).
    """

    def __init__(
        self,
        show: str = "all",
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        snapshot_every: float = 5.0,
        publish: Callable[[Display], None] = show_display,
    ) -> None:
        self.show = show
        self._targets = {"stdout": stdout or sys.stdout, "stderr": stderr or sys.stderr}
        self._streams: dict[tuple[int, str], _Stream] = {}
        self._pending: list[tuple[str, Any]] = []  # ("stdout"|"stderr", line), (Kind.DISPLAY, msg)
        self._publish = publish
        self._budgets: dict[int, _Budget] = {}
        self._last: dict[int, str] = {}
        self._held: set[int] = set()
        self.prefixes: dict[int, str] = {}  # rank -> its lines' label, where not "rank N"
        self.snapshot_every = snapshot_every

    def _stream(self, rank: int, name: str) -> _Stream:
        key = (rank, name)
        if key not in self._streams:
            self._streams[key] = _Stream()
        return self._streams[key]

    def prefix(self, rank: int) -> str:
        """``[rank N] ``, or the label its backend gave (``prefixes``: ``[node 1 rank 1] ``)."""
        return f"[{self.prefixes.get(rank, f'rank {rank}')}] "

    def _visible(self, rank: int) -> bool:
        return self.show == "all" or (self.show == "main" and rank == 0)

    def hold(self, rank: int) -> None:
        """Keep ``rank``'s further lines for :meth:`tail` only (not shown, not its last line):
        a stack dump the error report will show once, cleaned up."""
        self._held.add(rank)

    def _emit(self, rank: int, name: str, text: str) -> None:
        self._stream(rank, name).add_line(text)
        if rank in self._held:
            return
        if text.strip():
            self._last[rank] = text
        if self._visible(rank):
            line = f"{self.prefix(rank)}{text}\n"
            budget = self._budgets.setdefault(rank, _Budget())
            if budget.allow(len(line)):
                notice = budget.notice()
                if notice:
                    self._pending.append((name, f"{self.prefix(rank)}{notice}\n"))
                self._pending.append((name, line))

    def feed(self, rank: int, name: str, data: bytes) -> None:
        """Take raw bytes read from ``rank``'s ``name`` ("stdout"/"stderr") pipe."""
        stream = self._stream(rank, name)
        text = stream.partial + stream.decoder.decode(data)
        *lines, stream.partial = text.split("\n")
        for line in lines:
            self._emit(rank, name, _latest(line))
        if "\r" in stream.partial:
            stream.partial = "\r" + _latest(stream.partial)  # keep one state, not thousands

    def tick(self, now: float | None = None) -> None:
        """Print a snapshot of progress lines that have moved for a while."""
        now = time.monotonic() if now is None else now
        for (rank, name), stream in self._streams.items():
            current = _latest(stream.partial)
            if (
                current
                and current != stream.snapshot_text
                and now - stream.snapshot_at >= self.snapshot_every
            ):
                stream.snapshot_at, stream.snapshot_text = now, current
                if self._visible(rank) and rank not in self._held:
                    self._pending.append((name, f"{self.prefix(rank)}{current}\n"))

    def finish(self, rank: int) -> None:
        """Flush the unfinished last line of ``rank`` (its process has ended)."""
        budget = self._budgets.get(rank)
        notice = budget.notice() if budget is not None else None
        if notice:
            self._pending.append(("stderr", f"{self.prefix(rank)}{notice}\n"))
        for name in ("stdout", "stderr"):
            stream = self._streams.get((rank, name))
            if stream is None:
                continue
            rest = stream.partial + stream.decoder.decode(b"", final=True)
            stream.partial = ""
            if _latest(rest):
                self._emit(rank, name, _latest(rest))

    def display(self, message: Display) -> None:
        """Queue a rich display of the main worker, in order with the text around it."""
        self._pending.append((Kind.DISPLAY, message))

    def flush(self) -> None:
        """Write what was gathered since the last flush to the cell, in arrival order."""
        pending, self._pending = self._pending, []
        index = 0
        while index < len(pending):
            name, item = pending[index]
            if name is Kind.DISPLAY:
                self._publish(item)
                index += 1
                continue
            end = index
            while end < len(pending) and pending[end][0] == name:
                end += 1
            target = self._targets[name]
            target.write("".join(text for _, text in pending[index:end]))
            target.flush()
            index = end

    def last_line(self, rank: int) -> str:
        """What ``rank`` shows last: its moving progress line, else its last line."""
        for name in ("stderr", "stdout"):
            stream = self._streams.get((rank, name))
            if stream is not None and _latest(stream.partial).strip():
                return _latest(stream.partial)
        return self._last.get(rank, "")

    def line_count(self, rank: int, name: str = "stderr") -> int:
        """How many lines ``rank`` has written to ``name`` so far."""
        return self._stream(rank, name).count

    def tail(self, rank: int, name: str = "stderr", since: int = 0, limit: int = 60) -> str:
        """The last lines of ``rank``'s ``name`` stream (numbered ``since`` or later)."""
        lines = [text for index, text in self._stream(rank, name).tail if index >= since]
        return "\n".join(lines[-limit:])
