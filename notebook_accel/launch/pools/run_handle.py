"""``RunHandle``: a run on the warm pool that goes on in the background, and how to reach it.

``WorkerPool.submit`` (and ``%%accelerate --background``) start a run on a thread of the
kernel's own and return at once: the kernel stays free for other cells. The thread is the
run's output pump (the same supervisor, relay and stop as a cell's run); what the run would
print into a cell is kept in a :class:`~notebook_accel.launch.views.run_output.RunOutput` instead,
shown by :meth:`RunHandle.watch` in the cell that calls it (never in whichever cell happens
to run meanwhile).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from notebook_accel.launch.control.interrupts import (
    LaunchInterrupted,
    StopPresses,
    interrupts_raised,
)
from notebook_accel.launch.views.output import CELL_BURST, CELL_BYTES
from notebook_accel.launch.views.rich_output import show_display
from notebook_accel.launch.views.run_output import RunOutput
from notebook_accel.launch.views.text import format_duration, say
from notebook_accel.wire import Kind

WATCH_WAKE = 0.5  # seconds a watch waits for output before looking at the run again


class RunHandle:
    """A background run on a :class:`~notebook_accel.WorkerPool`.

    Attributes:
        what: what runs, in words (``"cell [14]"``, ``"a background run of train"``).
        advice: how to watch or stop it, for the refusal of another run meanwhile.
        output: what it would have printed in a cell, kept (bounded) for :meth:`watch`.

    Example:
        >>> run = pool.submit(train, epochs=3)  # doctest: +SKIP
        >>> run.watch()     # the lines so far, then live, until it ends (returns its value)
        >>> run.cancel()    # or stop it where every rank stops together
    """

    def __init__(self, what: str, advice: str, output: RunOutput | None = None) -> None:
        self.what = what
        self.advice = advice
        self.output = RunOutput() if output is None else output
        self.presses = StopPresses()
        self.started = time.monotonic()
        self._ended = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._told = False  # its failure was raised to the user (result, watch, the pool)

    # -- the run's side ------------------------------------------------------------------------

    def finish(self, value: Any, error: BaseException | None) -> None:
        """The run ended with ``value``, or raised ``error`` (called by the pool's thread,
        after the run's last output)."""
        self._value, self._error = value, error
        self._ended.set()
        self.output.end()

    # -- the user's side -----------------------------------------------------------------------

    def done(self) -> bool:
        """Whether the run has ended (finished, failed or cancelled)."""
        return self._ended.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the run (at most ``timeout`` seconds) and return rank 0's value (every
        rank's with ``return_all=True``).

        Raises:
            TimeoutError: still running after ``timeout`` seconds (the run goes on).
            WorkerError: the run failed (the same error a cell's run raises).
            LaunchInterrupted: the run was cancelled.
        """
        if not self._ended.wait(timeout):
            raise TimeoutError(f"{self.what} is still running after {timeout:g} s (it goes on); "
                               ".watch() shows it live, .cancel() stops it")
        return self._outcome()

    def cancel(self, timeout: float | None = None) -> bool:
        """Stop the run as the stop button stops a cell's: every rank at the same point (the
        consistent cut), else at once; the pool keeps its state. Waits for the run to end (at
        most ``timeout`` seconds).

        Returns:
            True if this stopped the run, False if it had ended already.
        """
        if self.done():
            return False
        self.presses.press()
        self._ended.wait(timeout)
        return True

    def watch(self) -> Any:
        """Show the run in this cell: the lines so far, then live, each line once, until it
        ends; then says that it finished and returns its value. The stop button
        (KeyboardInterrupt) stops watching, not the run.

        Raises:
            WorkerError: the run failed.
        """
        try:
            with interrupts_raised():  # (inside a launch's deferral: the press raises now)
                self._show_until_end()
        except KeyboardInterrupt:
            say(f"stopped watching {self.what}; it runs on (watch again to see it, "
                ".cancel() stops it)", sys.stderr)
            return None
        if isinstance(self._error, LaunchInterrupted):
            say(f"{self.what} was cancelled: {self._error}", sys.stderr)
            return None
        value = self._outcome()
        say(f"{self.what} finished")
        return value

    def logs(self, rank: int, stream: str | None = None) -> str:
        """Everything ``rank`` printed in this run so far (only ``stream``'s, "stdout" or
        "stderr", if given), also what a cell would have left out."""
        record = self.output.record
        return record.logs(rank, stream) if record is not None else ""

    def state(self) -> str:
        """``"running 12:05, step 912"``, ``"finished"``, ``"failed"``, ``"cancelled"``."""
        if not self.done():
            step = self.step
            age = format_duration(time.monotonic() - self.started)
            return f"running {age}" + (f", step {step}" if step is not None else "")
        if self._error is None:
            return "finished"
        return "cancelled" if isinstance(self._error, LaunchInterrupted) else "failed"

    @property
    def step(self) -> int | None:
        """The latest step the run told (a metric's step, else rank 0's progress bar), if any."""
        record = self.output.record
        if record is None:
            return None
        steps = [values[-1][0] for values in list(record.history.values())
                 if values and values[-1][0] is not None]
        if steps:
            return max(steps)
        bar = record.progress.get(min(record.ranks, default=0))
        return bar.get("n") if bar else None

    def __repr__(self) -> str:
        hint = "; .watch(), .cancel()" if not self.done() else "; .result(), .logs(rank)"
        return f"<RunHandle {self.what}: {self.state()}{hint}>"

    # -- helpers ---------------------------------------------------------------------------------

    def unreported_failure(self) -> BaseException | None:
        """The run's failure if it ended failing and nobody was told yet (then it counts as
        told): the pool raises it in the next call that touches the pool."""
        error = self._error
        if self._told or error is None or isinstance(error, LaunchInterrupted):
            return None
        self._told = True
        return error

    def _outcome(self) -> Any:
        if self._error is not None:
            self._told = True
            raise self._error
        return self._value

    def _show_until_end(self) -> None:
        """Write the output from its first kept piece on, then live, until it has ended."""
        number = 0
        if self.output.dropped_lines:
            say(f"{self.output.dropped_lines} earlier lines not kept (a background run keeps "
                f"its newest {self.output.keep / 1e6:.0f} MB of output; every rank's lines: "
                ".logs(rank))", sys.stderr)
        while True:
            items, number, dropped = self.output.since(number, WATCH_WAKE)
            if dropped:
                say(f"... {dropped} pieces of output not kept (.logs(rank) has them)", sys.stderr)
            _write(items)
            if self.output.ended and number == self.output.count:
                return


def _write(items: list[tuple[str, Any]]) -> None:
    """Write pieces of output to this cell, in order: runs of one stream in one write of at
    most ``CELL_BURST`` bytes, paced to ``CELL_BYTES`` a second (a replay of a long backlog
    stays below Jupyter's IOPub limits)."""
    index = 0
    while index < len(items):
        name, item = items[index]
        if name is Kind.DISPLAY:
            show_display(item)
            index += 1
            continue
        chunk, size = [], 0
        while index < len(items) and items[index][0] == name and size < CELL_BURST:
            chunk.append(items[index][1])
            size += len(items[index][1])
            index += 1
        stream = sys.stdout if name == "stdout" else sys.stderr
        stream.write("".join(chunk))
        stream.flush()
        if size >= CELL_BURST:
            time.sleep(size / CELL_BYTES)
