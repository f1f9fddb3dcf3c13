"""The kernel's side of a worker's debugger: its prompt in the notebook's input box.

A rank's debugger asks for each line (:class:`~notebook_accel.wire.InputAsk`); the
supervisor shows the rank's output so far, then the prompt with ``input()`` (in a
kernel, Jupyter's stdin channel: the cell's input box; elsewhere the terminal), and sends
the line back (:class:`~notebook_accel.wire.InputLine`). One rank at a time: a rank keeps
the prompt from its first line until its session ends (:class:`~notebook_accel.wire.DebugEnd`,
or the rank ends); others wait their turn. The stop button at the prompt ends the input
at once (:func:`~notebook_accel.launch.control.interrupts.interrupts_raised`) and the run with it.
While a session holds the prompt the launch's view is not redrawn (the supervisor asks
:attr:`Prompts.holder`), so no table lands inside the transcript.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from notebook_accel.launch.control.interrupts import interrupts_raised
from notebook_accel.wire import InputAsk, InputLine


class Prompts:
    """The debugger prompts of one run's ranks."""

    def __init__(self) -> None:
        self.asks: dict[int, tuple[Any, str]] = {}  # rank -> (its supervisor's Worker, prompt)
        self.holder: int | None = None  # the rank whose session has the prompt
        self.interrupted = False  # the stop button was pressed at a prompt

    def ask(self, worker: Any, message: InputAsk) -> None:
        self.asks[worker.rank] = (worker, message.prompt)

    def end(self, rank: int) -> None:
        """``rank``'s session ended (or the rank did): the next rank may have the prompt."""
        self.asks.pop(rank, None)
        if self.holder == rank:
            self.holder = None

    def serve(self, show_output: Callable[[Any], None]) -> bool:
        """Show the waiting prompt, if any, and send the line typed (blocks until then);
        returns whether it did.

        Raises:
            KeyboardInterrupt: the stop button at the prompt (``interrupted`` is set).
        """
        if not self.asks or (self.holder is not None and self.holder not in self.asks):
            return False  # no prompt, or the holder runs on between two prompts
        rank = self.holder if self.holder is not None else min(self.asks)
        worker, prompt = self.asks.pop(rank)
        self.holder = rank
        show_output(worker)
        if threading.current_thread() is not threading.main_thread():
            text = _no_input(rank, " (a background run has no input box)")  # (input() would
            # ask whichever cell runs now)
        else:
            try:
                with interrupts_raised():
                    text = input(prompt)
            except KeyboardInterrupt:
                self.interrupted = True
                raise
            except (EOFError, NotImplementedError):  # no input here (a front end without stdin)
                text = _no_input(rank)
        worker.handle.command(InputLine(text))
        return True


def _no_input(rank: int, why: str = "") -> None:
    """Say that ``rank``'s debugger gets no line (it quits)."""
    print(f"[notebook_accel] no input for rank {rank}'s debugger here{why}: it quits",
          file=sys.stderr, flush=True)
