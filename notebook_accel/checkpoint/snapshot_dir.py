"""A snapshot directory: one folder per snapshot, each in ``save_state``'s layout, complete or not.

    <dir>/snapshot_000004200/       complete: ``save_state``'s files plus ``snapshot.json`` (step, time,
                                    world size, strategy, model shapes); ``load_state`` loads it, the
                                    peer's too
    <dir>/snapshot_000004250.tmp/   being written, or left by a crash: never loaded, removed when
                                    snapshots are next switched on (as ``.old``, ``.pruned``: a
                                    replaced or pruned snapshot on its way out)

The writes run on a background thread of every rank, beside the training's collectives, so the
commit takes no collective: each rank writes (and fsyncs) its files into the ``.tmp`` folder, then a
marker ``.done-<rank>-<token>`` (the token is this run's: a marker left by a killed run never counts);
rank 0, once it has every rank's marker, writes ``snapshot.json`` and renames the folder
(``atomic_dir.swap_in``), so a folder without ``.tmp`` is whole. It needs a directory every rank sees
(one machine, or a shared file system), which ``snapshots`` checks when they are switched on.
The newest snapshot is the one saved last (not the highest step: a run started over from step 0
in the same directory writes lower steps, and those are its newest).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from notebook_accel.checkpoint.atomic_dir import fsync_dir, swap_in

META = "snapshot.json"
_NAME = re.compile(r"snapshot_(\d+)(\.tmp|\.old|\.pruned)?")  # with a suffix: never loaded
_MARKER = ".done-{rank}-{token}"


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot folder: its ``path``, ``step`` and, when complete, what ``snapshot.json`` says."""

    path: Path
    step: int
    meta: dict[str, Any] | None  # None: not complete (a .tmp folder, or one without snapshot.json)
    size: int | None = None  # its bytes where known without walking ``path`` (a remote one's)

    @property
    def complete(self) -> bool:
        return self.meta is not None

    @property
    def saved_at(self) -> float:
        """When it was committed (seconds since the epoch; 0 for an incomplete one)."""
        return float(self.meta["saved_at"]) if self.meta else 0.0

    def size_on_disk(self) -> int:
        """The bytes of its files (0 once it is gone: a prune may remove it meanwhile)."""
        if self.size is not None:
            return self.size
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total


def snapshot_name(step: int) -> str:
    """The folder of the snapshot taken after ``step`` optimizer steps."""
    return f"snapshot_{step:09d}"


def listing(directory: Path) -> list[SnapshotInfo]:
    """Every snapshot folder in ``directory``: the complete ones oldest first (by the time they were
    saved), then the incomplete ones by step."""
    found = []
    if directory.is_dir():
        for path in directory.iterdir():
            match = _NAME.fullmatch(path.name)
            if match and path.is_dir():
                meta = None if match.group(2) else _read_meta(path)
                found.append(SnapshotInfo(path, int(match.group(1)), meta))
    return sorted(found, key=lambda s: (not s.complete, s.saved_at, s.step))


def newest(directory: Path) -> SnapshotInfo | None:
    """The complete snapshot saved last, or ``None``."""
    complete = [s for s in listing(directory) if s.complete]
    return complete[-1] if complete else None


def clear_unfinished(directory: Path) -> None:
    """Remove the folders a killed run left half written or half removed (before this run writes any)."""
    for info in listing(directory):
        if _NAME.fullmatch(info.path.name).group(2):  # type: ignore[union-attr]
            shutil.rmtree(info.path, ignore_errors=True)


def mark_done(tmp: Path, rank: int, token: str) -> None:
    """Say that ``rank``'s files in ``tmp`` are written and durable."""
    fsync_dir(tmp)
    marker = tmp / _MARKER.format(rank=rank, token=token)
    with open(marker, "wb") as f:
        os.fsync(f.fileno())
    fsync_dir(tmp)


def wait_for_ranks(tmp: Path, world_size: int, token: str, timeout: float,
                   poll: float = 0.02, stop: Callable[[], bool] | None = None) -> list[int]:
    """Wait until every rank's marker of ``token`` is in ``tmp``; returns the ranks still missing
    when ``timeout`` seconds passed (or ``stop()`` said so), else ``[]``."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [r for r in range(world_size) if not (tmp / _MARKER.format(rank=r, token=token)).exists()]
        if not missing or time.monotonic() > deadline or (stop is not None and stop()):
            return missing
        time.sleep(poll)


def commit(tmp: Path, final: Path, meta: dict[str, Any]) -> None:
    """Make ``tmp`` (every rank's files in) the complete snapshot ``final``: the markers go,
    ``snapshot.json`` is written and fsync'd, then the folder is renamed."""
    for marker in tmp.glob(".done-*"):
        marker.unlink(missing_ok=True)
    with open(tmp / META, "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    swap_in(tmp, final)


def prune(directory: Path, keep: int) -> list[Path]:
    """Remove the complete snapshots older than the newest ``keep``; returns what went. Each is
    renamed first (atomic), so one half removed is never taken for complete."""
    complete = [s for s in listing(directory) if s.complete]
    gone = [s.path for s in complete[: max(len(complete) - keep, 0)]]
    for path in gone:
        doomed = path.with_name(path.name + ".pruned")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return gone


def size_text(count: int) -> str:
    """A byte count in words: ``812 B``, ``4.2 kB``, ``1.5 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def ago(seconds: float) -> str:
    """An age in words: ``42 s``, ``3 min``, ``5.2 h``, ``3 days``."""
    seconds = max(seconds, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _read_meta(path: Path) -> dict[str, Any] | None:
    try:
        with open(path / META) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "saved_at" in meta else None
