"""The launcher seam: a backend starts the workers of one call and hands back their channels.

Everything else on the kernel side is shared by every backend: the plan, the
payload, the supervisor (watch loop, root cause, stopping), the output relay, the
views and the result. A backend has two members, as Lightning Fabric's
``_Launcher``: :meth:`Backend.check` refuses up front what it cannot run here, and
:meth:`Backend.start` starts one worker per rank and returns a :class:`WorkerGroup`
whose :class:`WorkerHandle` objects the supervisor reads and stops.

Channels are the kernel's ends of four non-blocking file descriptors per rank, as
:mod:`notebook_accel.wire` describes: ``stdout`` and ``stderr`` (raw bytes),
``control`` (reliable framed messages: result, failure, displays) and ``events``
(lossy framed messages: progress, metrics). A backend whose workers are not local
children (a pool kept across calls, actors on other nodes) gives the same four
descriptors, e.g. by relaying its own connection into local pipes, or none: its handles
then share an ``inbox`` (one descriptor for them all, which says which channels have something)
and serve their channels' bytes from memory (:meth:`WorkerHandle.read_output`,
:meth:`WorkerHandle.frames`), as the cluster's node links do.

Signals go through :func:`~notebook_accel.launch.backends.signal_all.signal_all`, which hands a backend
whose handles share a way to their workers (``together``: a node's link) the ranks at once, one
message per node.

A backend whose workers outlive a call (the warm pool) marks its handles
``persistent``: a rank's run then ends with its :class:`~notebook_accel.wire.RunDone`
report (kept in ``last_report``), not with its exit, and the supervisor stops a run by
interrupting the rank (:meth:`WorkerHandle.interrupt`), killing it only when it does
not answer.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from notebook_accel import wire
from notebook_accel.launch.backends.signal_all import signal_all

if TYPE_CHECKING:
    from notebook_accel.launch.handoff.cells import SentCells
    from notebook_accel.launch.handoff.payload import Payload
    from notebook_accel.launch.planning.plan import LaunchPlan
    from notebook_accel.wire import Message, RunDone


class WorkerHandle(abc.ABC):
    """One rank as the kernel reaches it: who it is, whether it lives, its channels, how to stop it."""

    rank: int  # global rank
    stdout_fd: int
    stderr_fd: int
    control_fd: int
    events_fd: int
    node: int = 0  # the node it runs on (a cluster's; 0 on this machine)
    persistent: bool = False  # it outlives the run: the run ends with a RunDone, not an exit
    # seconds the kernel may wait, once the worker has ended, for the rest of its output and
    # control channels: 0 where they are local pipes (all there by then), more over a network
    end_grace: float = 0.0
    last_report: RunDone | None = None  # a persistent worker's report of its latest run
    commands_fd: int | None = None  # a persistent worker's commands channel (the kernel's end)
    inbox: Inbox | None = None  # shared by the group's handles when they have no descriptors
    together: Together | None = None  # signals the group's ranks at once (signal_all)
    rss_told: bool = False  # ``rss`` reads a figure here, and its inbox tells ("memory") when it moves

    def read_output(self, name: str) -> bytes | None:
        """What its ``stdout`` or ``stderr`` holds now: b"" at its end, None when nothing is."""
        try:
            return os.read(self.stdout_fd if name == "stdout" else self.stderr_fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def frames(self, name: str) -> wire.FrameReader:
        """A reader of its ``control`` or ``events`` channel."""
        return wire.FrameReader(self.control_fd if name == "control" else self.events_fd)

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The process id (on its host), for the record and the failure report."""

    @property
    @abc.abstractmethod
    def sentinel(self) -> int:
        """A file descriptor that becomes readable once the worker has ended."""

    @property
    @abc.abstractmethod
    def exitcode(self) -> int | None:
        """None while it runs; then its exit code (negative: the signal that ended it)."""

    @abc.abstractmethod
    def terminate(self) -> None:
        """Ask the worker (and whatever it started) to stop."""

    def interrupt(self) -> None:
        """Stop the current run of a persistent worker (a KeyboardInterrupt in it)."""
        self.terminate()

    def command(self, message: Message) -> bool:
        """Send a persistent worker ``message`` on its commands channel; False when it has
        none, or it is gone."""
        if self.commands_fd is None:
            return False
        try:
            wire.send(self.commands_fd, message)
        except OSError:
            return False
        return True

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop the worker (and whatever it started) now."""

    @abc.abstractmethod
    def dump_stacks(self) -> None:
        """Have the worker write every thread's stack to its stderr (the timeout report)."""

    @abc.abstractmethod
    def reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for an ended worker to be collected."""

    def rss(self) -> int | None:
        """The worker's resident memory in bytes, when the backend can tell."""
        return None

    @property
    def label(self) -> str:
        """The rank as errors name it (a cluster adds its node: ``rank 1 on node 1 (10.0.0.2)``)."""
        return f"rank {self.rank}"

    @property
    def prefix(self) -> str:
        """The label of its output lines, in brackets (``rank 1``, ``node 1 rank 1``)."""
        return f"rank {self.rank}"

    def describe_end(self) -> str | None:
        """How it ended, when the exit code cannot say (a lost node); None: the exit code says."""
        return None


