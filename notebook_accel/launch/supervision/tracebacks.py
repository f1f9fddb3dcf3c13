"""Make tracebacks read like IPython's: the user's frames, notebook cells as ``Cell In[N]``.

Worker tracebacks are formatted in the worker, where a notebook cell is only a file
name (``/tmp/ipykernel_1234/5678.py``); the kernel knows which cell that is. Stack
dumps (faulthandler, on a timeout) list every thread and the whole bootstrap; the
user needs the main thread's frames from their function down.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import traceback
import types
from collections.abc import Sequence
from typing import Any

from notebook_accel.launch.handoff.cells import cell_numbers
from notebook_accel.launch.worker.flight_recorder import DUMP_MARK

Frame = tuple[str, int, str]  # (file, line, function)
_LAUNCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # notebook_accel/launch/
_PACKAGE = os.path.dirname(_LAUNCH)  # notebook_accel/
OURS = (_PACKAGE + os.sep, os.path.join(os.path.dirname(_PACKAGE), "magics") + os.sep)
_WORKER_FILE = os.path.join(_LAUNCH, "worker", "main.py")  # the entry point
_WORKER_DIR = os.path.dirname(_WORKER_FILE) + os.sep  # the worker's own code (its threads too)
_TRACEBACK_FILE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?P<sep>,? in )')
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>.+)$')
_DUMP_LINE = re.compile(r'^(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+ .*|Stack \(most recent call '
                        r'first\):|\s+File ".*", line \d+ in .*|\s*<no Python frame>|\s*\.\.\.|\s*)$')


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def with_cell_labels(text: str) -> str:
    """Rewrite ``File "/tmp/ipykernel_1/2.py", line 5, in f`` as ``Cell In[3], line 5, in f``."""
    numbers = cell_numbers(_shell())

    def label(match: re.Match[str]) -> str:
        number = numbers.get(match["file"])
        if number is None:
            return match[0]
        return f"Cell In[{number}], line {match['line']}, in "

    return _TRACEBACK_FILE.sub(label, text)


def short_place(filename: str, line: int) -> str:
    """Where a line is, in a few characters: ``Cell In[4]:18`` for a notebook cell, else the
    file's name: ``train.py:18``."""
    number = cell_numbers(_shell()).get(filename)
    return f"Cell In[{number}]:{line}" if number is not None else f"{os.path.basename(filename)}:{line}"


_CRASH_LINES = 60  # a rank's death without a dump: the last lines of its stderr say why


def death_text(lines: list[str]) -> str:
    """What a rank that died without sending its failure left on stderr (``lines``, oldest
    first): faulthandler's whole dump when it wrote one (from its ``Fatal Python error`` line:
    a kernel's forked worker has a deep stack and threads of ours, so a fixed tail would cut
    the dump's head off), else the last lines."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    return "\n".join(lines[starts[-1]:] if starts else lines[-_CRASH_LINES:])


def is_dump_line(text: str) -> bool:
    """Whether ``text`` is a line of a faulthandler dump (a thread's header, a frame, a gap), or
    the flight recorder's line written with it."""
    return bool(_DUMP_LINE.match(text)) or text.startswith(DUMP_MARK)


def dump_frames(dump: str) -> tuple[tuple[str, int, str], ...]:
    """The dumped ("Current thread": the main) thread's frames of a faulthandler dump,
    ``(file, line, function)``, innermost last; empty when there is no such thread."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    current = [block for block in blocks if block.startswith("Current thread")]
    if not current:
        return ()
    frames = [(match["file"], int(match["line"]), match["name"])
              for line in current[-1].splitlines()[1:] if (match := _DUMP_FRAME.match(line))]
    return tuple(reversed(frames))


def without_cell_runner(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """``frames`` (innermost last) without the ``%%accelerate`` line that runs a cell's body:
    a cell's ``<module>`` frame whose next frame is a ``<module>`` of the same file (its
    body, run by ``exec``). A failure's traceback leaves it out too (``__tracebackhide__``),
    so stacks and tracebacks both start at the user's own first line."""
    return tuple(frame for frame, inner in zip(frames, (*frames[1:], None), strict=True)
                 if not (inner is not None and frame[2] == inner[2] == "<module>"
                         and frame[0] == inner[0]))


def main_thread_stack(dump: str) -> str:
    """The user's part of a faulthandler dump, as a traceback (most recent call last).

    Keeps the dumped ("Current thread") main thread only, from the first frame
    above the worker's entry point; other threads are counted, not listed.
    """
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    others = len([block for block in blocks  # the worker's own threads do not count
                  if block.startswith("Thread ") and _WORKER_DIR not in block])
    if not any(block.startswith("Current thread") for block in blocks):
        return dump.strip()
    frames = dump_frames(dump)
    user: list[tuple[str, int, str]] = []
    for frame in reversed(frames):  # most recent first: stop at the worker's entry point
        if frame[0] == _WORKER_FILE:
            break
        user.append(frame)
    lines = ["Traceback (most recent call last):"]
    for filename, line, name in without_cell_runner(tuple(reversed(user)) if user else frames):
        lines.append(f'  File "{filename}", line {line}, in {name}')
        source = linecache.getline(filename, line).strip()
        if source:
            lines.append(f"    {source}")
    if others:
        lines.append(f"({others} other thread{'s' if others > 1 else ''} not shown)")
    return with_cell_labels("\n".join(lines))


def _without_our_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(OURS):
            kept.append(tb)
        tb = tb.tb_next
    chain = None
    for entry in reversed(kept):
        chain = types.TracebackType(chain, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chain


def hide_our_frames(error: BaseException) -> BaseException:
    """Have IPython show ``error`` with the user's frames only (none of this package's).

    Sets an instance-level ``_render_traceback_`` (IPython's hook), so the error keeps
    its type for ``except`` clauses. Returns ``error``.
    """

    def render() -> list[str]:
        tb = _without_our_frames(error.__traceback__)
        shell = _shell()
        if shell is None:
            return "".join(traceback.format_exception(type(error), error, tb)).splitlines()
        return shell.InteractiveTB.structured_traceback(type(error), error, tb)

    error._render_traceback_ = render  # type: ignore[attr-defined]
    return error
