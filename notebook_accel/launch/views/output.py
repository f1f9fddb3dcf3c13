"""Relay worker output into the launching cell, one ``[rank N] `` prefixed line at a time.

Lines of one rank stay in order. Carriage-return progress lines (tqdm) collapse to
their latest state: the final state is printed when the line ends, and a snapshot
at most every ``snapshot_every`` seconds while it is still moving. A rank that
floods (more than a burst of ``BURST_BYTES`` then ``RATE_BYTES`` per second) has
the excess counted, not relayed, so the kernel and the browser stay responsive;
its last lines are still kept for error reports.

Whatever the number of ranks, the cell gets at most ``CELL_BYTES`` per second (after a burst
of ``CELL_BURST``) in at most ``1 / FLUSH_EVERY`` writes per stream, below Jupyter's IOPub
limits (1 MB/s, 1000 messages/s); lines past that are counted and said. Above
``DEDUP_ABOVE`` ranks, identical lines of many ranks are shown once with their ranks
(``line_groups.py``). Every line of every rank is kept (``rank_logs.py``:
``last_launch().logs(rank)``), whatever the cell showed.
"""

from __future__ import annotations

import codecs
import collections
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from notebook_accel.launch.views.line_groups import LineGroups
from notebook_accel.launch.views.rank_logs import RankLogs
from notebook_accel.launch.views.rank_ranges import ranks_text
from notebook_accel.launch.views.rich_output import show_display
from notebook_accel.wire import Display, Kind

