"""Where each rank of a one-off launch is: faulthandler's dump, read back from its stderr.

A one-off launch's workers have no commands channel to answer a ``StackAsk``; each has
faulthandler registered on ``SIGUSR1`` (``worker/main.py``), which writes every thread's
stack to its stderr even while its main thread waits inside C++ code (a collective), and
then its flight recorder's line (``worker/flight_recorder.answer_on_signal``). The
same mechanism gives a timeout's error its stacks; here the job runs on, so the ranks'
lines are held while their dumps arrive, then shown again without the dumps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from notebook_accel.launch.backends.signal_all import signal_all
from notebook_accel.launch.supervision.tracebacks import dump_frames, is_dump_line
from notebook_accel.launch.tuning import DUMP_LATEST, DUMP_WAIT
from notebook_accel.launch.views.output import OutputRelay
from notebook_accel.launch.worker.flight_recorder import DUMP_MARK, read_dump_line
from notebook_accel.wire import Collective

Frames = tuple[tuple[str, int, str], ...]
Recorder = tuple[Collective, ...] | None  # a rank's last collectives (None: none came)


class StackDumps:
    """One round of stack dumps at a time, for one launch's supervisor."""

    def __init__(self, relay: OutputRelay) -> None:
        self.relay = relay
        self._marks: dict[int, dict[str, int]] = {}  # rank -> its lines before the dump
        self._since: float | None = None

    @property
    def taking(self) -> bool:
        """A round of dumps was asked for and is not taken yet."""
        return self._since is not None

    def ranks(self) -> tuple[int, ...]:
        """The ranks of the round under way."""
        return tuple(self._marks)

    def ask(self, workers: Sequence[Any]) -> None:
        """Have each of ``workers`` (the supervisor's) dump its stacks to its stderr."""
        for w in workers:
            self._marks[w.rank] = {name: self.relay.line_count(w.rank, name)
                                   for name in ("stdout", "stderr")}
            self.relay.hold(w.rank)
        signal_all([w.handle for w in workers], "dump_stacks")  # once per node on a cluster
        self._since = time.monotonic()

    def ready(self) -> bool:
        """The dumps had their time (read meanwhile by the supervisor's loop): every rank's
        recorder line came (a thread writes it, after faulthandler's stacks: reading a full
        ring takes a busy machine a few tenths of a second), or :data:`DUMP_LATEST` passed."""
        if self._since is None or (waited := time.monotonic() - self._since) < DUMP_WAIT:
            return False
        return waited >= DUMP_LATEST or all(
            any(line.startswith(DUMP_MARK)
                for line in self.relay.tail(rank, since=marks["stderr"], limit=1000).splitlines())
            for rank, marks in self._marks.items())

    def take(self) -> tuple[dict[int, Frames], dict[int, Recorder]]:
        """Each rank's main-thread frames (empty: no dump came) and last collectives, and its
        other lines shown."""
        stacks, recorders = {}, {}
        for rank, marks in self._marks.items():
            tail = self.relay.tail(rank, since=marks["stderr"], limit=1000)
            stacks[rank] = dump_frames(tail)
            recorders[rank] = next((found for line in reversed(tail.splitlines())
                                    if (found := read_dump_line(line)) is not None), None)
            self.relay.release(rank, marks, drop=is_dump_line)
        self._marks, self._since = {}, None
        return stacks, recorders
