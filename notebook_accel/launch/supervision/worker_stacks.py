"""Ask pool workers where their main threads are (:class:`~notebook_accel.wire.StackAsk`).

Between runs nobody reads the workers' control channels, so this reads the answers itself.
While a run is in progress (a background run: the kernel is free) its supervisor reads them:
the answers to an ask of ours are handed over to :data:`ANSWERS`, where this waits for them.
"""

from __future__ import annotations

import contextlib
import itertools
import selectors
import threading
import time
from collections.abc import Sequence

from notebook_accel.launch.backends.base import WorkerHandle
from notebook_accel.launch.tuning import RECORDERS_WAIT, STACKS_WAIT
from notebook_accel.wire import Collective, Stack, StackAsk

Frames = tuple[tuple[str, int, str], ...]
_asks = itertools.count(1)


class Answers:
    """Answers to asks made while a run's supervisor reads the control channels: the
    supervisor hands over every answer (:meth:`deliver`), and those of an ask someone
    :meth:`expect` s are kept for it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._kept: dict[int, dict[int, Stack]] = {}  # ask -> rank -> its answer

    def expect(self, ask: int) -> None:
        with self._changed:
            self._kept[ask] = {}

    def deliver(self, rank: int, stack: Stack) -> None:
        """``rank``'s answer, read by a supervisor (kept only if its ask is expected)."""
        with self._changed:
            if stack.ask in self._kept:
                self._kept[stack.ask][rank] = stack
                self._changed.notify_all()

    def wait(self, ask: int, ranks: set[int], timeout: float) -> dict[int, Stack]:
        """The answers of ``ranks`` to ``ask`` that came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not ranks <= set(self._kept[ask]) and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return self._kept.pop(ask)


ANSWERS = Answers()


def stack_ask(recorder: int = 0, lines: bool = True) -> StackAsk:
    """A request for a worker's stack (and its last ``recorder`` collectives per group, with
    their lines when ``lines``), numbered: a later request has a larger number, so an answer
    to an earlier one (read late, by a later run) is known for what it is."""
    return StackAsk(next(_asks), recorder, lines)


def ask_stacks(handles: Sequence[WorkerHandle],
               timeout: float = STACKS_WAIT) -> tuple[dict[int, Frames], list[int]]:
    """Every idle worker's main-thread stack; returns (rank -> frames, ranks that did not
    answer within ``timeout`` seconds)."""
    answers, silent = ask_answers(handles, timeout)
    return {rank: stack.frames for rank, stack in answers.items()}, silent


def ask_recorders(handles: Sequence[WorkerHandle], last: int, timeout: float = RECORDERS_WAIT,
                  running: bool = False
                  ) -> tuple[dict[int, tuple[Collective, ...] | None], list[int]]:
    """Every worker's last ``last`` collectives per group (its flight recorder; a process's
    first read names the frames' code, about a second), idle or (``running``, see
    :func:`ask_answers`) in a run; returns (rank -> them, ranks that did not answer within
    ``timeout`` seconds)."""
    answers, silent = ask_answers(handles, timeout, recorder=last, running=running)
    return {rank: stack.recorder for rank, stack in answers.items()}, silent


def ask_answers(handles: Sequence[WorkerHandle], timeout: float = STACKS_WAIT,
                recorder: int = 0, running: bool = False) -> tuple[dict[int, Stack], list[int]]:
    """Every worker's answer to a :class:`StackAsk` (with its last ``recorder`` collectives
    per group); returns (rank -> its answer, ranks that did not answer within ``timeout``
    seconds). ``running``: a run's supervisor reads the channels (the answers come through
    :data:`ANSWERS`); else the workers are idle and their channels are read here."""
    stacks: dict[int, Stack] = {}
    ask = stack_ask(recorder)
    if running:
        ANSWERS.expect(ask.ask)
        asked = {h.rank for h in handles if h.exitcode is None and h.command(ask)}
        stacks = ANSWERS.wait(ask.ask, asked, timeout)
        return stacks, [h.rank for h in handles if h.rank not in stacks]
    waiting = {h.rank: (h, h.frames("control")) for h in handles
               if h.exitcode is None and h.command(ask)}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for handle, _ in waiting.values():  # a group's inbox, or each control channel
            with contextlib.suppress(KeyError):
                selector.register(handle.inbox or handle.control_fd, selectors.EVENT_READ)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                if not isinstance(key.fileobj, int):
                    key.fileobj.take(())  # kept for the next run; every waiting rank is read below
            for rank, (_, reader) in list(waiting.items()):
                messages, still_open = reader.read()
                for message in messages:
                    if type(message) is Stack and message.ask == ask.ask:
                        stacks[rank] = message
                if rank in stacks or not still_open:
                    del waiting[rank]
    return stacks, [h.rank for h in handles if h.rank not in stacks]
