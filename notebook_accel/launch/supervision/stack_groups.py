"""Every rank's stack at once, grouped: ``ranks 0, 2-7: all_reduce <- step <- train``.

Ranks standing at the same place are one group; its first line names the innermost
functions (innermost first), then its frames read as a traceback. The worker's own
frames around the user's code (its serve loop, the run's set-up, the ``%%accelerate`` line
that runs a cell) are left out, as in a failure's traceback; a rank
with nothing else is idle.
"""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
from collections.abc import Mapping, Sequence

from notebook_accel.launch.supervision.tracebacks import (
    OURS,
    Frame,
    with_cell_labels,
    without_cell_runner,
)
from notebook_accel.launch.views.rank_ranges import ranks_text

_STDLIB = sysconfig.get_paths()["stdlib"]
_WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "worker") + os.sep
_LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_NAMED = 4  # functions the headline names


def users_part(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """``frames`` (innermost last) below the worker's own (its entry, serve loop, the run's
    set-up) and the standard library's around the call, without the ``%%accelerate`` line
    that runs a cell: what the rank's run is doing; empty: the rank is idle."""
    start = max((i + 1 for i, (name, _, _) in enumerate(frames) if name.startswith(_WORKER)),
                default=0)
    for index in range(start, len(frames)):
        if not _ours_or_stdlib(frames[index][0]):
            return without_cell_runner(frames[index:])
    return ()


def _ours_or_stdlib(filename: str) -> bool:
    return filename.startswith(OURS) or filename.startswith(_STDLIB)


def is_users_file(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not ours, the standard library's or a library's."""
    return not _ours_or_stdlib(filename) and not _LIBRARY.search(filename)


def innermost(frames: Sequence[Frame]) -> str:
    """The function the rank is in now: ``all_reduce``; or ``idle``."""
    return frames[-1][2] if frames else "idle"


def headline(frames: Sequence[Frame]) -> str:
    """The innermost function, then the user's own ones: ``all_reduce <- step <- train``;
    or ``idle``."""
    if not frames:
        return "idle (no run)"
    names = [innermost(frames)]
    for filename, _, name in reversed(frames[:-1]):
        if is_users_file(filename) and name != names[-1]:  # (a cell's <module> once, not per frame)
            names.append(name)
    more = " <- ..." if len(names) > _NAMED else ""
    return " <- ".join(names[:_NAMED]) + more


def group_stacks(stacks: Mapping[int, Sequence[Frame]]) -> list[tuple[list[int], tuple[Frame, ...]]]:
    """Ranks with identical stacks (their user's part) together, the largest group first."""
    groups: dict[tuple[Frame, ...], list[int]] = {}
    for rank in sorted(stacks):
        groups.setdefault(users_part(stacks[rank]), []).append(rank)
    return sorted(((ranks, frames) for frames, ranks in groups.items()),
                  key=lambda group: (-len(group[0]), group[0][0]))


def stacks_text(stacks: Mapping[int, Sequence[Frame]], silent: Sequence[int] = ()) -> str:
    """Every group's headline and frames; ``silent``: ranks that did not answer."""
    parts = []
    for ranks, frames in group_stacks(stacks):
        lines = [f"{ranks_text(ranks)}: {headline(frames)}"]
        for filename, line, name in frames:
            lines.append(f'  File "{filename}", line {line}, in {name}')
            source = linecache.getline(filename, line).strip()
            if source:
                lines.append(f"    {source}")
        parts.append("\n".join(lines))
    if silent:
        parts.append(f"{ranks_text(silent)}: no answer (gone, or not a pool's worker)")
    return with_cell_labels("\n".join(parts))
