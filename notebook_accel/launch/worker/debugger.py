"""A pool worker's debugger, driven from the notebook's own input box.

pdb runs on the worker's main thread as usual (``breakpoint()``, or :func:`post_mortem`
on the failure of the rank's last run); only its input is bridged: each line it wants
is asked of the kernel (:class:`~notebook_accel.wire.InputAsk`, after the output so far
is flushed into the stdout pipe), which shows the prompt with ``input()`` (Jupyter's stdin
channel in a kernel, the terminal elsewhere) and sends the line back on the commands
channel (:class:`~notebook_accel.wire.InputLine`), where the worker's reader thread hands
it to :func:`feed`. The prompt names the rank: ``(Pdb rank 1)``. Where it stands reads as in
a traceback: ``> Cell In[5], line 4, in inner()``, for the notebook cells the kernel named
(``handoff.cells.NUMBERS``, sent with the payloads), not the kernel's temporary file.

The stop button while a prompt waits raises KeyboardInterrupt out of pdb (pdb itself
would only cancel the command), so the run ends as any interrupted run.
"""

from __future__ import annotations

import os
import pdb
import queue
import sys
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from notebook_accel.launch.handoff.cells import NUMBERS
from notebook_accel.wire import DebugEnd, InputAsk, InputLine

_lines: queue.Queue[str | None] = queue.Queue()
_send: Callable[[Any], None] | None = None  # sends a message on the control channel


def install(send: Callable[[Any], None]) -> None:
    """Make ``breakpoint()`` open the bridged debugger in this pool worker (unless the user
    chose another hook with ``PYTHONBREAKPOINT``)."""
    global _send
    _send = send
    if not os.environ.get("PYTHONBREAKPOINT"):
        sys.breakpointhook = _breakpoint


def feed(message: InputLine) -> None:
    """The reader thread's hand-over of a line typed at the prompt."""
    _lines.put(message.text)


class _Lines:
    """pdb's stdin: each ``readline`` asks the kernel for a line."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt

    def readline(self) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        while not _lines.empty():  # stale lines of an earlier session
            _lines.get_nowait()
        _send(InputAsk(self.prompt))
        text = _lines.get()  # the stop button's KeyboardInterrupt ends this wait
        return "" if text is None else text + "\n"  # "": end of input (pdb quits)


# the standard library's pdb: a worker forked from an IPython kernel inherits ipykernel's
# replacement (pdb.Pdb patched), whose command loop swallows the stop button's interrupt
_Pdb = next(cls for cls in pdb.Pdb.__mro__ if cls.__module__ == "pdb")


class RankPdb(_Pdb):
    """pdb whose lines come from the notebook, one rank at a time."""

    def __init__(self) -> None:
        rank = os.environ.get("RANK", "?")
        super().__init__(stdin=_Lines(f"(Pdb rank {rank}) "), stdout=sys.stdout)
        self.prompt = ""  # the kernel shows the prompt (_Lines.prompt) in the input box
        self.use_rawinput = False

    def format_stack_entry(self, frame_lineno: tuple[FrameType, int], lprefix: str = ": ") -> str:
        """pdb's ``file(line)function()``, with a notebook cell's ``Cell In[N], line L, in``
        for its file and line."""
        text = super().format_stack_entry(frame_lineno, lprefix)
        frame, line = frame_lineno
        number = NUMBERS.get(frame.f_code.co_filename)
        if number is None:
            return text
        place = f"{self.canonic(frame.f_code.co_filename)}({line!r})"
        return text.replace(place, f"Cell In[{number}], line {line}, in ", 1)

    def _cmdloop(self) -> None:
        self.allow_kbdint = True
        try:
            self.cmdloop()  # a KeyboardInterrupt ends the session and the run (not one command)
        finally:
            self.allow_kbdint = False

    def interaction(self, frame: FrameType | None, tb: Any) -> None:
        try:
            super().interaction(frame, tb)
        finally:
            sys.stdout.flush()
            _send(DebugEnd())


def _breakpoint(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook``: stop in the caller's frame."""
    RankPdb().set_trace(sys._getframe(1))


def post_mortem() -> None:
    """pdb at the frame that raised in this rank's last failed run (``sys.last_traceback``);
    what ``%accelerate debug`` runs on the root-cause rank."""
    tb: TracebackType | None = getattr(sys, "last_traceback", None)
    if tb is None:
        print("no failed run to debug on this rank (its last run did not raise)", flush=True)
        return
    debugger = RankPdb()
    debugger.reset()
    debugger.interaction(None, tb)


def no_prompt(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of a one-off launch's worker: no channel brings a prompt's input
    there, so say so and run on."""
    rank = os.environ.get("RANK", "?")
    print(f"[notebook_accel] breakpoint() on rank {rank} skipped: a one-off launch has no "
          "debugger prompt; run the job on a pool (WorkerPool, %accelerate start) to stop "
          "there", file=sys.stderr, flush=True)
