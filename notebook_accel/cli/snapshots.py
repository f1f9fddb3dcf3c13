"""``notebook-accel snapshots [DIR]`` and ``%accelerate snapshots [DIR]``: a snapshot directory's
snapshots as a person reads them: step, when saved, size on disk, complete or not, and which one
``resume()`` would load.

Without ``DIR``: where a job launched from here with no ``dir=`` would snapshot, the launch option
``snapshot_dir`` in force (the environment, then the config file), else ``./snapshots/<run>``
(``checkpoint/snapshot_place``; a job's ``project_dir`` is not known here).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from notebook_accel.config import load_config
from notebook_accel.config.resolve import layered_options

INCOMPLETE = "incomplete: being written or left by a crash"


def default_directory(config_file: str | os.PathLike[str] | None = None) -> Path:
    """Where a job launched from here snapshots without ``dir=`` or ``project_dir``.

    Raises:
        ValueError: a bad ``snapshot_dir`` in the environment or the config file, naming it (a
            URL fsspec cannot open among them).
    """
    from notebook_accel.checkpoint import snapshot_place

    option = layered_options(load_config(config_file))["snapshot_dir"]
    if option is None:
        return snapshot_place.snapshot_directory(None)
    return snapshot_place.local_directory(option, "snapshot_dir")


def describe(directory: str | os.PathLike[str], now: float | None = None) -> tuple[bool, str]:
    """The listing of ``directory`` in words; the flag says whether the directory exists.

    Raises:
        ValueError: a URL fsspec cannot open.
    """
    from notebook_accel.checkpoint import (  # (torch, imported when it is used)
        snapshot_dir,
        snapshot_remote,
    )
    from notebook_accel.checkpoint.snapshot_place import local_directory

    if snapshot_remote.url_scheme(directory) not in (None, "file"):
        snapshot_remote.check(os.fspath(directory), "DIR")
        found = snapshot_remote.listing(os.fspath(directory))
        if not found:
            return True, f"no snapshots at {os.fspath(directory)}: resume() would start at step 0"
    else:
        directory = local_directory(directory, "DIR")
        if not directory.is_dir():
            what = "is not a directory" if directory.exists() else "does not exist"
            return False, (f"{directory} {what}: no snapshots there. Snapshots are written by "
                           "accelerator.snapshot_every(...) or the launch option snapshot_every, "
                           "into snapshot_dir (or dir=) when set")
        found = snapshot_dir.listing(directory)
        if not found:
            return True, f"no snapshots in {directory}: resume() would start at step 0"
    complete = [info for info in found if info.complete]
    newest = complete[-1] if complete else None
    now = time.time() if now is None else now
    rows = []
    for info in sorted(found, key=lambda s: (s.complete, s.saved_at, s.step), reverse=True):
        when = info.saved_at if info.complete else _modified(info.path)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "?"
        saved = f"{snapshot_dir.ago(now - when)} ago ({stamp})" if when else "?"
        state = "complete" if info.complete else INCOMPLETE
        if newest is not None and info.path == newest.path:
            state += "  <- resume() loads this one"
        rows.append((f"{info.step:,}", saved, snapshot_dir.size_text(info.size_on_disk()), state))
    head = ("step", "saved", "size", "")
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(3)]
    lines = [f"snapshots in {directory}"
             + (f" (resume() goes on from step {newest.step:,})" if newest else
                " (none complete: resume() would start at step 0)")]
    for row in (head, *rows):
        lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
                     + "  " + row[3])
    return True, "\n".join(line.rstrip() for line in lines)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def cmd_snapshots(args: argparse.Namespace) -> int:
    """``notebook-accel snapshots [DIR]``: 1 when the directory does not exist."""
    directory = args.directory if args.directory is not None else default_directory(args.config_file)
    exists, text = describe(directory)
    print(text, file=sys.stdout if exists else sys.stderr)
    return 0 if exists else 1


def add_subcommand(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The ``snapshots`` subcommand of ``notebook-accel``."""
    parser = sub.add_parser("snapshots", parents=[common], help="list a snapshot directory's snapshots",
                            description="Each snapshot's step, when it was saved, its size on disk, "
                                        "whether it is complete, and which one resume() would load.")
    parser.add_argument("directory", nargs="?", default=None, metavar="DIR",
                        help="the snapshot directory (default: the snapshot_dir in force, else "
                             "./snapshots/$NOTEBOOK_ACCEL_RUN_NAME or ./snapshots/default)")
    parser.set_defaults(func=cmd_snapshots)