class Inbox(abc.ABC):
    """The channels of a group's handles behind one descriptor (readable when there is news)."""

    @abc.abstractmethod
    def fileno(self) -> int:
        """Readable while :meth:`take` has something to return."""

    @abc.abstractmethod
    def take(self, ranks: Container[int], most: int | None = None) -> list[tuple[int, str]]:
        """The (rank, channel) pairs of ``ranks`` with news since the last take, in arrival
        order; channel is ``stdout``, ``stderr``, ``control``, ``events``, ``memory`` or
        ``exit`` (the rank ended). ``most``: take only the oldest that many (about: news kept
        from before comes too); the rest stays news, and the inbox readable. Other ranks'
        news is kept for a later take (a run on some ranks leaves it)."""


class Together(abc.ABC):
    """Signals many ranks of a group at once (a cluster: one frame per node)."""

    @abc.abstractmethod
    def signal(self, ranks: Sequence[int], what: str) -> None:
        """Do ``what`` (a :class:`WorkerHandle` method: ``terminate``, ``kill``, ``interrupt``,
        ``dump_stacks``) to each of ``ranks``."""


def kill_all(handles: Sequence[WorkerHandle], reap_timeout: float = 5.0) -> None:
    """Kill every worker (stragglers included), then reap them."""
    signal_all(handles, "kill")
    for handle in handles:
        handle.reap(timeout=reap_timeout)


class ChannelKeeper:
    """Where the supervisor keeps the registered channels of workers that outlive a call (a
    warm pool's) from one run to the next; closed with the workers."""

    def __init__(self) -> None:
        self.channels: Any = None  # the supervisor's ReadyChannels (None: none yet)

    def close(self) -> None:
        if self.channels is not None:
            self.channels.close()
            self.channels = None


class WorkerGroup(abc.ABC):
    """The workers a backend started for one call.

    Attributes:
        plan: the plan the workers run (for the XLA backend: its one host worker),
            which the launch record and the result follow.
        handles: one per local rank, in rank order.
    """

    def __init__(self, plan: LaunchPlan, handles: list[WorkerHandle]) -> None:
        self.plan = plan
        self.handles = handles
        # a run on some ranks of a pool: their default-group collective counts before it
        # (None: a run on every rank); the supervisor stops one that enters a collective
        self.collectives_before: dict[int, int | None] | None = None
        # workers that outlive the call: where their channels stay registered between calls
        # (None: the supervisor registers them for this call only)
        self.keeper: ChannelKeeper | None = None

    def result(self, values: list[Any]) -> Any:
        """The call's return value from the ranks' values: rank 0's, or all with ``return_all``."""
        return values if self.plan.return_all else values[0]

    @abc.abstractmethod
    def close(self) -> None:
        """End the call: nothing of it may outlive this (stragglers, channels, rendezvous).

        A backend that keeps workers across calls returns them to its pool here
        instead of stopping them.
        """


class PoolWorkerSet(abc.ABC):
    """A warm pool's workers as a backend keeps them across runs (local processes, or a
    cluster's, forked by its hubs): the pool asks only this.

    Attributes:
        plan: the plan they were started for.
        handles: one persistent handle per rank, in rank order (replaced ones included).
        cells_sent: what the workers already have of the notebook's cells.
        local: they are processes of this machine (big tensor arguments reach them in shared
            memory), as the backend's ``local`` says.
        keeper: where the supervisor keeps their channels registered between runs (None:
            registered per run).
    """

    local: ClassVar[bool] = True
    plan: LaunchPlan
    handles: list[Any]
    cells_sent: SentCells
    keeper: ChannelKeeper | None

    @abc.abstractmethod
    def send_runs(self, payload: bytes, with_result: set[int], ranks: set[int]) -> None:
        """Start a run of ``payload`` on ``ranks``; those of ``with_result`` send its value back."""

    @abc.abstractmethod
    def dead(self) -> list[Any]:
        """The workers that have ended."""

    @abc.abstractmethod
    def replace(self, ranks: tuple[int, ...]) -> int:
        """Start new workers for the dead ``ranks`` around a fresh rendezvous; its port."""

    @abc.abstractmethod
    def close(self, grace: float = 2.0) -> None:
        """End every worker and release what the set holds. Idempotent."""


class Backend(abc.ABC):
    """How workers are started and reached (local processes, torch_xla, a pool, a cluster).

    Attributes:
        name: what it is called.
        local: its workers are processes of this machine that this kernel starts: big tensor
            arguments reach them in shared memory, they share its ``/dev/shm``, and its start
            method is theirs (False: a cluster's nodes start them).
    """

    name: str = ""
    local: ClassVar[bool] = True

    @classmethod
    def where(cls, plan: LaunchPlan) -> str:
        """Where its workers run, in words (a pool's start line): the start method here."""
        return plan.start.method

    def check(self, plan: LaunchPlan) -> None:
        """Refuse, before anything starts, what this backend cannot run from here.

        Raises:
            ImportError, RuntimeError, ValueError: with a message naming the way out.
        """
        return None  # by default, whatever the plan allows can run here

    @abc.abstractmethod
    def start(self, plan: LaunchPlan, payload: Payload) -> WorkerGroup:
        """Start one worker per local rank of ``plan``, each running ``payload``.

        Must leave nothing behind when it raises (a KeyboardInterrupt included).
        """