_TAIL_LINES = 200  # a rank's last lines kept for the error that names it
BURST_BYTES = 4 << 20  # bytes a rank may print at once before its rate applies
RATE_BYTES = 256 << 10  # bytes per second a rank may print past its burst (the rest counted)
CELL_BYTES = 400_000  # bytes per second into the cell, every rank together
CELL_BURST = 100_000
DEDUP_ABOVE = 16  # ranks shown: above this, identical lines of many ranks are shown once
FLUSH_EVERY = 0.05  # seconds between two writes to the cell while a job runs
NOTICE_EVERY = 1.0  # seconds between two notices of lines the cell's budget left out
RELEASE_SLICE = 0.0001  # seconds one paced flush spends releasing groups of identical lines


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
    """A token bucket of relayed bytes (a rank's, or the cell's); what does not fit is counted."""

    def __init__(self, burst: float, rate: float) -> None:
        self.burst, self.rate = burst, rate
        self.tokens = float(burst)
        self.updated = time.monotonic()
        self.skipped_lines = 0
        self.skipped_bytes = 0

    def allow(self, size: int) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
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
    """Prefixes, orders and forwards worker output; keeps each rank's lines.

    Args:
        show: "all" relays every rank, "main" only rank 0, "none" nothing (the
            lines are still kept, so failures can show what a rank printed).
        stdout, stderr: where relayed lines go (the cell's streams by default).
        snapshot_every: seconds between snapshots of a moving progress line.
        publish: shows a rich display message of the main worker (in the cell).
        dedup: show identical lines of many ranks once; None (default): when more than
            ``DEDUP_ABOVE`` ranks are shown.
    """

    def __init__(
        self,
        show: str = "all",
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        snapshot_every: float = 5.0,
        publish: Callable[[Display], None] = show_display,
        dedup: bool | None = None,
    ) -> None:
        self.show = show
        self._targets = {"stdout": stdout or sys.stdout, "stderr": stderr or sys.stderr}
        self._streams: dict[tuple[int, str], _Stream] = {}
        self._pending: list[tuple[str, Any]] = []  # ("stdout"|"stderr", line), (Kind.DISPLAY, msg)
        self._publish = publish
        self._budgets: dict[int, _Budget] = {}
        self._cell = _Budget(CELL_BURST, CELL_BYTES)
        self._cell_skipped: set[int] = set()  # ranks of the lines the cell's budget left out
        self._noticed = float("-inf")
        self._flushed = float("-inf")
        self._releasing = False  # a paced flush stopped within its groups: it goes on at once
        self._last: dict[int, str] = {}
        self._held: set[int] = set()
        self._moving: set[tuple[int, str]] = set()  # streams with an unfinished line
        self._touched: set[int] = set()  # ranks whose last line may have changed
        self.prefixes: dict[int, str] = {}  # rank -> its lines' label, where not "rank N"
        self.snapshot_every = snapshot_every
        self.dedup = dedup
        self.groups = LineGroups()
        self.logs = RankLogs()

    def watch(self, prefixes: dict[int, str]) -> None:
        """The launch's ranks, each with the label of its lines (``rank 1``, ``node 1 rank 1``)."""
        self.prefixes.update(prefixes)
        self.logs.expect(len(self.prefixes))

    @property
    def deduplicating(self) -> bool:
        """Whether identical lines of several ranks are shown once."""
        if self.dedup is not None:
            return self.dedup
        return self.show == "all" and len(self.prefixes) > DEDUP_ABOVE

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
        a stack dump shown once, cleaned up (in a timeout's error, or grouped while the job
        runs on: then :meth:`release` shows the lines around it)."""
        self._held.add(rank)

    def release(self, rank: int, since: dict[str, int], drop: Callable[[str], bool]) -> None:
        """Show ``rank``'s lines again: those it wrote while held (numbered ``since[name]`` or
        later in each stream) are shown now, except the ones ``drop`` picks (a stack dump)."""
        self._held.discard(rank)
        for name in ("stdout", "stderr"):
            held = [text for index, text in self._stream(rank, name).tail
                    if index >= since.get(name, 0)]
            for text in held:
                if not drop(text):
                    self._relay(rank, name, text)

    def _emit(self, rank: int, name: str, text: str) -> None:
        self._stream(rank, name).add_line(text)
        self.logs.add(rank, name, text)
        if rank not in self._held:
            self._relay(rank, name, text)

    def _relay(self, rank: int, name: str, text: str) -> None:
        """A line of ``rank``'s, kept already: its last line, and in the cell (within budget)."""
        if text.strip():
            self._last[rank] = text
            self._touched.add(rank)
        if self._visible(rank):
            budget = self._budgets.get(rank)
            if budget is None:
                budget = self._budgets[rank] = _Budget(BURST_BYTES, RATE_BYTES)
            if budget.allow(len(self.prefix(rank)) + len(text) + 1):
                notice = budget.notice()
                if notice:
                    self._pending.append((name, f"{self.prefix(rank)}{notice}\n"))
                self._queue(rank, name, text)

    def _queue(self, rank: int, name: str, text: str) -> None:
        """A line to show: grouped with the same line of other ranks, or shown on its own."""
        if self.deduplicating:
            self.groups.add(rank, name, text, time.monotonic())
        else:
            self._show(name, [rank], text)

    def _show(self, name: str, ranks: list[int], text: str) -> None:
        """Queue one line for the cell, within the cell's budget (else counted)."""
        label = self.prefix(ranks[0]) if len(ranks) == 1 else f"[{ranks_text(ranks)}] "
        line = f"{label}{text}\n"
        if self._cell.allow(len(line)):
            self._pending.append((name, line))
        else:
            self._cell_skipped.update(ranks)

    def _cell_notice(self, now: float, force: bool) -> None:
        """Say what the cell's budget left out (at most every ``NOTICE_EVERY`` seconds)."""
        if not self._cell.skipped_lines or (not force and now - self._noticed < NOTICE_EVERY):
            return
        self._noticed = now
        lines, size = self._cell.skipped_lines, self._cell.skipped_bytes
        self._cell.skipped_lines = self._cell.skipped_bytes = 0
        self._pending.append(("stderr", (
            f"[notebook_accel] ... {lines} lines ({size / 1e6:.1f} MB) of "
            f"{ranks_text(self._cell_skipped)} not shown: the cell shows at most "
            f"{CELL_BYTES / 1e3:.0f} kB/s; every line is kept: last_launch().logs(rank)\n")))
        self._cell_skipped = set()

    def feed(self, rank: int, name: str, data: bytes) -> None:
        """Take raw bytes read from ``rank``'s ``name`` ("stdout"/"stderr") pipe."""
        stream = self._stream(rank, name)
        text = stream.partial + stream.decoder.decode(data)
        *lines, stream.partial = text.split("\n")
        for line in lines:
            self._emit(rank, name, _latest(line))
        if "\r" in stream.partial:
            stream.partial = "\r" + _latest(stream.partial)  # keep one state, not thousands
        if stream.partial:
            self._moving.add((rank, name))
            self._touched.add(rank)
        else:
            self._moving.discard((rank, name))

    def take_touched(self) -> set[int]:
        """The ranks whose :meth:`last_line` may have changed since the last call."""
        touched, self._touched = self._touched, set()
        return touched

    def tick(self, now: float | None = None) -> None:
        """Print a snapshot of progress lines that have moved for a while; costs the number of
        unfinished lines, not of ranks."""
        now = time.monotonic() if now is None else now
        for rank, name in self._moving:
            stream = self._streams[(rank, name)]
            current = _latest(stream.partial)
            if (
                current
                and current != stream.snapshot_text
                and now - stream.snapshot_at >= self.snapshot_every
            ):
                stream.snapshot_at, stream.snapshot_text = now, current
                if self._visible(rank) and rank not in self._held:
                    self._queue(rank, name, current)

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
            self._moving.discard((rank, name))
            self._touched.add(rank)
            if _latest(rest):
                self._emit(rank, name, _latest(rest))

    def display(self, message: Display) -> None:
        """Queue a rich display of the main worker, in order with the text around it."""
        self._pending.append((Kind.DISPLAY, message))

    def due_in(self, pace: float = FLUSH_EVERY) -> float:
        """Seconds until :meth:`flush` with ``pace`` has something to write (inf: nothing)."""
        if self._releasing:
            return 0.0
        now = time.monotonic()
        due = 0.0 if self._pending else float("inf")
        if len(self.groups):
            due = min(due, self.groups.due_in(now))
        if self._cell.skipped_lines:
            due = min(due, self._noticed + NOTICE_EVERY - now)
        return max(due, self._flushed + pace - now, 0.0)

    def flush(self, pace: float = 0.0) -> None:
        """Write what was gathered to the cell, in arrival order: everything (lines still
        waiting for their group included), or with ``pace`` (seconds), nothing when the last
        write was less than that ago, and only the groups whose window has passed, taken out
        ``RELEASE_SLICE`` seconds at a time (one call of the watch loop stays short whatever
        the number of ranks; the rest at the next call, written together)."""
        now = time.monotonic()
        if pace and now - self._flushed < pace and not self._releasing:
            return
        until = time.perf_counter() + RELEASE_SLICE if pace else None
        self._releasing = not self.groups.release(now if pace else None, self._show, until)
        if self._releasing:
            return
        self._flushed = now
        self._cell_notice(now, force=not pace)
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
