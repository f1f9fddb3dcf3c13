"""What a launch's supervisor is given (:class:`WatchSettings`, from the plan) and what it knows
of each rank (:class:`Worker`: its handle, any backend's, and what it reported).

The verdicts (``verdicts/``) read the workers; the supervisor's loop fills them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from notebook_accel.contract import OPTIONS
from notebook_accel.launch.backends.base import WorkerHandle
from notebook_accel.launch.supervision.worker_stacks import stack_ask
from notebook_accel.wire import FailureRecord, FrameReader, Stack, StopCount

if TYPE_CHECKING:
    from notebook_accel.launch.planning.plan import LaunchPlan


@dataclass(frozen=True)
class WatchSettings:
    """What one launch asks of its supervisor (its plan's: :meth:`of`).

    Attributes:
        timeout: seconds the launch may run (None: no limit).
        stop_wait: seconds a pool run's ranks have to reach the stop button's cut.
        hang_after: seconds without progress before a rank is marked (None: never).
        collectives_before: a run on some ranks of a pool: each rank's default-group count
            before it (one more is a collective the other ranks never join: the run stops).
    """

    timeout: float | None = None
    stop_wait: float = OPTIONS["stop_wait"].default
    hang_after: float | None = OPTIONS["hang_after"].default
    collectives_before: Mapping[int, int | None] | None = None

    @classmethod
    def of(cls, plan: LaunchPlan,
           collectives_before: Mapping[int, int | None] | None = None) -> WatchSettings:
        """The settings ``plan`` gives (a pool run's ``collectives_before``: its backend's)."""
        return cls(plan.timeout, plan.stop_wait, plan.hang_after, collectives_before)


@dataclass
class Worker:
    """What the supervisor knows of one rank: its handle (any backend's), and what it reported."""

    handle: WorkerHandle
    result: bytes | None = None
    returned: bool = False  # it sent its Result
    error: FailureRecord | None = None  # the failure it reported
    exited: bool = False
    exit_time: float | None = None  # time.time() when the kernel saw it exit
    stopped: bool = False  # we stopped it (after another rank failed, a timeout, an interrupt)
    run_done: bool = False  # a persistent worker reported the end of its run
    stop_count: StopCount | None = None  # its answer when the stop button asked where it is
    stack: Stack | None = None  # its latest answer to a StackAsk of this run
    first_ask: int | None = None  # the number of this run's first StackAsk to it
    control: FrameReader = field(init=False)
    events: FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.control = self.handle.frames("control")
        self.events = self.handle.frames("events")

    @property
    def rank(self) -> int:
        return self.handle.rank

    def ask_stack(self, recorder: int = 0) -> bool:
        """Ask for its stack (and its last ``recorder`` collectives per group, without their
        lines: a fast read, the stack says where the rank waits): a pool's worker answers;
        False: it cannot."""
        ask = stack_ask(recorder, lines=False)
        if self.first_ask is None:
            self.first_ask = ask.ask
        return self.handle.command(ask)

    def answered(self, stack: Stack) -> bool:
        """Whether ``stack`` answers a request of this run (not one an earlier run left
        unread in the channel); if so, it is the latest known."""
        if self.first_ask is None or stack.ask < self.first_ask:
            return False
        self.stack = stack
        return True

    @property
    def finished(self) -> bool:
        """Its part of the run is over: it exited, or (a persistent worker) reported the end."""
        return self.exited or (self.handle.persistent and self.run_done)

    @property
    def succeeded(self) -> bool:
        if self.handle.persistent:
            return self.returned and self.run_done and not self.exited
        return self.exitcode == 0

    @property
    def interrupted(self) -> bool:
        """We stopped it and its only report is the KeyboardInterrupt we caused."""
        return self.stopped and (self.error is None or self.error.exc_type == "KeyboardInterrupt")

    @property
    def pid(self) -> int | None:
        return self.handle.pid

    @property
    def exitcode(self) -> int | None:
        return self.handle.exitcode
