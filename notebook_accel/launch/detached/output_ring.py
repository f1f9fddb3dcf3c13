"""A detached pool's run output, kept on disk: a bounded ring per rank, read from any number on.

The keeper's runs have no cell: the relay writes what a cell would show into a
:class:`RingOutput` (a :class:`~notebook_accel.launch.views.run_output.RunOutput` whose pieces live in
files, not in memory). Every line gets the next number; a line starting with a rank's prefix
(``[rank N] ``, the relay's own) goes to that rank's ring, every other piece (notes, rich
displays) to the ring of notes. A ring is two files of at most half its size each: when the
newer is full the older is removed (its lines counted as dropped) and a new one begun, so a
rank's ring holds its newest ``keep`` bytes (10 MB by default) whatever the run prints. A
watcher, in whichever kernel attaches, asks for the pieces from a number on: every piece
shown once, in order, the dropped ones counted.
"""

from __future__ import annotations

import array
import base64
import bisect
import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from notebook_accel.launch.views.run_output import RunOutput
from notebook_accel.wire import Kind

KEEP_PER_RANK = 10 << 20  # bytes on disk per rank (and for the notes): its newest lines
BATCH_BYTES = 1 << 20  # what one read hands a watcher, at most
_RANK_LINE = re.compile(r"\[(?:node \d+ )?rank (\d+)\] ")  # the relay's prefix (a cluster's: with its node)
_DISPLAY = "display"


class _Segment:
    """One file of a ring: its records' numbers and where each begins."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "ab")  # noqa: SIM115 - closed by the ring; flushed by each add
        os.chmod(path, 0o600)
        self.numbers = array.array("q")
        self.offsets = array.array("q")
        self.size = 0

    def append(self, number: int, record: bytes) -> None:
        self.numbers.append(number)
        self.offsets.append(self.size)
        self.file.write(record)
        self.size += len(record)

    def since(self, number: int) -> list[tuple[int, bytes]]:
        """The records numbered ``number`` or later, read from the file."""
        start = bisect.bisect_left(self.numbers, number)
        if start == len(self.numbers):
            return []
        self.flush()
        with open(self.path, "rb") as file:
            file.seek(self.offsets[start])
            data = file.read(self.size - self.offsets[start])
        return list(zip(self.numbers[start:], data.splitlines(keepends=True), strict=True))

    def flush(self) -> None:
        if not self.file.closed:
            self.file.flush()

    def remove(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class _Ring:
    """One rank's (or the notes') newest ``keep`` bytes, in two files."""

    def __init__(self, folder: Path, key: str, keep: int) -> None:
        self.folder, self.key, self.keep = folder, key, keep
        self.made = 0
        self.segments = [self._segment()]
        self.dropped_lines = 0
        self.dropped_bytes = 0

    def _segment(self) -> _Segment:
        self.made += 1
        return _Segment(self.folder / f"{self.key}.{self.made}")

    def append(self, number: int, record: bytes) -> None:
        current = self.segments[-1]
        if current.numbers and current.size + len(record) > self.keep // 2:
            current.flush()
            if len(self.segments) == 2:
                old = self.segments.pop(0)
                self.dropped_lines += len(old.numbers)
                self.dropped_bytes += old.size
                old.remove()
            current = self._segment()
            self.segments.append(current)
        current.append(number, record)

    def since(self, number: int) -> list[tuple[int, bytes]]:
        return [item for segment in self.segments for item in segment.since(number)]

    def close(self) -> None:
        for segment in self.segments:
            segment.file.close()


class RingOutput(RunOutput):
    """A run's output in rings on disk under ``folder`` (files ``NAME.rankN.K``, made with its
    first line), ``keep`` bytes per rank; the numbering, waiting and ending of
    :class:`RunOutput`."""

    def __init__(self, folder: Path, name: str = "run", keep: int = KEEP_PER_RANK) -> None:
        super().__init__(keep)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder, self.name = folder, name
        self._rings: dict[str, _Ring] = {}
        self._next = 0
        # called with each write's pieces as they are kept (their first number, the pieces)
        self.listener: Callable[[int, list[tuple[str, Any]]], None] | None = None

    def add(self, stream: str, item: Any) -> None:
        """Keep a piece: each line of a text in its rank's ring, a display in the notes'."""
        with self._changed:
            first = self._next
            pieces: list[tuple[str, Any]] = []
            touched = set()
            if isinstance(item, str):
                for line in item.splitlines(keepends=True):
                    match = _RANK_LINE.match(line)
                    pieces.append((stream, line))
                    touched.add(self._append(f"rank{match.group(1)}" if match else "notes",
                                             [stream, line]))
            else:
                pieces.append((Kind.DISPLAY, item))
                touched.add(self._append(
                    "notes", [_DISPLAY, base64.b64encode(pickle.dumps(item)).decode()]))
            for ring in touched:  # on disk at once: a keeper killed leaves it there
                ring.segments[-1].flush()
            self._changed.notify_all()
            if self.listener is not None:
                self.listener(first, pieces)

    def _append(self, key: str, record: list[str]) -> _Ring:
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = _Ring(self.folder, f"{self.name}.{key}", self.keep)
        ring.append(self._next, json.dumps(record).encode() + b"\n")
        self._next += 1
        return ring

    @property
    def count(self) -> int:
        with self._changed:
            return self._next

    @property
    def dropped_lines(self) -> int:  # (RunOutput sets it: ours is the rings' sum)
        return sum(ring.dropped_lines for ring in getattr(self, "_rings", {}).values())

    @dropped_lines.setter
    def dropped_lines(self, value: int) -> None:
        pass

    def since(self, number: int, timeout: float | None = None) -> tuple[list[tuple[str, Any]], int, int]:
        """As :meth:`RunOutput.since`, at most ``BATCH_BYTES`` of pieces at a time."""
        with self._changed:
            self._changed.wait_for(lambda: self._next > number or self.ended, timeout)
            found = sorted(item for ring in self._rings.values() for item in ring.since(number))
            size, items, following = 0, [], self._next
            for index, (_, record) in enumerate(found):
                if size >= BATCH_BYTES:
                    following = found[index][0]
                    break
                size += len(record)
                stream, text = json.loads(record)
                items.append((Kind.DISPLAY, pickle.loads(base64.b64decode(text)))
                             if stream == _DISPLAY else (stream, text))
            return items, following, following - number - len(items)

    def end(self) -> None:
        super().end()
        with self._changed:
            for ring in self._rings.values():
                ring.close()

    def remove(self) -> None:
        """Remove its files (a later run's output replaces it)."""
        with self._changed:
            for ring in self._rings.values():
                for segment in ring.segments:
                    segment.remove()
