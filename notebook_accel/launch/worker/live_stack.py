"""A pool worker's answer to :class:`~notebook_accel.wire.StackAsk`: where its main thread is now.

Read from ``sys._current_frames()`` by the worker's reader thread during a run (by the main
thread itself between runs), so it answers while the main thread computes, sleeps or waits
inside a collective.
"""

from __future__ import annotations

import sys

from notebook_accel.launch.worker import flight_recorder, stop_cut
from notebook_accel.launch.worker.collectives import default_count
from notebook_accel.wire import Stack


def main_stack(thread_id: int, ask: int = 0, recorder: int = 0, lines: bool = True) -> Stack:
    """The stack of thread ``thread_id`` (``(file, line, function)``, innermost last) and the
    default group's collective count, answering the kernel's request number ``ask``; with
    ``recorder``, the last that many collectives per group too (the flight recorder's; with
    the user's line each was called from when ``lines``; read until settled between runs)."""
    frame = sys._current_frames().get(thread_id)
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    collectives = (flight_recorder.recent(recorder, where=lines, settle=not stop_cut.in_run())
                   if recorder else None)
    return Stack(tuple(reversed(frames)), default_count(), ask, collectives)
